//! Partitions: what a counter counts for (a tenant, a client address, everything, or a header
//! value), and the key it is counted under.
//!
//! The store key (bytes, no allocation for the lookup): `0x00` + the raw bytes, or for values
//! longer than `MAX_RAW` bytes `0x01` + their BLAKE2b-256 digest, so a hostile 10 KB tenant id
//! costs 33 bytes of memory and can never be confused with a short one. Its Redis form is the
//! fleet sync's (`services::fleet_sync::keys`).

use blake2::{Blake2b, Digest};
use std::net::IpAddr;

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
    /// Write the store key into `buf`; returns its length.
    pub fn store_key(&self, buf: &mut [u8; KEY_BUF]) -> usize {
        let mut ip_octets = [0u8; 16];
        let raw: &[u8] = match self {
            PartitionValue::Bytes(b) => b,
            PartitionValue::Ip(IpAddr::V4(v4)) => {
                ip_octets[..4].copy_from_slice(&v4.octets());
                &ip_octets[..4]
            }
            PartitionValue::Ip(IpAddr::V6(v6)) => {
                ip_octets = v6.octets();
                &ip_octets
            }
            PartitionValue::Global => b"",
        };
        if raw.len() <= MAX_RAW {
            buf[0] = 0;
            buf[1..=raw.len()].copy_from_slice(raw);
            raw.len() + 1
        } else {
            buf[0] = 1;
            buf[1..33].copy_from_slice(&Blake2b256::digest(raw));
            33
        }
    }
}
