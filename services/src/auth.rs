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

/// Go's `AuthenticatedGroupAdder`, which the API server wraps around its authenticators
/// (the x509 one included): `system:authenticated` is added to a user's groups unless the
/// user is `system:anonymous` or already has `system:authenticated` or
/// `system:unauthenticated`.
pub fn with_authenticated_group(name: &str, mut groups: Vec<String>) -> Vec<String> {
    let has = |g: &str| groups.iter().any(|x| x == g);
    if name != "system:anonymous" && !has("system:authenticated") && !has("system:unauthenticated")
    {
        groups.push("system:authenticated".into());
    }
    groups
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

/// What an `Authorization` header holds for the bearer-token authenticator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bearer<'a> {
    /// No header, or not a bearer credential: not this authenticator's (anonymous when
    /// allowed, as upstream).
    Absent,
    /// A bearer credential no token can match (empty, not UTF-8): 401.
    Invalid,
    Token(&'a str),
}

/// Reads the header as the API server's bearer-token authenticator does: trimmed, split on
/// every single space; the scheme is the first part (any case), the token the second
/// (whatever follows a further space is ignored); an empty second part is an invalid
/// token (`Bearer  abc`, two spaces, is invalid there too).
pub fn bearer_token(header: Option<&[u8]>) -> Bearer<'_> {
    let Some(h) = header else {
        return Bearer::Absent;
    };
    let h = h.trim_ascii();
    let mut parts = h.split(|b| *b == b' ');
    let (Some(scheme), Some(token)) = (parts.next(), parts.next()) else {
        return Bearer::Absent;
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Bearer::Absent;
    }
    match std::str::from_utf8(token) {
        Ok(t) if !t.is_empty() => Bearer::Token(t),
        _ => Bearer::Invalid,
    }
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

    pub async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<UserInfo> {
        let token = match bearer_token(authorization) {
            Bearer::Absent => return Err(Error::MissingToken),
            Bearer::Invalid => return Err(Error::InvalidToken),
            Bearer::Token(t) => t,
        };
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
    fn the_authenticated_group_is_added_as_go_adds_it() {
        let table: &[(&str, &[&str], &[&str])] = &[
            ("bob", &[], &["system:authenticated"]),
            ("bob", &["g"], &["g", "system:authenticated"]),
            (
                "bob",
                &["system:authenticated", "g"],
                &["system:authenticated", "g"],
            ),
            (
                "bob",
                &["system:unauthenticated"],
                &["system:unauthenticated"],
            ),
            ("system:anonymous", &["g"], &["g"]),
            ("system:anonymous", &[], &[]),
        ];
        for (name, groups, want) in table {
            let given = groups.iter().map(|g| g.to_string()).collect();
            assert_eq!(
                with_authenticated_group(name, given),
                *want,
                "{name} {groups:?}"
            );
        }
    }

    #[test]
    fn bearer_parsing() {
        use Bearer::{Absent, Invalid, Token};
        let cases: &[(&[u8], Bearer)] = &[
            (b"Bearer abc", Token("abc")),
            (b"bearer abc ", Token("abc")),
            (b" BEARER abc", Token("abc")),
            (b"Bearer abc def", Token("abc")),
            // Two spaces: the token is the empty second part.
            (b"Bearer  abc", Invalid),
            (b"Bearer \xffabc", Invalid),
            (b"Basic abc", Absent),
            (b"Bearer ", Absent),
            (b"Bearer", Absent),
            (b"", Absent),
        ];
        for &(h, want) in cases {
            assert_eq!(
                bearer_token(Some(h)),
                want,
                "{:?}",
                String::from_utf8_lossy(h)
            );
        }
        assert_eq!(bearer_token(None), Absent);
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
