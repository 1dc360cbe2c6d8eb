//! The usage export's fleet-wide read (`GET /api/usage` with Redis): the partitions of one rule
//! that have a count in the previous or the current window of one tier, each with both counts
//! (contract section 6: a count key's value is what the fleet admitted in its window), a page at
//! a time. Keys are found with `SCAN` (server by server in a cluster) and read with `GET`s;
//! nothing is written.
//!
//! A page goes through two passes, the previous window's keys (or, once they are gone, its
//! archive: `fleet_sync::archive`) and then the current window's: a
//! partition is given in the first pass only while it has no current count yet, and in the
//! second always. So every partition counted in either window is given at least once, and
//! twice only when its current window began to count during the export (the later row is the
//! newer) or when Redis resized its key table meanwhile (`SCAN` may then repeat a key).

use super::backend::{RoundError, SyncBackend};
use super::keys::redis_key;

/// The field of a window's usage archive (`fleet_sync::archive`) whose first write elects the
/// instance that copies the window: not a partition (no partition begins with `=` but a
/// digest's `=b2=`).
pub const LOCK_FIELD: &str = "=lock";

/// The two windows of the tier: `(start ms, end ms)` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub previous: (u64, u64),
    pub current: (u64, u64),
}

/// One partition's counts, its name as its keys spell it (percent-encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub partition: String,
    pub previous: u64,
    pub current: u64,
}

/// Where a page begins: the pass (0: the previous window's keys, 1: the current's), the server
/// and its `SCAN` cursor. Written `<pass>-<server>-<cursor>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub pass: u8,
    pub server: usize,
    pub scan: u64,
}

impl Cursor {
    pub fn parse(text: &str) -> Option<Cursor> {
        let mut it = text.splitn(3, '-');
        let pass = it.next()?.parse().ok().filter(|p| *p <= 1)?;
        let server = it.next()?.parse().ok()?;
        let scan = it.next()?.parse().ok()?;
        Some(Cursor { pass, server, scan })
    }

    pub fn text(&self) -> String {
        format!("{}-{}-{}", self.pass, self.server, self.scan)
    }
}

/// Escape what `SCAN MATCH` would read as a pattern (`*`, `?`, `[`, `]`, `\`).
fn glob_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The pattern of one window's count keys of a rule: `<prefix>:{*}:<rule>:<start>:<end>`.
pub fn pattern(prefix: &str, rule_id: &str, (start, end): (u64, u64)) -> String {
    let mut out = String::with_capacity(prefix.len() + rule_id.len() + 40);
    glob_escape(prefix, &mut out);
    out.push_str(":{*}:");
    glob_escape(rule_id, &mut out);
    out.push_str(&format!(":{start}:{end}"));
    out
}

/// The partition of a count key of `rule_id`'s window `(start, end)`, if `key` is one (a
/// pattern's `*` may match more than a partition: the key is read back whole).
pub fn partition_of<'k>(
    key: &'k str,
    prefix: &str,
    rule_id: &str,
    (start, end): (u64, u64),
) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (partition, tail) = rest.split_once("}:")?;
    let tail = tail.strip_prefix(rule_id)?.strip_prefix(':')?;
    let (s, e) = tail.split_once(':')?;
    let ok = !partition.contains(['{', '}', ':'])
        && s.parse::<u64>().ok() == Some(start)
        && e.parse::<u64>().ok() == Some(end);
    ok.then_some(partition)
}

/// How many `SCAN` steps one page may take at most (a page then ends early, with a cursor).
const MAX_STEPS: usize = 2000;

/// One page of at least `limit` rows (fewer only when it is the last, or ran out of steps),
/// from `from`, and where the next begins (none: the export is done).
///
/// `archive`: the previous window's archive (`fleet_sync::archive`), once its keys are gone: the
/// first pass then reads the archive's fields (`HSCAN`) instead of the previous window's keys.
pub async fn page(
    backend: &dyn SyncBackend,
    (prefix, rule_id): (&str, &str),
    (windows, archive): (Windows, Option<&str>),
    from: Cursor,
    limit: usize,
) -> Result<(Vec<Row>, Option<Cursor>), RoundError> {
    let servers = backend.servers().await?;
    let count = (limit as u64).clamp(100, 10_000);
    let mut at = from;
    let mut rows = Vec::new();
    let mut steps = 0;
    while at.pass <= 1 && rows.len() < limit && steps < MAX_STEPS {
        if let (0, Some(archive)) = (at.pass, archive) {
            steps += 1;
            at = archived(
                backend,
                (prefix, rule_id),
                (windows, archive),
                at,
                count,
                &mut rows,
            )
            .await?;
            continue;
        }
        if at.server >= servers {
            at = Cursor {
                pass: at.pass + 1,
                ..Cursor::default()
            };
            continue;
        }
        let window = if at.pass == 0 {
            windows.previous
        } else {
            windows.current
        };
        let found = backend
            .scan(at.server, at.scan, &pattern(prefix, rule_id, window), count)
            .await?;
        steps += 1;
        let mut parts: Vec<&str> = found
            .keys
            .iter()
            .filter_map(|k| partition_of(k, prefix, rule_id, window))
            .collect();
        parts.sort_unstable();
        parts.dedup();
        read(
            backend,
            at,
            (prefix, rule_id),
            (windows, archive),
            &parts,
            &mut rows,
        )
        .await?;
        at = match found.cursor {
            0 => Cursor {
                server: at.server + 1,
                scan: 0,
                ..at
            },
            c => Cursor { scan: c, ..at },
        };
    }
    let next = (at.pass <= 1).then_some(at);
    Ok((rows, next))
}

/// A step of the first pass through the previous window's archive: the partitions it holds
/// that have no current count yet (the second pass finds the others), and where to go on.
async fn archived(
    backend: &dyn SyncBackend,
    (prefix, rule_id): (&str, &str),
    (windows, archive): (Windows, &str),
    at: Cursor,
    count: u64,
    rows: &mut Vec<Row>,
) -> Result<Cursor, RoundError> {
    let (next, fields) = backend.hscan(archive, at.scan, count).await?;
    let fields: Vec<(String, u64)> = fields
        .into_iter()
        .filter(|(f, _)| f != LOCK_FIELD)
        .collect();
    let (cs, ce) = windows.current;
    let keys: Vec<String> = fields
        .iter()
        .map(|(p, _)| redis_key(prefix, p, rule_id, cs, ce))
        .collect();
    let current = backend.counts_by_key(&keys).await?;
    for ((partition, previous), current) in fields.into_iter().zip(current) {
        if current.is_none() {
            rows.push(Row {
                partition,
                previous,
                current: 0,
            });
        }
    }
    Ok(match next {
        0 => Cursor {
            pass: 1,
            ..Cursor::default()
        },
        c => Cursor { scan: c, ..at },
    })
}

/// Read both windows' counts of `parts` (found on `at.server` in pass `at.pass`) into `rows`:
/// the previous window's from its keys, or from its archive once they are gone.
async fn read(
    backend: &dyn SyncBackend,
    at: Cursor,
    (prefix, rule_id): (&str, &str),
    (windows, archive): (Windows, Option<&str>),
    parts: &[&str],
    rows: &mut Vec<Row>,
) -> Result<(), RoundError> {
    let mut keys = Vec::with_capacity(parts.len() * 2);
    for p in parts {
        let (ps, pe) = windows.previous;
        let (cs, ce) = windows.current;
        keys.push(redis_key(prefix, p, rule_id, ps, pe));
        keys.push(redis_key(prefix, p, rule_id, cs, ce));
    }
    // (a partition's keys share its hash tag, so its slot and its server)
    let mut values = backend.counts(at.server, &keys).await?;
    if let Some(archive) = archive {
        let kept = backend.hash_counts(archive, parts).await?;
        for (v, k) in values.chunks_mut(2).zip(kept) {
            v[0] = k;
        }
    }
    for (p, v) in parts.iter().zip(values.chunks(2)) {
        let (previous, current) = (v.first().copied().flatten(), v.get(1).copied().flatten());
        // the first pass gives only what the second will not find
        if at.pass == 0 && current.is_some() {
            continue;
        }
        if previous.is_none() && current.is_none() {
            continue;
        }
        rows.push(Row {
            partition: (*p).to_string(),
            previous: previous.unwrap_or(0),
            current: current.unwrap_or(0),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_what_they_write() {
        let c = Cursor {
            pass: 1,
            server: 2,
            scan: 12345,
        };
        assert_eq!(Cursor::parse(&c.text()), Some(c));
        for bad in ["", "2-0-0", "1-0", "a-0-0", "1--1-0", "1-0-x"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_pattern_escapes_the_prefix_and_keys_are_read_back_whole() {
        assert_eq!(pattern("tg", "api", (1000, 2000)), "tg:{*}:api:1000:2000");
        assert_eq!(pattern("a*b[1]", "api", (1, 2)), "a\\*b\\[1\\]:{*}:api:1:2");
        let w = (1000, 2000);
        assert_eq!(
            partition_of("tg:{acme}:api:1000:2000", "tg", "api", w),
            Some("acme")
        );
        assert_eq!(
            partition_of("tg:{a%7Bb}:api:1000:2000", "tg", "api", w),
            Some("a%7Bb")
        );
        // another window, another rule, a ledger, or a pattern's `*` spanning more than a
        // partition
        for other in [
            "tg:{acme}:api:2000:3000",
            "tg:{acme}:api2:1000:2000",
            "tg:{acme}:api:1000:2000:fleet",
            "tg:{x}:y:{acme}:api:1000:2000",
            "tgx:{acme}:api:1000:2000",
        ] {
            assert_eq!(partition_of(other, "tg", "api", w), None, "{other}");
        }
    }
}
