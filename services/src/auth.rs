//! Authentication: a bearer token is validated with a TokenReview against the upstream,
//! as the API server's webhook token authenticator does, and the answer reused briefly.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use thiserror::Error;

use crate::ttl_cache::TtlCache;

#[derive(Debug, Error)]
pub enum Error {
    #[error("no bearer token")]
    MissingToken,
    #[error("invalid bearer token")]
    InvalidToken,
    #[error("TokenReview request failed: {0}")]
    ReviewFailed(#[source] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who a request is from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// Who a request without credentials is, with the API server's default
    /// `--anonymous-auth=true`.
    pub fn anonymous() -> Self {
        UserInfo {
            username: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

pub struct Authenticator {
    client: kube::Client,
    /// token → user, or `None` for a token the upstream rejected.
    cache: TtlCache<String, Option<UserInfo>>,
}

/// The bearer token of an `Authorization` header value, if it has one.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Authenticator {
    pub fn new(client: kube::Client, ttl: Duration, capacity: usize) -> Self {
        Authenticator {
            client,
            cache: TtlCache::new(capacity, move |_| ttl),
        }
    }

    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<UserInfo> {
        let token = bearer_token(authorization).ok_or(Error::MissingToken)?;
        if let Some(hit) = self.cache.get(token) {
            return hit.ok_or(Error::InvalidToken);
        }
        let user = self.review(token).await?;
        self.cache.insert(token.to_string(), user.clone());
        user.ok_or(Error::InvalidToken)
    }

    async fn review(&self, token: &str) -> Result<Option<UserInfo>> {
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let out = api
            .create(&Default::default(), &review)
            .await
            .map_err(Error::ReviewFailed)?;
        let Some(status) = out.status else {
            return Ok(None);
        };
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let user = status.user.unwrap_or_default();
        Ok(Some(UserInfo {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(None), None);
    }
}
