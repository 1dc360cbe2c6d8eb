//! The Redis identity of a counter (contract section 6): the partition as text, percent-encoded
//! so that `%`, `{`, `}`, `:`, white space and control characters never appear raw (only
//! `A-Z a-z 0-9 - . _ ~` stay as they are). Two different partitions never share a key, and a
//! client cannot pick the Redis Cluster slot: the hash tag `{...}` is the whole encoded
//! partition.

use crate::config::model::PartitionBy;
use std::fmt::Write;
use std::net::IpAddr;

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Percent-encode every byte outside `A-Z a-z 0-9 - . _ ~`.
pub fn encode(raw: &[u8], out: &mut String) {
    for &b in raw {
        if is_unreserved(b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// The partition as it appears in a Redis key, from a store key and the rule's `per`.
pub fn redis_partition(per: &PartitionBy, store_key: &[u8]) -> String {
    let mut out = String::with_capacity(store_key.len() * 3 + 8);
    let (tag, body) = match store_key.split_first() {
        Some((t, b)) => (*t, b),
        None => (0, &[][..]),
    };
    match per {
        PartitionBy::Global => out.push_str("global"),
        PartitionBy::Ip => {
            out.push_str("ip:");
            let ip = match body.len() {
                4 => <[u8; 4]>::try_from(body).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(body).ok().map(IpAddr::from),
                _ => None,
            };
            match ip {
                Some(ip) => encode(ip.to_string().as_bytes(), &mut out),
                None => encode(body, &mut out),
            }
        }
        PartitionBy::Tenant | PartitionBy::Header(_) => {
            if matches!(per, PartitionBy::Header(_)) {
                out.push_str("hdr:");
            }
            if tag == 1 {
                // a digest: '=' never appears in an encoded raw value, so this cannot collide
                out.push_str("=b2=");
                for b in body {
                    let _ = write!(out, "{b:02x}");
                }
            } else {
                encode(body, &mut out);
            }
        }
    }
    out
}

/// `<prefix>:{<partition>}:<rule id>:<window start ms>:<window end ms>` (contract section 6).
pub fn redis_key(
    prefix: &str,
    partition: &str,
    rule_id: &str,
    start_ms: u64,
    end_ms: u64,
) -> String {
    format!("{prefix}:{{{partition}}}:{rule_id}:{start_ms}:{end_ms}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tollgate_limits::partition::{PartitionValue, MAX_RAW};

    fn key_of(v: PartitionValue) -> Vec<u8> {
        v.key_buf().to_vec()
    }

    fn decode(s: &str) -> Vec<u8> {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        out
    }

    #[test]
    fn examples() {
        let t =
            |raw: &[u8]| redis_partition(&PartitionBy::Tenant, &key_of(PartitionValue::Bytes(raw)));
        assert_eq!(t(b"acme"), "acme");
        assert_eq!(t(b"a:b{c}%d e\r\n"), "a%3Ab%7Bc%7D%25d%20e%0D%0A");
        assert_eq!(t(&[0xff, 0x00]), "%FF%00");
        let ip = |s: &str| {
            redis_partition(
                &PartitionBy::Ip,
                &key_of(PartitionValue::Ip(s.parse().unwrap())),
            )
        };
        assert_eq!(ip("10.1.2.3"), "ip:10.1.2.3");
        assert_eq!(ip("2001:db8::1"), "ip:2001%3Adb8%3A%3A1");
        assert_eq!(
            redis_partition(&PartitionBy::Global, &key_of(PartitionValue::Global)),
            "global"
        );
        let long = vec![b'x'; 10_000];
        let p = t(&long);
        assert!(p.starts_with("=b2=") && p.len() == 4 + 64, "{p}");
        assert_eq!(
            redis_key(
                "tollgate",
                "acme",
                "get-product",
                1_627_318_770_000,
                1_627_318_780_000
            ),
            "tollgate:{acme}:get-product:1627318770000:1627318780000"
        );
    }

    proptest! {
        #[test]
        fn encoding_is_injective_and_has_no_raw_specials(a in proptest::collection::vec(any::<u8>(), 0..600),
                                                         b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let pa = redis_partition(&PartitionBy::Tenant, &key_of(PartitionValue::Bytes(&a)));
            let pb = redis_partition(&PartitionBy::Tenant, &key_of(PartitionValue::Bytes(&b)));
            for p in [&pa, &pb] {
                prop_assert!(p.bytes().all(|c| c.is_ascii_graphic()));
                let forbidden = ['{', '}', ':', ' '];
                prop_assert!(!p.contains(forbidden), "raw special in {}", p);
            }
            prop_assert_eq!(a == b, pa == pb);
            prop_assert_eq!(a == b, key_of(PartitionValue::Bytes(&a)) == key_of(PartitionValue::Bytes(&b)));
            if a.len() <= MAX_RAW {
                prop_assert_eq!(decode(&pa), a);
            }
        }
    }
}
