//! What the gateway knows of gRPC over HTTP/2 (the protocol's own rules, no Pingora, no
//! config): which requests are gRPC, the status codes and their names, the HTTP status of an
//! answer made here mapped to a gRPC status, `grpc-timeout` and `grpc-message`.

use http::{HeaderMap, HeaderValue};
use percent_encoding::{AsciiSet, CONTROLS};
use std::time::Duration;

/// The status codes' names, by number (0 to 16).
pub const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

pub const OK: u8 = 0;
pub const CANCELLED: u8 = 1;
pub const INVALID_ARGUMENT: u8 = 3;
pub const DEADLINE_EXCEEDED: u8 = 4;
pub const PERMISSION_DENIED: u8 = 7;
pub const RESOURCE_EXHAUSTED: u8 = 8;
pub const UNIMPLEMENTED: u8 = 12;
pub const INTERNAL: u8 = 13;
pub const UNAVAILABLE: u8 = 14;
pub const UNAUTHENTICATED: u8 = 16;
pub const UNKNOWN: u8 = 2;

pub const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
pub const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");
pub const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
pub const RETRY_PUSHBACK: http::HeaderName =
    http::HeaderName::from_static("grpc-retry-pushback-ms");
pub const CONTENT_TYPE: &str = "application/grpc";

/// A status by its name (`UNAVAILABLE`, any case) or number (`14`).
pub fn code_of(name: &str) -> Option<u8> {
    if let Ok(n) = name.parse::<u8>() {
        return (usize::from(n) < NAMES.len()).then_some(n);
    }
    NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .and_then(|i| u8::try_from(i).ok())
}

/// A path pattern that names gRPC methods: its first segment a service, `package.Service`
/// (dotted, its last part capitalized, no glob in it): `/helloworld.Greeter/*`.
pub fn names_service(pattern: &str) -> bool {
    let first = pattern
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    let service = first.rsplit('.').next().unwrap_or("");
    first.contains('.')
        && !first.contains(['*', '?', '{', '['])
        && service.starts_with(|c: char| c.is_ascii_uppercase())
}

/// A gRPC request: its content type is `application/grpc`, alone or with a suffix
/// (`application/grpc+proto`, `application/grpc-web`).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| starts_with_grpc(v.as_bytes()))
}

fn starts_with_grpc(v: &[u8]) -> bool {
    const T: &[u8] = CONTENT_TYPE.as_bytes();
    v.len() >= T.len()
        && v[..T.len()].eq_ignore_ascii_case(T)
        && matches!(v.get(T.len()), None | Some(b'+' | b'-' | b';'))
}

/// The `grpc-status` a message (response headers of a trailers-only answer, or trailers)
/// carries.
pub fn status_in(fields: &HeaderMap) -> Option<u8> {
    let v = fields.get(GRPC_STATUS)?.to_str().ok()?;
    v.trim().parse::<u8>().ok()
}

/// The gRPC status of an answer the gateway makes itself with HTTP status `status`
/// (docs/configuration.md, "gRPC": the table). A refusal by a limit (`by_limit`) is
/// RESOURCE_EXHAUSTED whatever its status (429, or 503 where a rule says so).
pub fn status_for(status: u16, by_limit: bool) -> u8 {
    if by_limit {
        return RESOURCE_EXHAUSTED;
    }
    match status {
        200..=299 => OK,
        400 => INVALID_ARGUMENT,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 | 405 => UNIMPLEMENTED,
        408 | 504 => DEADLINE_EXCEEDED,
        413 | 414 | 429 | 431 => RESOURCE_EXHAUSTED,
        502 | 503 => UNAVAILABLE,
        500 => INTERNAL,
        _ => UNKNOWN,
    }
}

/// What `grpc-message` may carry unencoded: the printable ASCII but `%` (gRPC over HTTP/2).
const MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// `grpc-message`: the text percent-encoded (UTF-8), as the protocol says.
pub fn message(text: &str) -> HeaderValue {
    let encoded = percent_encoding::utf8_percent_encode(text, MESSAGE).to_string();
    HeaderValue::from_str(&encoded).unwrap_or(HeaderValue::from_static(""))
}

/// `grpc-timeout` (`TimeoutValue TimeoutUnit`: up to 8 digits and one of H M S m u n), or
/// `None` when missing or malformed (a malformed timeout is ignored, as servers do).
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(GRPC_TIMEOUT)?.as_bytes();
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `grpc-timeout` for what is left of a deadline: milliseconds (at least 1), or seconds past
/// the 8 digits' room.
pub fn timeout_value(left: Duration) -> HeaderValue {
    let ms = left.as_millis().max(1);
    let mut s = String::with_capacity(10);
    if ms < 100_000_000 {
        s.push_str(itoa::Buffer::new().format(ms));
        s.push('m');
    } else {
        s.push_str(itoa::Buffer::new().format(left.as_secs().min(99_999_999)));
        s.push('S');
    }
    // the String's buffer becomes the value's (one allocation)
    HeaderValue::try_from(s).unwrap_or(HeaderValue::from_static("1m"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(code_of("UNAVAILABLE"), Some(14));
        assert_eq!(code_of("resource_exhausted"), Some(8));
        assert_eq!(code_of("16"), Some(16));
        assert_eq!(code_of("17"), None);
        assert_eq!(code_of("NOPE"), None);
        assert_eq!(NAMES[usize::from(UNAUTHENTICATED)], "UNAUTHENTICATED");
    }

    #[test]
    fn service_paths() {
        assert!(names_service("/helloworld.Greeter/*"));
        assert!(names_service("/grpc.health.v1.Health/Check"));
        assert!(!names_service("/api.v1/**"));
        assert!(!names_service("/static/app.Js"));
        assert!(!names_service("/**"));
        assert!(!names_service("/*.Greeter/*"));
    }

    #[test]
    fn grpc_requests_by_content_type() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_str(ct).unwrap(),
            );
            is_grpc(&h)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("Application/GRPC-web+json"));
        assert!(!with("application/grpcx"));
        assert!(!with("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn timeouts_in_every_unit_and_malformed_ones_ignored() {
        let t = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(GRPC_TIMEOUT, HeaderValue::from_str(v).unwrap());
            timeout(&h)
        };
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("2M"), Some(Duration::from_secs(120)));
        assert_eq!(t("3S"), Some(Duration::from_secs(3)));
        assert_eq!(t("500m"), Some(Duration::from_millis(500)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "10x", "1.5S", "-1S", "10"] {
            assert_eq!(t(bad), None, "{bad}");
        }
        assert_eq!(timeout_value(Duration::from_micros(10)), "1m");
        assert_eq!(timeout_value(Duration::from_millis(1500)), "1500m");
        assert_eq!(timeout_value(Duration::from_secs(200_000)), "200000S");
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(message("rate limit: 10/s"), "rate limit: 10/s");
        assert_eq!(message("100% used\n"), "100%25 used%0A");
        assert_eq!(message("zu groß"), "zu gro%C3%9F");
    }

    #[test]
    fn answers_map_to_statuses() {
        assert_eq!(status_for(503, true), RESOURCE_EXHAUSTED);
        assert_eq!(status_for(429, false), RESOURCE_EXHAUSTED);
        assert_eq!(status_for(503, false), UNAVAILABLE);
        assert_eq!(status_for(504, false), DEADLINE_EXCEEDED);
        assert_eq!(status_for(404, false), UNIMPLEMENTED);
        assert_eq!(status_for(401, false), UNAUTHENTICATED);
        assert_eq!(status_for(403, false), PERMISSION_DENIED);
        assert_eq!(status_for(400, false), INVALID_ARGUMENT);
        assert_eq!(status_for(418, false), UNKNOWN);
        assert_eq!(status_for(405, false), UNIMPLEMENTED);
        assert_eq!(status_for(408, false), DEADLINE_EXCEEDED);
        for s in [413, 414, 431] {
            assert_eq!(status_for(s, false), RESOURCE_EXHAUSTED);
        }
        assert_eq!(status_for(500, false), INTERNAL);
        assert_eq!(status_for(204, false), OK);
    }
}
