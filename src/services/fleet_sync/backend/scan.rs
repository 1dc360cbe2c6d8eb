//! Reading counts outside the rounds, for the usage export (`fleet_sync::usage`): a page of
//! `SCAN` on one server and the values of count keys (`GET`s in one pipeline). Both read only;
//! neither changes a key or its TTL.

use super::round::{RoundError, ScanPage};

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
