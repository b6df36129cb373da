//! The one error catalogue of the request path, rendered once at the edge in the caller's
//! dialect.
//!
//! Every stage returns a [`GatewayError`]; nothing below the edge builds an HTTP response.
//! Messages are for the caller: they never carry another tenant's data, prompt text or a
//! secret. Mid-stream failures use the same catalogue, as the dialect's error event.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::request::Dialect;

/// What went wrong, in terms the caller can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for something unsupported.
    InvalidRequest,
    /// No or a wrong API key.
    Authentication,
    /// The key may not do this.
    PermissionDenied,
    /// The model or path does not exist.
    NotFound,
    /// The body is larger than the configured limit.
    PayloadTooLarge,
    /// The client took too long to send its request.
    RequestTimeout,
    /// A tenant limit is exhausted.
    RateLimited,
    /// The front door is at its concurrency bound or draining; retry later.
    Overloaded,
    /// No capacity for this request right now (every candidate filtered out).
    NoCapacity,
    /// The upstream failed or sent something malformed.
    UpstreamFailed,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// A bug or an unexpected condition.
    Internal,
}

/// An error of the request path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GatewayError {
    /// Category.
    pub kind: ErrorKind,
    /// Human-readable, caller-safe message.
    pub message: String,
    /// OpenAI's `code` (machine-readable detail).
    pub code: &'static str,
    /// The request parameter at fault, when one is.
    pub param: Option<String>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<Duration>,
}

impl GatewayError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> GatewayError {
        GatewayError { kind, message: message.into(), code, param: None, retry_after: None }
    }

    /// A malformed request.
    pub fn invalid(message: impl Into<String>) -> GatewayError {
        GatewayError::new(ErrorKind::InvalidRequest, "invalid_request", message)
    }

    /// A malformed request, naming the parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> GatewayError {
        GatewayError { param: Some(param.to_owned()), ..GatewayError::invalid(message) }
    }

    /// An unknown model.
    pub fn model_not_found(message: impl Into<String>) -> GatewayError {
        GatewayError::new(ErrorKind::NotFound, "model_not_found", message)
    }

    /// At the concurrency bound.
    pub fn overloaded(retry_after: Duration) -> GatewayError {
        GatewayError {
            retry_after: Some(retry_after),
            ..GatewayError::new(ErrorKind::Overloaded, "overloaded", "the server is at capacity; retry shortly")
        }
    }

    /// An upstream failure.
    pub fn upstream(message: impl Into<String>) -> GatewayError {
        GatewayError::new(ErrorKind::UpstreamFailed, "upstream_failed", message)
    }

    /// The HTTP status in `dialect`. Overload is 529 for Anthropic (its SDK's
    /// `OverloadedError`) and 503 for OpenAI.
    pub fn status(&self, dialect: Dialect) -> StatusCode {
        match self.kind {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Overloaded => match dialect {
                Dialect::OpenAi => StatusCode::SERVICE_UNAVAILABLE,
                Dialect::Anthropic => StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            },
            ErrorKind::NoCapacity => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::UpstreamFailed => StatusCode::BAD_GATEWAY,
            ErrorKind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn openai_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::NotFound | ErrorKind::PayloadTooLarge => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::PermissionDenied => "permission_error",
            ErrorKind::RequestTimeout | ErrorKind::UpstreamTimeout => "timeout_error",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Overloaded | ErrorKind::NoCapacity => "service_unavailable",
            ErrorKind::UpstreamFailed | ErrorKind::Internal => "api_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::PermissionDenied => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::PayloadTooLarge => "request_too_large",
            ErrorKind::RequestTimeout | ErrorKind::UpstreamTimeout => "timeout_error",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Overloaded | ErrorKind::NoCapacity => "overloaded_error",
            ErrorKind::UpstreamFailed | ErrorKind::Internal => "api_error",
        }
    }

    /// The error body in `dialect`.
    pub fn body(&self, dialect: Dialect, request_id: Option<&str>) -> Value {
        match dialect {
            Dialect::OpenAi => json!({"error": {
                "message": self.message, "type": self.openai_type(), "param": self.param, "code": self.code,
            }}),
            Dialect::Anthropic => {
                let mut v = json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}});
                if let Some(id) = request_id {
                    v["request_id"] = json!(id);
                }
                v
            }
        }
    }

    /// The error as one SSE event of `dialect` (a stream that already started).
    pub fn sse_event(&self, dialect: Dialect) -> String {
        let body = self.body(dialect, None);
        match dialect {
            Dialect::OpenAi => format!("data: {body}\n\n"),
            Dialect::Anthropic => format!("event: error\ndata: {body}\n\n"),
        }
    }

    /// The whole HTTP response in `dialect`.
    pub fn into_response_for(self, dialect: Dialect, request_id: Option<&str>) -> Response {
        let status = self.status(dialect);
        let mut r = (status, axum::Json(self.body(dialect, request_id))).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs().max(1);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            if let Ok(v) = HeaderValue::from_str(&after.as_millis().to_string()) {
                r.headers_mut().insert("retry-after-ms", v);
            }
        }
        if let Some(id) = request_id
            && let Ok(v) = HeaderValue::from_str(id)
        {
            r.headers_mut().insert("request-id", v);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_is_503_for_openai_and_529_for_anthropic() {
        let e = GatewayError::overloaded(Duration::from_secs(2));
        assert_eq!(e.status(Dialect::OpenAi).as_u16(), 503);
        assert_eq!(e.status(Dialect::Anthropic).as_u16(), 529);
        let r = e.into_response_for(Dialect::Anthropic, Some("r1"));
        assert_eq!(r.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("2"));
    }

    #[test]
    fn bodies_follow_each_dialect() {
        let e = GatewayError::model_not_found("no model `x`");
        let o = e.body(Dialect::OpenAi, None);
        assert_eq!(o["error"]["type"], "invalid_request_error");
        assert_eq!(o["error"]["code"], "model_not_found");
        let a = e.body(Dialect::Anthropic, Some("req_1"));
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "not_found_error");
        assert_eq!(a["request_id"], "req_1");
        assert!(e.sse_event(Dialect::Anthropic).starts_with("event: error\ndata: {"));
    }
}
