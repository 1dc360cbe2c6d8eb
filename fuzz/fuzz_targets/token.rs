//! The bearer token parser: any header value is absent, valid or refused with a reason, never a
//! panic (the header read, base64url, strict JSON, the key look-up, jsonwebtoken's checks).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tollgate::tokens::{example_source, JwtSource};

fuzz_target!(|data: &[u8]| {
    static SOURCE: OnceLock<JwtSource> = OnceLock::new();
    let source = SOURCE.get_or_init(example_source);
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value);
    let _ = source.check(&headers, 1_800_000_000_000);
});
