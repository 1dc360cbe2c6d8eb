//! A deterministic simulation of a fleet: N instances, each with the real limiter, counters,
//! ledger, sync round code (`Accounts`) and round schedule (`Schedule`), under one fake clock,
//! against a simulated Redis that runs `ledger_model` (the Rust twin of the Lua script, held
//! to the same answers by `tests/ledger_script.rs` on a real redis-server). Redis answers with
//! latency and jitter; fault seeds add timeouts, lost replies and restarts.
//!
//! Every seed draws its fleet (instances, algorithm, threshold, window, sync interval, start)
//! and its load (even, 90/10 skew, all on one instance, bursts hopping between instances,
//! ramps, idle instances, from 10 requests/s to wrk rates) and checks the contract's bounds
//! (section 6): in every window the fleet admits at most `threshold x 1.02` (plus one per
//! instance under 100), at least `threshold x 0.98` when offered 1.5x the threshold, Redis holds
//! exactly what was admitted, and no instance makes more than `1/sync_interval + 20` round
//! trips a second. A failing seed is printed; replay it with
//! `FLEET_SIM_SEED=<seed> cargo test --release --test fleet_sim -- --nocapture`.
//! `FLEET_SIM_SEEDS=<n>` runs more seeds. Measuring switches (docs/fleet.md, Holding):
//! `FLEET_SIM_HOLD_ONCE=1` holds requests `timeout + 1.5 x rtt` from their first hold and no
//! longer (the bound issue 43 asks; decided again at each round's end all the same, as the
//! gateway does), `FLEET_SIM_NO_PUBSUB=1` has no instance listen on the waits channel,
//! `FLEET_SIM_PER_SECOND=1` prints the seed scenario's Redis calls by second of each run.

use http::{HeaderMap, Method};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use tollgate::config::calendar::{Calendar, CalendarUnit};
use tollgate::config::{self, model::RedisSettings};
use tollgate::limits::fleet::{hold_limit, Fleet, Link, MIN_ROUND_GAP_MS};
use tollgate::limits::ledger::SPARE_PERCENT;
use tollgate::limits::{CounterRegistry, FakeClock, LimitRequest, Limiter, Verdict};
#[path = "common/ledger_model.rs"]
mod ledger_model;
use ledger_model::{count_model, update_model};
use redis::Value;
use tollgate::services::fleet_sync::backend::journal::{Journal, Marked, Repair};
use tollgate::services::fleet_sync::backend::{
    beat_reply, Exchange, Heartbeat, RoundError, Update, WAIT_MARK_MS,
};
use tollgate::services::fleet_sync::{Accounts, Asked, Between, Cursor, Round, Schedule};

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp()
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Even,
    Skewed,
    One,
    Bursts,
    Ramp,
    /// Even over some instances, the others idle.
    SomeIdle,
    /// The fleet's rate even, each instance's swaying around its share (+-30%, a 7 s cycle,
    /// the instances' cycles spread over it): as tenants drawn at random spread over
    /// instances (`scripts/bench-fleet`'s seed run). Only the seed scenario uses it.
    Swaying,
    /// Spikes of 0.2 x threshold arriving in the same ms on one instance, five to a window
    /// (or to the run, for long windows): the fleet passes 0.9 x threshold at the fifth.
    Spikes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Faults {
    None,
    /// Replies later than the timeout (the round was applied), and replies lost.
    SlowAndLost,
    /// Redis restarts empty once, down for a while.
    Restart,
    /// Redis fails over once, down for a while: the replica that takes over lacks the writes
    /// of the last ms before the failure (1 to 50, replication being asynchronous), answers
    /// the primary had already sent back included. On half of these seeds the fleet leases
    /// only, as it does behind a Redis Cluster or Sentinel; on the others records far from
    /// their limit send plain increments, marked (`backend::journal`), as behind one endpoint.
    /// (Half of the seeds that would draw `Restart`.)
    Failover,
    /// The tenant's Redis Cluster node does not answer for a while; the rest of Redis (the
    /// heartbeat's node) does.
    ShardDown,
    /// Redis stalls (answers nothing) for less than the timeout, a few times.
    Stall,
}

#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    instances: usize,
    sliding: bool,
    /// A token bucket (neither window).
    bucket: bool,
    /// A leaky bucket's queue (with `bucket`): the bucket holds `queue + 1`.
    queue: Option<u64>,
    /// A sliding log (with `sliding`: its fleet accounting is windowed as a sliding window's).
    log: bool,
    threshold: u64,
    period_ms: u64,
    interval_ms: u64,
    timeout_ms: u64,
    /// Round trip to Redis (jittered by up to a half).
    rtt_ms: u64,
    /// Requests per second offered to the whole fleet.
    rate: f64,
    shape: Shape,
    /// The instances knew each other before the load started.
    warm: bool,
    faults: Faults,
    /// Simulated time from the first request, and the offset of the start in its window.
    span_ms: u64,
    phase_ms: u64,
    /// Requests cost 1 to this many units each (a `cost` header; 0: no cost, one unit).
    cost_max: u64,
    /// Charged once the answer comes, this long after admission (0: at admission).
    late_ms: u64,
    /// Late charges: the share of answers `count_when` counts (percent; 100: a cost from the
    /// answer, 1 to `cost_max` units each).
    counted_percent: u64,
    /// A calendar day (`period: 1d`) in this time zone, and the end of the day the run
    /// crosses (ms since the epoch): a day of 23 or 25 hours.
    calendar: Option<(&'static str, u64)>,
    /// The calendar days the run touches (start, end), computed once.
    days: Vec<(u64, u64)>,
    /// The last instance starts this far into the run (0: with the others): until then it
    /// runs no round and takes no request, and the others count themselves without it.
    join_ms: u64,
    /// The most updates a part of a round carries (`usize::MAX`: one part; a gateway's 1,024,
    /// or `TOLLGATE_ROUND_PART_UPDATES`), and how many other tenants of the rule each
    /// instance sends a request every quarter interval, whose counters fill the rounds.
    part_updates: usize,
    fillers: usize,
}

/// Most decisions a seed may make (keeps the whole run within seconds).
const MAX_REQUESTS: f64 = 60_000.0;

impl Scenario {
    fn draw(seed: u64) -> Scenario {
        let mut r = Rng(seed);
        let instances = if r.below(5) == 0 {
            r.pick(&[2, 5, 10])
        } else {
            3
        };
        let threshold = if r.below(8) == 0 {
            r.log_uniform(5.0, 100.0) as u64
        } else {
            r.log_uniform(100.0, 100_000.0) as u64
        };
        let period_ms = r.pick(&[1000, 1000, 2000, 5000, 10_000, 60_000, 3_600_000]);
        let interval_ms = r.pick(&[1000, 1000, 1000, 500, 200]);
        let shape = r.pick(&[
            Shape::Even,
            Shape::Skewed,
            Shape::One,
            Shape::Bursts,
            Shape::Ramp,
            Shape::SomeIdle,
            Shape::Spikes,
            Shape::Spikes,
        ]);
        let faults = match r.below(10) {
            0 => Faults::SlowAndLost,
            1 if seed.is_multiple_of(2) => Faults::Failover,
            1 => Faults::Restart,
            2 => Faults::ShardDown,
            3 => Faults::Stall,
            _ => Faults::None,
        };
        // Redis next door, or up to 5 ms away each way
        let rtt_ms = r.pick(&[1, 2, 3, 5, 10]);
        // up to two whole windows of the short periods, a few seconds of the long ones
        let span_ms = if period_ms <= 10_000 {
            2 * period_ms
        } else {
            3000 + r.below(2000)
        };
        let phase_ms = r.below(period_ms);
        // from 10 requests/s to wrk rates, but never more than MAX_REQUESTS in the span
        let mut rate = r.log_uniform(10.0, 75_000.0);
        rate = rate.min(MAX_REQUESTS * 1000.0 / span_ms as f64);
        let algo = r.below(4);
        Scenario {
            seed,
            instances,
            sliding: algo == 0,
            bucket: algo == 1,
            queue: None,
            log: false,
            threshold,
            period_ms,
            interval_ms,
            timeout_ms: 100,
            rtt_ms,
            rate,
            shape,
            warm: r.below(2) == 0,
            faults,
            span_ms,
            phase_ms,
            cost_max: 0,
            late_ms: 0,
            counted_percent: 100,
            calendar: None,
            days: Vec::new(),
            join_ms: 0,
            part_updates: usize::MAX,
            fillers: 0,
        }
    }

    /// The same fleet and load as `draw`, beside 4 to 12 other tenants of the rule (each
    /// instance sends each of them a request every quarter interval), in rounds of parts of 1
    /// to 3 updates: a periodic round goes in several parts, and a round asked for at once (a
    /// quiet tenant's first request in its window: the others' first ones, each window) runs
    /// whole between two of them, as `SyncService::round` does.
    fn draw_parts(seed: u64) -> Scenario {
        let mut s = Scenario::draw(seed);
        let mut r = Rng(seed ^ 0x9A27);
        s.part_updates = 1 + r.below(3) as usize;
        s.fillers = 4 + r.below(9) as usize;
        s
    }

    /// The same fleet and load as `draw`, on a fixed window of one calendar day (`1d`) in a
    /// zone whose clocks change that day, the run crossing its end (local midnight) half-way.
    fn draw_calendar(seed: u64) -> Scenario {
        let mut s = Scenario::draw(seed);
        let mut r = Rng(seed ^ 0xCA1E);
        // (zone, the end of a day of 23 or 25 hours in it: `date -u -d ... +%s`)
        let day = r.pick(&[
            ("Europe/Berlin", 1_774_821_600_000), // 2026-03-29, 23 h, ends 22:00 UTC
            ("Europe/Berlin", 1_792_969_200_000), // 2026-10-25, 25 h, ends 23:00 UTC
            ("America/New_York", 1_793_595_600_000), // 2026-11-01, 25 h, ends 05:00 UTC
            ("Australia/Adelaide", 1_775_399_400_000), // 2026-04-05, 25 h, ends 14:30 UTC
        ]);
        s.sliding = false;
        s.bucket = false;
        s.period_ms = 86_400_000;
        s.span_ms = 3000 + r.below(2000);
        s.phase_ms = 0;
        s.rate = s.rate.min(MAX_REQUESTS * 1000.0 / s.span_ms as f64);
        s.calendar = Some(day);
        let cal = Calendar::new(CalendarUnit::Day, day.0).expect("a zone");
        s.days = vec![cal.window_of(day.1 - 1), cal.window_of(day.1)];
        s
    }

    /// The same fleet and load as `draw`, on a small fixed window (5 to 500, which takes
    /// parts when filling), the instances meeting at the start, the last one starting 100 ms
    /// to 3 s after the others: one that took its part while it counted itself alone may hold
    /// the whole window when it comes (`tests/outcomes.rs`' `a_fleet_takes_late_charges` once
    /// refused under the quota so).
    fn draw_join(seed: u64) -> Scenario {
        let mut s = Scenario::draw(seed);
        let mut r = Rng(seed ^ 0x301E);
        s.sliding = false;
        s.bucket = false;
        s.warm = false;
        s.instances = s.instances.max(2);
        s.threshold = r.log_uniform(5.0, 500.0) as u64;
        s.period_ms = r.pick(&[10_000, 60_000, 3_600_000]);
        s.span_ms = s.span_ms.max(4000);
        s.phase_ms %= s.period_ms;
        s.join_ms = 100 + r.below(2900);
        // from a few requests a second to ten times the threshold a window
        let most = 10.0 * s.threshold as f64 * 1000.0 / s.period_ms as f64;
        s.rate = r.log_uniform(2.0, most.max(4.0));
        // a third charged once the answer comes, `count_when` counting some answers (an
        // instance whose answers were not counted holds its part with nothing to report)
        if r.below(3) == 0 {
            s.late_ms = r.pick(&[2, 20, 100]);
            s.counted_percent = r.pick(&[0, 10, 50]);
        }
        s
    }

    /// The same fleet and load as `draw`, on a leaky bucket whose queue is its threshold (the
    /// default), half of it or a tenth.
    fn draw_leaky(seed: u64) -> Scenario {
        let mut s = Scenario::draw(seed);
        let mut r = Rng(seed ^ 0x1EA4);
        s.sliding = false;
        s.bucket = true;
        let t = s.threshold;
        s.queue = Some(r.pick(&[t, t, t / 2, t / 10]));
        s
    }

    /// The same fleet and load as `draw`, on a sliding log (thresholds up to its most, 10,000).
    fn draw_log(seed: u64) -> Scenario {
        let mut s = Scenario::draw(seed);
        s.sliding = true;
        s.bucket = false;
        s.log = true;
        s.threshold = s.threshold.min(10_000);
        s
    }

    /// What the fleet's one bucket holds when full: a token bucket's threshold, a leaky
    /// bucket's queue and the turn leaving now, or a fiftieth of its threshold if that is more
    /// (so that leases flow however small the queue: `algorithm::fleet_tolerance_ns`).
    fn capacity(&self) -> f64 {
        self.queue
            .map_or(self.threshold, |q| (q + 1).max(self.threshold / 50)) as f64
    }

    /// The window holding `now`: start and end.
    fn window_of(&self, now: u64) -> (u64, u64) {
        if let Some(&day) = self.days.iter().find(|(a, b)| (*a..*b).contains(&now)) {
            return day;
        }
        match self.calendar {
            Some((tz, _)) => Calendar::new(CalendarUnit::Day, tz)
                .expect("a zone")
                .window_of(now),
            None => {
                let start = now / self.period_ms * self.period_ms;
                (start, start + self.period_ms)
            }
        }
    }

    /// The end of the window starting at `start`.
    fn window_end(&self, start: u64) -> u64 {
        self.window_of(start).1
    }

    /// The same fleet and load as `draw`, each request charged once its answer comes
    /// (`late_ms` after admission, from 2 ms to half a second): either `count_when` counting
    /// some of the answers, or a cost the answer carries (1 to `cost_max` units, as in
    /// `draw_cost`).
    fn draw_late(seed: u64) -> Scenario {
        let mut s = Scenario::draw_cost(seed);
        let mut r = Rng(seed ^ 0x1A7E);
        s.late_ms = r.pick(&[2, 5, 20, 100, 500]);
        if r.below(2) == 0 {
            s.cost_max = 0;
            s.counted_percent = r.pick(&[10, 50, 100]);
        }
        s
    }

    /// The same fleet and load as `draw`, each request costing 1 to `cost_max` units (a
    /// `cost: { header }` rule; `cost_max` up to a tenth of the threshold, at most 20).
    fn draw_cost(seed: u64) -> Scenario {
        let mut s = Scenario::draw(seed);
        let most = (s.threshold / 10).clamp(1, 20);
        s.cost_max = 1 + Rng(seed ^ 0xC057).below(most);
        s
    }

    /// What one request may take beyond a count of requests: its units.
    fn units(&self) -> u64 {
        self.cost_max.max(1)
    }

    /// Requests per ms offered to instance `i` at `t` ms into the run.
    fn rate_of(&self, i: usize, t: u64, bursts: &[(u64, u64, usize)]) -> f64 {
        let per_ms = self.rate / 1000.0;
        let n = self.instances;
        match self.shape {
            Shape::Even => per_ms / n as f64,
            Shape::Swaying => {
                let turn = t as f64 / 7000.0 + i as f64 / n as f64;
                per_ms / n as f64 * (1.0 + 0.3 * (std::f64::consts::TAU * turn).sin())
            }
            Shape::Skewed => match i {
                0 => per_ms * 0.9,
                1 => per_ms * 0.1,
                _ => 0.0,
            },
            Shape::One => {
                if i == 0 {
                    per_ms
                } else {
                    0.0
                }
            }
            Shape::Ramp => per_ms / n as f64 * 2.0 * t as f64 / self.span_ms as f64,
            Shape::SomeIdle => {
                if i < n.div_ceil(2) {
                    per_ms / n.div_ceil(2) as f64
                } else {
                    0.0
                }
            }
            Shape::Bursts => bursts
                .iter()
                .find(|(a, b, who)| *who == i && (*a..*b).contains(&t))
                .map_or(0.0, |_| per_ms * 3.0),
            // the spikes come on their own
            Shape::Spikes => 0.0,
        }
    }
}

/// The hashes of a simulated Redis, by key.
type Hashes = HashMap<String, HashMap<String, i64>>;

/// The simulated Redis: the ledger model, the heartbeat set, and faults.
#[derive(Default)]
struct SimRedis {
    strings: HashMap<String, i64>,
    hashes: Hashes,
    beats: HashMap<String, u64>,
    /// The waiting marks (`Heartbeat::waiting_key`): when each member was marked.
    waiting: HashMap<String, u64>,
    down_until: u64,
    restarted: bool,
    /// The tenant's node does not answer in [from, until).
    shard_down: (u64, u64),
    /// Redis runs nothing in these spans [from, until) (a stall): what arrives waits.
    stalls: Vec<(u64, u64)>,
    /// Rounds that reach Redis after their sender gave up on them: (when, instance, marks,
    /// updates, heartbeat).
    late: Vec<LateRound>,
    /// Each instance's round marks (`backend::journal`).
    marks: HashMap<usize, Vec<u64>>,
    /// What the waits channel carries (`backend::WAITS_CHANNEL`): when it was published, by
    /// whom, the count keys waited on.
    published: Vec<(u64, String, Vec<String>)>,
}

/// A round that reaches Redis after its sender gave up on it: when, from which instance, its
/// marks, updates and heartbeat.
type LateRound = (u64, usize, SimMarks, Vec<Update>, Option<Heartbeat>);

/// What Redis keeps: its strings, its hashes, each instance's round marks.
type RedisData = (HashMap<String, i64>, Hashes, HashMap<usize, Vec<u64>>);

/// What a round carries of its marks, as `backend::single` sends them: whether it checks the
/// kept rounds first, its own mark, the mark it reads back.
#[derive(Debug, Clone, Copy, Default)]
struct SimMarks {
    check: bool,
    seq: Option<u64>,
    probe: Option<u64>,
}

impl SimRedis {
    /// Run instance `i`'s round with its marks, as `backend::single` does on one connection:
    /// the check of the kept rounds and the repair first (when the round checks), then the
    /// round with its plain increments and its mark, all or nothing. `None` while Redis is
    /// down; with the round's answer, what became of its mark and whether Redis held the mark
    /// it reads back.
    fn run_marked(
        &mut self,
        i: usize,
        journal: &mut Journal,
        m: SimMarks,
        updates: &[Update],
        hb: Option<&Heartbeat>,
        now: u64,
    ) -> Option<(Exchange, Marked, Option<bool>)> {
        if now < self.down_until {
            return None;
        }
        if m.check {
            let marks = self.marks.get(&i).cloned().unwrap_or_default();
            if let Repair::Again(seq, again) = journal.repair(&marks, now, m.seq) {
                for c in &again {
                    if std::env::var("FLEET_SIM_TRACE").is_ok() {
                        eprintln!("{now} i{i} repair count {} {}", c.key, c.delta);
                    }
                    count_model(&mut self.strings, c);
                }
                self.marks.entry(i).or_default().push(seq);
                journal.answered(Some(seq), Marked::Applied, &[], now);
            }
        }
        let held = m
            .probe
            .map(|p| self.marks.get(&i).is_some_and(|v| v.contains(&p)));
        let ex = self.run(updates, hb, now)?;
        // (a node down answers nothing of the transaction: none of it ran)
        let applied = ex.answers.iter().all(Option::is_some);
        let marked = if applied {
            if let Some(seq) = m.seq {
                self.marks.entry(i).or_default().push(seq);
            }
            Marked::Applied
        } else {
            Marked::Refused
        };
        Some((ex, marked, held))
    }

    /// Run a round; `None` while Redis is down (the connection is refused: nothing applied).
    fn run(&mut self, updates: &[Update], hb: Option<&Heartbeat>, now: u64) -> Option<Exchange> {
        if now < self.down_until {
            return None;
        }
        let shard_down = (self.shard_down.0..self.shard_down.1).contains(&now);
        let answers = updates
            .iter()
            .map(|u| (!shard_down).then(|| update_model(&mut self.strings, &mut self.hashes, u)))
            .collect();
        // the heartbeat's commands as Redis runs them, read by the gateway's own `beat_reply`
        let told = hb.map(|hb| {
            for key in &hb.waits {
                let member = hb.wait_member(key);
                self.waiting.insert(member, hb.now_ms);
            }
            let mut replies = Vec::new();
            if !hb.waits.is_empty() {
                replies.extend([Value::Int(hb.waits.len() as i64), Value::Int(1)]);
                if hb.publish {
                    self.published
                        .push((now, hb.instance.clone(), hb.waits.clone()));
                    replies.push(Value::Int(0));
                }
            }
            if hb.beat {
                self.beats.insert(hb.instance.clone(), hb.now_ms);
                let live = self
                    .beats
                    .values()
                    .filter(|&&t| t + hb.liveness_ms > hb.now_ms)
                    .count();
                let old = hb.now_ms.saturating_sub(WAIT_MARK_MS);
                self.waiting.retain(|_, t| *t > old);
                let marks = self
                    .waiting
                    .keys()
                    .map(|m| Value::BulkString(m.clone().into_bytes()))
                    .collect();
                replies.extend([Value::Int(1), Value::Int(0), Value::Int(1), Value::Nil]);
                replies.extend([Value::Int(0), Value::Array(marks), Value::Int(live as i64)]);
            }
            beat_reply(hb, &replies).0
        });
        let (instances, waited) = told.map_or((None, Vec::new()), |t| (t.instances, t.waited));
        Some(Exchange {
            answers,
            instances,
            waited,
            ..Exchange::default()
        })
    }
}

struct InFlight {
    round: Round,
    marks: SimMarks,
    /// Where the round goes on after this part (none: its last).
    rest: Option<Cursor>,
    /// When Redis runs it, when the reply is back, and when the instance gives up.
    apply_at: u64,
    reply_at: u64,
    timeout_at: u64,
    lost: bool,
    result: Option<Option<(Exchange, Marked, Option<bool>)>>,
}

struct Instance {
    /// Requests held for the fleet (`Verdict::Hold`): when each arrived, and until when it
    /// waits.
    held: std::collections::VecDeque<(u64, u64, u64)>,
    limiter: Limiter,
    accounts: Accounts,
    fleet: Arc<Fleet>,
    schedule: Schedule,
    flight: Option<InFlight>,
    /// The rounds begun: the one the part in flight belongs to last; before it, a round that
    /// goes on once the round at once between its parts is done (periodic, where it goes on,
    /// and what runs between its parts).
    levels: Vec<(bool, Option<Cursor>, Between)>,
    /// Its rounds' plain increments and their marks, as `backend::single` keeps them.
    journal: Journal,
    /// When Redis runs the last round this instance sent.
    applied_until: u64,
    rounds: u64,
    acc: f64,
}

fn config_text(s: &Scenario) -> String {
    format!(
        r#"
server: {{ listen: ["127.0.0.1:1"] }}
upstreams: {{ app: {{ servers: ["127.0.0.1:2"] }} }}
routes: [{{ id: all, path: /**, upstream: app }}]
tenant: {{ from: [{{ header: x-org-id, trusted: true }}] }}
limits:
  - id: sim
    pathPattern: /**
    algorithm: {algo}
    tiers: [{{ period: {p}, threshold: {t} }}]{cost}{calendar}
redis:
  url: redis://127.0.0.1:1
  sync_interval: {i}ms
  timeout: {to}ms
  key_prefix: sim
"#,
        algo = if s.log {
            "sliding_log"
        } else if s.sliding {
            "sliding_window"
        } else if s.queue.is_some() {
            "leaky_bucket"
        } else if s.bucket {
            "token_bucket"
        } else {
            "fixed_window"
        },
        p = if s.calendar.is_some() {
            "1d".to_string()
        } else {
            format!("{}ms", s.period_ms)
        },
        t = s.threshold,
        i = s.interval_ms,
        to = s.timeout_ms,
        cost = match (s.cost_max, s.late_ms) {
            (0, 0) => String::new(),
            (0, _) => "\n    count_when: { status: [500] }".to_string(),
            (m, 0) => format!("\n    cost: {{ header: x-cost, max: {m} }}"),
            (m, _) => format!("\n    cost: {{ response_header: x-cost, max: {m} }}"),
        },
        calendar = match (s.calendar, s.queue) {
            (Some((tz, _)), _) => format!("\n    calendar: {{ tz: {tz} }}"),
            (None, Some(q)) => format!("\n    queue: {q}"),
            (None, None) => String::new(),
        },
    )
}

#[derive(Debug, Default)]
struct Outcome {
    /// Admitted per window start, offered per window start.
    admitted: BTreeMap<u64, u64>,
    offered: BTreeMap<u64, u64>,
    /// Sliding windows: the largest estimate (previous x weight + current) seen at an
    /// admission, per window.
    estimate: BTreeMap<u64, f64>,
    /// Sliding logs: the largest span as Redis counts it (`span_late`), per window.
    estimate_late: BTreeMap<u64, f64>,
    max_rounds_per_s: f64,
    /// Rounds of more than one part, and rounds at once run between two parts of another.
    multi_part: u64,
    between: u64,
    /// Token buckets: the most admitted since the start beyond what one bucket allows (full
    /// at the start, refilled `threshold` per period), and what was admitted over the run.
    bucket_excess: f64,
    bucket_admitted: u64,
    /// Token buckets: admitted after the first period (the steady refill).
    bucket_admitted_late: u64,
    redis: HashMap<String, i64>,
    restarted: bool,
    /// Refusals while the fleet had admitted at most 0.9 x threshold (the request included;
    /// sliding windows: the weighted count; token buckets: while the fleet's bucket kept 0.1 x
    /// threshold), made with Redis answering: (ms into the run, instance, the fleet's count).
    false_refusals: Vec<(u64, usize, f64)>,
    /// The same, made under `on_failure` (a round failed, or a request waited past its hold
    /// in a seed with faults).
    failure_refusals: u64,
    refusals: u64,
    /// Updates sent to Redis (one script call each), and requests admitted.
    updates: u64,
    total_admitted: u64,
    /// The longest a request was held (ms), and how long each held request was (ms).
    longest_hold: u64,
    holds: Vec<u64>,
    /// Script calls and plain increments sent, by second of the run.
    updates_by_second: Vec<u64>,
    /// The first ms of the run.
    t0: u64,
    /// Late charges: the most units owed by requests in flight on one instance at one moment
    /// of a window, by (window, instance).
    in_flight_by: BTreeMap<(u64, usize), u64>,
    /// Sliding logs: the fleet's admissions of the last period (ms, units), and their sum.
    span: std::collections::VecDeque<(u64, u64)>,
    span_sum: u64,
    /// The same as Redis counts them: a unit in the span until its hundredth of the window
    /// ends and a period (when it leaves, units).
    span_late: std::collections::VecDeque<(u64, u64)>,
    span_late_sum: u64,
}

impl Outcome {
    /// Late charges: what the instances had in flight in window `w`, each at its most.
    fn owed(&self, w: u64) -> u64 {
        self.in_flight_by
            .range((w, 0)..(w + 1, 0))
            .map(|(_, &u)| u)
            .sum()
    }
}

/// The part of the previous window's fleet count that still weighs at `now` (sliding windows).
fn previous_weight(out: &Outcome, s: &Scenario, window: u64, now: u64) -> f64 {
    let prev = *out
        .admitted
        .get(&window.wrapping_sub(s.period_ms))
        .unwrap_or(&0) as f64;
    prev * (s.period_ms - (now - window)) as f64 / s.period_ms as f64
}

/// The first tier of the tenant's counter on an instance (for the trace).
fn first_state(limiter: &Limiter) -> Option<tollgate::limits::algorithm::TierState> {
    let mut st = None;
    limiter.core.limits[0].counters.for_each(|k, c| {
        if k == b"\0acme" {
            st = Some(c.tiers[0]);
        }
    });
    st
}

/// Send a part of a round of instance `inst`, as `backend::single`
/// does: its plain increments kept and marked, a round trip drawn (and, with `SlowAndLost`,
/// its reply lost or late), behind what the instance sent before on its one connection.
fn launch(
    inst: &mut Instance,
    round: Round,
    s: &Scenario,
    rng: &mut Rng,
    (now, step): (u64, u64),
    out: &mut Outcome,
) {
    out.updates += round.updates.len() as u64;
    let second = (step / 1000) as usize;
    if out.updates_by_second.len() <= second {
        out.updates_by_second.resize(second + 1, 0);
    }
    out.updates_by_second[second] += round.updates.len() as u64;
    // as `backend::single` marks a round (its I/O at the round's turn in Redis)
    let counts = round
        .updates
        .iter()
        .filter_map(|u| match u {
            Update::Count(c) => Some(c.clone()),
            Update::Lease(_) => None,
        })
        .collect();
    let check = inst.journal.wants_check();
    let seq = inst.journal.begin(counts, now);
    let probe = inst.journal.probe().map(|(p, _)| p);
    let marks = SimMarks { check, seq, probe };
    let latency = s.rtt_ms + rng.below(s.rtt_ms / 2 + 1);
    let rest = round.rest;
    let mut f = InFlight {
        round,
        marks,
        rest,
        apply_at: now + latency / 2,
        reply_at: now + latency,
        timeout_at: now + s.timeout_ms,
        lost: false,
        result: None,
    };
    if s.faults == Faults::SlowAndLost {
        match rng.below(20) {
            0 => f.lost = true,
            1 => {
                f.apply_at = now + s.timeout_ms / 2 + rng.below(s.timeout_ms);
                f.reply_at = f.apply_at + 1;
            }
            _ => {}
        }
    }
    // one connection: Redis runs an instance's rounds in the order sent (a round sent after
    // one given up on runs after it)
    if f.apply_at < inst.applied_until {
        f.reply_at += inst.applied_until - f.apply_at;
        f.apply_at = inst.applied_until;
    }
    inst.applied_until = f.apply_at;
    inst.flight = Some(f);
}

/// A part of instance `inst`'s round ended (`rest`: where its round goes on; `ok`: Redis
/// answered it), and it goes on as `SyncService::round` does: the next part, or first a
/// round asked for at once, whole, between two parts of the outermost round (an early round
/// for the schedule); after a round at once, the round it ran within. Returns whether a round
/// ended (held requests decide again, as at `Fleet::round_ended`); the outermost round's end
/// is the schedule's.
fn part_ended(
    inst: &mut Instance,
    (rest, ok): (Option<Cursor>, bool),
    (s, settings): (&Scenario, &RedisSettings),
    rng: &mut Rng,
    (now, step): (u64, u64),
    out: &mut Outcome,
) -> bool {
    let outermost = inst.levels.len() == 1;
    let Some(level) = inst.levels.last_mut() else {
        return false;
    };
    let periodic = level.0;
    if let Some(next) = rest.filter(|_| ok) {
        level.1 = Some(next);
        out.multi_part += 1;
        if outermost {
            inst.schedule.answered_part();
        }
        let (periodic, from) = if outermost && level.2.at_once(&inst.fleet) {
            inst.schedule.early_between(step);
            out.between += 1;
            inst.rounds += 1;
            inst.levels
                .push((false, None, Between::before(&inst.fleet, false)));
            (false, None)
        } else {
            (periodic, Some(next))
        };
        let round = inst
            .accounts
            .begin_part(settings, periodic, from, s.part_updates);
        launch(inst, round, s, rng, (now, step), out);
        return false;
    }
    inst.levels.pop();
    match inst.levels.last() {
        Some(&(periodic, from, _)) => {
            // the round at once is done: the round it ran within goes on
            let round = inst
                .accounts
                .begin_part(settings, periodic, from, s.part_updates);
            launch(inst, round, s, rng, (now, step), out);
        }
        None => inst.schedule.finished(ok, s.interval_ms, periodic),
    }
    true
}

fn simulate(s: &Scenario) -> Outcome {
    let cfg = config::load_str(Path::new("sim.yaml"), &config_text(s)).expect("valid config");
    let settings: RedisSettings = cfg.redis.clone().expect("redis section");
    let mut rng = Rng(s.seed ^ 0xA5A5_5A5A);
    // start on a whole second plus the phase, far from the epoch
    let t0 = match s.calendar {
        // half-way through the run, the day ends
        Some((_, end)) => end - s.span_ms / 2,
        None => 1_800_000_000_000 / s.period_ms * s.period_ms + s.phase_ms,
    };
    let clock = Arc::new(FakeClock::at_ms(t0));
    let metrics = tollgate::metrics::Metrics::new().expect("metrics");
    // (`FLEET_SIM_NO_PUBSUB`: no instance listens on the waits channel, as where none can
    // subscribe)
    let listening = std::env::var_os("FLEET_SIM_NO_PUBSUB").is_none();
    let mut instances: Vec<Instance> = (0..s.instances)
        .map(|i| {
            // (keys hashed with the seed's own seeds: a seed of many tenants replays)
            let registry = Arc::new(
                CounterRegistry::new(metrics.evictions.clone(), metrics.untracked.clone())
                    .seeded(s.seed),
            );
            registry.set_syncing(true);
            let fleet = Arc::new(Fleet::default());
            fleet.configure(true, settings.on_failure);
            fleet.set_hold(hold_limit(settings.timeout));
            fleet.set_interval(settings.sync_interval.as_millis() as u64);
            let limiter = Limiter::build(
                &cfg.rules,
                &cfg.plans,
                &registry,
                &metrics.decisions,
                100_000,
                clock.clone(),
                fleet.clone(),
            );
            let accounts = Accounts::new(registry, fleet.clone(), clock.clone(), format!("i{i}"));
            accounts.set_subscribed(listening);
            Instance {
                held: Default::default(),
                limiter,
                accounts,
                fleet,
                schedule: Schedule::new(0),
                flight: None,
                levels: Vec::new(),
                journal: Journal::new(format!("sim:rounds:i{i}")),
                applied_until: 0,
                rounds: 0,
                acc: 0.0,
            }
        })
        .collect();
    let mut redis = SimRedis::default();
    if s.warm {
        // the instances have met before: the heartbeat set knows them all
        for (i, inst) in instances.iter().enumerate() {
            redis.beats.insert(format!("i{i}"), t0);
            inst.fleet.set_instances(s.instances as u64);
        }
    }
    let failover = s.faults == Faults::Failover;
    let restart_at =
        matches!(s.faults, Faults::Restart | Faults::Failover).then(|| 200 + rng.below(s.span_ms));
    // a failover: what the replica had when the primary failed, and how far it lagged
    let lag_ms = 1 + (s.seed / 2) % 50;
    let mut replica: Option<RedisData> = None;
    if failover && (s.seed / 2) % 2 == 1 {
        for inst in &instances {
            inst.fleet.set_plain_increments(false);
        }
    }
    if s.faults == Faults::ShardDown {
        let from = t0 + 200 + rng.below(s.span_ms);
        redis.shard_down = (from, from + 300 + rng.below(1500));
    }
    if s.faults == Faults::Stall {
        for _ in 0..3 {
            let from = t0 + 200 + rng.below(s.span_ms);
            let len = s.timeout_ms * (3 + rng.below(5)) / 10;
            redis.stalls.push((from, from + len));
        }
    }
    let mut bursts = Vec::new();
    let mut t = 0;
    while t < s.span_ms {
        let len = 100 + rng.below(400);
        bursts.push((t, t + len, rng.below(s.instances as u64) as usize));
        t += len + rng.below(600);
    }
    // spikes: (ms into the run, instance, requests)
    let mut spikes: Vec<(u64, usize, u64)> = Vec::new();
    if s.shape == Shape::Spikes {
        let gap = (s.period_ms.min(s.span_ms) / 5).max(1);
        let size = (s.threshold / 5).max(1);
        let mut t = 300 + rng.below(gap);
        while t < s.span_ms {
            spikes.push((t, rng.below(s.instances as u64) as usize, size));
            t += gap;
        }
    }
    let mut out = Outcome {
        t0,
        ..Outcome::default()
    };
    let headers = HeaderMap::new();
    let method = Method::GET;
    let segments = tollgate::matching::Segments::new("/x");
    let ip = "10.0.0.1".parse().expect("ip");
    let req = LimitRequest {
        method: &method,
        host: None,
        path: &segments,
        tenant: b"acme",
        plan: None,
        client_ip: ip,
        headers: &headers,
    };
    let fillers: Vec<Vec<u8>> = (0..s.fillers)
        .map(|k| format!("filler-{k}").into_bytes())
        .collect();
    let trace = std::env::var("FLEET_SIM_TRACE").is_ok();
    let mut admitted_log: Vec<(u64, u64)> = Vec::new(); // (ms, window) of admissions, sliding
                                                        // (after a failover late in the span: until the retries, backing off up to 5 s apart,
                                                        // find Redis again, and a round after that)
    let flush_ms = 3 * s.interval_ms.max(1000)
        + 2 * s.timeout_ms
        + if s.faults == Faults::Failover {
            8000
        } else {
            0
        };
    // (`FLEET_SIM_HOLD_ONCE`: a hold of `timeout` plus the longest round trip, not given
    // again at rounds' ends)
    let once = std::env::var_os("FLEET_SIM_HOLD_ONCE").is_some();
    let hold_ms = if once {
        s.timeout_ms + s.rtt_ms + s.rtt_ms / 2
    } else {
        hold_limit(settings.timeout)
    };
    // refusals waiting to be judged: (when, refused at, instance, under on_failure, window)
    // (token buckets: the bucket's level then, and the tokens taken until then)
    #[allow(clippy::type_complexity)]
    let mut pending: Vec<(u64, u64, usize, bool, u64, f64, u64, u64)> = Vec::new();
    // the fleet's one true bucket (token buckets): full at the start
    let t = s.threshold as f64;
    let mut level = s.capacity();
    // late charges owed: (due, instance, decision, units), in the order they come due; and
    // their units
    let mut owed: std::collections::VecDeque<(u64, usize, tollgate::limits::Decision, u64)> =
        Default::default();
    let mut owed_by = vec![0u64; s.instances];
    for step in 0..s.span_ms + flush_ms {
        let now = t0 + step;
        clock.set_ms(now);
        if s.bucket {
            level = (level + t / s.period_ms as f64).min(s.capacity());
        }
        // sliding logs: what left the fleet's span (a unit admitted at t is in it until t + p)
        while out
            .span
            .front()
            .is_some_and(|&(at, _)| at + s.period_ms <= now)
        {
            if let Some((_, u)) = out.span.pop_front() {
                out.span_sum -= u;
            }
        }
        while out.span_late.front().is_some_and(|&(at, _)| at <= now) {
            if let Some((_, u)) = out.span_late.pop_front() {
                out.span_late_sum -= u;
            }
        }
        if failover && restart_at == Some(step + lag_ms) {
            replica = Some((
                redis.strings.clone(),
                redis.hashes.clone(),
                redis.marks.clone(),
            ));
        }
        if restart_at == Some(step) {
            if trace {
                eprintln!("{step} redis restarts (failover: {failover})");
            }
            let (strings, hashes, marks) = replica.take().unwrap_or_default();
            redis = SimRedis {
                marks,
                down_until: now + 300 + rng.below(1500),
                restarted: !failover,
                beats: HashMap::new(),
                stalls: std::mem::take(&mut redis.stalls),
                strings,
                hashes,
                ..SimRedis::default()
            };
        }
        let stalled_until = redis
            .stalls
            .iter()
            .find(|(a, b)| (*a..*b).contains(&now))
            .map(|&(_, b)| b);
        let late = std::mem::take(&mut redis.late);
        for (at, i, m, updates, hb) in late {
            if at <= now && stalled_until.is_none() {
                let journal = &mut instances[i].journal;
                redis.run_marked(i, journal, m, &updates, hb.as_ref(), now);
            } else {
                redis.late.push((at, i, m, updates, hb));
            }
        }
        // the waits channel: each message reaches the other instances' subscribers one way
        // later
        let published = std::mem::take(&mut redis.published);
        for (at, from, keys) in published {
            if at + s.rtt_ms / 2 <= now {
                for inst in instances
                    .iter()
                    .filter(|x| listening && x.accounts.instance != from)
                {
                    if trace {
                        eprintln!("{step} {} told {keys:?}", inst.accounts.instance);
                    }
                    inst.accounts.told(&keys);
                }
            } else {
                redis.published.push((at, from, keys));
            }
        }
        let window = s.window_of(now).0;
        // the answers of this ms: their late charges
        while owed.front().is_some_and(|&(due, ..)| due <= step) {
            let Some((_, i, mut d, units)) = owed.pop_front() else {
                break;
            };
            let mut h = HeaderMap::new();
            h.insert("x-cost", units.into());
            let status = if units > 0 { 500 } else { 200 };
            instances[i].limiter.charge_late(&mut d, status, &h);
            owed_by[i] -= units;
            if units > 0 {
                account(&mut out, s, &mut level, units, step);
                if s.sliding {
                    admitted_log.push((now, window));
                }
            }
        }
        // the refusals of this ms: (instance, made under on_failure)
        let mut refused_now: Vec<(usize, bool, u64)> = Vec::new();
        // refusals are judged a moment later: requests granted to other instances in the same
        // round trip are admitted a few ms after, and their order is the network's (the
        // contract's "at most 0.9 x threshold, the request included" among concurrent requests)
        let judge_ms = 2 * s.rtt_ms + MIN_ROUND_GAP_MS;
        for (i, inst) in instances.iter_mut().enumerate() {
            if i + 1 == s.instances && step < s.join_ms {
                // not started yet
                continue;
            }
            // 1. the round in flight
            let mut round_ended = false;
            if let Some(f) = &mut inst.flight {
                if let Some(until) = stalled_until {
                    // nothing runs while Redis stalls: what arrives is run when it ends
                    if f.result.is_none() && f.apply_at <= now {
                        let back = f.reply_at - f.apply_at;
                        f.apply_at = until;
                        f.reply_at = until + back;
                    }
                }
                if f.result.is_none() && now >= f.apply_at && stalled_until.is_none() {
                    let (updates, hb) = (&f.round.updates, f.round.heartbeat.as_ref());
                    f.result =
                        Some(redis.run_marked(i, &mut inst.journal, f.marks, updates, hb, now));
                }
                let back = f.result.as_ref().is_some_and(|r| r.is_some()) && !f.lost;
                // Redis down: the connection is refused at once, nothing was applied
                let refused = f.result.as_ref().is_some_and(|r| r.is_none());
                // Redis ran it (or refused it): it is not on its way any more
                let ran = f.result.is_some();
                let finished = if back && now >= f.reply_at && f.reply_at <= f.timeout_at {
                    let (ex, marked, held) = f.result.take().flatten().expect("an answer");
                    // as `backend::single` does with the answer
                    let j = &mut inst.journal;
                    j.answered(f.marks.seq, marked, &[], now);
                    j.settled();
                    if held == Some(false) {
                        j.lost_sight();
                    }
                    Some(Ok(ex))
                } else if refused && now >= f.reply_at {
                    inst.journal.unapplied(f.marks.seq);
                    Some(Err(RoundError {
                        message: "refused".into(),
                        unapplied: true,
                    }))
                } else if now >= f.timeout_at {
                    Some(Err(RoundError::from("timeout")))
                } else {
                    None
                };
                if let Some(outcome) = finished {
                    let Some(f) = inst.flight.take() else {
                        unreachable!()
                    };
                    // given up on, but on its way: Redis runs it later. Not a round that
                    // checks the marks first: the gateway sends the rest of it (the repair,
                    // the round) only when the read of the marks answers, and gave up before
                    // (`SingleRedis::marked_exchange`); run late here, its repair took the
                    // rounds begun since, still on their way, for lost and sent them twice
                    // (parts seed 950, with other changes: Redis held 172 for 171 admitted)
                    if !ran && !f.marks.check {
                        let (u, h) = (f.round.updates.clone(), f.round.heartbeat.clone());
                        redis.late.push((f.apply_at, i, f.marks, u, h));
                    }
                    if trace {
                        for (k, u) in f.round.updates.iter().enumerate() {
                            let a = outcome
                                .as_ref()
                                .ok()
                                .and_then(|ex| ex.answers.get(k).copied().flatten());
                            match u {
                                Update::Lease(u) => eprintln!(
                                    "{step} i{i} round {} used {} want {} need {} since {} level {level:.0} log {:?} from {} -> {a:?}", u.key,
                                    u.used, u.want, u.need, u.since_ms.saturating_sub(t0), u.log.units, u.log.from
                                ),
                                Update::Count(c) => eprintln!(
                                    "{step} i{i} round count {} {} first {} -> {a:?}",
                                    c.key, c.delta, c.first
                                ),
                            }
                        }
                    }
                    let rest = f.rest;
                    let done = inst.accounts.finish(f.round, &outcome);
                    let at = (now, step);
                    round_ended = part_ended(
                        inst,
                        (rest, done.ok),
                        (s, &settings),
                        &mut rng,
                        at,
                        &mut out,
                    );
                }
            }
            // 2. start a round when due
            if inst.flight.is_none() {
                let asked = Asked::of(&inst.fleet);
                let healthy = inst.fleet.is_connected();
                let ends = inst.accounts.ends_in_ms().map(|d| step + d);
                if step >= inst.schedule.due_or_end_ms(asked, healthy, ends) {
                    let periodic = inst.schedule.started(step);
                    inst.rounds += 1;
                    let between = Between::before(&inst.fleet, periodic);
                    inst.levels.push((periodic, None, between));
                    let round = inst
                        .accounts
                        .begin_part(&settings, periodic, None, s.part_updates);
                    launch(inst, round, s, &mut rng, (now, step), &mut out);
                }
            }
            // 3. the requests of this ms (once the instance is ready: its first round ended):
            // the held ones again when a round ended or their wait is over, then the new ones
            if inst.fleet.link() == Link::Unknown {
                continue;
            }
            // the rule's other tenants (`fillers`), a request each every quarter interval
            // (what they are answered is not this run's to judge; a held one is let go)
            let every = (s.interval_ms / 4).max(1);
            for (k, tenant) in fillers.iter().enumerate().filter(|_| step < s.span_ms) {
                if (step + 7 * k as u64 + 13 * i as u64).is_multiple_of(every) {
                    let req = LimitRequest { tenant, ..req };
                    inst.limiter.decide(&req, &cfg.plans);
                }
            }
            // (a held request waits while rounds end: each gives it the hold limit again, up to
            // four in all, as in the gateway)
            // (since, until, units)
            let mut arrivals: Vec<(Option<u64>, u64, u64)> = Vec::new();
            let held = std::mem::take(&mut inst.held);
            for (since, until, units) in held {
                if round_ended {
                    // (`once`: decided again all the same, its wait not lengthened)
                    let until = if once {
                        until
                    } else {
                        (step + hold_ms).min(since + 4 * hold_ms)
                    };
                    arrivals.push((Some(since), until, units));
                } else if step >= until {
                    arrivals.push((Some(since), until, units));
                } else {
                    inst.held.push_back((since, until, units));
                }
            }
            if step < s.span_ms {
                inst.acc += s.rate_of(i, step, &bursts) * (0.5 + rng.unit());
                let mut n = inst.acc.floor() as u64;
                inst.acc -= n as f64;
                n += spikes
                    .iter()
                    .filter(|&&(at, who, _)| at == step && who == i)
                    .map(|&(_, _, k)| k)
                    .sum::<u64>();
                for _ in 0..n {
                    let units = if s.cost_max > 0 {
                        1 + rng.below(s.cost_max)
                    } else if s.late_ms > 0 {
                        // count_when: the answers it counts
                        u64::from(rng.below(100) < s.counted_percent)
                    } else {
                        1
                    };
                    *out.offered.entry(window).or_default() += units;
                    arrivals.push((None, step + hold_ms, units));
                }
            }
            for (since, until, units) in arrivals {
                let waited_out = since.is_some() && step >= until;
                let mut cost_headers = HeaderMap::new();
                // what admission checks room for (a charge from the answer: one unit)
                let checked = if s.late_ms > 0 { 1 } else { units };
                if s.cost_max > 0 && s.late_ms == 0 {
                    cost_headers.insert("x-cost", units.into());
                }
                let req = LimitRequest {
                    headers: &cost_headers,
                    ..req
                };
                let d = if waited_out {
                    inst.limiter.decide_after_hold(&req, &cfg.plans)
                } else if since.is_some() {
                    inst.limiter.decide_again(&req, &cfg.plans)
                } else {
                    inst.limiter.decide(&req, &cfg.plans)
                };
                if d.verdict == Verdict::Hold {
                    inst.held.push_back((since.unwrap_or(step), until, units));
                    continue;
                }
                if let Some(at) = since {
                    let held = step.saturating_sub(at);
                    out.longest_hold = out.longest_hold.max(held);
                    out.holds.push(held);
                }
                if d.verdict != Verdict::Allow {
                    out.refusals += 1;
                    // judged a round trip later (see `judge_ms`)
                    // under on_failure: a hold waited out under faults (with Redis answering
                    // and no fault, a hold waited out is no excuse: the contract's "no
                    // refusal under 0.9 x threshold" holds; but not yet for a sliding log,
                    // whose span counts the previous window's unused leases of the other
                    // instances until their periodic rounds give them back: seed 351 of
                    // `sliding_logs_keep_the_bounds_over_many_seeds` waits them out and is
                    // refused), Redis down, or (Redis Cluster) the counter's own node silent
                    // at its last round
                    let failure = (waited_out && (s.faults != Faults::None || s.log))
                        || !inst.fleet.is_connected()
                        || first_state(&inst.limiter).is_some_and(|st| st.ledger.unreachable);
                    refused_now.push((i, failure, checked));
                    if trace {
                        let st = first_state(&inst.limiter);
                        eprintln!("{step} i{i} refused: retry {} {st:?}", d.retry_after_ms());
                    }
                    continue;
                }
                if s.late_ms > 0 {
                    // charged when its answer comes
                    owed.push_back((step + s.late_ms, i, d, units));
                    owed_by[i] += units;
                    if trace {
                        eprintln!("{step} i{i} admitted, owes {units}");
                    }
                    continue;
                }
                account(&mut out, s, &mut level, units, step);
                if s.sliding {
                    admitted_log.push((now, window));
                }
                if trace {
                    eprintln!("{step} i{i} {:?}", first_state(&inst.limiter));
                }
            }
        }
        // the refusals of this ms against the fleet's count, as the contract measures it (the
        // request included; under 100, one request per instance either way, as for the upper
        // bound)
        pending.extend(refused_now.into_iter().map(|(i, failure, units)| {
            // token buckets: the level; sliding windows: the previous window's weight
            let then = if s.log {
                out.span_late_sum as f64
            } else if s.sliding {
                previous_weight(&out, s, window, now)
            } else {
                level
            };
            // token buckets: the tokens taken until then; late charges: what the window had
            // counted and what the requests in flight owed then (they are charged, whatever
            // comes after)
            let taken = if s.bucket {
                out.bucket_admitted
            } else if s.log {
                out.total_admitted
            } else if s.late_ms > 0 {
                out.admitted.get(&window).copied().unwrap_or(0) + owed_by.iter().sum::<u64>()
            } else {
                0
            };
            (
                step + judge_ms,
                step,
                i,
                failure,
                window,
                then,
                taken,
                units,
            )
        }));
        let last_ms_of = |w: u64| s.window_end(w) - 1;
        let due: Vec<_> = pending
            .iter()
            .copied()
            .filter(|&(at, _, _, _, w, _, _, _)| t0 + at <= now || now >= last_ms_of(w))
            .collect();
        pending.retain(|&(at, _, _, _, w, _, _, _)| !(t0 + at <= now || now >= last_ms_of(w)));
        for (_, refused_at, i, failure, window, then, taken, units) in due {
            let u = units as f64;
            let cur = *out.admitted.get(&window).unwrap_or(&0) as f64;
            let cur = if s.late_ms > 0 && !s.bucket {
                cur.max(taken as f64)
            } else {
                cur
            };
            // under 100, one request per instance (a lease is never split finer); with costs,
            // one of the largest requests per other instance (what the others hold leased may
            // not fit a request whole); else none (no credit at any threshold)
            let small = if s.threshold < 100 {
                (s.instances as u64 * s.units()) as f64
            } else if s.cost_max > 0 {
                ((s.instances as u64 - 1) * s.units()) as f64
            } else {
                0.0
            };
            let (count, under) = if s.bucket {
                // the level then, less what was taken since (not the refill since)
                let level = then - (out.bucket_admitted - taken) as f64;
                let spare = SPARE_PERCENT as f64 / 100.0;
                (t - level, level - u >= (0.1 + spare) * t + small)
            } else if s.log {
                // the fleet's span then, and what it admitted since
                let e = then + (out.total_admitted - taken) as f64 + u;
                (e, e <= 0.9 * t - small)
            } else if s.sliding {
                // the previous window's weight then, and this window's count since
                let e = then + cur + u;
                (e, e <= 0.9 * t - small)
            } else {
                (cur + u, cur + u <= 0.9 * t - small)
            };
            match (under, failure) {
                (false, _) => {}
                (true, true) => out.failure_refusals += 1,
                (true, false) => out.false_refusals.push((refused_at, i, count)),
            }
        }
        // each instance's most owed in the window, summed over the instances
        for (i, &units) in owed_by.iter().enumerate() {
            let most = out.in_flight_by.entry((window, i)).or_default();
            *most = (*most).max(units);
        }
        // sliding logs: the span as Redis counts it, at every ms (the lower bound's: a window
        // whose span the previous window's last units filled admits nothing, and is full)
        if s.log {
            let e = out.estimate_late.entry(window).or_default();
            *e = e.max(out.span_late_sum as f64);
        }
        // sliding windows: the fleet's estimate at each admission of this ms
        if s.sliding && admitted_log.last().is_some_and(|&(ms, _)| ms == now) {
            let weighted = previous_weight(&out, s, window, now);
            let cur = *out.admitted.get(&window).unwrap_or(&0) as f64;
            // (a log: the fleet's span, exactly)
            let now_e = if s.log {
                out.span_sum as f64
            } else {
                weighted + cur
            };
            let e = out.estimate.entry(window).or_default();
            *e = e.max(now_e);
            if trace {
                eprintln!(
                    "{step} estimate {:.1} (previous {weighted:.1}, cur {cur}; span {})",
                    weighted + cur,
                    out.span_sum
                );
            }
        }
    }
    let seconds = (s.span_ms + flush_ms) as f64 / 1000.0;
    out.max_rounds_per_s = instances
        .iter()
        .map(|i| i.rounds as f64 / seconds)
        .fold(0.0, f64::max);
    out.redis = redis.strings;
    out.restarted = redis.restarted;
    out
}

/// Count `units` admitted (or charged late) at `step` ms into the run.
fn account(out: &mut Outcome, s: &Scenario, level: &mut f64, units: u64, step: u64) {
    let t = s.threshold as f64;
    let now = out.t0 + step;
    out.total_admitted += units;
    *out.admitted.entry(s.window_of(now).0).or_default() += units;
    if s.log {
        out.span.push_back((now, units));
        out.span_sum += units;
        let (start, end) = s.window_of(now);
        let bucket = tollgate::limits::sliding_log::bucket_ms(end - start);
        let leaves = start + ((now - start) / bucket + 1) * bucket + s.period_ms;
        out.span_late.push_back((leaves, units));
        out.span_late_sum += units;
    }
    if s.bucket {
        *level -= units as f64;
        out.bucket_admitted += units;
        if step >= s.period_ms {
            out.bucket_admitted_late += units;
        }
        let allows = s.capacity() + t * step as f64 / s.period_ms as f64;
        out.bucket_excess = out.bucket_excess.max(out.bucket_admitted as f64 - allows);
    }
}

/// Check one seed; the reasons it fails.
fn check(s: &Scenario, o: &Outcome) -> Vec<String> {
    let mut why = Vec::new();
    let t = s.threshold;
    let n = s.instances as u64;
    // docs/fleet.md, "The bound": the threshold (no credit at any threshold: the leases alone,
    // and direct records within what the script keeps out of leases for them); with costs,
    // one of the largest requests, whose units may not fit whole
    let slack = if s.cost_max > 0 { s.units() } else { 0 };
    let reachable = s.faults == Faults::None;
    // late charges: also what the requests in flight owed (docs/configuration.md, "Cost from
    // the answer": the count passes the threshold by at most that)
    // (what the instances had in flight, each at its most in the window; measured over 4,000
    // seeds: at most 1.0014 x that beside the threshold and the slack; asserted: 1.01 x)
    let owed = |w: u64| o.owed(w) * 101 / 100;
    let most_owed = o
        .in_flight_by
        .keys()
        .map(|&(w, _)| o.owed(w))
        .max()
        .unwrap_or(0);
    if reachable && s.bucket && o.bucket_excess > (slack + most_owed) as f64 {
        why.push(format!(
            "the bucket admitted {:.1} more than one bucket allows",
            o.bucket_excess
        ));
    }
    for (&w, &admitted) in &o.admitted {
        if reachable && !s.sliding && !s.bucket && admitted > t + slack + owed(w) {
            why.push(format!(
                "window {w}: admitted {admitted} > {t} + {slack} + {} owed in flight",
                owed(w)
            ));
        }
        // the tenant's node down, the rest of Redis up: that counter falls back to
        // local_share. An instance that had an answer in the window keeps its lease and takes
        // its part of what nobody held; one that had none takes threshold / instances, not
        // knowing what the others admitted before the node failed. So the window in which
        // the node fails may admit up to twice the threshold; a window that starts while it
        // is down, one threshold.
        if s.faults == Faults::ShardDown
            && !s.sliding
            && !s.bucket
            && admitted > 2 * t + slack + n + owed(w)
        {
            why.push(format!(
                "window {w}: shard down: admitted {admitted} > 2 x {t} + {slack} + {n}"
            ));
        }
    }
    for (&w, &e) in &o.estimate {
        let owed = owed(w) + owed(w.wrapping_sub(s.period_ms));
        if reachable && e > (t + slack + owed) as f64 + 1e-9 {
            why.push(format!(
                "window {w}: sliding estimate {e:.1} > {t} + {slack} + {owed} owed in flight"
            ));
        }
    }
    // the lower bound, in whole windows offered 1.5x the threshold all along
    let first = o.offered.keys().next().copied();
    for (&w, &offered) in &o.offered {
        let whole =
            Some(w) != first && s.window_end(w) <= o.offered.keys().last().copied().unwrap_or(0);
        let steady = matches!(
            s.shape,
            Shape::Even | Shape::Skewed | Shape::One | Shape::SomeIdle
        );
        if !reachable || !whole || !steady || s.bucket || (offered as f64) < 1.5 * t as f64 {
            continue;
        }
        // late charges past the threshold in the previous window weigh on a sliding one
        let prev = o.admitted.get(&w.wrapping_sub(s.period_ms)).copied();
        if s.late_ms > 0 && s.sliding && prev.is_some_and(|p| p > t) {
            continue;
        }
        // a sliding window's count is its estimate (a log's: its span as Redis counts it)
        let admitted = if s.log {
            o.estimate_late.get(&w).copied().unwrap_or(0.0) as u64
        } else if s.sliding {
            o.estimate.get(&w).copied().unwrap_or(0.0) as u64
        } else {
            *o.admitted.get(&w).unwrap_or(&0)
        };
        // under 100, one request per instance either way (as for the upper bound)
        // (with costs: the last request of a full window may not fit by up to its units)
        let floor = 0.98 * t as f64 - if t < 100 { n as f64 } else { 0.0 } - (s.units() - 1) as f64;
        if (admitted as f64) < floor {
            why.push(format!(
                "window {w}: admitted {admitted} of {t} although offered {offered}"
            ));
        }
    }
    // a bucket offered 1.5x its refill admits at least 98% of the refill after the first
    // period (a cold fleet can leave the refill of its first rounds in the full bucket)
    let steady = matches!(
        s.shape,
        Shape::Even | Shape::Skewed | Shape::One | Shape::SomeIdle
    );
    if reachable && s.bucket && steady && s.span_ms >= 2 * s.period_ms {
        let refill = t as f64 * (s.span_ms - s.period_ms) as f64 / s.period_ms as f64;
        let offered = s.rate * (s.span_ms - s.period_ms) as f64 / 1000.0;
        let mut floor =
            0.98 * refill - if t < 100 { n as f64 } else { 0.0 } - (s.units() - 1) as f64;
        if s.late_ms > 0 {
            // late charges past the bucket (what was in flight) are repaid from its refill
            floor -= o.bucket_excess.max(0.0);
        }
        if offered >= 1.5 * refill && (o.bucket_admitted_late as f64) < floor {
            why.push(format!(
                "the bucket admitted {} of a refill of {refill:.0} after its first period",
                o.bucket_admitted_late
            ));
        }
    }
    // no refusal under 0.9 x threshold while Redis answers: stalls shorter than the timeout,
    // a Redis Cluster node down (its counter's refusals are under on_failure: counted apart),
    // a restart of Redis, and replies lost or later than the timeout (a lease granted in a
    // lost reply is stranded until its holder's next round: the others wait on meanwhile,
    // `ledger::apply`). Token buckets are held to keeping 0.1 x threshold
    // plus the spare budget (`SPARE_PERCENT`): tokens leased and not yet used are out of the
    // bucket in Redis.
    // A sliding log after Redis restarts empty: the units its members report again come
    // without their instants (only what Redis had not confirmed is named), and are counted at
    // the oldest instant named, later than they came, for up to a period (docs/fleet.md,
    // "Sliding logs"): reported, not asserted.
    let asserted = std::env::var("FLEET_SIM_ALL").is_ok()
        || match s.faults {
            Faults::Restart => !s.log,
            Faults::Failover => true,
            Faults::None | Faults::Stall | Faults::ShardDown | Faults::SlowAndLost => true,
        };
    if asserted && !o.false_refusals.is_empty() {
        let (step, i, count) = o.false_refusals[0];
        why.push(format!(
            "{} refusal(s) under 0.9 x {t}, the first at {step} ms on i{i} with the fleet at {count:.1}",
            o.false_refusals.len()
        ));
    }
    if o.max_rounds_per_s > 1000.0 / s.interval_ms as f64 + 20.0 {
        why.push(format!("{:.1} rounds per second", o.max_rounds_per_s));
    }
    // no count lost, none counted twice (unless Redis lost its keys; a failover's lost
    // writes are reported again)
    if !o.restarted {
        for (&w, &admitted) in &o.admitted {
            let key = format!("sim:{{acme}}:sim:{w}:{}", s.window_end(w));
            let held = o.redis.get(&key).copied().unwrap_or(0);
            if held != admitted as i64 {
                why.push(format!(
                    "window {w}: Redis holds {held}, admitted {admitted}"
                ));
            }
        }
    }
    why
}

fn seeds() -> Vec<u64> {
    seeds_replaying("FLEET_SIM_SEEDS", 60, 2000, &REPLAYED)
}

/// `seeds_of`, and in a release build without `FLEET_SIM_SEED` the seeds of `replayed` past
/// them: seeds that once failed, replayed on every run.
fn seeds_replaying(var: &str, debug: u64, release: u64, replayed: &[u64]) -> Vec<u64> {
    let mut seeds = seeds_of(var, debug, release);
    let n = seeds.len() as u64;
    if !cfg!(debug_assertions) && std::env::var("FLEET_SIM_SEED").is_err() {
        seeds.extend(replayed.iter().filter(|&&s| s > n));
    }
    seeds
}

/// `FLEET_SIM_SEED=<seed>` alone, or seeds 1 to `$var` (`debug` in a debug build, `release`
/// in a release one).
fn seeds_of(var: &str, debug: u64, release: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("FLEET_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            debug
        } else {
            release
        });
    (1..=n).collect()
}

/// Seeds past the default 2,000 that once failed, replayed on every run:
/// 2458, 2571 (an idle instance's previous record taken for the previous window: a sliding
/// cap far too low), 2523, 2595 (a bucket's lease granted to a record that had rolled meanwhile,
/// never given back), 4223, 5461, 5980 (a lease granted for requests that went elsewhere, kept
/// past the spare budget as a forecast), 4635, 5598 (a node down across a window's change: a
/// bucket's tokens admitted meanwhile in both records charged as of its return, not from the
/// window's start and the last answer), 3475 (failed with a sliding window's previous-window
/// leases taken as held alone, before their holders reported at the window's end: refusals
/// under 0.9 x threshold; docs/fleet.md, "Early rounds").
const REPLAYED: [u64; 10] = [2458, 2523, 2571, 2595, 3475, 4223, 4635, 5461, 5598, 5980];

/// The README's "Redis work" of each algorithm: at most this many Redis updates (a script call
/// or a plain increment) per admitted request over the default seeds of the simulation.
/// (Held in release builds, on the default seeds: a debug build runs fewer.)
const REDIS_WORK: [(&str, f64); 5] = [
    ("fixed_window", 0.01),
    ("sliding_window", 0.02),
    ("token_bucket", 0.02),
    ("leaky_bucket", 0.02),
    ("sliding_log", 0.05),
];

/// Whether a run holds the README's `REDIS_WORK` (the default seeds of a release build).
fn holds_redis_work() -> bool {
    !cfg!(debug_assertions)
        && std::env::var("FLEET_SIM_SEED").is_err()
        && std::env::vars().all(|(k, _)| !k.ends_with("_SEEDS"))
}

/// Redis updates per admitted request of `REDIS_WORK[k]`'s algorithm, held to the README's
/// bound where the run holds it.
fn redis_work(k: usize, updates: u64, admitted: u64) -> f64 {
    let work = updates as f64 / admitted.max(1) as f64;
    assert!(
        !holds_redis_work() || work <= REDIS_WORK[k].1,
        "README: {:?}, measured {work:.4}",
        REDIS_WORK[k]
    );
    work
}

#[test]
fn the_fleet_holds_its_limits_over_many_seeds() {
    let mut failures = Vec::new();
    let mut by_shape: BTreeMap<String, (f64, f64, u32)> = BTreeMap::new();
    // per shape: refusals under 0.9 x threshold with Redis answering, the same under
    // on_failure, all refusals, updates sent, requests admitted, the longest hold
    let mut work: BTreeMap<String, [u64; 6]> = BTreeMap::new();
    // per algorithm (fixed, sliding, token bucket): updates, admitted
    let mut by_algorithm = [(0u64, 0u64); 3];
    for seed in seeds() {
        let s = Scenario::draw(seed);
        let o = simulate(&s);
        let k = if s.sliding {
            1
        } else if s.bucket {
            2
        } else {
            0
        };
        by_algorithm[k].0 += o.updates;
        by_algorithm[k].1 += o.total_admitted;
        let w = work.entry(format!("{:?}", s.shape)).or_default();
        w[0] += o.false_refusals.len() as u64;
        w[1] += o.failure_refusals;
        w[2] += o.refusals;
        w[3] += o.updates;
        w[4] += o.total_admitted;
        w[5] = w[5].max(o.longest_hold);
        // the spread over whole windows of fixed-window seeds offered 1.5x (reported)
        let first = o.offered.keys().next().copied();
        let last = o.offered.keys().last().copied().unwrap_or(0);
        for (&w, &admitted) in &o.admitted {
            let whole = Some(w) != first && w + s.period_ms <= last;
            let offered = o.offered.get(&w).copied().unwrap_or(0);
            if whole
                && offered as f64 >= 1.5 * s.threshold as f64
                && s.threshold >= 100
                && s.faults == Faults::None
                && !s.sliding
                && !s.bucket
            {
                let e = by_shape
                    .entry(format!("{:?}", s.shape))
                    .or_insert((f64::MAX, 0.0, 0));
                let r = admitted as f64 / s.threshold as f64;
                e.0 = e.0.min(r);
                e.1 = e.1.max(r);
                e.2 += 1;
            }
        }
        if std::env::var("FLEET_SIM_SEED").is_ok() {
            eprintln!("{s:?}");
        }
        let why = check(&s, &o);
        if !why.is_empty() {
            eprintln!("seed {seed} failed: {s:?}\n  {}", why.join("\n  "));
            failures.push(seed);
        }
    }
    for (shape, [under, under_failure, refused, updates, admitted, hold]) in &work {
        eprintln!(
            "{shape:>9}: {under} refusal(s) under 0.9x with Redis answering, {under_failure} under on_failure, {refused} in all; {:.4} Redis updates per admitted request; longest hold {hold} ms",
            *updates as f64 / (*admitted).max(1) as f64
        );
    }
    for (k, &(updates, admitted)) in by_algorithm.iter().enumerate() {
        eprintln!(
            "{}: {:.4} Redis updates per admitted request",
            REDIS_WORK[k].0,
            redis_work(k, updates, admitted)
        );
    }
    for (shape, (lo, hi, n)) in &by_shape {
        eprintln!(
            "{shape:>9}: admitted/threshold {lo:.3}..{hi:.3} over {n} whole fixed windows offered >= 1.5x (threshold >= 100)"
        );
    }
    assert!(
        failures.is_empty(),
        "{} seed(s) failed: {:?} (replay with FLEET_SIM_SEED=<seed>)",
        failures.len(),
        failures
    );
}

/// Issue 43's small limits, as measured before they took no credit (docs/fleet.md, "Small
/// limits"): 10 and 20 per second on 10 instances, 10 per second on 3, 50 per 5 s on 10,
/// offered ten times the threshold in every shape, fixed and sliding windows, Redis 0.5 to 5
/// ms away: every window holds at most `threshold + 1` (the general check, which also
/// refuses a refusal under 0.9 x threshold), and the holds this costs are printed.
#[test]
fn small_limits_hold_their_threshold_flat_out() {
    let mut failures = Vec::new();
    for (instances, threshold, period_ms) in [
        (10, 10, 1000),
        (10, 20, 1000),
        (3, 10, 1000),
        (10, 50, 5000),
    ] {
        let (mut most, mut holds, mut updates, mut admitted) = (0.0f64, Vec::new(), 0, 0);
        for seed in seeds_of("FLEET_SIM_SMALL_SEEDS", 10, 100) {
            let mut s = Scenario::draw(seed);
            s.instances = instances;
            s.threshold = threshold;
            s.period_ms = period_ms;
            s.span_ms = 3 * period_ms;
            s.phase_ms %= period_ms;
            s.rate = 10.0 * threshold as f64 * 1000.0 / period_ms as f64;
            s.bucket = false;
            s.faults = Faults::None;
            let o = simulate(&s);
            for &a in o.admitted.values() {
                most = most.max(a as f64 / threshold as f64);
            }
            holds.extend(o.holds.iter().copied());
            updates += o.updates;
            admitted += o.total_admitted;
            let why = check(&s, &o);
            if !why.is_empty() {
                eprintln!("small seed {seed} failed: {s:?}\n  {}", why.join("\n  "));
                failures.push(seed);
            }
        }
        holds.sort_unstable();
        let q = |p: f64| {
            holds
                .get(((holds.len() as f64 * p) as usize).min(holds.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        eprintln!(
            "{threshold} per {period_ms} ms on {instances} instances: the fullest window {most:.2} x threshold; {} holds for {admitted} admitted requests, p50 {} ms, p99 {} ms, max {} ms ({} over 300 ms); {:.3} Redis updates per admitted request",
            holds.len(),
            q(0.5),
            q(0.99),
            holds.last().copied().unwrap_or(0),
            holds.iter().filter(|&&h| h > 300).count(),
            updates as f64 / admitted.max(1) as f64
        );
    }
    assert_none_failed("small", &failures);
}

/// Simulate and check the scenario `draw` makes of each seed, handing each to `visit`; the
/// seeds that fail are printed (as `kind`) and returned.
fn failing_seeds(
    kind: &str,
    seeds: Vec<u64>,
    draw: fn(u64) -> Scenario,
    mut visit: impl FnMut(&Scenario, &Outcome),
) -> Vec<u64> {
    let mut failures = Vec::new();
    for seed in seeds {
        let s = draw(seed);
        let o = simulate(&s);
        visit(&s, &o);
        let why = check(&s, &o);
        if !why.is_empty() {
            eprintln!("{kind} seed {seed} failed: {s:?}\n  {}", why.join("\n  "));
            failures.push(seed);
        }
    }
    failures
}

fn assert_none_failed(kind: &str, failures: &[u64]) {
    assert!(
        failures.is_empty(),
        "{} {kind} seed(s) failed: {failures:?} (replay with FLEET_SIM_SEED=<seed>)",
        failures.len(),
    );
}

/// Late charges (`count_when`, `cost: { response_header }`): the same fleets and loads, each
/// request charged once its answer comes, 2 to 500 ms after admission: every bound holds with
/// what the requests in flight owe beside the threshold, and Redis holds exactly the units
/// charged. `FLEET_SIM_LATE_SEEDS=<n>` runs more seeds.
#[test]
fn late_charges_pass_the_bounds_by_no_more_than_the_requests_in_flight() {
    let (mut units, mut under, mut over, mut share_under) = (0u64, 0usize, 0f64, 0usize);
    let failures = failing_seeds(
        "late",
        seeds_of("FLEET_SIM_LATE_SEEDS", 20, 500),
        Scenario::draw_late,
        |s, o| {
            units += o.total_admitted;
            under += o.false_refusals.len();
            for (w, &a) in &o.admitted {
                let owed = o.owed(*w);
                if s.faults == Faults::None
                    && !s.bucket
                    && !s.sliding
                    && a > s.threshold
                    && owed > 0
                {
                    over = over.max((a - s.threshold) as f64 / owed as f64);
                }
            }
            if s.counted_percent < 100 {
                share_under += o.false_refusals.len();
            }
        },
    );
    eprintln!(
        "late charges: {units} units charged, {under} refusals under 0.9x ({share_under} of them by count_when counting a share of the answers); over the threshold by at most {over:.4} x what was in flight"
    );
    assert_none_failed("late", &failures);
}

/// The seed's own scenario (`scripts/bench-fleet`, issue 43 item 4), one of its tenants: 3
/// instances offered twice the limit of 200 per 10 s, evenly, `sync_interval: 1s`, Redis next
/// door; and the same with each instance's demand swaying around its share (`Shape::Swaying`,
/// as in the bench, where tenants are drawn at random). Every whole window admits exactly 200,
/// and what the fleet asks of Redis for it stays where it is (script calls per second for the
/// tenant, printed; the seed's design makes 3, one `INCRBY` per instance a second, each far
/// cheaper than a script call). Every bound holds for both: swaying demand refused one
/// request under 0.9 x threshold in seeds 0-7 (41 in seeds 0-79, which a release build runs)
/// until a holder heard that others waited on its window (`Heartbeat::waits`): none now.
#[test]
fn the_seed_scenario_is_exact_and_asks_little_at_the_limit() {
    let mut calls = Vec::new();
    let mut holds = Vec::new();
    let mut swaying_under = 0;
    let mut all_holds: [Vec<u64>; 2] = Default::default();
    // (`FLEET_SIM_SEED_SCENARIO_SEEDS`: seeds 0 to n - 1; 80 in a release build, 8 in a debug
    // one; the bounds on script calls below are of the first 8, as they were measured)
    let n = std::env::var("FLEET_SIM_SEED_SCENARIO_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 8u64 } else { 80 });
    for (seed, shape) in (0..n).flat_map(|seed| [(seed, Shape::Even), (seed, Shape::Swaying)]) {
        let s = Scenario {
            seed,
            instances: 3,
            sliding: false,
            bucket: false,
            queue: None,
            log: false,
            threshold: 200,
            period_ms: 10_000,
            interval_ms: 1000,
            timeout_ms: 100,
            rtt_ms: 1,
            rate: 40.0,
            shape,
            warm: true,
            faults: Faults::None,
            span_ms: 40_000,
            phase_ms: seed * 1250,
            cost_max: 0,
            late_ms: 0,
            counted_percent: 100,
            calendar: None,
            days: Vec::new(),
            join_ms: 0,
            part_updates: usize::MAX,
            fillers: 0,
        };
        let o = simulate(&s);
        if std::env::var_os("FLEET_SIM_PER_SECOND").is_some() {
            eprintln!(
                "seed {seed} {shape:?}, load from {} ms into a window: script calls by second {:?}",
                s.phase_ms % s.period_ms,
                o.updates_by_second
            );
        }
        let why = check(&s, &o);
        if shape == Shape::Swaying {
            swaying_under += o.false_refusals.len();
        }
        assert!(why.is_empty(), "seed {seed} {shape:?}: {}", why.join("; "));
        let first = o.offered.keys().next().copied();
        let last = o.offered.keys().last().copied().unwrap_or(0);
        for (&w, &admitted) in &o.admitted {
            if Some(w) != first && w + s.period_ms <= last {
                assert_eq!(admitted, 200, "seed {seed}: window {w} admitted {admitted}");
            }
        }
        calls.push(o.updates as f64 * 1000.0 / s.span_ms as f64);
        holds.push(o.longest_hold);
        all_holds[usize::from(shape == Shape::Swaying)].extend(o.holds.iter().copied());
    }
    let mut p99 = [0; 2];
    for ((name, h), p) in ["even", "swaying"]
        .iter()
        .zip(all_holds.iter_mut())
        .zip(&mut p99)
    {
        h.sort_unstable();
        let at = |q: f64| h[((h.len() as f64 * q) as usize).min(h.len() - 1)];
        *p = at(0.99);
        eprintln!(
            "seed scenario, {name}: {} holds, p50 {} p99 {} p99.9 {} max {} ms",
            h.len(),
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0)
        );
    }
    // swaying: p99 954 ms, max 1,200 while holders heard of waits at their heartbeats only
    // (`FLEET_SIM_NO_PUBSUB=1`), 252 and 303 since they hear on the waits channel (302 and
    // 302 in the first 8 seeds), 302 and 302 since a window's first asks take their part on
    // one interval's demand, 202 and 302 since a part asks again once used up, not at half,
    // 242 and 302 since a window's first ask takes its even part of the threshold, 299 and
    // 302 since a part reports at periodic rounds only near its end (`LASTS_HALVES`), 291
    // and 302 since a part kept whole at a call for waits lets the next go (`HEARD_GAP_MS`),
    // 287 and 302 since a used-up part reports its unreported counts when others wait
    assert!(
        p99[1] <= 300,
        "held requests wait longer than they did: p99 {} ms",
        p99[1]
    );
    eprintln!("seed scenario: longest holds (ms, even and swaying by seed): {holds:?}");
    eprintln!("seed scenario, swaying: {swaying_under} refusals under 0.9 x threshold");
    // 16 (in 3 of the 8 seeds) while the parts were set at a window's first asks, 1 while a
    // holder under half of its part did not hear of the others' waits (`Heartbeat::waits`)
    assert_eq!(swaying_under, 0, "refusals under 0.9 x threshold");
    let even: Vec<f64> = calls.iter().step_by(2).take(8).copied().collect();
    let swaying: Vec<f64> = calls.iter().skip(1).step_by(2).take(8).copied().collect();
    let mean = even.iter().sum::<f64>() / even.len() as f64;
    let mean_swaying = swaying.iter().sum::<f64>() / swaying.len() as f64;
    eprintln!("seed scenario, one tenant: {mean:.2} script calls per second (seeds: {even:.2?})");
    eprintln!("seed scenario, swaying: {mean_swaying:.2} script calls per second ({swaying:.2?})");
    // swaying: 2.94 while the parts were set at a window's first asks (refusing 16 requests
    // under 0.9 x threshold in 3 of the 8 seeds), 3.23 since a part is re-split to its share
    // at its holder's calls, 3.25 since a holder hears of the others' waits, 3.34 since it
    // hears of them within a round trip (the waits channel; holds p99 954 -> 252 ms), 3.12
    // since a window's first asks take their part on one interval's demand, 2.79 since a
    // window that will not fill leases each its demand until the end and the first interval's
    // demand so far sizes it, 2.81 since a part waited on calls even with nothing to report,
    // 2.53 since a part asks again once used up, not at half (2.58 alone), and a window's last
    // two intervals take parts on one interval's demand too; 2.42 since a record's first ask
    // takes its even part of the spare budget (`Sizing::first_ahead`), 2.34 since a filling
    // window's first ask takes its even part of the threshold (`Sizing::first_part`), 2.19
    // since a part reports at periodic rounds only near its end (`LASTS_HALVES`), 1.98 since
    // a part kept whole at a call for waits lets the next go for a while (`HEARD_GAP_MS`),
    // 1.99 since a used-up part reports its unreported counts when others wait
    assert!(
        mean_swaying <= 2.10,
        "swaying demand asks Redis more than it did: {mean_swaying:.2} script calls a second"
    );
    // 13.2 before a fixed window's lease in use stayed through a quiet moment (38e30de), 10.0
    // since; 3.80 since a filling fixed window leases each instance its part at once
    // (`Ask::rest`), 3.00 since such a part reports at periodic rounds only past half of it,
    // 2.70 since the spare budget's part takes each other member to want at least as much as
    // the asker, 2.67 since a used part waiting on the others asks every 100-200 ms, not 50,
    // 2.59 since a part refused in a window counted full no longer asks at periodic rounds,
    // 2.30 since a used lease that reached the cap is full without asking (`Ledger::capped`),
    // 2.33 since a part larger than its share is re-split at its holder's calls, 2.31 since
    // a holder hears of the others' waits, 2.42 since it hears of them within a round trip,
    // 2.18 since a window's first asks take their part on one interval's demand, 2.21 since
    // a re-split part that others wait on calls at once (`Ledger::resplit`), 1.95 since a
    // window that will not fill leases each its demand until the end (2.14 alone) and the
    // first interval's demand so far sizes it (2.10 alone), 2.00 since a part waited on calls
    // even with nothing to report, 1.84 since a part asks again once used up, not at half
    // (1.87 alone), and a window's last two intervals take parts on one interval's demand too
    // (1.98 alone: a cold fleet's load starting there, seed 7 here, 26 -> 15 calls in its
    // first two seconds), 1.82 since a record's first ask takes its even part of the spare
    // budget (each instance's first window: three asks before its part, now two), 1.66 since
    // a filling window's first ask takes its even part of the threshold (one ask, its part),
    // 1.46 since a part reports at periodic rounds only near its end (`LASTS_HALVES`), 1.42
    // since a part kept whole at a call for waits lets the next go for a while, 1.40 since a
    // used-up part reports its unreported counts when others wait
    // (deterministic: the same seeds give the same figure)
    assert!(
        mean <= 1.55,
        "the seed scenario asks Redis more than it did: {mean:.2} script calls a second"
    );
}

/// Calendar days (`period: 1d` with `calendar.tz`): the same fleets and loads on a fixed
/// window of one day of 23 or 25 hours (Berlin, New York, Adelaide), the run crossing its end:
/// every bound holds in both windows, and Redis holds each under the key of its real start and
/// end. `FLEET_SIM_CALENDAR_SEEDS=<n>` runs more seeds.
#[test]
fn calendar_days_keep_the_bounds_across_their_end() {
    let mut windows = 0;
    let failures = failing_seeds(
        "calendar",
        seeds_of("FLEET_SIM_CALENDAR_SEEDS", 10, 200),
        Scenario::draw_calendar,
        |_, o| {
            windows += o.admitted.len();
        },
    );
    eprintln!("calendar days: {windows} windows checked");
    assert_none_failed("calendar", &failures);
}

/// Leaky buckets (`algorithm: leaky_bucket`, the queue its threshold, half or a tenth of it):
/// the same fleets and loads; the fleet admits no more than the bucket of `queue + 1` and its
/// outflow allow, and at least 98% of the outflow when offered 1.5x.
/// `FLEET_SIM_LEAKY_SEEDS=<n>` runs more seeds.
#[test]
fn leaky_buckets_keep_the_bounds_over_many_seeds() {
    let (mut admitted, mut under, mut updates) = (0u64, 0usize, 0u64);
    let failures = failing_seeds(
        "leaky",
        seeds_of("FLEET_SIM_LEAKY_SEEDS", 20, 500),
        Scenario::draw_leaky,
        |_, o| {
            admitted += o.total_admitted;
            updates += o.updates;
            under += o.false_refusals.len();
        },
    );
    let work = redis_work(3, updates, admitted);
    eprintln!(
        "leaky buckets: {admitted} admitted, {under} refusals under 0.9x; {work:.4} Redis updates per admitted request"
    );
    assert_none_failed("leaky", &failures);
}

/// Sliding logs (`algorithm: sliding_log`, thresholds up to 10,000): the same fleets and loads;
/// no span of one period, wherever it starts, holds more than the threshold and the slack
/// fleet-wide; no request is refused while the fleet's span held 0.9 x threshold, a unit
/// counted in it until its hundredth of the window ends (as Redis counts it: up to a
/// hundredth of a period late); and a window offered 1.5x sees a span of 0.98 x threshold.
/// `FLEET_SIM_LOG_SEEDS=<n>` runs more.
#[test]
fn sliding_logs_keep_the_bounds_over_many_seeds() {
    let (mut admitted, mut under, mut most, mut updates) = (0u64, 0usize, 0f64, 0u64);
    let failures = failing_seeds(
        "log",
        seeds_of("FLEET_SIM_LOG_SEEDS", 20, 500),
        Scenario::draw_log,
        |s, o| {
            admitted += o.total_admitted;
            updates += o.updates;
            under += o.false_refusals.len();
            if s.faults == Faults::None {
                for &e in o.estimate.values() {
                    most = most.max(e / s.threshold as f64);
                }
            }
        },
    );
    let work = redis_work(4, updates, admitted);
    eprintln!("sliding logs: {admitted} admitted, {under} refusals under 0.9x; the fullest span {most:.4} x threshold; {work:.4} Redis updates per admitted request");
    assert_none_failed("log", &failures);
}

/// Seeds past the default 500 that once failed, replayed on every run (a release build): 814
/// (an instance idle in the previous window, its requests held, then refused while a sliding
/// window's previous-window bound still counted the others' unused leases: docs/fleet.md,
/// "Early rounds").
const REPLAYED_COST: [u64; 1] = [814];

/// Costs (`cost: { header }`): the same fleets and loads, each request taking 1 to `cost_max`
/// units (up to a tenth of the threshold): every bound holds in units (the slack: one of the
/// largest requests, whose units may not fit whole), and Redis holds exactly the units admitted.
/// `FLEET_SIM_COST_SEEDS=<n>` runs more seeds.
#[test]
fn costs_keep_the_bounds_in_units_over_many_seeds() {
    let (mut units, mut under) = (0u64, 0usize);
    let seeds = seeds_replaying("FLEET_SIM_COST_SEEDS", 20, 500, &REPLAYED_COST);
    let failures = failing_seeds("cost", seeds, Scenario::draw_cost, |_, o| {
        units += o.total_admitted;
        under += o.false_refusals.len();
    });
    eprintln!("costs: {units} units admitted, {under} refusals under 0.9x");
    assert_none_failed("cost", &failures);
}

/// Join seeds past the default 300 that failed, replayed on every run (a release build)
/// (drawn before the late charges below were added to the draw; they replay all the same):
/// 361, 761 (the one that came waited without marking: it held no part, so the holder of the
/// whole window never heard), 1293, 1434, 2438, 2699 (the holders heard and reported, but
/// Redis kept what their parts held before the re-split until their next calls, a periodic
/// round away: `Ledger::resplit`).
/// Then, with a third of the seeds charged late (`count_when`): 353, 623 (a holder whose
/// answers were not counted had nothing to report, so it did not call when told of the
/// waits), 1503 (a part taken while alone, held on as a plain lease once its instance's
/// demand no longer filled the window: only parts were told of waits).
const REPLAYED_JOIN: [u64; 9] = [353, 361, 623, 761, 1293, 1434, 1503, 2438, 2699];

/// An instance that starts after the others (`Scenario::draw_join`): every bound holds, no
/// refusal under 0.9 x threshold while one that counted itself alone holds its part of the
/// whole window. `FLEET_SIM_JOIN_SEEDS=<n>` runs more seeds.
#[test]
fn an_instance_that_starts_late_gets_its_share() {
    let (mut admitted, mut under) = (0u64, 0usize);
    let seeds = seeds_replaying("FLEET_SIM_JOIN_SEEDS", 20, 300, &REPLAYED_JOIN);
    let failures = failing_seeds("join", seeds, Scenario::draw_join, |_, o| {
        admitted += o.total_admitted;
        under += o.false_refusals.len();
    });
    eprintln!("late joiners: {admitted} admitted, {under} refusals under 0.9x");
    assert_none_failed("join", &failures);
}

/// Seeds of `rounds_in_parts_keep_the_bounds_with_rounds_at_once_between_them` known to fail:
/// 246, a token bucket of 14,869 per 10 s on 3 instances through a failover, refuses 15,780
/// requests under 0.9 x threshold from 12 s after Redis came back: an instance's first part
/// after the outage answered, its next round's fresh tokens reached Redis before another
/// instance's backlog of the outage, which went in behind them (the bucket in Redis a second
/// emptier than it was until it leaked; the same seed in one part: the backlogs came first).
const KNOWN_PARTS: [u64; 1] = [246];

/// Seeds past the default 300 of the same family that once failed, replayed on every run:
/// 1785 (a sliding window whose cap of the moment was full only with another instance's
/// unused lease, taken for a spike: requests within this instance's lease refused at once
/// with the fleet at 3,196 of 4,198, not held until that lease came back); 1445 (a sliding
/// window's previous window weighed with the others' unused leases until their periodic
/// rounds: 1,177 refusals under 0.9 x threshold), 1515 (an estimate past the threshold with the
/// first mend of 1445 alone), 950 (a late round's check, run as of its late arrival, sent the
/// counts of rounds begun since again: a flaw of the simulation, mended), 1494 (a resumed
/// periodic round that went to the end only: counts before where it began waited past the
/// simulation's flush): docs/fleet.md, "Early rounds".
const REPLAYED_PARTS: [u64; 5] = [950, 1445, 1494, 1515, 1785];

/// Rounds in parts (a gateway's parts carry 1,024 updates; here 1 to 3, beside 4 to 12 other
/// tenants of the rule): the same fleets and loads keep every bound, with periodic rounds in
/// several parts and rounds asked for at once run between two of them
/// (`SyncService::round`). `FLEET_SIM_PARTS_SEEDS=<n>` runs more seeds.
#[test]
fn rounds_in_parts_keep_the_bounds_with_rounds_at_once_between_them() {
    let (mut parts, mut between, mut under) = (0u64, 0u64, 0usize);
    let seeds = seeds_replaying("FLEET_SIM_PARTS_SEEDS", 20, 300, &REPLAYED_PARTS);
    let failures = failing_seeds("parts", seeds.clone(), Scenario::draw_parts, |_, o| {
        parts += o.multi_part;
        between += o.between;
        under += o.false_refusals.len();
    });
    eprintln!("rounds in parts: {parts} parts past a round's first, {between} rounds at once between two parts, {under} refusals under 0.9x");
    // (known, and failing as it did: a token bucket's charges that reach Redis out of the
    // order their tokens came, docs/fleet.md, "Token buckets"; one gone, the list shrinks)
    let unknown: Vec<u64> = failures
        .iter()
        .copied()
        .filter(|f| !KNOWN_PARTS.contains(f))
        .collect();
    assert_none_failed("parts", &unknown);
    let gone: Vec<u64> = KNOWN_PARTS
        .iter()
        .copied()
        .filter(|k| seeds.contains(k) && !failures.contains(k))
        .collect();
    assert!(
        gone.is_empty(),
        "known failing seeds that pass now: {gone:?} (drop them from KNOWN_PARTS)"
    );
    assert!(
        parts > 0 && between > 0,
        "rounds went in parts, some at once between them"
    );
}

/// FNV-1a of a text (the fingerprints of `golden_line`).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One seed's figures, as the golden file keeps them: the counts, and fingerprints of what
/// each window admitted and was offered, of the sliding estimates, and of what Redis holds.
fn golden_line(kind: &str, seed: u64, o: &Outcome) -> String {
    let mut redis: Vec<_> = o.redis.iter().collect();
    redis.sort();
    format!(
        "{kind} {seed}: admitted {} refusals {} (under 0.9x {}, on_failure {}) updates {} longest hold {} ms; windows {:016x} offered {:016x} estimates {:016x}/{:016x} redis {:016x} buckets {}/{}/{:.6}",
        o.total_admitted,
        o.refusals,
        o.false_refusals.len(),
        o.failure_refusals,
        o.updates,
        o.longest_hold,
        fnv(&format!("{:?}", o.admitted)),
        fnv(&format!("{:?}", o.offered)),
        fnv(&format!("{:?}", o.estimate)),
        fnv(&format!("{:?}", o.estimate_late)),
        fnv(&format!("{redis:?}")),
        o.bucket_admitted,
        o.bucket_admitted_late,
        o.bucket_excess,
    )
}

/// Behaviour unchanged, proven: the same seeds print the same figures as the golden file,
/// `tests/fleet_sim.golden`, kept from the head before the limits core moved into its own crate
/// (issue 44). A change of behaviour that is meant is blessed with
/// `FLEET_SIM_BLESS=1 cargo test --release --test fleet_sim -- golden` (and said in its commit).
#[test]
fn the_same_seeds_print_the_golden_figures() {
    type Draw = fn(u64) -> Scenario;
    let kinds: [(&str, Draw, u64); 6] = [
        ("fleet", Scenario::draw, 160),
        ("late", Scenario::draw_late, 40),
        ("calendar", Scenario::draw_calendar, 20),
        ("leaky", Scenario::draw_leaky, 40),
        ("log", Scenario::draw_log, 40),
        ("cost", Scenario::draw_cost, 40),
    ];
    // a debug build (the first pass of `make test`) runs an eighth of the seeds
    let share = if cfg!(debug_assertions) { 8 } else { 1 };
    let mut lines = String::new();
    for (kind, draw, n) in kinds {
        for seed in 1..=n / share {
            lines.push_str(&golden_line(kind, seed, &simulate(&draw(seed))));
            lines.push('\n');
        }
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fleet_sim.golden");
    if std::env::var_os("FLEET_SIM_BLESS").is_some() && share == 1 {
        std::fs::write(&path, &lines).expect("the golden file is written");
        return;
    }
    let golden = std::fs::read_to_string(&path).expect("tests/fleet_sim.golden");
    let by_seed = |text: &str| -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| Some((l.split_once(':')?.0.to_string(), l.to_string())))
            .collect()
    };
    let (golden, now) = (by_seed(&golden), by_seed(&lines));
    let differ: Vec<_> = now
        .iter()
        .filter(|(seed, l)| golden.get(*seed) != Some(*l))
        .map(|(seed, l)| {
            let g = golden.get(seed).map_or("(none)", String::as_str);
            format!("  golden: {g}\n  now:    {l}")
        })
        .collect();
    assert!(
        differ.is_empty() && (share > 1 || golden.len() == now.len()),
        "{} seed(s) print other figures than tests/fleet_sim.golden ({} lines, {} now):\n{}",
        differ.len(),
        golden.len(),
        now.len(),
        differ.join("\n")
    );
}
