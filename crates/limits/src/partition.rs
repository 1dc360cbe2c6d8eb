//! Partitions: what a counter counts for (a tenant, a client address, everything, or a header
//! value), and the key it is counted under.
//!
//! The store key (bytes, no allocation for the lookup): `0x00` + the raw bytes, or for values
//! longer than `MAX_RAW` bytes `0x01` + their BLAKE2b-256 digest, so a hostile 10 KB tenant id
//! costs 33 bytes of memory and can never be confused with a short one. Its Redis form is the
//! fleet sync's (`services::fleet_sync::keys`).

use blake2::{Blake2b, Digest};
use std::net::IpAddr;

/// What a rule counts for (`per`): each tenant, each client address, everything, or each
/// value of a header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PartitionBy {
    Tenant,
    Ip,
    Global,
    Header(http::HeaderName),
}

/// Values longer than this are stored and sent to Redis as their digest.
pub const MAX_RAW: usize = 512;
/// Longest store key: tag byte + MAX_RAW bytes.
pub const KEY_BUF: usize = MAX_RAW + 1;

type Blake2b256 = Blake2b<blake2::digest::consts::U32>;

/// The raw partition value of one request for one rule, borrowed from the request.
#[derive(Debug, Clone, Copy)]
pub enum PartitionValue<'a> {
    Bytes(&'a [u8]),
    Ip(IpAddr),
    Global,
}

impl PartitionValue<'_> {
    /// Append the store key to `out` (an arena of keys, or a buffer of its own), by slices
    /// (a byte at a time through `Extend` cost a few hundred instructions a request).
    pub fn store_key<A: smallvec::Array<Item = u8>>(&self, out: &mut smallvec::SmallVec<A>) {
        let v4;
        let v6;
        let raw: &[u8] = match self {
            PartitionValue::Bytes(b) => b,
            PartitionValue::Ip(IpAddr::V4(ip)) => {
                v4 = ip.octets();
                &v4
            }
            PartitionValue::Ip(IpAddr::V6(ip)) => {
                v6 = ip.octets();
                &v6
            }
            PartitionValue::Global => b"",
        };
        if raw.len() <= MAX_RAW {
            out.push(0);
            out.extend_from_slice(raw);
        } else {
            out.push(1);
            out.extend_from_slice(&Blake2b256::digest(raw));
        }
    }

    /// The store key in a buffer of its own (no allocation).
    pub fn key_buf(&self) -> KeyBuf {
        let mut buf = KeyBuf::new();
        self.store_key(&mut buf);
        buf
    }
}

/// A store key on the stack (the longest fits).
pub type KeyBuf = smallvec::SmallVec<[u8; KEY_BUF]>;
