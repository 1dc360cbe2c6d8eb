//! The request's id, `x-request-id`: kept from a trusted proxy (`server.trusted_proxies`) when
//! it sends a well-formed one, else made here (32 hex digits, unique per process and random
//! across processes). The upstream gets it, the client gets it back on every answer, the
//! access log and the request's trace span carry it.

use ahash::RandomState;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The most bytes of a kept id.
const MOST: usize = 128;

/// The id of a request from `peer` with `headers`, marked sensitive: HTTP/2 sends a value
/// unique to one request without indexing it (RFC 7541 6.2.3), so it does not push the
/// answers' constant headers out of the connection's HPACK table.
pub fn of(headers: &HeaderMap, peer: IpAddr, trusted_proxies: &[IpNet]) -> HeaderValue {
    let mut id = kept(headers, peer, trusted_proxies).unwrap_or_else(made);
    id.set_sensitive(true);
    id
}

fn kept(headers: &HeaderMap, peer: IpAddr, trusted_proxies: &[IpNet]) -> Option<HeaderValue> {
    if !super::client_addr::trusted(peer, trusted_proxies) {
        return None;
    }
    headers
        .get(X_REQUEST_ID)
        .filter(|v| well_formed(v.as_bytes()))
        .cloned()
}

/// 1 to 128 letters, digits and `-_.:/+=` (a UUID, a ULID, base64): nothing a log line or a
/// header could be forged with.
fn well_formed(id: &[u8]) -> bool {
    (1..=MOST).contains(&id.len())
        && id
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.:/+=".contains(&b))
}

/// A new id: two keyed hashes of a counter, the key drawn at random once per process.
fn made() -> HeaderValue {
    static KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut id = [0u8; 32];
    for (half, out) in id.chunks_exact_mut(16).enumerate() {
        let h = KEY.hash_one((n, half));
        for (i, o) in out.iter_mut().enumerate() {
            *o = b"0123456789abcdef"[((h >> (60 - 4 * i)) & 0xf) as usize];
        }
    }
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_kept_only_from_a_trusted_proxy_and_only_when_well_formed() {
        let proxy: IpNet = "10.0.0.0/8".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static("abc-123"));
        let from = |ip: &str, h: &HeaderMap| of(h, ip.parse().unwrap(), &[proxy]);
        assert_eq!(from("10.1.2.3", &h), "abc-123");
        let new = from("192.0.2.1", &h);
        assert_ne!(new, "abc-123");
        assert_eq!(new.len(), 32);
        assert!(new.as_bytes().iter().all(u8::is_ascii_hexdigit));
        for bad in ["a b", "x\"y", "", &"z".repeat(129)] {
            h.insert(X_REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            assert_eq!(from("10.1.2.3", &h).len(), 32, "{bad:?} is replaced");
        }
        // made ids differ
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| made()).collect();
        assert_eq!(ids.len(), 1000);
    }
}
