//! The usage archive: what each partition used in a long fixed or calendar window (an hour or
//! more: days, weeks, months), kept through the next window for the usage export
//! (`GET /api/usage`, `fleet_sync::usage`). A window's count keys live until 10 s after its end
//! (contract section 6); shortly after the end, once the last reports are in, one instance
//! copies them into one hash per rule and window, `<key_prefix>:usage:{<rule id>}:<start
//! ms>:<end ms>` (field: the partition as its keys spell it; value: its count), whose TTL is the
//! next window's end plus 10 s: the time it is needed. The first `HSET` of the field `=lock`
//! (no partition begins with `=` but a digest's `=b2=`) elects the instance that copies; the
//! others leave it. The copy reads with `SCAN` and `GET` and writes with a script of `HSET` and
//! `PEXPIREAT`, commands the gateway's ACL user has (`SCAN` besides, as the export needs).

use super::backend::{self, RoundError, SyncBackend};
pub use super::usage::LOCK_FIELD;
use super::usage::{partition_of, pattern};
use super::KEY_GRACE_MS;
use crate::config::model::{Algorithm, PartitionBy};
use crate::metrics::Metrics;
use crate::snapshot::{SharedSnapshot, Snapshot};
use crate::ticker::Ticker;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Windows this long or longer are archived.
pub const ARCHIVE_FROM_MS: u64 = 3_600_000;

/// The archive of `rule_id`'s window `(start, end)`.
pub fn archive_key(prefix: &str, rule_id: &str, (start, end): (u64, u64)) -> String {
    format!("{prefix}:usage:{{{rule_id}}}:{start}:{end}")
}

/// The most field, value pairs one call of the script writes.
const WRITE_AT_ONCE: usize = 500;

/// `KEYS[1]`: the archive; `ARGV[1]`: when it expires (Unix ms); then field, value pairs.
/// Answers how many fields were new.
const WRITE: &str = r#"
local n = redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return n
"#;

static WRITE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(WRITE));

/// The archive script's source (the access check reads what it calls).
pub fn source() -> &'static str {
    WRITE
}

async fn write(
    backend: &dyn SyncBackend,
    key: &str,
    expire_at_ms: u64,
    pairs: &[(&str, u64)],
) -> Result<u64, RoundError> {
    let mut call = WRITE_SCRIPT.prepare_invoke();
    call.key(key).arg(expire_at_ms);
    for (field, value) in pairs {
        call.arg(*field).arg(*value);
    }
    match backend.invoke(&call).await? {
        redis::Value::Int(n) => Ok(n.max(0) as u64),
        other => Err(format!("unexpected answer {other:?}").into()),
    }
}

/// How long after a window's end its counts are taken as final: the reports of its last
/// requests come within a round or two.
pub fn settle_ms(sync_interval_ms: u64) -> u64 {
    (2 * sync_interval_ms + 1000).min(KEY_GRACE_MS / 2)
}

/// Copy the counts of `rule_id`'s window `ended` into its archive, to live until `keep_until_ms`,
/// unless another instance does (`None`); answers how many partitions were copied.
pub async fn copy(
    backend: &dyn SyncBackend,
    (prefix, rule_id): (&str, &str),
    ended: (u64, u64),
    keep_until_ms: u64,
) -> Result<Option<usize>, RoundError> {
    let key = archive_key(prefix, rule_id, ended);
    if write(backend, &key, keep_until_ms, &[(LOCK_FIELD, 0)]).await? == 0 {
        return Ok(None);
    }
    let servers = backend.servers().await?;
    let pattern = pattern(prefix, rule_id, ended);
    let mut copied = 0;
    for server in 0..servers {
        let mut cursor = 0;
        loop {
            let page = backend.scan(server, cursor, &pattern, 1000).await?;
            let keys: Vec<String> = page
                .keys
                .into_iter()
                .filter(|k| partition_of(k, prefix, rule_id, ended).is_some())
                .collect();
            let values = backend.counts(server, &keys).await?;
            let pairs: Vec<(&str, u64)> = keys
                .iter()
                .zip(values)
                .filter_map(|(k, v)| Some((partition_of(k, prefix, rule_id, ended)?, v?)))
                .collect();
            // (a script's arguments are unpacked onto Lua's stack: a few hundred at a time)
            for chunk in pairs.chunks(WRITE_AT_ONCE) {
                write(backend, &key, keep_until_ms, chunk).await?;
            }
            copied += pairs.len();
            cursor = page.cursor;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(Some(copied))
}

/// The shortest window archived: `ARCHIVE_FROM_MS`, or what `TOLLGATE_USAGE_ARCHIVE_FROM_MS`
/// says (at least 1 s; the tests archive windows of seconds).
pub fn from_ms(env: Option<&str>) -> u64 {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(ARCHIVE_FROM_MS, |ms| ms.max(1000))
}

/// The windows to archive now: for each per-tenant fixed-window rule, each ended window of a
/// tier of `from_ms` or longer whose counts have settled and whose keys still live; with when
/// its archive may go (the next window's end plus the grace).
pub fn due(
    snap: &Snapshot,
    from_ms: u64,
    settle_ms: u64,
    now_ms: u64,
) -> Vec<(String, (u64, u64), u64)> {
    let mut out = Vec::new();
    for (cr, limit) in snap.limiter.rules.iter().zip(&snap.limiter.core.limits) {
        if cr.rule.per != PartitionBy::Tenant
            || limit.counters.algorithm() != Algorithm::FixedWindow
        {
            continue;
        }
        let lists = limit.counters.tiers();
        let mut seen: Vec<(u64, u64)> = Vec::new();
        for q in lists.iter().flatten().filter(|q| q.period_ms >= from_ms) {
            let current = q.window_of(now_ms);
            let ended = q.window_of(current.0.saturating_sub(1));
            let open = ended.1 + settle_ms <= now_ms && now_ms + 1000 < ended.1 + KEY_GRACE_MS;
            if open && !seen.contains(&ended) {
                seen.push(ended);
                out.push((cr.rule.id.clone(), ended, current.1 + KEY_GRACE_MS));
            }
        }
    }
    out
}

/// The background service that archives each long window once it has ended.
pub struct Archiver {
    pub shared: SharedSnapshot,
    pub from_ms: u64,
    pub metrics: Arc<Metrics>,
    /// The windows archived (or left to another instance): rule id, end.
    done: parking_lot::Mutex<Vec<(String, u64)>>,
}

impl Archiver {
    pub fn new(shared: SharedSnapshot, from_ms: u64, metrics: Arc<Metrics>) -> Archiver {
        Archiver {
            shared,
            from_ms,
            metrics,
            done: parking_lot::Mutex::new(Vec::new()),
        }
    }

    async fn tick(&self) {
        let snap = self.shared.load();
        let Some(settings) = snap.config.redis.clone() else {
            return;
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let settle = settle_ms(settings.sync_interval.as_millis() as u64);
        self.done
            .lock()
            .retain(|(_, end)| end + KEY_GRACE_MS > now_ms);
        let due: Vec<_> = due(&snap, self.from_ms, settle, now_ms)
            .into_iter()
            .filter(|(id, w, _)| !self.done.lock().iter().any(|(d, e)| d == id && *e == w.1))
            .collect();
        if due.is_empty() {
            return;
        }
        let result = |r: &str| self.metrics.usage_archive.with_label_values(&[r]).inc();
        let backend = match backend::make(&settings) {
            Ok(b) => b,
            Err(e) => {
                result("error");
                return log::warn!("usage archive: {e}");
            }
        };
        for (id, ended, keep_until) in due {
            let prefix = settings.key_prefix.as_str();
            let run = copy(backend.as_ref(), (prefix, &id), ended, keep_until);
            match tokio::time::timeout(Duration::from_millis(KEY_GRACE_MS), run).await {
                Ok(Ok(copied)) => {
                    if let Some(n) = copied {
                        log::info!(
                            "usage archive: rule {id}: {n} partitions of the window {}..{} kept",
                            ended.0,
                            ended.1
                        );
                    }
                    result(if copied.is_some() {
                        "copied"
                    } else {
                        "elsewhere"
                    });
                    self.done.lock().push((id, ended.1));
                }
                Ok(Err(e)) => {
                    result("error");
                    log::warn!("usage archive: rule {id}: {e}")
                }
                Err(_) => {
                    result("error");
                    log::warn!("usage archive: rule {id}: not done within {KEY_GRACE_MS} ms")
                }
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Archiver {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = Ticker::every(Duration::from_secs(1));
        while ticker.tick(&mut shutdown).await {
            self.tick().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_in_the_rules_slot_and_settles_within_the_grace() {
        assert_eq!(archive_key("tg", "api", (1, 2)), "tg:usage:{api}:1:2");
        assert_eq!(settle_ms(1000), 3000);
        assert_eq!(settle_ms(60_000), KEY_GRACE_MS / 2);
        assert_eq!(from_ms(None), ARCHIVE_FROM_MS);
        assert_eq!(from_ms(Some("2000")), 2000);
        assert_eq!(from_ms(Some("5")), 1000);
        assert_eq!(from_ms(Some("x")), ARCHIVE_FROM_MS);
    }
}
