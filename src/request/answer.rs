//! An answer made by the gateway itself (a refusal, a denial, a shadowban's reply), as data:
//! status, headers and body. The admission decides it; the Pingora adapter writes it, in one
//! place (`proxy::write_answer`).

use crate::{grpc, problem};
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue};

const X_RETRY_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-retry-after");

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Close the connection after it: the request's framing cannot be trusted, so neither can
    /// what follows it on the connection.
    pub close: bool,
    /// A refusal by a limit (a gRPC client is told RESOURCE_EXHAUSTED, whatever the status).
    pub by_limit: bool,
}

impl Answer {
    /// A problem+json answer (`type: about:blank`, the status's reason phrase as title).
    pub fn problem(status: u16, detail: &str) -> Answer {
        Answer::problem_body(status, problem::plain(status, detail))
    }

    /// An answer with a problem+json body made by the caller.
    pub fn problem_body(status: u16, body: Bytes) -> Answer {
        let mut headers = HeaderMap::with_capacity(6);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(problem::CONTENT_TYPE),
        );
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Answer {
            status,
            headers,
            body,
            close: false,
            by_limit: false,
        }
    }

    /// Any body, with its content type (a shadowban's reply).
    pub fn reply(status: u16, content_type: &str, body: Bytes) -> Answer {
        let mut headers = HeaderMap::with_capacity(2);
        if let Ok(v) = HeaderValue::from_str(content_type) {
            headers.insert(CONTENT_TYPE, v);
        }
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        Answer {
            status,
            headers,
            body,
            close: false,
            by_limit: false,
        }
    }

    /// `Retry-After: <secs>`, and the seed's `X-Ratelimit-Retry-After` beside it when the
    /// `x_ratelimit` header family is on.
    pub fn retry_after(mut self, secs: u64, x_ratelimit: bool) -> Answer {
        self.headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        if x_ratelimit {
            self.headers.insert(X_RETRY_AFTER, HeaderValue::from(secs));
        }
        self
    }

    /// A refusal by a limit.
    pub fn by_limit(mut self) -> Answer {
        self.by_limit = true;
        self
    }

    /// The same answer to a gRPC client: trailers-only (HTTP 200, `content-type:
    /// application/grpc`, `grpc-status` by `grpc::status_for`, the problem's detail as
    /// `grpc-message`, no body); every other header stays as metadata (the quota headers,
    /// `retry-after`), and a retry-after gets `grpc-retry-pushback-ms` beside it, which a
    /// client's retry policy obeys. `h1`: the client speaks HTTP/1.1 (a body of 0 bytes is
    /// said).
    pub fn to_grpc(mut self, h1: bool) -> Answer {
        let code = grpc::status_for(self.status, self.by_limit);
        let detail = problem::detail(&self.body);
        let h = &mut self.headers;
        h.remove(CACHE_CONTROL);
        if h1 {
            h.insert(CONTENT_LENGTH, HeaderValue::from(0));
        } else {
            h.remove(CONTENT_LENGTH);
        }
        h.insert(CONTENT_TYPE, HeaderValue::from_static(grpc::CONTENT_TYPE));
        h.insert(grpc::GRPC_STATUS, HeaderValue::from(u16::from(code)));
        if let Some(detail) = detail.as_deref().filter(|d| !d.is_empty()) {
            h.insert(grpc::GRPC_MESSAGE, grpc::message(detail));
        }
        let pushback = h
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(secs) = pushback {
            h.insert(
                grpc::RETRY_PUSHBACK,
                HeaderValue::from(secs.saturating_mul(1000)),
            );
        }
        self.status = 200;
        self.body = Bytes::new();
        self
    }

    /// Close the connection after this answer.
    pub fn closing(mut self) -> Answer {
        self.close = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_says_its_type_length_and_no_store() {
        let a = Answer::problem(404, "no route matches this request").retry_after(3, true);
        assert_eq!(a.headers["content-type"], "application/problem+json");
        assert_eq!(
            a.headers["content-length"],
            a.body.len().to_string().as_str()
        );
        assert_eq!(a.headers["cache-control"], "no-store");
        assert_eq!(a.headers["retry-after"], "3");
        assert_eq!(a.headers["x-ratelimit-retry-after"], "3");
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["title"], "Not Found");
        assert_eq!(v["detail"], "no route matches this request");
        let b = Answer::problem(503, "busy").retry_after(1, false);
        assert!(!b.headers.contains_key("x-ratelimit-retry-after"));
        assert!(!b.close && Answer::problem(400, "x").closing().close);
    }

    #[test]
    fn a_grpc_client_gets_trailers_only_with_the_status_detail_and_pushback() {
        let a = Answer::problem(429, "rate limit 100% used")
            .retry_after(3, true)
            .by_limit()
            .to_grpc(false);
        assert_eq!(a.status, 200);
        assert!(a.body.is_empty());
        assert_eq!(a.headers["content-type"], "application/grpc");
        assert_eq!(a.headers["grpc-status"], "8");
        assert_eq!(a.headers["grpc-message"], "rate limit 100%25 used");
        assert_eq!(a.headers["retry-after"], "3");
        assert_eq!(a.headers["grpc-retry-pushback-ms"], "3000");
        assert!(!a.headers.contains_key("content-length"));
        let b = Answer::problem(503, "busy").by_limit().to_grpc(true);
        assert_eq!(b.headers["grpc-status"], "8");
        assert_eq!(b.headers["content-length"], "0");
        let c = Answer::problem(503, "the upstream is busy").to_grpc(false);
        assert_eq!(c.headers["grpc-status"], "14");
        assert!(!c.headers.contains_key("grpc-retry-pushback-ms"));
        let d = Answer::reply(200, "text/plain", Bytes::from_static(b"ok")).to_grpc(false);
        assert_eq!(d.headers["grpc-status"], "0");
        assert!(!d.headers.contains_key("grpc-message"));
    }
}
