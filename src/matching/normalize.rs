//! Path normalization (contract section 3): query dropped, duplicate slashes merged, `.` and
//! `..` resolved, percent-encoded unreserved characters decoded, a trailing slash ignored.
//! Other escapes keep their meaning (`%2F` stays an escaped slash) with upper-case hex, so
//! `%2f` and `%2F` are one spelling.

use std::borrow::Cow;

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The value of one hex digit (either case).
pub fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// True when `path` is already in normal form, so the common case allocates nothing: one pass
/// over the bytes (a `split` over `char`s cost about 600 instructions for a 40-byte path).
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    if b == b"/" {
        return true;
    }
    if b.first() != Some(&b'/') || b[b.len() - 1] == b'/' || b.contains(&b'%') {
        return false;
    }
    // no empty, "." or ".." segment; `prev` is the index of the '/' before the segment
    let mut prev = 0;
    for i in 1..b.len() {
        if b[i] == b'/' {
            if dot_or_empty(&b[prev + 1..i]) {
                return false;
            }
            prev = i;
        }
    }
    !dot_or_empty(&b[prev + 1..])
}

fn dot_or_empty(seg: &[u8]) -> bool {
    match seg.len() {
        0 => true,
        1 => seg[0] == b'.',
        2 => seg[0] == b'.' && seg[1] == b'.',
        _ => false,
    }
}

/// Decode escapes of unreserved characters; upper-case the hex of the others.
fn decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex_value(b[i + 1]), hex_value(b[i + 2])) {
                let v = h * 16 + l;
                if is_unreserved(v) {
                    out.push(v as char);
                } else {
                    out.push('%');
                    out.push(b[i + 1].to_ascii_uppercase() as char);
                    out.push(b[i + 2].to_ascii_uppercase() as char);
                }
                i += 3;
                continue;
            }
        }
        // `path` is ASCII in practice (http::Uri), but stay correct for any UTF-8.
        let ch_len = path[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&path[i..i + ch_len]);
        i += ch_len;
    }
    out
}

/// Normalize a request path (query and fragment, if present, are dropped).
pub fn normalize_path(raw: &str) -> Cow<'_, str> {
    // word-at-a-time searches: a request's path (`http::Uri::path`) has neither in practice
    let bytes = raw.as_bytes();
    let path = if bytes.contains(&b'?') || bytes.contains(&b'#') {
        let i = bytes.iter().position(|&c| c == b'?' || c == b'#');
        &raw[..i.unwrap_or(raw.len())]
    } else {
        raw
    };
    if is_normal(path) {
        return Cow::Borrowed(path);
    }
    Cow::Owned(rebuild(path))
}

/// The normal form of a path, built in full.
fn rebuild(path: &str) -> String {
    // until nothing changes: a decoded escape can complete a new one ("%%30a" -> "%0a" ->
    // "%0A"), and the normal form must be its own normal form (each pass that changes
    // anything shortens the path or upper-cases an escape, so this ends)
    let mut decoded = decode_unreserved(path);
    loop {
        let again = decode_unreserved(&decoded);
        if again == decoded {
            break;
        }
        decoded = again;
    }
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len() + 1);
    if segments.is_empty() {
        out.push('/');
    }
    for s in segments {
        out.push('/');
        out.push_str(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples() {
        let cases = [
            ("/", "/"),
            ("", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b"),
            ("//a///b", "/a/b"),
            ("/a/./b", "/a/b"),
            ("/a/../b", "/b"),
            ("/../../a", "/a"),
            ("/a/b/..", "/a"),
            ("/a?x=1", "/a"),
            ("/%61%62c", "/abc"),
            ("/a/%2e%2e/b", "/b"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb", "/a%2Fb"),
            ("/a%zz", "/a%zz"),
            ("/%%30a", "/%0A"),
            ("/%%32%46", "/%2F"),
            ("/a%", "/a%"),
            ("/a%4", "/a%4"),
            ("/%7Euser", "/~user"),
            ("a/b", "/a/b"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_path(input), want, "input {input:?}");
        }
    }

    #[test]
    fn normal_paths_are_borrowed() {
        assert!(matches!(
            normalize_path("/v1/x/product/7"),
            Cow::Borrowed(_)
        ));
        assert!(matches!(normalize_path("/"), Cow::Borrowed(_)));
        assert!(matches!(normalize_path("/a/"), Cow::Owned(_)));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// One segment made of unreserved characters and escapes of reserved ones.
    fn segment() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("a"),
                Just("Z"),
                Just("9"),
                Just("-"),
                Just("_"),
                Just("~"),
                Just("%2F"),
                Just("%3A")
            ],
            1..4,
        )
        .prop_map(|parts| parts.concat())
        .prop_filter("not a dot segment", |s| s != "." && s != "..")
    }

    /// A spelling of the path `segs` that a client might send instead.
    fn respell(segs: &[String], noise: &[u8]) -> String {
        let mut out = String::new();
        for (i, s) in segs.iter().enumerate() {
            let n = noise.get(i).copied().unwrap_or(0);
            out.push('/');
            if n & 1 != 0 {
                out.push('/'); // duplicate slash
            }
            if n & 2 != 0 {
                out.push_str("./");
            }
            if n & 4 != 0 {
                out.push_str("junk/../");
            }
            if n & 8 != 0 {
                // percent-encode the unreserved characters, lower-case hex
                for ch in s.chars() {
                    if ch.is_ascii_alphanumeric() || "-_~".contains(ch) {
                        out.push_str(&format!("%{:02x}", ch as u8));
                    } else {
                        out.push(ch);
                    }
                }
                continue;
            }
            out.push_str(&s.replace("%2F", "%2f"));
        }
        if noise.last().is_some_and(|n| n & 16 != 0) {
            out.push('/');
        }
        out
    }

    proptest! {
        #[test]
        fn every_spelling_normalizes_to_the_canonical_path(
            segs in proptest::collection::vec(segment(), 0..6),
            noise in proptest::collection::vec(any::<u8>(), 0..7),
        ) {
            let canonical = if segs.is_empty() { "/".to_string() } else { format!("/{}", segs.join("/")) };
            prop_assert_eq!(normalize_path(&canonical), canonical.as_str());
            let spelled = respell(&segs, &noise);
            prop_assert_eq!(normalize_path(&spelled), canonical.as_str(), "spelled {}", spelled);
        }

        #[test]
        fn the_quick_check_agrees_with_the_full_rebuild(raw in "[a/.%2F]{0,12}") {
            if is_normal(&raw) {
                prop_assert_eq!(rebuild(&raw), raw);
            }
        }

        #[test]
        fn normalization_is_idempotent_and_clean(raw in "[a-z/.%0-9A-F?]{0,40}") {
            let once = normalize_path(&raw).into_owned();
            prop_assert_eq!(normalize_path(&once), once.as_str());
            prop_assert!(once.starts_with('/'));
            prop_assert!(!once.contains("//"));
            prop_assert!(!once.split('/').any(|s| s == "." || s == ".."));
            prop_assert!(once == "/" || !once.ends_with('/'));
        }
    }
}
