//! An operator's reset or grant of one tier of one partition, fleet-wide
//! (`POST /api/tenants/{id}/reset`, `/grant`): one script call, outside the rounds, on the
//! server holding the partition's keys. It writes what was granted to the current window
//! (`g:` in the window's ledger): every ledger script adds it to the threshold it leases
//! against and answers it, so each instance learns it from its next answer (a counter the count
//! refuses asks again at every periodic round while requests come: `ledger::note_count_full`).
//! The window's count keeps counting what the fleet admitted (contract section 6); a grant is
//! beside it, never subtracted from it.
//!
//! - A grant adds its units to the window's grant (windows and logs; a bucket refills on its
//!   own and takes none).
//! - A reset grants what the window has counted (so its count weighs nothing), and, for a
//!   sliding window or log, all the previous window counted (its weight fades to nothing at
//!   once). A bucket is full again: its time in Redis goes back to 0, and its grant grows by
//!   its size so that each instance empties its own bucket's time as much.
//!
//! Requests refused before a grant were never counted (a count is only of what was admitted),
//! so none of them is charged to it. Counts an instance admitted before a reset and reports
//! after it (at most a round's) count after it.

use super::backend::RoundError;
use super::backend::SyncBackend;
use super::keys::{redis_key, redis_partition};
use super::KEY_GRACE_MS;
use crate::config::model::{Algorithm, PartitionBy, RedisSettings};
use std::sync::LazyLock;
use tollgate_limits::algorithm::{interval_ns, Quota};

/// What an operator does to a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Reset,
    Grant(u64),
}

/// The window of one tier of one partition of a rule.
pub struct Target<'a> {
    pub rule_id: &'a str,
    pub algorithm: Algorithm,
    pub per: &'a PartitionBy,
    /// The partition's key in the store (`PartitionValue::key_buf`).
    pub store_key: &'a [u8],
    pub quota: &'a Quota,
}

/// The adjustment: keys `count`, `ledger` (this window's), `prev_count`, `prev_ledger` (the
/// previous window's; this window's again unless sliding), `bucket` (a bucket's time, µs);
/// arguments `op` (`reset` or `grant`), `units` (a reset: the threshold), the ledgers'
/// expiries, whether it is a bucket (its time per token, µs; 0: not one), its period and now.
/// Answers the window's grant after it.
const ADJUST: &str = r#"
local op, units = ARGV[1], tonumber(ARGV[2])
local expire_at_ms, prev_expire_at_ms = ARGV[3], ARGV[4]
local bucket_us, period_ms, now_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function grant_of(key)
  local f = redis.call('HGETALL', key)
  for i = 1, #f, 2 do
    if f[i] == 'g:' then return tonumber(f[i + 1]) end
  end
  return 0
end
local grant = grant_of(KEYS[2])
if bucket_us > 0 then
  -- a bucket's reset: full (its time 0); `units`, its size, tells the instances so
  redis.call('SET', KEYS[5], '0')
  redis.call('PEXPIREAT', KEYS[5], now_ms + period_ms + 10000)
  grant = grant + units
elseif op == 'reset' then
  -- what the window counted weighs nothing (what was granted and not used stays: the count
  -- used the grant past the threshold, `units`); a sliding window's previous one neither
  local total = tonumber(redis.call('GET', KEYS[1]) or '0')
  grant = total + grant - math.min(grant, math.max(total - units, 0))
  if KEYS[4] ~= KEYS[2] then
    local counted = tonumber(redis.call('GET', KEYS[3]) or '0')
    if counted > grant_of(KEYS[4]) then
      redis.call('HSET', KEYS[4], 'g:', counted)
      redis.call('PEXPIREAT', KEYS[4], prev_expire_at_ms)
    end
  end
else
  grant = grant + units
end
redis.call('HSET', KEYS[2], 'g:', grant)
redis.call('PEXPIREAT', KEYS[2], expire_at_ms)
return grant
"#;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ADJUST));

/// The mark every heartbeat reads (`backend::adjusted_key`): a new value makes each instance
/// carry, in its next round, the counters its count refuses, so that they hear of the
/// adjustment within a round. Kept as long as the heartbeats need to see it.
const MARK: &str = r#"
redis.call('HSET', KEYS[1], 'v', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

static MARK_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(MARK));

/// Mark an adjustment for the fleet's heartbeats (after the windows' own calls): `mark`, a
/// value no other adjustment had (the time in ns).
pub async fn mark(
    settings: &RedisSettings,
    backend: &dyn SyncBackend,
    mark: u64,
) -> Result<(), RoundError> {
    let key = super::backend::adjusted_key(&super::heartbeat_key(settings));
    // every instance's heartbeat comes within a sync interval (three, with room to spare)
    let keep_ms = (3 * settings.sync_interval.as_millis() as u64).max(3000) + KEY_GRACE_MS;
    let mut call = MARK_SCRIPT.prepare_invoke();
    call.key(&key).arg(mark).arg(keep_ms);
    let deadline = backend.deadline(settings.timeout) * 2;
    tokio::time::timeout(deadline, backend.invoke(&call))
        .await
        .map_err(|_| RoundError::from(format!("no answer within {deadline:?}")))??;
    Ok(())
}

/// The adjustment scripts' sources (the access check reads what they call).
pub fn sources() -> [&'static str; 2] {
    [ADJUST, MARK]
}

/// Reset or grant the window of `now_ms` of `t`, fleet-wide. Answers the window's grant after
/// it (units; a bucket's: tokens given back in the window), as the instance applies it.
pub async fn fleet(
    settings: &RedisSettings,
    backend: &dyn SyncBackend,
    t: &Target<'_>,
    op: Op,
    now_ms: u64,
) -> Result<u64, RoundError> {
    let partition = redis_partition(t.per, t.store_key);
    let (start, end) = t.quota.window_of(now_ms);
    let p = end.saturating_sub(start).max(1);
    let key = |s: u64, e: u64| redis_key(&settings.key_prefix, &partition, t.rule_id, s, e);
    let count = key(start, end);
    let ledger = format!("{count}:fleet");
    let sliding = t.algorithm.is_sliding();
    // (the previous window as the rounds name it: `previous_keys`)
    let (prev_count, prev_ledger) = if sliding {
        let prev = key(start.saturating_sub(p), start);
        let prev_ledger = format!("{prev}:fleet");
        (prev, prev_ledger)
    } else {
        (count.clone(), ledger.clone())
    };
    let bucket = format!(
        "{}:{{{partition}}}:{}:bucket",
        settings.key_prefix, t.rule_id
    );
    let keep = if sliding { p } else { 0 };
    let bucket_ns = if t.algorithm.is_bucket() {
        u64::try_from(interval_ns(t.quota)).unwrap_or(u64::MAX)
    } else {
        0
    };
    let (verb, units) = match op {
        Op::Reset => ("reset", t.quota.threshold),
        Op::Grant(n) => ("grant", n),
    };
    let mut call = SCRIPT.prepare_invoke();
    call.key(&count)
        .key(&ledger)
        .key(&prev_count)
        .key(&prev_ledger)
        .key(&bucket)
        .arg(verb)
        .arg(units)
        .arg(end + keep + KEY_GRACE_MS)
        .arg(start + keep + KEY_GRACE_MS)
        .arg(super::backend::script::bucket_arg(bucket_ns))
        .arg(p)
        .arg(now_ms);
    let deadline = backend.deadline(settings.timeout) * 2;
    let reply = tokio::time::timeout(deadline, backend.invoke(&call))
        .await
        .map_err(|_| RoundError::from(format!("no answer within {deadline:?}")))??;
    match reply {
        redis::Value::Int(g) => Ok(g.max(0) as u64),
        other => Err(format!("unexpected answer {other:?}").into()),
    }
}
