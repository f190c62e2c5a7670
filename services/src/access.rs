//! Who a cache-served request is and whether it may: the API server's authenticator chain
//! (client certificate, bearer token through TokenReview, anonymous) and its authorizer
//! (SubjectAccessReview), each answer in the API server's status codes.

use std::sync::atomic::Ordering;

use actix_web::HttpRequest;

use crate::auth::{self, UserInfo};
use crate::authz::{self, Attributes};
use crate::state::ApiState;
use crate::status::ApiError;

/// Authenticates the request as the API server's authenticator chain does: a verified
/// client certificate with a common name first, then a bearer token through TokenReview;
/// no credentials is `system:anonymous` when allowed (as the API server's
/// `--anonymous-auth=true`) — but not after a certificate failed authentication.
pub async fn identify(req: &HttpRequest, state: &ApiState) -> Result<UserInfo, ApiError> {
    let authorization = req.headers().get("authorization").map(|v| v.as_bytes());
    let cert_failed = match cert_auth(req) {
        CertAuth::User(user) => return Ok(user),
        CertAuth::Failed => true,
        CertAuth::None => false,
    };
    match state.auth.authenticate(authorization).await {
        Ok(user) => Ok(user),
        // No bearer credential (none, or another scheme): anonymous, as upstream, when
        // allowed.
        Err(auth::Error::MissingToken)
            if !cert_failed && state.anonymous.load(Ordering::Relaxed) =>
        {
            Ok(UserInfo::anonymous())
        }
        Err(auth::Error::MissingToken | auth::Error::InvalidToken) => Err(ApiError::unauthorized()),
        Err(e @ auth::Error::ReviewFailed(_)) => {
            tracing::warn!(error = %e, "cannot authenticate: TokenReview failed");
            Err(ApiError::service_unavailable(
                "cannot authenticate the request: the API server's TokenReview failed",
            ))
        }
    }
}

/// What the connection's client certificate says (`crate::cert_identity`).
pub enum CertAuth {
    /// No certificate, or one without a common name: other credentials decide.
    None,
    User(UserInfo),
    /// The x509 authenticator failed (a malformed UID): only a bearer token can still
    /// authenticate the request; it is never anonymous.
    Failed,
}

/// The user of a client certificate verified against `--client-ca-file`, as the API
/// server's x509 authenticator reads it.
pub fn cert_auth(req: &HttpRequest) -> CertAuth {
    use crate::cert_identity::Identity;
    let Some(cert) = req.conn_data::<crate::tls::ClientCert>() else {
        return CertAuth::None;
    };
    match &cert.0 {
        Ok(Identity::User {
            name,
            uid,
            groups,
            extra,
        }) => CertAuth::User(UserInfo {
            username: name.clone(),
            uid: uid.clone(),
            groups: crate::auth::with_authenticated_group(name, groups.clone()),
            extra: extra.clone(),
        }),
        Ok(Identity::Nobody) => CertAuth::None,
        Err(e) => {
            tracing::info!(error = %e, "client certificate not authenticated");
            CertAuth::Failed
        }
    }
}

/// Authorizes `attrs` for `user` with a SubjectAccessReview; a denial is the API server's 403.
pub async fn check(state: &ApiState, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
    let d = decide(state, user, attrs).await?;
    if d.allowed {
        Ok(())
    } else {
        Err(authz::forbidden(user, attrs, &d.reason))
    }
}

/// The SubjectAccessReview's decision on `attrs` for `user` (through the authorization
/// cache); a review that failed is a 503, as the API server cannot decide either.
pub async fn decide(
    state: &ApiState,
    user: &UserInfo,
    attrs: &Attributes,
) -> Result<authz::Decision, ApiError> {
    state.authz.authorize(user, attrs).await.map_err(|e| {
        tracing::warn!(error = %e, "cannot authorize: SubjectAccessReview failed");
        ApiError::service_unavailable(
            "cannot authorize the request: the API server's SubjectAccessReview failed",
        )
    })
}
