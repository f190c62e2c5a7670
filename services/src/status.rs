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
    /// (`ValidateListOptions`): 422 Invalid, kind ListOptions.
    pub fn invalid_list_options(message: impl std::fmt::Display) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
        );
        e.details = Some(json!({"group": "meta.k8s.io", "kind": "ListOptions"}));
        e
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `secrets "x" not found`, with the details the API server adds.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "group": group, "kind": resource}));
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
