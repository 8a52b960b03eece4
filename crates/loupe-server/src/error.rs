//! The OpenAI error body, `{"error": {"message", "type", "param", "code"}}`, used by every
//! 4xx and 5xx answer. Internal failures are logged on the server and answered with a
//! generic message: a client never sees paths, tensor names or stack traces.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

/// An error answer: status, the OpenAI body's fields, and extra fields for the body.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `rate_limit_error`, `server_error`, `unavailable_error`, `timeout_error`.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Extra members of the `error` object (`num_tokens`, `max_length`).
    pub extra: Map<String, Value>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            extra: Map::new(),
            retry_after: None,
        }
    }

    /// 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key".into()),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "Incorrect or missing API key: send 'Authorization: Bearer <key>' with the key given to --api-key.",
            )
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found".into()),
            ..ApiError::not_found(format!("The model `{model}` does not exist; this server serves `{served}`."))
        }
    }

    pub fn queue_full(limit: usize) -> ApiError {
        ApiError {
            retry_after: Some(1),
            code: Some("queue_full".into()),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("The server is at its limit of {limit} requests in flight (running and queued); retry later."),
            )
        }
    }

    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body exceeds the limit of {limit} bytes (--max-body-bytes)."),
        )
    }

    pub fn loading() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "Loading model")
        }
    }

    pub fn shutting_down() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "The server is shutting down.")
    }

    pub fn timeout(seconds: f64) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            format!("The request did not finish within the server's timeout of {seconds} s (--request-timeout)."),
        )
    }

    /// 500 whose detail stays in the server's log.
    pub fn internal() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "The server failed to complete this request; its log has the details.",
        )
    }

    /// The prompt does not leave room for one generated token.
    pub fn prompt_too_long(num_tokens: usize, max_length: usize, param: &str) -> ApiError {
        let mut e = ApiError::invalid(
            param,
            format!("Prompt is too long: {num_tokens} tokens exceeds the configured maximum context length of {max_length} tokens. Please shorten your prompt."),
        );
        e.code = Some("context_length_exceeded".into());
        e.extra.insert("num_tokens".into(), json!(num_tokens));
        e.extra.insert("max_length".into(), json!(max_length));
        e
    }

    /// The `{"error": {...}}` body.
    pub fn body(&self) -> Value {
        let mut error = Map::new();
        error.insert("message".into(), json!(self.message));
        error.insert("type".into(), json!(self.kind));
        error.insert("param".into(), json!(self.param));
        error.insert("code".into(), json!(self.code));
        for (k, v) in &self.extra {
            error.insert(k.clone(), v.clone());
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            response.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_too_long_body_carries_counts_and_the_documented_message() {
        let body = ApiError::prompt_too_long(9000, 8192, "messages").body();
        assert_eq!(body["error"]["num_tokens"], 9000);
        assert_eq!(body["error"]["max_length"], 8192);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(
            body["error"]["message"],
            "Prompt is too long: 9000 tokens exceeds the configured maximum context length of 8192 tokens. Please shorten your prompt."
        );
    }
}
