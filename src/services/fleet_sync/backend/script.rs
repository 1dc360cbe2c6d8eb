//! The ledger scripts: the Lua a round runs for a lease ask, one script per algorithm family
//! (`Family`: windows, buckets, the sliding log), each with its keys and named arguments in a
//! documented order (`Family::keys`, `Family::args`: the script's first lines name them, made
//! from the same lists), on sections of Lua they share (`PRELUDE`, `SECTIONS`); their loading
//! and the call that runs one by its hash (`ledger_cmd`). Their Rust twin, the same keys and
//! answers for the simulation, is under the tests (`tests/common/ledger_model.rs`), not in the
//! binary; `tests/ledger_script.rs` holds the two to the same answers on a real redis-server.

use super::round::LedgerUpdate;
use std::sync::LazyLock;

/// The algorithm families, each with a script of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Fixed and sliding windows (`WINDOWS`).
    Windows,
    /// Token and leaky buckets (`BUCKETS`).
    Buckets,
    /// The sliding log (`LOG`).
    Log,
}

/// How a script takes an argument: as Redis gives it (its own `ARGV`, after the numbers), or
/// as a number: all of a call's numbers travel in its first argument, packed as
/// little-endian doubles (`NUMBER`), which the script unpacks with Redis's `struct` library
/// in one call (the numbers Lua holds are doubles anyway): 15 `tonumber` of text arguments and
/// their locals took 19k of a call's 221k instructions in Redis (callgrind; BENCHMARKS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Number,
}

/// The `struct` format of one packed argument (`Kind::Number`; a ledger's member record is six
/// of them, `RECORD` in `PRELUDE`).
const NUMBER: &str = "d";

use Kind::{Number, Text};

/// Arguments every family takes first, in this order.
const COMMON_ARGS: [(&str, Kind); 8] = [
    // this instance and the record's incarnation
    ("member", Text),
    // its cumulative count in the window
    ("used", Number),
    // what it wants to be able to admit in all
    ("want", Number),
    ("now_ms", Number),
    // until when the lease holds (the window's end; a bucket's: the next window's)
    ("lease_until_ms", Number),
    // when the keys expire (Unix ms)
    ("expire_at_ms", Text),
    // of `want - used`, the requests waiting now: granted first, from all that is free
    ("need", Number),
    // what all members together may hold unused beyond their needs
    ("spare", Number),
];

const WINDOW_ARGS: [(&str, Kind); 7] = [
    // the threshold
    ("cap", Number),
    // a sliding window: how much of the previous window still weighs (ms of `period_ms`);
    // 0: a fixed window
    ("weight_ms", Number),
    ("period_ms", Number),
    // what direct records can admit in the window in all (0: none can)
    ("direct_cap", Number),
    // the instances of the fleet, as this member knows them
    ("instances", Number),
    // what a direct record may hold admitted and unreported (`ledger::direct_allowance`)
    ("direct_each", Number),
    // a fixed window: the member's steady demand until the window's end, within `want` (0:
    // none)
    ("rest", Number),
];

const BUCKET_ARGS: [(&str, Kind); 6] = [
    ("period_ms", Number),
    // µs per token, to the ns (`bucket_arg`)
    ("bucket_us", Number),
    // how far ahead the bucket may be booked (µs)
    ("tolerance_us", Number),
    // the lease carried over from the previous window's record
    ("adopt", Number),
    // of `used`, what Redis confirmed before (charged already if it lost its record)
    ("confirmed", Number),
    // what it has not charged yet was admitted at or after this instant (ms; 0: now)
    ("since_ms", Number),
];

const LOG_ARGS: [(&str, Kind); 3] = [
    // the threshold
    ("cap", Number),
    // where units named without their instants go: the bucket of now, or the window's last
    ("last_bucket", Text),
    // the previous window's buckets from this one are still in the span
    ("from_bucket", Number),
    // then (bucket, units) pairs, oldest first
];

impl Family {
    /// The family of an update.
    pub fn of(u: &LedgerUpdate) -> Family {
        if u.bucket_ns > 0 {
            Family::Buckets
        } else if u.log.bucket_ms > 0 {
            Family::Log
        } else {
            Family::Windows
        }
    }

    /// The script's keys, in order (`KEYS[1]`, ...).
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            // the contract's count, this window's ledger, the previous window's ledger and
            // count (a sliding window; else this window's again)
            Family::Windows => &["count", "ledger", "prev_ledger", "prev_count"],
            // the count, the ledger, the bucket (when it is full again, µs), the previous
            // window's ledger (the leases its records hold until they move here)
            Family::Buckets => &["count", "ledger", "bucket", "prev_ledger"],
            // the count, the ledger, the previous window's ledger (its buckets in the span;
            // this window's ledger again for a previous window's record)
            Family::Log => &["count", "ledger", "prev_ledger"],
        }
    }

    /// The script's arguments after the common ones, in order.
    fn own_args(self) -> &'static [(&'static str, Kind)] {
        match self {
            Family::Windows => &WINDOW_ARGS,
            Family::Buckets => &BUCKET_ARGS,
            Family::Log => &LOG_ARGS,
        }
    }

    /// The names of the script's arguments, in their documented order.
    pub fn args(self) -> impl Iterator<Item = &'static str> {
        COMMON_ARGS
            .iter()
            .chain(self.own_args())
            .map(|&(name, _)| name)
    }

    /// The names of the arguments of one kind, in order: the numbers as packed in `ARGV[1]`,
    /// the texts as `ARGV[2]`, ...
    fn args_of(self, kind: Kind) -> impl Iterator<Item = &'static str> {
        COMMON_ARGS
            .iter()
            .chain(self.own_args())
            .filter(move |&&(_, k)| k == kind)
            .map(|&(name, _)| name)
    }

    fn body(self) -> &'static str {
        match self {
            Family::Windows => WINDOWS,
            Family::Buckets => BUCKETS,
            Family::Log => LOG,
        }
    }

    /// The whole script: its keys and arguments named, the prelude, its body with the
    /// sections it names (`--@name`) in their places.
    pub fn source(self) -> String {
        let mut s = String::from("-- tollgate ledger script: ");
        s.push_str(match self {
            Family::Windows => "windows\n",
            Family::Buckets => "buckets\n",
            Family::Log => "log\n",
        });
        for (i, k) in self.keys().iter().enumerate() {
            s.push_str(&format!(
                "local KEY_{} = KEYS[{}]\n",
                k.to_uppercase(),
                i + 1
            ));
        }
        // the numbers, packed in the first argument, then the texts, each an argument
        let numbers: Vec<&str> = self.args_of(Number).collect();
        s.push_str(&format!(
            "local {} = struct.unpack('<{}', ARGV[1])\n",
            numbers.join(", "),
            NUMBER.repeat(numbers.len())
        ));
        for (i, name) in self.args_of(Text).enumerate() {
            s.push_str(&format!("local {name} = ARGV[{}]\n", i + 2));
        }
        let texts = self.args_of(Text).count();
        s.push_str(&format!("local FIRST_PAIR = {}\n", texts + 2));
        s.push_str(PRELUDE);
        splice(&mut s, self.body());
        s
    }

    fn script(self) -> &'static redis::Script {
        match self {
            Family::Windows => &SCRIPTS[0],
            Family::Buckets => &SCRIPTS[1],
            Family::Log => &SCRIPTS[2],
        }
    }

    pub const ALL: [Family; 3] = [Family::Windows, Family::Buckets, Family::Log];
}

/// Lua with its lines `--@name` replaced by the sections they name (`SECTIONS`, whose own
/// such lines are replaced in turn; a name no section has stays as it is, a comment, which a
/// test finds).
fn splice(s: &mut String, lua: &str) {
    for line in lua.split_inclusive('\n') {
        let name = line.strip_prefix("--@").map(str::trim_end);
        match SECTIONS.iter().find(|&&(n, _)| Some(n) == name) {
            Some(&(_, section)) => splice(s, section.trim_start_matches('\n')),
            None => s.push_str(line),
        }
    }
}

static SCRIPTS: LazyLock<[redis::Script; 3]> =
    LazyLock::new(|| Family::ALL.map(|f| redis::Script::new(&f.source())));

/// Every script's source (what `SCRIPT LOAD` sends, and the ACL check reads).
pub fn sources() -> [String; 3] {
    Family::ALL.map(Family::source)
}

/// Load the scripts into a server (rounds call them by hash).
pub async fn load_scripts(conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<()> {
    for s in SCRIPTS.iter() {
        s.load_async(conn).await?;
    }
    Ok(())
}

/// The same, on a blocking connection (tests).
pub fn load_scripts_blocking(conn: &mut dyn redis::ConnectionLike) -> redis::RedisResult<()> {
    for s in SCRIPTS.iter() {
        s.load(conn)?;
    }
    Ok(())
}

/// Whether a server refused a command because it does not know the script.
pub(super) fn no_script(values: &[redis::Value]) -> bool {
    values.iter().any(|v| {
        matches!(v, redis::Value::ServerError(e)
            if e.kind() == Some(redis::ServerErrorKind::NoScript))
    })
}

/// What every family shares: reading a ledger, reporting the count, the other members'
/// leases, the lease itself, and the answer: sections of Lua that `Family::source` splices
/// into each family's body where it names them (a line `--@name`, `SECTIONS`), not functions:
/// a script's functions are closures made again at every call, and the five the library was
/// (with their upvalues, their calls, and `math.max` and the like called where a comparison
/// does) cost Redis about 30k of a call's 110k instructions (callgrind, BENCHMARKS.md). The
/// sections share their locals by name: each one's doc says what it reads and what it
/// defines.
///
/// Report a cumulative count (only its growth reaches the key: re-sending changes nothing),
/// then lease: keep what this member holds up to what it wants, and add from what is free,
/// `cap - total - what the other members hold unused`: first the requests waiting at the
/// member (`need`), then its forecast, out of the spare budget only: what all members hold
/// unused stays within `spare`, and while other members hold live leases, no member holds
/// more than its fair part of it, in proportion to what each asked for beyond its count
/// (`d:`), which is answered too so that a member holding more asks for less next time. A
/// member that wants nothing more gives its lease back at once. The member enforces the cap
/// of each moment of a sliding window itself, from `prev` and `held` (answered).
///
/// Buckets: tokens are charged as the members report them admitted. Those a member admitted
/// beyond what was charged (out of a lease, or while Redis was out of reach; after
/// a restart of Redis, all but what it had confirmed) are charged from `since_ms`, the earliest
/// they can have been admitted, not from now: the refill since then covers them as it would
/// have, had they been reported one by one, and since leases are not in the bucket's time,
/// each member's go in behind the others' admitted tokens, not behind their leases. That errs
/// towards admitting, by at most those tokens, when charges arrive in the order their tokens
/// came; one that arrives after others' later tokens goes in behind them (docs/fleet.md).
///
/// Direct records (far from the limit) report plain increments of the key and hold no lease;
/// while the (weighted) count is under `direct_cap`, what they may still report (the cap less
/// what they reported: the total less the members' counts) is kept out of leases; past it,
/// `direct_each` for each of the fleet's `instances` not yet among the members (a record that
/// runs the script reports its direct count unsent with it, and leases from then on).
const PRELUDE: &str = r#"
-- the members' records in a ledger, one field each (`m:` and the member), its numbers packed
-- as doubles (`RECORD`, Redis's `struct` library: no number is parsed from text or written as
-- text): its count, its ceiling, its lease's end, what it asked for beyond its count, the
-- tokens charged to it (buckets; else -1: none), the ceiling a part held before a re-split,
-- until its holder's next call (windows); and what an operator granted to the window (`g:`,
-- text, the adjustment script's). Records are read where they are used, each unpacked into
-- locals (a table a record, or one per member, cost Redis about 10k instructions a call more)
local RECORD = '<dddddd'
-- this member's field
local MEMBER = 'm:' .. member
local max, min, floor, ceil = math.max, math.min, math.floor, math.ceil
local byte, unpack_ = string.byte, struct.unpack
"#;

/// The sections a family's body names (`--@name`), in the order a body uses them.
const SECTIONS: [(&str, &str); 7] = [
    // reads KEY_LEDGER; defines `f` (its fields), `grant`, this member's record `m1` to `m6`
    // (none: `m2` nil, the others 0, `m5` -1), `first` (no lease of this member in the ledger
    // yet: it gets its expiry) and `mine` (its count there)
    ("read", READ),
    // reads `used` and `mine`; reports the growth; defines `total`, `mine` the count written
    ("report", REPORT),
    // reads `f`, `mine`; defines `desire` (what this member wants beyond its count), and of
    // the other members `held`, `active`, `wanted` (their live leases: unused, how many, what
    // they asked for), `scripted`, `members` (all of their records: counts, and how many
    // members with this one)
    ("others", OTHERS),
    // reads `avail`, `split`, `charged` (and the above); writes the record; defines
    // `ceiling`, `fair`, `left`
    ("lease", LEASE),
    // reads `first`, `total`, `ceiling`, `fair`, `left`, `held`, `prev`, `grant`; defines
    // `out`, the answer packed (a sliding log appends its steps)
    ("answer", ANSWER),
    // defines `packed(f)`: a ledger's fields with the text records of an earlier release
    // packed (named where it is needed only: a function defined is a closure made at every
    // call)
    ("packed", PACKED),
    // defines `unused_in(key, live)`: what a ledger's records hold leased and unused, and
    // the grant of its window
    ("unused_in", UNUSED_IN),
];

const PACKED: &str = r#"
-- a ledger's fields (HGETALL) with its records written as text fields (`u:`, `c:`, `e:`,
-- `d:`, `t:`, `p:` and the member: before 2026-11-28) packed as the others are, so that an
-- instance not yet upgraded is seen holding what it holds (a member with a packed record
-- too is read from that one; a text record without its ceiling is taken to hold nothing)
local function packed(f)
  local text, out, has = {}, {}, {}
  for i = 1, #f, 2 do
    local kind = byte(f[i])
    local slot = (kind == 117 and 1) or (kind == 99 and 2) or (kind == 101 and 3)
      or (kind == 100 and 4) or (kind == 116 and 5) or (kind == 112 and 6)
    if slot then
      local id = 'm:' .. string.sub(f[i], 3)
      local x = text[id]
      if not x then x = {}; text[id] = x end
      x[slot] = tonumber(f[i + 1])
    else
      out[#out + 1], out[#out + 2] = f[i], f[i + 1]
      has[f[i]] = true
    end
  end
  for id, x in pairs(text) do
    if not has[id] then
      out[#out + 1], out[#out + 2] = id,
        struct.pack(RECORD, x[1] or 0, x[2] or x[1] or 0, x[3] or 0, x[4] or 0, x[5] or -1, x[6] or 0)
    end
  end
  return out
end
"#;

const UNUSED_IN: &str = r#"
--@packed
-- of a ledger's records, what they hold leased and unused (`live`: only leases that last
-- now), and what was granted to its window
local function unused_in(key, live)
  local f, unused, g = redis.call('HGETALL', key), 0, 0
  for i = 1, #f, 2 do
    local kind = byte(f[i])
    if kind ~= 109 and kind ~= 98 and kind ~= 103 then f = packed(f); break end
  end
  for i = 1, #f, 2 do
    local kind = byte(f[i])
    if kind == 109 then
      local x1, x2, x3 = unpack_(RECORD, f[i + 1])
      if x2 > x1 and (x3 > now_ms or not live) then unused = unused + x2 - x1 end
    elseif kind == 103 then g = tonumber(f[i + 1])
    end
  end
  return unused, g
end
"#;

const READ: &str = r#"
local f = redis.call('HGETALL', KEY_LEDGER)
local grant, me = 0, nil
for i = 1, #f, 2 do
  local k = f[i]
  if k == MEMBER then me = f[i + 1]
  elseif k == 'g:' then grant = tonumber(f[i + 1])
  else
    local kind = byte(k)
    if kind ~= 109 and kind ~= 98 then
--@packed
      f = packed(f)
      for j = 1, #f, 2 do if f[j] == MEMBER then me = f[j + 1] end end
      break
    end
  end
end
local m1, m2, m3, m4, m5, m6 = 0, nil, 0, 0, -1, 0
if me then m1, m2, m3, m4, m5, m6 = unpack_(RECORD, me) end
local first = m2 == nil
local mine = m1
"#;

// report the cumulative count: only its growth reaches the count (re-sending changes
// nothing; a count this growth created gets its expiry)
const REPORT: &str = r#"
local total
if used <= mine then total = tonumber(redis.call('GET', KEY_COUNT) or '0')
else
  total = redis.call('INCRBY', KEY_COUNT, used - mine)
  if total == used - mine then redis.call('PEXPIREAT', KEY_COUNT, expire_at_ms) end
  mine = used
end
"#;

// what the other members hold leased and unused while their leases last (a part re-split
// at its holder's last call: what it held before, until its next, the record's sixth), how
// many hold one, and what they asked for beyond their counts, each taken to want at least
// `desire`: what a member asked last may be from before its demand grew
const OTHERS: &str = r#"
local desire = want - mine
if desire < 0 then desire = 0 end
local held, active, wanted, scripted, members = 0, 0, 0, 0, 1
for i = 1, #f, 2 do
  local k = f[i]
  if k ~= MEMBER and k ~= 'g:' and byte(k) == 109 then
    local x1, x2, x3, x4, _, x6 = unpack_(RECORD, f[i + 1])
    scripted, members = scripted + x1, members + 1
    if x3 > now_ms then
      active = active + 1
      local out = (x2 > x6 and x2 or x6) - x1
      if out > 0 then held = held + out end
      wanted = wanted + (x4 > desire and x4 or desire)
    end
  end
end
"#;

// the lease out of `avail`: keep what this member holds up to what it wants, then the
// requests waiting (`need`) from all that is free, then its part of the spare budget, or
// (`split`, a fixed window filling) at least that much unused; written to the ledger with
// the tokens `charged` to it (buckets; -1: none). A part larger than its share of what
// nobody has admitted (the others' demand grew) is re-split to it, what it held kept for it
// (its record's last number) until its next call: it may admit up to that until this answer
// reaches it.
const LEASE: &str = r#"
local keep = mine
if m2 and m3 > now_ms then
  keep = want < m2 and want or m2
  if keep < mine then keep = mine end
end
local pending = 0
if split > 0 and keep > mine + split then pending, keep = keep, mine + split end
local free = avail - (keep - mine)
local fair = avail < spare and avail or spare
if active > 0 then
  local d = desire > 1 and desire or 1
  fair = ceil(fair * d / (d + wanted))
  if fair < 1 then fair = 1 end
end
local n = mine + need - keep
if n > free then n = free end
if n < 0 then n = 0 end
local more = min(want - keep - n, free - n, fair - (keep - mine), spare - held - (keep - mine))
local ceiling = keep + n
if more > 0 then ceiling = ceiling + more end
if split > 0 then
  local least = mine + (split < avail and split or avail)
  if least > ceiling then ceiling = least end
end
local until_ms = lease_until_ms
if want <= mine then until_ms = now_ms end
redis.call('HSET', KEY_LEDGER, MEMBER,
  struct.pack(RECORD, mine, ceiling, until_ms, desire, charged, pending))
local left = avail - (ceiling - mine)
"#;

// the ledger's expiry (`first`: the member's first lease in it, which a ledger lost and
// written again also is), and the answer: total, ceiling, fair, room, held, prev, grant,
// packed as doubles in one string (a table of numbers, which Redis turns into a reply element
// by element, cost it about 5k instructions a call more, by callgrind)
const ANSWER: &str = r#"
if first then redis.call('PEXPIREAT', KEY_LEDGER, expire_at_ms) end
local out = struct.pack('<ddddddd', total, ceiling, fair > 0 and fair or 0,
  left > 0 and left or 0, held, prev, grant)
"#;

/// Fixed and sliding windows: the cap is the threshold and what was granted to the window,
/// lowered for a sliding window by the previous window's weight at the lease's horizon
/// (counting that window's leases as used, less what was granted to it); what direct records
/// may still report is kept out of leases.
const WINDOWS: &str = r#"
--@read
cap = cap + grant
--@report
--@others
local prev, prevw = 0, 0
if weight_ms > 0 then
--@unused_in
  local unused, pg = unused_in(KEY_PREV_LEDGER, false)
  prev = max(tonumber(redis.call('GET', KEY_PREV_COUNT) or '0') + unused - pg, 0)
  prevw = ceil(prev * weight_ms / period_ms)
  cap = cap - prevw
end
-- what direct records may still report, kept out of leases: while the (weighted) count is
-- under the cap of what they can admit, the cap less what they reported; past it, what each
-- instance that has not run this script in the window (still direct) may hold unreported
local reserve = 0
if direct_cap > 0 then
  reserve = max(direct_cap - (total - scripted - mine), 0)
  if total + prevw >= direct_cap then
    reserve = min(reserve, max(instances - members, 0) * direct_each)
  end
end
-- a fixed window filling: when this member's steady demand until the window's end and the
-- others' fill what nobody has admitted, it holds its part of that at once; each other
-- instance is taken to want at least as much as this one (what a member asked last may be
-- from before its demand grew; an instance that holds no lease may ask next); when they do
-- not fill it, its own demand until the end (what is left is more than they all want)
local split = 0
if rest > 0 then
  local pool = cap - total - reserve
  local demand = desire + max(instances - 1 - active, 0) * desire + wanted
  if demand >= pool and pool > 0 then split = floor(pool * desire / demand)
  elseif pool > 0 then split = desire end
end
local avail = cap - total - held - reserve
local charged = m5
--@lease
--@answer
return out
"#;

/// Token and leaky buckets: the cap is the tokens of a bucket kept in Redis (the time at which
/// it is full again of what the members admitted, µs, which may lie in the past) of
/// `tolerance_us`, less what the members hold leased and unused in this window's ledger and the
/// previous window's. Tokens admitted beyond what was charged are charged from `since_ms`.
const BUCKETS: &str = r#"
--@read
if adopt > 0 and first then m2, m3 = adopt, lease_until_ms end
--@report
--@others
local nowus = now_ms * 1000
local charge = mine - (m5 >= 0 and m5 or confirmed)
-- admitted tokens count from when they can first have come: behind the others' tokens
-- admitted before, not behind leases (tokens of a lease count as admitted when used)
local from = nowus
if since_ms > 0 then from = min(since_ms * 1000, nowus) end
local tat = tonumber(redis.call('GET', KEY_BUCKET) or '0')
-- leases the previous window's records hold until they move to this one
--@unused_in
held = held + unused_in(KEY_PREV_LEDGER, true)
if charge > 0 then tat = max(tat, from) + charge * bucket_us end
local avail = floor((nowus + tolerance_us - max(tat, nowus)) / bucket_us) - held
local split, charged = 0, mine
--@lease
redis.call('SET', KEY_BUCKET, string.format('%.0f', tat))
redis.call('PEXPIREAT', KEY_BUCKET, string.format('%.0f', ceil(max(tat, nowus) / 1000) + period_ms + 10000))
local prev = 0
--@answer
return out
"#;

/// The sliding log: the growth is also counted by bucket of the window (`b:`); the cap is
/// lowered by what of the previous window is still in the span, its leases counted as used.
const LOG: &str = r#"
--@read
cap = cap + grant
if used > mine then
  -- (a script is not undone when a command in it fails: the sliding log's own command comes
  -- first, so that a user who may not run it gets an error before anything is written, and
  -- the count goes again, whole, once it may)
  -- the growth by bucket, the newest units named first; what is not named goes to the
  -- oldest bucket named (or the window's last), later than it came
  local g, j, at = used - mine, #ARGV - 1, last_bucket
  while g > 0 and j >= FIRST_PAIR do
    local n = min(tonumber(ARGV[j + 1]), g)
    at = ARGV[j]
    redis.call('HINCRBY', KEY_LEDGER, 'b:' .. at, n)
    g, j = g - n, j - 2
  end
  if g > 0 then redis.call('HINCRBY', KEY_LEDGER, 'b:' .. at, g) end
end
--@report
local prev, steps = 0, {}
if KEY_PREV_LEDGER ~= KEY_LEDGER then
  -- what of the previous window is still in the span (its buckets from `from_bucket`) and
  -- what its members hold leased, all of it
  local pf = redis.call('HGETALL', KEY_PREV_LEDGER)
  for i = 1, #pf, 2 do
    if string.sub(pf[i], 1, 2) == 'b:' and tonumber(string.sub(pf[i], 3)) >= from_bucket then
      prev = prev + tonumber(pf[i + 1])
      steps[#steps + 1] = {tonumber(string.sub(pf[i], 3)), tonumber(pf[i + 1])}
    end
  end
  table.sort(steps, function(a, b) return a[1] < b[1] end)
--@unused_in
  local unused, pg = unused_in(KEY_PREV_LEDGER, false)
  prev = max(prev + unused - pg, 0)
  cap = cap - prev
end
--@others
local avail = cap - total - held
local charged = m5
local split = 0
--@lease
--@answer
-- and the previous window's first buckets still in the span (bucket, units, ...)
local n = min(#steps, 8)
if n == 0 then return out end
local tail = {}
for k = 1, n do
  tail[#tail + 1] = steps[k][1]
  tail[#tail + 1] = steps[k][2]
end
return out .. struct.pack('<' .. string.rep('d', #tail), unpack(tail))
"#;

/// Arguments pushed by name, in the order the family's script names them (checked in debug
/// builds, so every test that builds a call checks it): the numbers packed in one argument
/// (`Kind::Number`), then the texts.
struct Named<I: Iterator<Item = &'static str>> {
    names: I,
}

impl<I: Iterator<Item = &'static str>> Named<I> {
    fn next(&mut self, name: &str) {
        let expected = self.names.next();
        debug_assert_eq!(
            expected,
            Some(name),
            "the script's arguments are in another order"
        );
    }

    fn done(mut self) {
        debug_assert!(
            self.names.next().is_none(),
            "an argument of the script is missing"
        );
    }
}

/// The numbers of a call, packed as the script unpacks them.
struct Numbers<I: Iterator<Item = &'static str>> {
    named: Named<I>,
    packed: Vec<u8>,
}

impl<I: Iterator<Item = &'static str>> Numbers<I> {
    /// A count or an instant (integers far under 2^53, which a double holds exactly).
    fn push(&mut self, name: &str, v: u64) -> &mut Self {
        self.real(name, v as f64)
    }

    fn real(&mut self, name: &str, v: f64) -> &mut Self {
        self.named.next(name);
        self.packed.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// The text arguments of a call, after its numbers.
struct Texts<'c, I: Iterator<Item = &'static str>> {
    named: Named<I>,
    cmd: &'c mut redis::Cmd,
}

impl<I: Iterator<Item = &'static str>> Texts<'_, I> {
    fn push(&mut self, name: &str, v: impl redis::ToRedisArgs) -> &mut Self {
        self.named.next(name);
        self.cmd.arg(v);
        self
    }
}

/// The script call for one update, by its family's script hash (pipelined in rounds; alone in
/// tests, after `load_scripts_blocking`).
pub fn ledger_cmd(u: &LedgerUpdate) -> redis::Cmd {
    let family = Family::of(u);
    let mut c = redis::cmd("EVALSHA");
    c.arg(family.script().get_hash()).arg(family.keys().len());
    c.arg(&u.key).arg(&u.ledger_key).arg(&u.prev_ledger_key);
    if family != Family::Log {
        c.arg(&u.prev_key);
    }
    let mut n = Numbers {
        named: Named {
            names: family.args_of(Number),
        },
        packed: Vec::with_capacity(8 * 16),
    };
    n.push("used", u.used)
        .push("want", u.want)
        .push("now_ms", u.now_ms)
        .push("lease_until_ms", u.lease_until_ms)
        .push("need", u.need)
        .push("spare", u.spare);
    match family {
        Family::Windows => n
            .push("cap", u.cap)
            .push("weight_ms", u.weight_ms)
            .push("period_ms", u.period_ms)
            .push("direct_cap", u.direct_cap)
            .push("instances", u.instances)
            .push("direct_each", u.direct_each)
            .push("rest", u.rest),
        Family::Buckets => n
            .push("period_ms", u.period_ms)
            .real("bucket_us", bucket_us(u.bucket_ns))
            .push("tolerance_us", u.tolerance_us)
            .push("adopt", u.adopt)
            .push("confirmed", u.confirmed)
            .push("since_ms", u.since_ms),
        Family::Log => n.push("cap", u.cap).push("from_bucket", u.log.from),
    };
    let Numbers { named, packed } = n;
    named.done();
    c.arg(packed);
    let mut t = Texts {
        named: Named {
            names: family.args_of(Text),
        },
        cmd: &mut c,
    };
    t.push("member", &u.member)
        .push("expire_at_ms", u.expire_at_ms);
    if family == Family::Log {
        t.push("last_bucket", u.log.last);
    }
    t.named.done();
    for &(b, n) in &u.log.units {
        c.arg(b).arg(n);
    }
    c
}

/// A bucket's time per token as the script takes it, in µs (to the ns: a whole number of µs
/// would make a bucket of 17,606 per 10 s refill 0.2% too fast): the double nearest the
/// decimal `bucket_arg` writes.
fn bucket_us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A bucket's time per token as the script takes it: µs, to the ns (`"567.983"`): a whole
/// number of µs would make a bucket of 17,606 per 10 s refill 0.2% too fast.
pub fn bucket_arg(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::fleet_sync::backend::LogReport;

    fn update(family: Family) -> LedgerUpdate {
        LedgerUpdate {
            bucket_ns: if family == Family::Buckets { 3_333 } else { 0 },
            log: LogReport {
                bucket_ms: if family == Family::Log { 10 } else { 0 },
                units: if family == Family::Log {
                    vec![(1, 2), (3, 4)]
                } else {
                    Vec::new()
                },
                ..LogReport::default()
            },
            ..LedgerUpdate::default()
        }
    }

    #[test]
    fn each_family_names_its_keys_and_arguments_in_the_documented_order() {
        for family in Family::ALL {
            let src = family.source();
            for (i, k) in family.keys().iter().enumerate() {
                let line = format!("local KEY_{} = KEYS[{}]\n", k.to_uppercase(), i + 1);
                assert!(src.contains(&line), "{family:?}: {line}");
            }
            // the numbers from the first argument, in order; then each text
            let numbers: Vec<&str> = family.args_of(Number).collect();
            let line = format!(
                "local {} = struct.unpack('<{}', ARGV[1])\n",
                numbers.join(", "),
                NUMBER.repeat(numbers.len())
            );
            assert!(src.contains(&line), "{family:?}: {line}");
            for (i, name) in family.args_of(Text).enumerate() {
                let line = format!("local {name} = ARGV[{}]\n", i + 2);
                assert!(src.contains(&line), "{family:?}: {line}");
            }
            // every argument is one or the other, named once in the script's head
            let head = &src[..src.find("local FIRST_PAIR").unwrap_or(0)];
            for name in family.args() {
                let named = head
                    .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                    .filter(|w| *w == name)
                    .count();
                assert_eq!(named, 1, "{family:?}: {name}");
            }
            // the bodies read arguments by name (the log's pairs after them excepted)
            let body = family.body();
            assert_eq!(
                body.matches("ARGV[").count(),
                if family == Family::Log { 2 } else { 0 },
                "{family:?}"
            );
        }
    }

    #[test]
    fn every_section_a_body_names_is_spliced_in_and_each_is_used() {
        for family in Family::ALL {
            let src = family.source();
            assert!(!src.contains("--@"), "{family:?}: a section left unnamed");
            for (name, _) in &SECTIONS[..5] {
                let line = format!("--@{name}\n");
                assert_eq!(
                    family.body().matches(&line).count(),
                    1,
                    "{family:?}: {name}"
                );
            }
        }
    }

    #[test]
    fn a_call_passes_every_named_argument_of_its_family_and_nothing_else() {
        for family in Family::ALL {
            let u = update(family);
            assert_eq!(Family::of(&u), family);
            // (the order of the names is checked as the call is built, in debug builds)
            let cmd = ledger_cmd(&u);
            let pairs = if family == Family::Log { 4 } else { 0 };
            // EVALSHA, the hash, the number of keys, then the keys, the numbers packed in one
            // argument (8 bytes each) and the texts
            let numbers = family.args_of(Number).count();
            let expected = 3 + family.keys().len() + 1 + family.args_of(Text).count() + pairs;
            let packed = cmd.args_iter().nth(3 + family.keys().len());
            assert!(
                matches!(packed, Some(redis::Arg::Simple(b)) if b.len() == 8 * numbers),
                "{family:?}"
            );
            assert_eq!(cmd.args_iter().count(), expected, "{family:?}");
        }
    }
}
