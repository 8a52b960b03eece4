//! A request body's fields ([`Fields`]), taken one by one with the type and range checks
//! every endpoint shares; what is left at the end is unknown. A leaf of `request`.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A request body's fields, consumed as they are read; what is left is unknown.
pub struct Fields(Map<String, Value>);

/// How a JSON value is named in an error message.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Fields {
    /// The members of a JSON object body, nulls removed.
    pub fn parse(body: &[u8]) -> Result<Fields, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON: {e}")))?;
        match value {
            Value::Object(map) => Ok(Fields(map.into_iter().filter(|(_, v)| !v.is_null()).collect())),
            other => {
                Err(ApiError::bad_request(format!("The request body must be a JSON object, got {}.", kind_of(&other))))
            }
        }
    }

    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key)
    }

    pub fn f32_in(&mut self, key: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if (lo as f64..=hi as f64).contains(&x) => Ok(Some(x as f32)),
                _ => Err(ApiError::invalid(key, format!("'{key}' must be a number in [{lo}, {hi}], got {v}."))),
            },
        }
    }

    pub fn int_in(&mut self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
                _ => Err(ApiError::invalid(key, format!("'{key}' must be an integer in [{lo}, {hi}], got {v}."))),
            },
        }
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(ApiError::invalid(key, format!("'{key}' must be a boolean, got {}.", kind_of(&v)))),
        }
    }

    pub fn string(&mut self, key: &str) -> Result<Option<String>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::invalid(key, format!("'{key}' must be a string, got {}.", kind_of(&v)))),
        }
    }

    /// Unknown fields: a 400 naming the first, or (allowed) their names to log.
    pub fn finish(self, allow_extra: bool) -> Result<Vec<String>, ApiError> {
        let mut rest: Vec<String> = self.0.into_iter().map(|(k, _)| k).collect();
        rest.sort();
        match rest.first() {
            Some(first) if !allow_extra => Err(ApiError::invalid(
                first,
                format!("Unrecognized request argument supplied: {first} (start the server with --allow-extra-request-fields to drop unknown fields with a warning)."),
            )),
            _ => Ok(rest),
        }
    }
}
