//! Partition values (a tenant, a header's bytes) into store keys and Redis key parts:
//! different values give different keys, and a Redis key part holds no raw special byte.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tollgate::config::model::PartitionBy;
use tollgate::limits::partition::PartitionValue;
use tollgate::services::fleet_sync::keys::redis_partition;

fuzz_target!(|data: (&[u8], &[u8])| {
    let (a, b) = data;
    let (ka, kb) = (PartitionValue::Bytes(a).key_buf(), PartitionValue::Bytes(b).key_buf());
    if a != b {
        assert_ne!(ka, kb);
    }
    let part = redis_partition(&PartitionBy::Tenant, &ka);
    assert!(!part.bytes().any(|c| matches!(c, b'{' | b'}' | b':' | b' ' | b'\n' | b'*')));
});
