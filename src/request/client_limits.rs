//! What a client may send, checked before routing (contract section 9):
//! - `server.client_header_timeout`: an HTTP/1 request header must be complete this long after
//!   the gateway starts waiting for it (at accept, or after the previous answer on a kept-alive
//!   connection), or the connection is closed without an answer, as nginx does. A slow client
//!   (slowloris) thus holds a connection for at most that long, not for pingora's 60 s per read
//!   (`request::edge` and `request::header_deadline`).
//! - `server.max_request_header_bytes`: larger request headers get 431.
//! - `server.max_body_bytes`: a larger `Content-Length` gets 413 before anything is proxied;
//!   a body that grows past the limit while streaming ends the request with 413.

use crate::config::model::ServerSettings;
use http::request::Parts;

pub const BODY_TOO_LARGE: &str = "the request body is larger than this gateway accepts";

/// The answer to a request whose framing is ambiguous, or whose header or declared body is
/// over the limits, if it is.
pub fn refuse(
    req: &Parts,
    raw_path: &[u8],
    server: &ServerSettings,
) -> Option<(u16, &'static str)> {
    if let Some(detail) = malformed(req) {
        return Some((400, detail));
    }
    if header_bytes(req, raw_path) > server.max_request_header_bytes {
        return Some((
            431,
            "the request header is larger than this gateway accepts",
        ));
    }
    let max = server.max_body_bytes?;
    content_length(req)
        .is_some_and(|n| n > max)
        .then_some((413, BODY_TOO_LARGE))
}

/// What RFC 9112 says a server must answer 400, and Pingora's parser lets through: an
/// HTTP/1.1 request without `Host` (section 3.2), more than one `Host`, a `Content-Length`
/// that is repeated or a list, even of equal values (section 6.3: a recipient may take a list
/// of equal values as one, but a proxy that forwards it as it came hands the next hop the
/// ambiguity; nginx refuses both). HTTP/2 requests carry `:authority` instead of `Host`.
/// (`Transfer-Encoding` Pingora checks itself: it drops a `Content-Length` beside it and closes
/// the connection after the answer, as section 6.1 asks, and refuses a last coding that is not
/// `chunked`.)
pub fn malformed(req: &Parts) -> Option<&'static str> {
    let hosts = req.headers.get_all(http::header::HOST).iter().count();
    if hosts == 0 && req.version == http::Version::HTTP_11 {
        return Some("an HTTP/1.1 request must have a Host header");
    }
    if hosts > 1 {
        return Some("a request must have one Host header, not several");
    }
    let mut lengths = req.headers.get_all(http::header::CONTENT_LENGTH).iter();
    if let Some(first) = lengths.next() {
        if lengths.next().is_some() {
            return Some("a request must have at most one Content-Length header");
        }
        let digits = first.as_bytes().trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Some("Content-Length must be one decimal number");
        }
    }
    None
}

/// The size of a request header as sent: the request line and every field line.
pub fn header_bytes(req: &Parts, raw_path: &[u8]) -> usize {
    let line = req.method.as_str().len() + raw_path.len() + 14;
    req.headers
        .iter()
        .fold(line, |n, (k, v)| n + k.as_str().len() + v.len() + 4)
}

/// The declared body size, when the request says it.
pub fn content_length(req: &Parts) -> Option<u64> {
    req.headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::http::RequestHeader;

    #[test]
    fn header_size_counts_every_line() {
        let mut req = RequestHeader::build("GET", b"/v1/x", None).unwrap();
        let bare = header_bytes(&req, req.raw_path());
        assert_eq!(bare, "GET /v1/x HTTP/1.1\r\n".len() + 2);
        req.insert_header("x-org-id", "acme").unwrap();
        assert_eq!(
            header_bytes(&req, req.raw_path()),
            bare + "x-org-id: acme\r\n".len()
        );
        req.insert_header("content-length", " 42 ").unwrap();
        assert_eq!(content_length(&req), Some(42));
    }

    #[test]
    fn ambiguous_framing_is_malformed() {
        let build = |version, headers: &[(&str, &str)]| {
            let mut req = RequestHeader::build("POST", b"/a", None).unwrap();
            req.set_version(version);
            for (k, v) in headers {
                req.append_header(k.to_string(), *v).unwrap();
            }
            malformed(&req)
        };
        use http::Version;
        assert_eq!(build(Version::HTTP_11, &[("host", "x")]), None);
        assert_eq!(build(Version::HTTP_10, &[]), None, "HTTP/1.0 needs no Host");
        assert_eq!(build(Version::HTTP_2, &[]), None, ":authority instead");
        assert!(build(Version::HTTP_11, &[]).is_some());
        assert!(build(Version::HTTP_11, &[("host", "x"), ("host", "x")]).is_some());
        let cl = |v: &str| build(Version::HTTP_11, &[("host", "x"), ("content-length", v)]);
        assert_eq!(cl("5"), None);
        assert_eq!(cl(" 5 "), None);
        for bad in ["5, 5", "5,5", "-1", "+5", "0x5", "", "5 5"] {
            assert!(cl(bad).is_some(), "{bad:?}");
        }
        assert!(build(
            Version::HTTP_11,
            &[
                ("host", "x"),
                ("content-length", "5"),
                ("content-length", "5")
            ]
        )
        .is_some());
    }
}
