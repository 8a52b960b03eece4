//! One blocking HTTP/1.1 request per connection over `std::net::TcpStream`: what a test or a
//! bisect rung needs to talk to `loupe serve` without an async runtime. The response body is
//! read to the end (`Connection: close`) and de-chunked; malformed framing is an error,
//! never a panic.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// Why a request got no usable response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{method} {path} on {addr}: {source}")]
    Io { method: String, path: String, addr: String, source: std::io::Error },
    #[error("{method} {path}: malformed response: {why}")]
    Malformed { method: String, path: String, why: String },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Status { method: String, path: String, status: u16, body: String },
    #[error("{method} {path}: the body is not JSON ({source}): {body}")]
    Json { method: String, path: String, body: String, source: serde_json::Error },
}

/// A response: the status code and the whole body (de-chunked, lossily UTF-8).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    /// The payloads of the body's SSE `data: ` lines, `[DONE]` included, in order.
    pub fn sse_data(&self) -> impl Iterator<Item = &str> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: "))
    }
}

/// Requests to one server address (`127.0.0.1:8000`, no scheme).
#[derive(Debug, Clone)]
pub struct HttpClient {
    addr: String,
    timeout: Duration,
    api_key: Option<String>,
}

impl HttpClient {
    /// A client of `addr` whose reads time out after 600 s (a long greedy generation).
    pub fn new(addr: impl Into<String>) -> HttpClient {
        HttpClient { addr: addr.into(), timeout: Duration::from_secs(600), api_key: None }
    }

    /// Reads time out after `timeout` instead.
    pub fn with_timeout(mut self, timeout: Duration) -> HttpClient {
        self.timeout = timeout;
        self
    }

    /// Sends `Authorization: Bearer KEY` with every request.
    pub fn with_api_key(mut self, key: impl Into<String>) -> HttpClient {
        self.api_key = Some(key.into());
        self
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// One request on a fresh connection with an optional JSON body; any status is returned.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Response, HttpError> {
        let io = |source| HttpError::Io { method: method.into(), path: path.into(), addr: self.addr.clone(), source };
        let mut stream = TcpStream::connect(&self.addr).map_err(io)?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        let payload = body.map(Value::to_string).unwrap_or_default();
        let auth = self.api_key.as_ref().map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{payload}",
            self.addr,
            payload.len()
        )
        .map_err(io)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).map_err(io)?;
        parse_response(&raw).map_err(|why| HttpError::Malformed { method: method.into(), path: path.into(), why })
    }

    /// A request that must answer 200; its body.
    pub fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Result<String, HttpError> {
        let r = self.request(method, path, body)?;
        if r.status != 200 {
            return Err(HttpError::Status { method: method.into(), path: path.into(), status: r.status, body: r.body });
        }
        Ok(r.body)
    }

    /// A request whose body must be JSON (any status); the status and the value.
    pub fn json(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), HttpError> {
        let r = self.request(method, path, body)?;
        let value = serde_json::from_str(&r.body).map_err(|source| HttpError::Json {
            method: method.into(),
            path: path.into(),
            body: r.body.clone(),
            source,
        })?;
        Ok((r.status, value))
    }
}

/// Splits a raw HTTP/1.1 response into its status and de-chunked body.
fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status_line = head.lines().next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body)? } else { body.to_string() };
    Ok(Response { status, body })
}

/// The data of a chunked body, up to its last (zero-size) chunk.
fn dechunk(mut rest: &str) -> Result<String, String> {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        // A chunk size may carry extensions after ';'.
        let size = size.split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16).map_err(|_| format!("bad chunk size {size:?}"))?;
        if n == 0 {
            return Ok(out);
        }
        let data = tail.get(..n).ok_or_else(|| format!("chunk of {n} bytes with {} left", tail.len()))?;
        out.push_str(data);
        rest = tail[n..].strip_prefix("\r\n").unwrap_or(&tail[n..]);
    }
    Err("the chunked body ends without its last chunk".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_bodies() {
        let r = parse_response(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "{}"));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hello!"));
        assert_eq!(r.sse_data().count(), 0);
    }

    #[test]
    fn malformed_responses_are_errors_not_panics() {
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        let truncated = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nff\r\nshort";
        assert!(parse_response(truncated).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n").is_err());
    }

    #[test]
    fn sse_lines() {
        let r = Response { status: 200, body: "data: {\"a\":1}\n\ndata: [DONE]\n\n".into() };
        assert_eq!(r.sse_data().collect::<Vec<_>>(), vec!["{\"a\":1}", "[DONE]"]);
    }
}
