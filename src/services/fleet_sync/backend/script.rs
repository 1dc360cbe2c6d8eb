//! The ledger script: `LEDGER_SCRIPT` (the Lua a round runs for a lease ask), its loading and
//! the call that runs it by hash (`ledger_cmd`). Its Rust twin, the same keys and answers for
//! the simulation, is under the tests (`tests/common/ledger_model.rs`), not in the binary;
//! `tests/ledger_script.rs` holds the two to the same answers on a real redis-server.

use super::round::LedgerUpdate;
use std::sync::LazyLock;

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

/// Whether a server refused a command because it does not know the script.
pub(super) fn no_script(values: &[redis::Value]) -> bool {
    values.iter().any(|v| {
        matches!(v, redis::Value::ServerError(e)
            if e.kind() == Some(redis::ServerErrorKind::NoScript))
    })
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
/// Buckets: the cap is the tokens in a bucket kept in Redis (`prev_ledger_key`: the time
/// at which it is full again of what the members admitted, in µs, which may lie in the past),
/// of `ARGV[17]` µs (a token bucket's period; a leaky bucket's queue and one turn) less what the
/// members hold leased and unused, in this window's ledger and in the previous
/// window's (`prev_key`: its records hold their leases until they move here). Tokens are
/// charged as the members report them admitted. Those a member admitted beyond what was
/// charged (out of a lease, on credit, or while Redis was out of reach; after a restart of Redis,
/// all but what it had confirmed) are charged from `since` (`ARGV[16]`), the earliest they can have
/// been admitted, not from now: the refill since then covers them as it would have, had they
/// been reported one by one, and since leases are not in the bucket's time, each member's go
/// in behind the others' admitted tokens, not behind their leases. That errs towards
/// admitting, by at most those tokens.
///
/// Direct records (far from the limit) report plain increments of the key and hold no lease;
/// while the (weighted) count is under `direct_cap`, what they may still report (the cap less
/// what they reported: the total less the members' counts) is kept out of leases.
///
/// Answer: `{total, ceiling, fair, room, held, prev}`, and for a sliding log the previous
/// window's first `LOG_STEPS` buckets still in the span (bucket, units, ...).
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
local lb = tonumber(ARGV[18])
if used > mine then
  -- (a script is not undone when a command in it fails: the sliding log's own command comes
  -- first, so that a user who may not run it gets an error before anything is written, and
  -- the count goes again, whole, once it may)
  if lb > 0 then
    -- a sliding log: the growth by bucket, the newest units named first; what is not named
    -- goes to the oldest bucket named (or the window's last), later than it came
    local g, j, at = used - mine, #ARGV - 1, ARGV[19]
    while g > 0 and j >= 21 do
      local n = math.min(tonumber(ARGV[j + 1]), g)
      at = ARGV[j]
      redis.call('HINCRBY', KEYS[2], 'b:' .. at, n)
      g, j = g - n, j - 2
    end
    if g > 0 then redis.call('HINCRBY', KEYS[2], 'b:' .. at, g) end
  end
  redis.call('INCRBY', KEYS[1], used - mine)
  redis.call('HSET', KEYS[2], 'u:' .. me, used)
  mine = used
end
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev, prevw, steps = 0, 0, {}
if lb > 0 and KEYS[3] ~= KEYS[2] then
  -- a sliding log: what of the previous window is still in the span (its buckets from
  -- ARGV[20]) and what its members hold leased, all of it
  local f = redis.call('HGETALL', KEYS[3])
  local from = tonumber(ARGV[20])
  for i = 1, #f, 2 do
    if string.sub(f[i], 1, 2) == 'b:' and tonumber(string.sub(f[i], 3)) >= from then
      prev = prev + tonumber(f[i + 1])
      steps[#steps + 1] = {tonumber(string.sub(f[i], 3)), tonumber(f[i + 1])}
    end
  end
  table.sort(steps, function(a, b) return a[1] < b[1] end)
  local pu, pc = fields(KEYS[3])
  for id, v in pairs(pc) do prev = prev + math.max(v - (pu[id] or 0), 0) end
  prevw = prev
  cap = cap - prevw
elseif w > 0 then
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
  avail = math.floor((nowus + tonumber(ARGV[17]) - math.max(tat, nowus)) / tb) - held
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
local out = {total, ceiling, math.max(fair, 0), math.max(left, 0), held, prev}
for k = 1, math.min(#steps, 8) do
  out[#out + 1] = steps[k][1]
  out[#out + 1] = steps[k][2]
end
return out
"#;

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
        .arg(bucket_arg(u.bucket_ns))
        .arg(u.adopt)
        .arg(u.need)
        .arg(u.spare)
        .arg(u.confirmed)
        .arg(u.direct_cap)
        .arg(u.since_ms)
        .arg(u.tolerance_us)
        .arg(u.log.bucket_ms)
        .arg(u.log.last)
        .arg(u.log.from);
    for &(b, n) in &u.log.units {
        c.arg(b).arg(n);
    }
    c
}

/// A bucket's time per token as the script takes it: µs, to the ns (`"567.983"`): a whole
/// number of µs would make a bucket of 17,606 per 10 s refill 0.2% too fast.
pub fn bucket_arg(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}
