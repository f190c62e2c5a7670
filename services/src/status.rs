//! Kubernetes `Status` objects: every error kcache answers itself takes this form, so
//! clients show it as they would the API server's.

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde_json::{json, Value};

/// A `Status` failure with the API server's reason for each code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// A query whose `ListOptions` fail the API server's validation
    /// (`ValidateListOptions`): 422 Invalid, kind ListOptions, a cause per field error
    /// (`errors.NewInvalid`).
    pub fn invalid_list_options(error: kcache_actors::core::rv::Error) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {error}"),
        );
        let mut details = json!({"group": "meta.k8s.io", "kind": "ListOptions"});
        if let kcache_actors::core::rv::Error::Invalid(errs) = &error {
            details["causes"] = errs
                .iter()
                .map(|f| json!({"reason": f.reason(), "message": f.body(), "field": f.field()}))
                .collect();
        }
        e.details = Some(details);
        e
    }

    /// The API server's answer to a storage error it has no reason for: 500, and a
    /// Status without `reason` (as it answers a watch or get whose resourceVersion does
    /// not parse).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `secrets "x" not found` (`endpointslices.discovery.k8s.io "x"` in a group), with the
    /// details the API server adds (`group` only when there is one: the core group's is
    /// omitted, as Go's `omitempty` does).
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let mut e = Self::new(
            404,
            "NotFound",
            format!(
                "{qualified} {} not found",
                kcache_actors::core::go_quote::go_quote(name)
            ),
        );
        let mut details = json!({"name": name, "kind": resource});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        e.details = Some(details);
        e
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 1.20's "Too large resource version" (504, retry after 1 s).
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        e.retry_after = Some(1);
        e
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty() {
            if let Some(m) = s.as_object_mut() {
                m.remove("reason");
            }
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl actix_web::ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut b = HttpResponse::build(self.status_code());
        if let Some(ra) = self.retry_after {
            b.insert_header(("Retry-After", ra.to_string()));
        }
        if self.code == 401 {
            // As the API server: tells clients which scheme to use.
            b.insert_header(("WWW-Authenticate", "Bearer realm=\"kcache\""));
        }
        b.content_type("application/json").json(self.to_status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shape() {
        let s = ApiError::not_found("", "secrets", "s1").to_status();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "secrets \"s1\" not found");
        let t = ApiError::too_large_resource_version(9, 5);
        assert_eq!(t.code, 504);
        assert_eq!(t.to_status()["details"]["retryAfterSeconds"], 1);
    }
}
