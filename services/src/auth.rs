//! Authentication: a bearer token is validated with a TokenReview against the upstream,
//! as the API server's webhook token authenticator does, and the answer reused briefly.
//! The cache is keyed by the token's SHA-256, so no token is kept in memory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use thiserror::Error;

use crate::ttl_cache::{record_review, TtlCache};

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

/// Who a request is from. Hashed whole (`extra` included) as part of authorization's
/// cache key: tokens of one user scoped or bound differently may be allowed differently.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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
    /// SHA-256 of the token → user, or `None` for a token the upstream rejected.
    cache: TtlCache<TokenKey, Option<UserInfo>>,
}

/// What a token is cached under: its digest, not the secret itself.
type TokenKey = Box<[u8]>;

fn token_key(token: &str) -> TokenKey {
    ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
        .as_ref()
        .into()
}

/// The bearer token of an `Authorization` header value, if it has one.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Authenticator {
    /// Answers live `ttl` (zero: not cached); at most `capacity` are kept.
    pub fn new(client: kube::Client, ttl: Duration, capacity: usize) -> Self {
        let capacity = if ttl.is_zero() { 0 } else { capacity };
        Authenticator {
            client,
            cache: TtlCache::new("token", capacity, move |_| ttl),
        }
    }

    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<UserInfo> {
        let token = bearer_token(authorization).ok_or(Error::MissingToken)?;
        self.cache
            .get_or_fetch(token_key(token), || self.review(token))
            .await?
            .ok_or(Error::InvalidToken)
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
        let started = Instant::now();
        let out = api.create(&Default::default(), &review).await;
        let authenticated = out.as_ref().map(|r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.authenticated == Some(true))
        });
        let result = match authenticated {
            Ok(true) => "authenticated",
            Ok(false) => "unauthenticated",
            Err(_) => "error",
        };
        record_review("TokenReview", result, started.elapsed());
        let out = out.map_err(Error::ReviewFailed)?;
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

    #[test]
    fn tokens_are_cached_by_digest() {
        let k = token_key("s3cr3t-token");
        assert_eq!(k.len(), 32);
        assert_eq!(k, token_key("s3cr3t-token"));
        assert_ne!(k, token_key("s3cr3t-tokem"));
        assert!(!k.windows(6).any(|w| w == b"s3cr3t"));
    }
}
