//! Partition values (a tenant, a header's bytes) into store keys and Redis key parts:
//! different values give different keys, and a Redis key part holds no raw special byte.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tollgate::config::model::PartitionBy;
use tollgate::limits::partition::{PartitionValue, KEY_BUF};
use tollgate::services::fleet_sync::keys::redis_partition;

fuzz_target!(|data: (&[u8], &[u8])| {
    let (a, b) = data;
    let (mut ka, mut kb) = ([0u8; KEY_BUF], [0u8; KEY_BUF]);
    let na = PartitionValue::Bytes(a).store_key(&mut ka);
    let nb = PartitionValue::Bytes(b).store_key(&mut kb);
    if a != b {
        assert_ne!(&ka[..na], &kb[..nb]);
    }
    let part = redis_partition(&PartitionBy::Tenant, &ka[..na]);
    assert!(!part.bytes().any(|c| matches!(c, b'{' | b'}' | b':' | b' ' | b'\n' | b'*')));
});
