//! Error answers to clients as `application/problem+json` (RFC 9457). Bodies say what went
//! wrong in the client's terms only: never a Redis key or error, a stack trace, an internal
//! address, or another tenant's data.

use bytes::Bytes;

pub const CONTENT_TYPE: &str = "application/problem+json";

/// Build a problem body: `type`, `title`, `status`, `detail`, then the `extra` members, each
/// value serialized by serde_json (so any text is escaped).
pub fn body(
    status: u16,
    title: &str,
    detail: &str,
    type_uri: &str,
    extra: &[(&str, serde_json::Value)],
) -> Bytes {
    let mut s = String::with_capacity(160 + detail.len());
    let mut member = |key: &str, value: &serde_json::Value| {
        s.push(if s.is_empty() { '{' } else { ',' });
        s.push_str(&serde_json::Value::from(key).to_string());
        s.push(':');
        s.push_str(&value.to_string());
    };
    member("type", &type_uri.into());
    member("title", &title.into());
    member("status", &status.into());
    member("detail", &detail.into());
    for (k, v) in extra {
        member(k, v);
    }
    s.push('}');
    Bytes::from(s)
}

/// A plain problem body (`type: about:blank`), its title the status's standard reason phrase.
pub fn plain(status: u16, detail: &str) -> Bytes {
    let title = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    body(status, title, detail, "about:blank", &[])
}

/// The `detail` of a problem body (`None` when the body is not one).
pub fn detail(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Detail {
        detail: String,
    }
    serde_json::from_slice::<Detail>(body)
        .ok()
        .map(|d| d.detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_valid_json_with_escaping() {
        let b = body(
            404,
            "Not Found",
            "no route for \"/x\"",
            "about:blank",
            &[
                ("retry_after", 1.into()),
                ("odd \"key\"", "a\nline </script>".into()),
            ],
        );
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["status"], 404);
        assert_eq!(v["detail"], "no route for \"/x\"");
        assert_eq!(v["retry_after"], 1);
        assert_eq!(v["odd \"key\""], "a\nline </script>");
        assert_eq!(detail(&b).as_deref(), Some("no route for \"/x\""));
        assert_eq!(detail(b"hello"), None);
    }
}
