//! Where counts go: one pipelined round trip per round. Each window record is one atomic Lua
//! script, called by its hash (EVALSHA; loaded once per server, again after a NOSCRIPT answer)
//! (`LEDGER_SCRIPT`: report the cumulative count, take a lease, set absolute expiry
//! times every instance computes alike, so no key is ever left without a TTL), or a plain
//! `INCRBY` far from the limit; periodic rounds end with the heartbeat that counts live
//! instances (four plain commands). `ledger_model` is the same script in Rust,
//! for the simulation; a test holds the two to the same answers on a real redis-server.

use crate::config::model::{RedisEndpoint, RedisSettings};
use crate::config::redis_client::{client, tls_crypto};
use crate::limits::ledger::Answer;
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

static LEDGER: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LEDGER_SCRIPT));

/// Load the scripts into a server (rounds call them by hash).
pub async fn load_scripts(conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<()> {
    LEDGER.load_async(conn).await?;
    Ok(())
}

/// The same, on a blocking connection (tests).
pub fn load_scripts_blocking(conn: &mut dyn redis::ConnectionLike) -> redis::RedisResult<()> {
    LEDGER.load(conn)?;
    Ok(())
}

/// Why a round has no answer. `unapplied`: certainly nothing of it reached Redis (the
/// connection was refused), so plain increments are sent again; otherwise (a timeout, a
/// connection lost on the way) they may have been applied and are taken as counted, so that
/// none is ever counted twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundError {
    pub message: String,
    pub unapplied: bool,
}

impl From<String> for RoundError {
    fn from(message: String) -> Self {
        RoundError {
            message,
            unapplied: false,
        }
    }
}

impl From<&str> for RoundError {
    fn from(message: &str) -> Self {
        RoundError::from(message.to_string())
    }
}

impl From<redis::RedisError> for RoundError {
    fn from(e: redis::RedisError) -> Self {
        RoundError {
            unapplied: e.is_connection_refusal(),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for RoundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether a server refused a command because it does not know the script.
fn no_script(values: &[redis::Value]) -> bool {
    values.iter().any(|v| {
        matches!(v, redis::Value::ServerError(e)
            if e.kind() == Some(redis::ServerErrorKind::NoScript))
    })
}

/// Run a round's pipeline (its errors come back in place, as replies); if the server does not
/// know the scripts (first use, a restart, a failover, `SCRIPT FLUSH`), load them and run it
/// once more. A script that was not known ran nothing, so running the pipeline again counts
/// nothing twice.
async fn query_round<C: redis::aio::ConnectionLike>(
    p: &redis::Pipeline,
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::Value>> {
    let values: Vec<redis::Value> = p.query_async(conn).await?;
    if no_script(&values) {
        load_scripts(conn).await?;
        return p.query_async(conn).await;
    }
    Ok(values)
}

/// What one window record of one counter sends in a round: a lease ask (the script), or a
/// plain increment (a direct record far from its limit, see `limits::ledger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    Lease(LedgerUpdate),
    Count(CountUpdate),
}

impl Update {
    /// The contract's key (which cluster slot the update goes to).
    pub fn key(&self) -> &str {
        match self {
            Update::Lease(u) => &u.key,
            Update::Count(c) => &c.key,
        }
    }
}

/// What Redis answered to an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Lease(Answer),
    /// The fleet's total after the increment.
    Count(u64),
}

/// A plain increment of the contract's key: `INCRBY`, and `PEXPIREAT` after it when the
/// increment created the key (its total is the increment: the first report of the window, a
/// restart, an expiry) or when `first` (the record's earlier report is not known to have set
/// the expiry: its round failed). An `INCRBY` and a `PEXPIREAT` for the key's creator only:
/// the others' reports cost one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountUpdate {
    pub key: String,
    pub delta: u64,
    pub first: bool,
    pub expire_at_ms: u64,
}

/// The steps of a plain increment: 1 `INCRBY`, 2 `PEXPIREAT`.
pub fn count_cmd(c: &CountUpdate, stage: u8) -> redis::Cmd {
    match stage {
        1 => {
            let mut cmd = redis::cmd("INCRBY");
            cmd.arg(&c.key).arg(c.delta);
            cmd
        }
        _ => {
            let mut cmd = redis::cmd("PEXPIREAT");
            cmd.arg(&c.key).arg(c.expire_at_ms);
            cmd
        }
    }
}

/// The first step of a plain increment.
pub fn count_start(_: &CountUpdate) -> u8 {
    1
}

/// After a step's reply: `Ok(Ok(total))` done, `Ok(Err((stage, total)))` the next step.
pub type CountStep = Result<Result<u64, (u8, u64)>, String>;

/// What a plain increment's step answered (`total`: what an earlier step found).
pub fn count_reply(c: &CountUpdate, stage: u8, total: u64, v: &redis::Value) -> CountStep {
    match (stage, v) {
        (1, redis::Value::Int(t)) => {
            let t = (*t).max(0) as u64;
            // the increment created the key: it has no expiry yet
            if t == c.delta || c.first {
                Ok(Err((2, t)))
            } else {
                Ok(Ok(t))
            }
        }
        (2, redis::Value::Int(_)) => Ok(Ok(total)),
        (_, redis::Value::ServerError(e)) => Err(format!("{e:?}")),
        _ => Err(format!("unexpected answer {v:?} to a count")),
    }
}

/// A plain increment on a model of the keys (the simulation's Redis).
pub fn count_model(strings: &mut HashMap<String, i64>, c: &CountUpdate) -> u64 {
    let v = strings.entry(c.key.clone()).or_insert(0);
    *v += i64::try_from(c.delta).unwrap_or(i64::MAX);
    (*v).max(0) as u64
}

/// An update on a model of the keys: the script's twin, or a plain increment.
pub fn update_model(
    strings: &mut HashMap<String, i64>,
    hashes: &mut HashMap<String, HashMap<String, i64>>,
    u: &Update,
) -> Reply {
    match u {
        Update::Lease(l) => Reply::Lease(ledger_model(strings, hashes, l)),
        Update::Count(c) => Reply::Count(count_model(strings, c)),
    }
}

/// Run the later steps of plain increments (`pending`: update index, stage, total so far) on
/// one connection, one pipeline a step; fills `answers` where they end.
async fn finish_counts<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    updates: &[Update],
    mut pending: Vec<(usize, u8, u64)>,
    answers: &mut [Option<Reply>],
) -> Result<(), RoundError> {
    while !pending.is_empty() {
        let mut p = redis::pipe();
        for &(i, stage, _) in &pending {
            if let Some(Update::Count(c)) = updates.get(i) {
                p.add_command(count_cmd(c, stage));
            }
        }
        let values: Vec<redis::Value> = p.query_async(conn).await?;
        let mut next = Vec::new();
        for (&(i, stage, total), v) in pending.iter().zip(&values) {
            let Some(Update::Count(c)) = updates.get(i) else {
                continue;
            };
            match count_reply(c, stage, total, v)? {
                Ok(t) => answers[i] = Some(Reply::Count(t)),
                Err(step) => next.push((i, step.0, step.1)),
            }
        }
        pending = next;
    }
    Ok(())
}

/// What one window record of one counter sends in a round (see `LEDGER_SCRIPT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerUpdate {
    /// The contract's key: the fleet's admitted count for the window.
    pub key: String,
    /// `<key>:fleet`, a hash: each member's cumulative count (`u:`), ceiling (`c:`) and lease
    /// end (`e:`).
    pub ledger_key: String,
    /// Sliding windows: the previous window's ledger; token buckets: the bucket
    /// (`<prefix>:{<partition>}:<rule id>:bucket`, the time it is full again, in µs); else
    /// `ledger_key` again.
    pub prev_ledger_key: String,
    /// This instance and the record's incarnation.
    pub member: String,
    pub used: u64,
    pub want: u64,
    /// The threshold.
    pub cap: u64,
    pub now_ms: u64,
    /// Until when the lease holds (the window's end).
    pub lease_until_ms: u64,
    /// Unix ms at which both keys expire.
    pub expire_at_ms: u64,
    /// Sliding windows: how much of the previous window still weighs (ms of `period_ms`) at
    /// the end of the lease's horizon; 0 for fixed windows.
    pub weight_ms: u64,
    pub period_ms: u64,
    /// Token buckets: µs per token (`period / threshold`); 0 for windows.
    pub bucket_us: u64,
    /// Token buckets: the lease carried over from the previous window's record (which gives
    /// it back in the same round, just before): the member's ceiling if it has none yet.
    pub adopt: u64,
    /// Of `want - used`, the requests waiting now: granted first, from all that is free.
    pub need: u64,
    /// The spare budget: what all members together may hold unused beyond their needs.
    pub spare: u64,
    /// Token buckets: of `used`, what Redis confirmed before: what it has charged already if
    /// it has lost its record of the member (a restart), so that it is not charged twice.
    pub confirmed: u64,
    /// Sliding windows: the previous window's contract key (its count, plain increments
    /// included); token buckets: the previous window's ledger (its records' leases); else
    /// `key` again.
    pub prev_key: String,
    /// What direct records can admit in the window in all (`ledger::direct_cap`; 0: none
    /// can): kept out of leases, less what they reported, until the total passes it.
    pub direct_cap: u64,
    /// Token buckets: what this member admitted and Redis has not charged yet was admitted
    /// at or after this instant (ms; 0: now). Charged from then, so that tokens admitted
    /// while Redis was out of reach refill as they would have (see `LEDGER_SCRIPT`).
    pub since_ms: u64,
}

/// This instance's heartbeat.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub key: String,
    pub instance: String,
    pub now_ms: u64,
    /// Instances not heard from for this long are no longer counted.
    pub liveness_ms: u64,
}

/// What a round got back.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// Each update's answer; `None` where its node did not answer (a cluster node down or
    /// slow: the others' answers still count).
    pub answers: Vec<Option<Reply>>,
    /// The live instance count (`None`: the heartbeat's node did not answer).
    pub instances: Option<u64>,
    /// Cluster: how many slots the round went to answered, and how many did not (their keys
    /// wait), and why.
    pub slots_answered: usize,
    pub slots_failed: usize,
    pub slot_error: Option<String>,
    /// Cluster: the slots whose last round did not answer, after this one.
    pub slots_down: usize,
}

impl Exchange {
    /// Every update answered.
    pub fn whole(answers: Vec<Reply>, instances: Option<u64>) -> Exchange {
        Exchange {
            answers: answers.into_iter().map(Some).collect(),
            instances,
            ..Exchange::default()
        }
    }
}

#[async_trait]
pub trait SyncBackend: Send + Sync {
    /// Apply the updates; answer each, and count the live instances (periodic rounds carry
    /// the heartbeat). `Err` when nothing answered. Never called for an empty round.
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError>;

    /// How long a whole round may take (a cluster waits for each node up to the timeout, and
    /// may read the slot map first).
    fn deadline(&self, timeout: Duration) -> Duration {
        timeout
    }
}

/// Report a cumulative count (only its growth reaches the key: re-sending changes nothing),
/// then lease: keep what this member holds up to what it wants, and add from what is free,
/// `cap - total - what the other members hold unused`: first the requests waiting at the
/// member (`need`), then its forecast, out of the spare budget only: what all members hold
/// unused stays within `spare`, and while other members hold live leases, no member holds
/// more than its fair part of it, in proportion to what each asked for beyond its count
/// (`d:`), which is answered too so that a member holding more asks for less next time. A
/// member that wants nothing more gives its lease back at once. Sliding windows: the cap is lowered by the previous window's
/// weight at the lease's horizon, counting that window's leases as used (its count may not
/// all have arrived); the member enforces the cap of each moment itself, from `prev` and
/// `held` (answered).
///
/// Token buckets: the cap is the tokens in a bucket kept in Redis (`prev_ledger_key`: the time
/// at which it is full again of what the members admitted, in µs, which may lie in the past),
/// less what the members hold leased and unused, in this window's ledger and in the previous
/// window's (`prev_key`: its records hold their leases until they move here). Tokens are
/// charged as the members report them admitted. Those a member admitted beyond what was
/// charged (out of a lease, on credit, or while Redis was out of reach; after a restart of Redis,
/// all but what it had confirmed) are charged from `since` (ARGV[16]), the earliest they can have
/// been admitted, not from now: the refill since then covers them as it would have, had they
/// been reported one by one, and since leases are not in the bucket's time, each member's go
/// in behind the others' admitted tokens, not behind their leases. That errs towards
/// admitting, by at most those tokens.
///
/// Direct records (far from the limit) report plain increments of the key and hold no lease;
/// while the (weighted) count is under `direct_cap`, what they may still report (the cap less
/// what they reported: the total less the members' counts) is kept out of leases.
///
/// Answer: `{total, ceiling, fair, room, held, prev}`.
pub const LEDGER_SCRIPT: &str = r#"
local me = ARGV[1]
local used, want, cap, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local w, p = tonumber(ARGV[8]), tonumber(ARGV[9])
local function fields(key)
  local u, c, e, d, t = {}, {}, {}, {}, {}
  local f = redis.call('HGETALL', key)
  for i = 1, #f, 2 do
    local kind, id, v = string.sub(f[i], 1, 1), string.sub(f[i], 3), tonumber(f[i + 1])
    if kind == 'u' then u[id] = v elseif kind == 'c' then c[id] = v
    elseif kind == 'e' then e[id] = v elseif kind == 'd' then d[id] = v
    elseif kind == 't' then t[id] = v end
  end
  return u, c, e, d, t
end
local u, c, e, d, t = fields(KEYS[2])
local adopt, adopted = tonumber(ARGV[11]), false
if adopt > 0 and not c[me] then c[me] = adopt; e[me] = tonumber(ARGV[6]); adopted = true end
local mine = u[me] or 0
if used > mine then
  redis.call('INCRBY', KEYS[1], used - mine)
  redis.call('HSET', KEYS[2], 'u:' .. me, used)
  mine = used
end
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev, prevw = 0, 0
if w > 0 then
  local pu, pc = fields(KEYS[3])
  prev = tonumber(redis.call('GET', KEYS[4]) or '0')
  for id, v in pairs(pc) do prev = prev + math.max(v - (pu[id] or 0), 0) end
  prevw = math.ceil(prev * w / p)
  cap = cap - prevw
end
-- what direct records may still report: kept out of leases while the (weighted) count is
-- under the cap of what they can admit
local dcap, reserve = tonumber(ARGV[15]), 0
if dcap > 0 and total + prevw < dcap then
  local scripted = 0
  for id, v in pairs(u) do if id ~= me then scripted = scripted + v end end
  reserve = math.max(dcap - (total - scripted - mine), 0)
end
local held, active, wanted = 0, 0, 0
for id, ceiling in pairs(c) do
  if id ~= me and (e[id] or 0) > now then
    active = active + 1
    local out = ceiling - (u[id] or 0)
    if out > 0 then held = held + out end
    wanted = wanted + (d[id] or 0)
  end
end
local keep = mine
if c[me] and (e[me] or 0) > now then keep = math.max(mine, math.min(want, c[me])) end
local desire = math.max(want - mine, 0)
local function fair_part(avail)
  if active == 0 then return avail end
  return math.max(1, math.ceil(avail * math.max(desire, 1) / (math.max(desire, 1) + wanted)))
end
local need, spare = tonumber(ARGV[12]), tonumber(ARGV[13])
local avail, free
local tb = tonumber(ARGV[10])
local tat, nowus = 0, now * 1000
if tb > 0 then
  -- a token bucket: the time it is full again of what the members admitted (in µs; it may
  -- lie in the past), less the tokens they hold leased and unused
  local charge = mine - (t[me] or tonumber(ARGV[14]))
  -- admitted tokens count from when they can first have come: behind the others' tokens
  -- admitted before, not behind leases (tokens of a lease count as admitted when used)
  local from, since = nowus, tonumber(ARGV[16])
  if since > 0 then from = math.min(since * 1000, nowus) end
  tat = tonumber(redis.call('GET', KEYS[3]) or '0')
  -- leases the previous window's records hold until they move to this one (`KEYS[4]`)
  local pu, pc, pe = fields(KEYS[4])
  for id, ceiling in pairs(pc) do
    if (pe[id] or 0) > now then held = held + math.max(ceiling - (pu[id] or 0), 0) end
  end
  if charge > 0 then tat = math.max(tat, from) + charge * tb end
  avail = math.floor((nowus + p * 1000 - math.max(tat, nowus)) / tb) - held
else
  avail = cap - total - held - reserve
end
free = avail - (keep - mine)
local fair = fair_part(math.min(avail, spare))
local n = math.max(math.min(mine + need - keep, free), 0)
local f = math.min(want - keep - n, free - n, fair - (keep - mine), spare - held - (keep - mine))
local extra = n + math.max(f, 0)
local ceiling = keep + extra
local until_ms = ARGV[6]
if want <= mine then until_ms = now end
redis.call('HSET', KEYS[2], 'c:' .. me, ceiling, 'e:' .. me, until_ms, 'd:' .. me, desire)
local left = avail - (ceiling - mine)
if tb > 0 then
  redis.call('HSET', KEYS[2], 't:' .. me, mine)
  redis.call('SET', KEYS[3], string.format('%.0f', tat))
  redis.call('PEXPIREAT', KEYS[3], string.format('%.0f', math.ceil(math.max(tat, nowus) / 1000) + p + 10000))
end
redis.call('PEXPIREAT', KEYS[1], ARGV[7])
redis.call('PEXPIREAT', KEYS[2], ARGV[7])
return {total, ceiling, math.max(fair, 0), math.max(left, 0), held, prev}
"#;

/// `LEDGER_SCRIPT` in Rust, on a model of the keys (`strings`: the counters, `hashes`: the
/// ledgers). Expiry is not modelled.
pub fn ledger_model(
    strings: &mut HashMap<String, i64>,
    hashes: &mut HashMap<String, HashMap<String, i64>>,
    up: &LedgerUpdate,
) -> Answer {
    let as_i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let (used, want, now) = (as_i(up.used), as_i(up.want), as_i(up.now_ms));
    let get =
        |h: &HashMap<String, i64>, kind: &str, id: &str| h.get(&format!("{kind}:{id}")).copied();
    let (mut prev, mut prevw) = (0, 0);
    let mut cap = as_i(up.cap);
    if up.weight_ms > 0 {
        prev = strings.get(&up.prev_key).copied().unwrap_or(0);
        if let Some(ph) = hashes.get(&up.prev_ledger_key) {
            for (name, &c) in ph {
                if let Some(id) = name.strip_prefix("c:") {
                    prev += (c - get(ph, "u", id).unwrap_or(0)).max(0);
                }
            }
        }
        let p = as_i(up.period_ms).max(1);
        prevw = (prev * as_i(up.weight_ms) + p - 1).div_euclid(p);
        cap -= prevw;
    }
    // token buckets: leases the previous window's records hold until they move here
    let mut prev_leased = 0;
    if let Some(ph) = hashes.get(&up.prev_key).filter(|_| up.bucket_us > 0) {
        for (name, &c) in ph {
            if let Some(id) = name.strip_prefix("c:") {
                if get(ph, "e", id).unwrap_or(0) > now {
                    prev_leased += (c - get(ph, "u", id).unwrap_or(0)).max(0);
                }
            }
        }
    }
    let h = hashes.entry(up.ledger_key.clone()).or_default();
    let adopted = up.adopt > 0 && !h.contains_key(&format!("c:{}", up.member));
    if adopted {
        h.insert(format!("c:{}", up.member), as_i(up.adopt));
        h.insert(format!("e:{}", up.member), as_i(up.lease_until_ms));
    }
    let mut mine = get(h, "u", &up.member).unwrap_or(0);
    if used > mine {
        *strings.entry(up.key.clone()).or_insert(0) += used - mine;
        h.insert(format!("u:{}", up.member), used);
        mine = used;
    }
    let total = strings.get(&up.key).copied().unwrap_or(0);
    let dcap = as_i(up.direct_cap);
    let reserve = if dcap > 0 && total + prevw < dcap {
        let scripted: i64 = h
            .iter()
            .filter(|(name, _)| name.starts_with("u:"))
            .map(|(_, &v)| v)
            .sum();
        (dcap - (total - scripted)).max(0)
    } else {
        0
    };
    let (mut held, mut active, mut wanted) = (0, 0, 0);
    for (name, &ceiling) in h.iter() {
        let Some(id) = name.strip_prefix("c:") else {
            continue;
        };
        if id != up.member && get(h, "e", id).unwrap_or(0) > now {
            active += 1;
            held += (ceiling - get(h, "u", id).unwrap_or(0)).max(0);
            wanted += get(h, "d", id).unwrap_or(0);
        }
    }
    let mut keep = mine;
    if let Some(c) = get(h, "c", &up.member) {
        if get(h, "e", &up.member).unwrap_or(0) > now {
            keep = mine.max(want.min(c));
        }
    }
    let desire = (want - mine).max(0);
    let fair_part = |avail: i64| {
        if active > 0 {
            // as Lua computes it, in floating point
            let d = desire.max(1) as f64;
            ((avail as f64 * d / (d + wanted as f64)).ceil() as i64).max(1)
        } else {
            avail
        }
    };
    let (need, spare) = (as_i(up.need), as_i(up.spare));
    let tb = as_i(up.bucket_us);
    let mut tat = 0;
    let avail = if tb > 0 {
        let now_us = now * 1000;
        let charge = mine - get(h, "t", &up.member).unwrap_or(as_i(up.confirmed));
        let from = if up.since_ms > 0 {
            (as_i(up.since_ms) * 1000).min(now_us)
        } else {
            now_us
        };
        tat = strings.get(&up.prev_ledger_key).copied().unwrap_or(0);
        held += prev_leased;
        if charge > 0 {
            tat = tat.max(from) + charge * tb;
        }
        (now_us + as_i(up.period_ms) * 1000 - tat.max(now_us)).div_euclid(tb) - held
    } else {
        cap - total - held - reserve
    };
    let free = avail - (keep - mine);
    let fair = fair_part(avail.min(spare));
    let n = (mine + need - keep).min(free).max(0);
    let f = (want - keep - n)
        .min(free - n)
        .min(fair - (keep - mine))
        .min(spare - held - (keep - mine));
    let extra = n + f.max(0);
    let ceiling = keep + extra;
    let until = if want <= mine {
        now
    } else {
        as_i(up.lease_until_ms)
    };
    h.insert(format!("c:{}", up.member), ceiling);
    h.insert(format!("e:{}", up.member), until);
    h.insert(format!("d:{}", up.member), desire);
    let left = avail - (ceiling - mine);
    if tb > 0 {
        h.insert(format!("t:{}", up.member), mine);
        strings.insert(up.prev_ledger_key.clone(), tat);
    }
    let u = |v: i64| v.max(0) as u64;
    Answer {
        total: u(total),
        ceiling: u(ceiling),
        fair: u(fair),
        room: u(left),
        held: u(held),
        prev: u(prev),
    }
}

/// How long the heartbeat set outlives its last writer.
pub const HEARTBEAT_TTL_MS: u64 = 60_000;

/// The script call for one update, by the script's hash (pipelined in rounds; alone in tests,
/// after `load_scripts_blocking`).
pub fn ledger_cmd(u: &LedgerUpdate) -> redis::Cmd {
    let mut c = redis::cmd("EVALSHA");
    c.arg(LEDGER.get_hash())
        .arg(4)
        .arg(&u.key)
        .arg(&u.ledger_key)
        .arg(&u.prev_ledger_key)
        .arg(&u.prev_key)
        .arg(&u.member)
        .arg(u.used)
        .arg(u.want)
        .arg(u.cap)
        .arg(u.now_ms)
        .arg(u.lease_until_ms)
        .arg(u.expire_at_ms)
        .arg(u.weight_ms)
        .arg(u.period_ms)
        .arg(u.bucket_us)
        .arg(u.adopt)
        .arg(u.need)
        .arg(u.spare)
        .arg(u.confirmed)
        .arg(u.direct_cap)
        .arg(u.since_ms);
    c
}

fn add_update(p: &mut redis::Pipeline, u: &Update) {
    p.add_command(match u {
        Update::Lease(l) => ledger_cmd(l),
        Update::Count(c) => count_cmd(c, count_start(c)),
    });
}

/// The heartbeat: plain commands, not a script (a script call costs Redis 50-85 us by INFO
/// commandstats, these four 15-20 us together in `scripts/bench-redis-cost`). Not atomic, and need not be: each instance only adds itself and
/// removes the silent ones, and the count is read last. Its answer is the last reply.
fn add_heartbeat(p: &mut redis::Pipeline, hb: &Heartbeat) {
    p.cmd("ZADD").arg(&hb.key).arg(hb.now_ms).arg(&hb.instance);
    p.cmd("ZREMRANGEBYSCORE")
        .arg(&hb.key)
        .arg("-inf")
        .arg(hb.now_ms.saturating_sub(hb.liveness_ms));
    p.cmd("PEXPIRE").arg(&hb.key).arg(HEARTBEAT_TTL_MS);
    p.cmd("ZCARD").arg(&hb.key);
}

/// How many replies the heartbeat adds to a pipeline.
pub const HEARTBEAT_REPLIES: usize = 4;

/// The round's pipeline for one server: every update (a plain increment's first step), then
/// the heartbeat (periodic rounds).
pub fn pipeline<'a>(
    updates: impl Iterator<Item = &'a Update>,
    hb: Option<&Heartbeat>,
) -> redis::Pipeline {
    let mut p = redis::pipe();
    updates.for_each(|u| add_update(&mut p, u));
    if let Some(hb) = hb {
        add_heartbeat(&mut p, hb);
    }
    p
}

/// The first replies to the updates `idxs` (in pipeline order): their answers where they are
/// done; the plain increments that take another step are returned.
fn first_replies(
    updates: &[Update],
    idxs: impl Iterator<Item = usize>,
    values: &[redis::Value],
    answers: &mut [Option<Reply>],
) -> Result<Vec<(usize, u8, u64)>, RoundError> {
    let mut pending = Vec::new();
    for (i, v) in idxs.zip(values) {
        match updates.get(i) {
            Some(Update::Lease(_)) => {
                let a = answer(v).ok_or_else(|| format!("unexpected answer {v:?}"))?;
                answers[i] = Some(Reply::Lease(a));
            }
            Some(Update::Count(c)) => match count_reply(c, count_start(c), 0, v)? {
                Ok(t) => answers[i] = Some(Reply::Count(t)),
                Err((stage, total)) => pending.push((i, stage, total)),
            },
            None => {}
        }
    }
    Ok(pending)
}

/// One script answer: `{total, ceiling, fair, room, held, prev}`.
pub fn answer(v: &redis::Value) -> Option<Answer> {
    let redis::Value::Array(a) = v else {
        return None;
    };
    let n = |i: usize| a.get(i).and_then(int).map(|x| x.max(0) as u64);
    Some(Answer {
        total: n(0)?,
        ceiling: n(1)?,
        fair: n(2)?,
        room: n(3)?,
        held: n(4)?,
        prev: n(5)?,
    })
}

/// The backend for the configured endpoint. Call inside the runtime: connections are made
/// lazily and in the background.
pub fn make(settings: &RedisSettings) -> Result<Box<dyn SyncBackend>, String> {
    Ok(match &settings.endpoint {
        RedisEndpoint::Single(_) => Box::new(SingleRedis::new(settings)?),
        RedisEndpoint::Cluster(_) => Box::new(ClusterRedis::new(settings)?),
    })
}

/// One Redis server, through a connection manager that reconnects by itself.
pub struct SingleRedis {
    conn: ConnectionManager,
}

impl SingleRedis {
    pub fn new(settings: &RedisSettings) -> Result<Self, String> {
        let RedisEndpoint::Single(url) = &settings.endpoint else {
            return Err("not a single-server endpoint".into());
        };
        let client = client(url, &settings.access)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            // one quick retry, so that a refusal (a certificate, a password) comes back
            // within the round's timeout with its reason; rounds themselves retry later
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_secs(1));
        let conn = client
            .get_connection_manager_lazy(config)
            .map_err(|e| e.to_string())?;
        Ok(SingleRedis { conn })
    }
}

#[async_trait]
impl SyncBackend for SingleRedis {
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        let mut conn = self.conn.clone();
        let mut p = pipeline(updates.iter(), hb);
        // each command's error in its place: a command Redis refused (a full Redis with
        // `noeviction`: OOM; a replica: READONLY) was not applied, the others were
        p.ignore_errors();
        let mut values = query_round(&p, &mut conn).await?;
        let n = updates.len() + if hb.is_some() { HEARTBEAT_REPLIES } else { 0 };
        if values.len() != n {
            return Err(format!("expected {n} answers, got {}", values.len()).into());
        }
        let instances = match hb {
            Some(_) => values.pop().as_ref().and_then(int).map(|i| i.max(1) as u64),
            None => None,
        };
        values.truncate(updates.len());
        let mut refused = None;
        let mut answered = Vec::with_capacity(values.len());
        let mut replies = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            match v {
                redis::Value::ServerError(e) => refused = Some(format!("{e:?}")),
                v => {
                    answered.push(i);
                    replies.push(v);
                }
            }
        }
        if let Some(message) = refused.as_ref().filter(|_| answered.is_empty()) {
            // Redis refused every update: nothing of the round was applied
            return Err(RoundError {
                message: message.clone(),
                unapplied: true,
            });
        }
        // the refused updates have no answer: they go again with a later round, and their
        // counters fall back to `on_failure` meanwhile
        let mut answers = vec![None; updates.len()];
        let pending = first_replies(updates, answered.into_iter(), &replies, &mut answers)?;
        finish_counts(&mut conn, updates, pending, &mut answers).await?;
        Ok(Exchange {
            answers,
            instances,
            ..Exchange::default()
        })
    }
}

/// A Redis Cluster, through the `redis` crate's cluster client (it reads the slot map, follows
/// failovers and MOVED answers, and keeps one multiplexed connection per node). Keys carry the
/// `{partition}` hash tag, so a tenant's keys share a slot; a round sends one pipeline per slot,
/// all at once (the client multiplexes them on each node's connection), each bounded by the
/// timeout. A node that does not answer holds up only its own slots: the others' answers are
/// applied, and its counts wait for a later round (rounds are idempotent). The client retries
/// nothing itself (`retries(0)`): a round is sent again whole by the next round, so that a
/// request is never applied twice; an answer that the map is stale (MOVED) makes it read the
/// map again before the next one.
pub struct ClusterRedis {
    client: redis::cluster::ClusterClient,
    timeout: Duration,
    /// Made at the first round (the gateway starts with the cluster down as with it up).
    conn: tokio::sync::Mutex<Option<redis::cluster_async::ClusterConnection>>,
    /// The slots whose last round did not answer.
    down: parking_lot::Mutex<std::collections::HashSet<redis::cluster_routing::Slot>>,
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    }
}

impl ClusterRedis {
    pub fn new(settings: &RedisSettings) -> Result<Self, String> {
        let RedisEndpoint::Cluster(seeds) = &settings.endpoint else {
            return Err("not a cluster endpoint".into());
        };
        let access = &settings.access;
        tls_crypto();
        let mut infos = Vec::with_capacity(seeds.len());
        for url in seeds {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| e.to_string())?;
            // no `CLIENT SETINFO` at connect: one command fewer for the ACL the README gives
            let login = info.redis_settings().clone().set_skip_set_lib_name();
            infos.push(info.set_redis_settings(login));
        }
        // a user or password in a seed's URL applies to every node, as the client does
        let mut b = redis::cluster::ClusterClientBuilder::new(infos)
            .connection_timeout(settings.timeout)
            .response_timeout(settings.timeout)
            .retries(0);
        if let Some(user) = &access.username {
            b = b.username(user);
        }
        if let Some(password) = &access.password {
            b = b.password(password);
        }
        if access.ca.is_some() || access.client.is_some() {
            b = b.certs(redis::TlsCertificates {
                client_tls: access
                    .client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                root_cert: access.ca.clone(),
            });
        }
        Ok(ClusterRedis {
            client: b.build().map_err(|e| e.to_string())?,
            timeout: settings.timeout,
            conn: tokio::sync::Mutex::new(None),
            down: Default::default(),
        })
    }

    /// The cluster connection, made now if it is not yet (reading the slot map from a seed).
    async fn connection(&self) -> Result<redis::cluster_async::ClusterConnection, RoundError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let made = tokio::time::timeout(self.timeout * 2, self.client.get_async_connection())
            .await
            .map_err(|_| RoundError {
                message: format!("no cluster node answered within {:?}", self.timeout * 2),
                unapplied: true,
            })?
            .map_err(|e| RoundError {
                message: e.to_string(),
                // nothing was sent yet
                unapplied: true,
            })?;
        *guard = Some(made.clone());
        Ok(made)
    }
}

/// One slot's pipeline on the cluster connection (loading the script on that slot's master if
/// it does not know it): its replies, in order.
async fn query_slot(
    conn: &mut redis::cluster_async::ClusterConnection,
    p: &redis::Pipeline,
    n: usize,
    route: redis::cluster_routing::Route,
) -> redis::RedisResult<Vec<redis::Value>> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let to = || SingleNodeRoutingInfo::SpecificNode(route);
    // the cluster client answers a pipeline's replies as they are, errors included
    match conn.route_pipeline(p.clone(), 0, n, to()).await {
        Ok(values) if no_script(&values) => {
            // a script that was not known ran nothing: the pipeline goes again whole
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(LEDGER_SCRIPT);
            conn.route_command(load, RoutingInfo::SingleNode(to()))
                .await?;
            conn.route_pipeline(p.clone(), 0, n, to()).await
        }
        r => r,
    }
}

#[async_trait]
impl SyncBackend for ClusterRedis {
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        use redis::cluster_routing::{Route, Slot, SlotAddr};
        let conn = self.connection().await?;
        // group by slot: one pipeline each (a pipeline may not cross slots)
        let mut slots: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, u) in updates.iter().enumerate() {
            slots.entry(Slot::for_key(u.key())).or_default().push(i);
        }
        let hb_slot = hb.map(|hb| Slot::for_key(&hb.key));
        if let Some(s) = hb_slot {
            slots.entry(s).or_default();
        }
        let mut tasks = Vec::with_capacity(slots.len());
        for (slot, idxs) in slots {
            let with_hb = hb.filter(|_| Some(slot) == hb_slot);
            let p = pipeline(idxs.iter().filter_map(|&i| updates.get(i)), with_hb);
            let n = idxs.len()
                + if with_hb.is_some() {
                    HEARTBEAT_REPLIES
                } else {
                    0
                };
            let mine: Vec<Update> = idxs
                .iter()
                .filter_map(|&i| updates.get(i).cloned())
                .collect();
            let (mut conn, timeout) = (conn.clone(), self.timeout);
            let task = tokio::spawn(async move {
                let run = async {
                    let route = Route::with_slot(slot, SlotAddr::Master);
                    let values = query_slot(&mut conn, &p, n, route).await?;
                    if values.len() != n {
                        return Err(format!("expected {n} answers, got {}", values.len()).into());
                    }
                    let mut answers = vec![None; mine.len()];
                    let pending = first_replies(&mine, 0..mine.len(), &values, &mut answers)?;
                    finish_counts(&mut conn, &mine, pending, &mut answers).await?;
                    let instances = values.get(mine.len() + HEARTBEAT_REPLIES - 1).and_then(int);
                    Ok::<_, RoundError>((answers, instances))
                };
                tokio::time::timeout(timeout, run)
                    .await
                    .map_err(|_| RoundError::from(format!("no answer within {timeout:?}")))
                    .and_then(|r| r)
            });
            tasks.push((slot, idxs, with_hb.is_some(), task));
        }
        let mut out = Exchange {
            answers: vec![None; updates.len()],
            ..Exchange::default()
        };
        let mut last_error = None;
        let mut heard = Vec::with_capacity(tasks.len());
        for (slot, idxs, with_hb, task) in tasks {
            let result = task
                .await
                .map_err(|e| RoundError::from(e.to_string()))
                .and_then(|r| r);
            match result {
                Ok((answers, instances)) => {
                    for (k, &i) in idxs.iter().enumerate() {
                        out.answers[i] = answers.get(k).copied().flatten();
                    }
                    if with_hb {
                        out.instances = instances.map(|i| i.max(1) as u64);
                    }
                    out.slots_answered += 1;
                    heard.push((slot, true));
                }
                Err(e) => {
                    out.slots_failed += 1;
                    heard.push((slot, false));
                    last_error = Some(e);
                }
            }
        }
        let mut down = self.down.lock();
        for (slot, ok) in heard {
            if ok {
                down.remove(&slot);
            } else {
                down.insert(slot);
            }
        }
        out.slots_down = down.len();
        drop(down);
        match last_error {
            Some(e) if out.slots_answered == 0 => Err(e),
            Some(e) => {
                out.slot_error = Some(e.message);
                Ok(out)
            }
            None => Ok(out),
        }
    }

    fn deadline(&self, timeout: Duration) -> Duration {
        // the connection first (a seed's connect and the slot map), then the slots' answers
        timeout * 3 + timeout / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_become_answers_and_plain_increments_take_their_steps() {
        use redis::Value::{Array, Int};
        let a = |t, c| Array(vec![Int(t), Int(c), Int(4), Int(2), Int(1), Int(0)]);
        let lease = |key: &str| {
            Update::Lease(LedgerUpdate {
                key: key.into(),
                ledger_key: String::new(),
                prev_ledger_key: String::new(),
                prev_key: String::new(),
                member: String::new(),
                used: 0,
                want: 0,
                cap: 0,
                now_ms: 0,
                lease_until_ms: 0,
                expire_at_ms: 0,
                weight_ms: 0,
                period_ms: 0,
                bucket_us: 0,
                adopt: 0,
                need: 0,
                spare: 0,
                confirmed: 0,
                direct_cap: 0,
                since_ms: 0,
            })
        };
        let count = |first| {
            Update::Count(CountUpdate {
                key: "k".into(),
                delta: 3,
                first,
                expire_at_ms: 99,
            })
        };
        let updates = [lease("a"), count(true), count(false), count(false)];
        let mut answers = vec![None; updates.len()];
        let replies = [a(5, 9), Int(10), Int(10), Int(3)];
        let pending = first_replies(&updates, 0..4, &replies, &mut answers).unwrap();
        assert_eq!(
            answers[0],
            Some(Reply::Lease(Answer {
                total: 5,
                ceiling: 9,
                fair: 4,
                room: 2,
                held: 1,
                prev: 0
            }))
        );
        assert_eq!(answers[2], Some(Reply::Count(10)), "one INCRBY, no more");
        // the expiry after: an earlier report may have created the key (`first`), or this
        // increment did (its total is the increment)
        assert_eq!(pending, vec![(1, 2, 10), (3, 2, 3)]);
        let Update::Count(c) = &updates[1] else {
            unreachable!()
        };
        assert_eq!(count_reply(c, 2, 10, &Int(1)), Ok(Ok(10)));
        let cmd = |stage| {
            String::from_utf8_lossy(&count_cmd(c, stage).get_packed_command()).replace("\r\n", " ")
        };
        assert!(cmd(1).contains("INCRBY $1 k $1 3"), "{}", cmd(1));
        assert!(cmd(2).contains("PEXPIREAT $1 k $2 99"));
        assert!(
            first_replies(&updates, 0..1, &[Int(5)], &mut answers).is_err(),
            "not a script answer"
        );
    }
}
