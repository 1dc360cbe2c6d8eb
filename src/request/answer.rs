//! An answer made by the gateway itself (a refusal, a denial, a shadowban's reply), as data:
//! status, headers and body. The admission decides it; the Pingora adapter writes it, in one
//! place (`proxy::write_answer`).

use crate::problem;
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
}
