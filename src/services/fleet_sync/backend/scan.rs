//! Reading counts outside the rounds, for the usage export (`fleet_sync::usage`) and its archive
//! of long windows (`fleet_sync::archive`): a page of `SCAN` on one server, the values of count
//! keys (`GET`s in one pipeline), a page of a hash's fields (`HSCAN`) and some of their values
//! (`HMGET`). All read only; none changes a key or its TTL.

use super::round::{HashPage, RoundError, ScanPage};

/// `SCAN cursor MATCH pattern COUNT count` on this connection's server.
pub async fn scan_on<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    cursor: u64,
    pattern: &str,
    count: u64,
) -> Result<ScanPage, RoundError> {
    let (cursor, keys): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(ScanPage { keys, cursor })
}

/// The integer values of `keys` (none: no such key, or not an integer), in one pipeline.
pub async fn counts_on<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    keys: &[String],
) -> Result<Vec<Option<u64>>, RoundError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut p = redis::pipe();
    for k in keys {
        p.cmd("GET").arg(k);
    }
    let values: Vec<Option<String>> = p.query_async(conn).await?;
    Ok(values
        .into_iter()
        .map(|v| v.and_then(|s| s.parse().ok()))
        .collect())
}

/// `HSCAN key cursor COUNT count`: the fields found with their integer values (a value that is
/// not one: 0), and where to go on (0: done).
pub async fn hscan_on<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    cursor: u64,
    count: u64,
) -> Result<HashPage, RoundError> {
    let (cursor, pairs): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
        .arg(key)
        .arg(cursor)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    let fields = pairs
        .into_iter()
        .map(|(f, v)| (f, v.parse().unwrap_or(0)))
        .collect();
    Ok((cursor, fields))
}

/// `HMGET key fields...`: their integer values (none: no such field, or no such key).
pub async fn hash_counts_on<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    fields: &[&str],
) -> Result<Vec<Option<u64>>, RoundError> {
    if fields.is_empty() {
        return Ok(Vec::new());
    }
    let values: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(key)
        .arg(fields)
        .query_async(conn)
        .await?;
    Ok(values
        .into_iter()
        .map(|v| v.and_then(|s| s.parse().ok()))
        .collect())
}
