//! The ledger script and its Rust twin: `LEDGER_SCRIPT` (the Lua a round runs for a lease ask),
//! its loading and the call that runs it by hash (`ledger_cmd`), and `ledger_model` (with
//! `update_model` and `count_model`), the same keys and answers in Rust for the simulation.
//! Everything here must give the answers the Lua script gives; `tests/ledger_script.rs` holds
//! the two to it on a real redis-server.

use super::round::{CountUpdate, LedgerUpdate, Reply, Update};
use std::collections::HashMap;
use std::sync::LazyLock;
use tollgate_limits::ledger::Answer;

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
    let mut steps: Vec<(u64, u64)> = Vec::new();
    let mut cap = as_i(up.cap);
    if up.log.bucket_ms > 0 && up.prev_ledger_key != up.ledger_key {
        if let Some(ph) = hashes.get(&up.prev_ledger_key) {
            for (name, &v) in ph {
                if let Some(b) = name.strip_prefix("b:") {
                    if let Some(b) = b.parse::<u64>().ok().filter(|&b| b >= up.log.from) {
                        prev += v;
                        steps.push((b, v.max(0) as u64));
                    }
                } else if let Some(id) = name.strip_prefix("c:") {
                    prev += (v - get(ph, "u", id).unwrap_or(0)).max(0);
                }
            }
        }
        prevw = prev;
        cap -= prevw;
        steps.sort_unstable();
    } else if up.weight_ms > 0 {
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
    if let Some(ph) = hashes.get(&up.prev_key).filter(|_| up.bucket_ns > 0) {
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
        if up.log.bucket_ms > 0 {
            let mut g = used - mine;
            let mut at = up.log.last;
            for &(b, n) in up.log.units.iter().rev() {
                if g <= 0 {
                    break;
                }
                let n = as_i(n).min(g);
                at = b;
                *h.entry(format!("b:{b}")).or_insert(0) += n;
                g -= n;
            }
            if g > 0 {
                *h.entry(format!("b:{at}")).or_insert(0) += g;
            }
        }
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
    // as Lua computes it, in floating point, µs to the ns; the bucket's time stored whole
    let tb: f64 = bucket_arg(up.bucket_ns).parse().unwrap_or(0.0);
    let mut tat = 0;
    let avail = if up.bucket_ns > 0 {
        let now_us = (now * 1000) as f64;
        let charge = mine - get(h, "t", &up.member).unwrap_or(as_i(up.confirmed));
        let from = if up.since_ms > 0 {
            ((as_i(up.since_ms) * 1000) as f64).min(now_us)
        } else {
            now_us
        };
        let mut t = strings.get(&up.prev_ledger_key).copied().unwrap_or(0) as f64;
        held += prev_leased;
        if charge > 0 {
            t = t.max(from) + charge as f64 * tb;
        }
        tat = format!("{t:.0}").parse().unwrap_or(i64::MAX);
        ((now_us + up.tolerance_us as f64 - t.max(now_us)) / tb).floor() as i64 - held
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
    if up.bucket_ns > 0 {
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
        steps: std::array::from_fn(|k| steps.get(k).copied().unwrap_or_default()),
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
