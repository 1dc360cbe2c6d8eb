//! The fleet sync: a background service that drains what each counter has to tell Redis (its
//! cumulative count and the lease it wants, see `limits::ledger`), sends it in one pipelined
//! round trip, and applies the answers. The request path never waits on it.
//!
//! `Accounts` is the instance's side of a round without any I/O (`begin` drains, `finish`
//! applies), so that the simulation in `tests/fleet_sim.rs` drives the same code under a fake
//! clock against a simulated Redis; `SyncService` runs it against the real one.

pub mod adjust;
pub mod archive;
pub mod backend;
pub mod keys;
pub mod usage;

use crate::config::model::{Algorithm, RedisSettings};
use crate::limits::fleet::ReplyErrorState;
pub use crate::limits::fleet::{Fleet, FleetMode, Link, MIN_ROUND_GAP_MS};
use crate::metrics::Metrics;
use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use backend::{
    CountUpdate, ErrorKind, Exchange, Heartbeat, LedgerUpdate, LogReport, Reply, ReplyError,
    RoundError, SyncBackend, Update,
};
use keys::{redis_key, redis_partition};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate_limits::algorithm::{self, Quota, TierState};
use tollgate_limits::clock::{Clock, NANOS_PER_MS};
use tollgate_limits::fleet::FleetState;
use tollgate_limits::ledger::{self, Ask};
use tollgate_limits::sliding_log;
use tollgate_limits::store::{Counter, CounterRegistry, OrphanCount, RuleCounters, SHARDS};

/// Keys live this long past the last moment they are needed.
pub const KEY_GRACE_MS: u64 = 10_000;
/// After a failure, the records Redis answered within this span before it report their whole
/// counts again (`Accounts::note_trouble`); plain increments' rounds are kept as long.
pub use backend::journal::RESYNC_SPAN_MS;
/// Longest wait between retries while Redis is failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The last round of a draining process starts this long before its grace period ends.
pub const LAST_ROUND_MARGIN: Duration = Duration::from_millis(300);

/// The key of the heartbeat's set of live instances.
pub fn heartbeat_key(settings: &RedisSettings) -> String {
    format!("{}:instances", settings.key_prefix)
}

/// How far ahead an ask looks: until the next periodic round could renew it.
pub fn horizon_ms(settings: &RedisSettings) -> u64 {
    let interval = settings.sync_interval.as_millis() as u64;
    let timeout = settings.timeout.as_millis() as u64;
    (interval + 2 * timeout).max(100)
}

/// Where an update came from, so that its answer goes back there.
struct Source {
    counters: Arc<RuleCounters>,
    key: Box<[u8]>,
    list: u16,
    tier: usize,
    ask: Ask,
    period_ms: u64,
    threshold: u64,
    /// The update came from the orphans (the counter had moved on).
    orphan: bool,
}

/// One round: what is sent, and where the answers go.
pub struct Round {
    pub updates: Vec<Update>,
    /// Periodic rounds count the live instances; early rounds carry only what asks (and
    /// their waiting marks, `Heartbeat::waits`).
    pub heartbeat: Option<Heartbeat>,
    sources: Vec<Source>,
    sent_ms: u64,
    /// The count keys of its asks with requests waiting (`Heartbeat::waits`).
    waits: Vec<String>,
    /// How many parts it reports because others wait on their windows (`Sizing::waited_on`).
    pub heard: u64,
    /// The round stopped at its size: where its next part starts draining.
    pub rest: Option<Cursor>,
    /// Where this part began draining.
    start: Cursor,
}

impl Round {
    fn empty(heartbeat: Option<Heartbeat>, sent_ms: u64) -> Round {
        Round {
            updates: Vec::new(),
            heartbeat,
            sources: Vec::new(),
            sent_ms,
            waits: Vec::new(),
            heard: 0,
            rest: None,
            start: Cursor::default(),
        }
    }

    /// Its waiting marks go with its heartbeat, or alone (`Heartbeat::beat` off).
    fn with_marks(mut self, hb: impl FnOnce() -> Heartbeat) -> Round {
        if self.waits.is_empty() {
            return self;
        }
        let waits = std::mem::take(&mut self.waits);
        self.heartbeat.get_or_insert_with(hb).waits = waits;
        self
    }
}

/// The count keys the other instances' requests waited on lately (a heartbeat's read,
/// `Beat::waited`, or the waits channel), sorted, each with when it was heard (ms); `last_ms`:
/// the latest of those. Each is kept `WAIT_MARK_MS`, so the set stays as small as the waits
/// of the last moment however long messages keep coming.
#[derive(Debug, Default)]
struct Waited {
    last_ms: u64,
    keys: Vec<(String, u64)>,
}

/// When a drain happens, as `ledger::Sizing` takes it.
#[derive(Debug, Clone, Copy)]
struct DrainTime<'a> {
    now_ms: u64,
    since_ms: u64,
    horizon_ms: u64,
    periodic: bool,
    /// Time since the last periodic round began (`Sizing::into_interval_ms`).
    into_interval_ms: u64,
    /// When this instance last heard of an operator's reset or grant (ms; 0: never): a
    /// counter its count refused and that has not asked since asks, to hear of it.
    adjusted_ms: u64,
    /// What others wait on: a part of it held unused and not drained since is reported.
    waited: &'a Waited,
}

/// Whether the others wait on a window of which this record holds a part unused (or a lease,
/// where its tier takes parts: `parts`), and it has
/// not drained since the heartbeat read their marks (`ledger::Sizing::waited_on`), within
/// `WAIT_MARK_MS` of that read (later, the wait has most likely ended, and the next heartbeat
/// tells), and it hears them (`ledger::hears_waits`: not within `HEARD_GAP_MS` of a call for
/// waits whose answer kept its part whole). Only such a record's key is made to be looked up.
fn waited_on(
    settings: &RedisSettings,
    counters: &RuleCounters,
    (key, st, tier, parts): (&[u8], &TierState, &Quota, bool),
    (waited, now_ms): (&Waited, u64),
) -> bool {
    let l = &st.ledger;
    // (a part of a filling window, or a lease of a tier that takes parts, `parts`: one taken
    // while the window was not filling yet is held as any lease)
    if waited.keys.is_empty()
        || now_ms >= waited.last_ms.saturating_add(backend::WAIT_MARK_MS)
        || !(l.split || parts)
        || l.drained_ms >= waited.last_ms
        || !ledger::hears_waits(l, now_ms)
    {
        return false;
    }
    let partition = redis_partition(&counters.identity.per, key);
    let start = st.window_start_ms;
    let k = redis_key(
        &settings.key_prefix,
        &partition,
        &counters.identity.id,
        start,
        tier.window_end(start),
    );
    match waited
        .keys
        .binary_search_by(|(w, _)| w.as_str().cmp(k.as_str()))
    {
        Ok(i) => waited.keys.get(i).is_some_and(|&(_, at)| {
            now_ms < at.saturating_add(backend::WAIT_MARK_MS) && l.drained_ms < at
        }),
        Err(_) => false,
    }
}

/// A sliding window's record that holds a lease or counts Redis has not confirmed
/// (`ledger::holds_to_its_end`), rolled once its window has ended, so that what it held goes
/// back in this round rather than at its next request or periodic round (nothing before the
/// end: `algorithm::roll`). Returns the record that had to make room, as `roll` does.
fn roll_at_its_end(
    st: &mut TierState,
    tier: &Quota,
    algorithm: Algorithm,
    now_ms: u64,
) -> Option<ledger::Orphan> {
    if algorithm != Algorithm::SlidingWindow || !ledger::holds_to_its_end(&st.ledger) {
        return None;
    }
    algorithm::roll(st, tier, algorithm, now_ms.saturating_mul(NANOS_PER_MS))
}

/// Where a round in parts goes on: the rule (by `uid`) and its shard (in that order), and
/// where its visit wraps or stops (`Lap`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    uid: u64,
    shard: usize,
    lap: Lap,
}

/// A periodic round that resumes where a failed part began (`Accounts::resume`) visits every
/// counter all the same: to the end (`To`: then from the start), then from the start up to
/// where it began (`Until`). Going to the end only, the counts before that point waited for
/// the next periodic round from the start, and with its replies lost again, longer: the
/// simulation's parts seed 1494 held 35 for 38 admitted 3.2 s after the load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Lap {
    /// From the start to the end.
    #[default]
    Whole,
    /// To the end, then from the start up to (uid, shard).
    To(u64, usize),
    /// Up to (uid, shard), from the start.
    Until(u64, usize),
}

impl Cursor {
    /// Where a visit from here begins, without its lap (what a failed part leaves to resume).
    fn place(self) -> Cursor {
        Cursor {
            lap: Lap::Whole,
            ..self
        }
    }

    /// A periodic round's first part from here: around to where it began.
    fn around(self) -> Cursor {
        match self == Cursor::default() {
            true => self,
            false => Cursor {
                lap: Lap::To(self.uid, self.shard),
                ..self
            },
        }
    }

    /// Whether a visit has come around to where it began (at `uid`'s `shard`).
    fn reached(self, uid: u64, shard: usize) -> bool {
        matches!(self.lap, Lap::Until(u, s) if (uid, shard) >= (u, s))
    }
}

/// The most updates one part of a round carries (its memory, and the pipeline's, is
/// bounded by it; a round with more to send goes on in parts, one round trip each).
pub const ROUND_PART_UPDATES: usize = 1024;

/// The updates of a part, read once: `ROUND_PART_UPDATES`, unless the environment variable
/// `TOLLGATE_ROUND_PART_UPDATES` gives another (at least 1). A knob for tests, which make
/// rounds of many parts out of a few dozen counters; not part of the configuration, and an
/// unreadable value is ignored.
pub fn part_updates(env: Option<&str>) -> usize {
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(ROUND_PART_UPDATES)
}

static PART_UPDATES: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
    part_updates(std::env::var("TOLLGATE_ROUND_PART_UPDATES").ok().as_deref())
});

/// What a round in parts tells its schedule between two parts (`SyncService::round`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BetweenParts {
    /// A part was answered, and more are to come ([`Schedule::answered_part`]).
    Answered,
    /// A round asked for at once runs now, whole, before the next part
    /// ([`Schedule::early_between`]).
    AtOnce,
}

/// Between two parts of a round: whether a round asked for at once runs before the next part
/// (`SyncService::round`; the simulation steps rounds in parts with it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Between {
    asked: bool,
}

impl Between {
    /// Before a round's first part: a round at once asked for before a periodic round began
    /// (which takes the ask; what asked may be in its last part).
    pub fn before(fleet: &FleetState, periodic: bool) -> Between {
        Between {
            asked: periodic && fleet.round_requested() && fleet.round_at_once(),
        }
    }

    /// After a part that leaves more to send: whether a round at once runs now, whole,
    /// before the next part.
    pub fn at_once(&mut self, fleet: &FleetState) -> bool {
        let asked = fleet.round_requested() && fleet.round_at_once();
        std::mem::take(&mut self.asked) || asked
    }
}

/// What a finished round changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub ok: bool,
    /// The link state before, when this round changed it.
    pub changed_from: Option<Link>,
}

/// The instance's side of the fleet accounting, without I/O.
pub struct Accounts {
    pub registry: Arc<CounterRegistry>,
    pub fleet: Arc<Fleet>,
    pub clock: Arc<dyn Clock>,
    pub instance: String,
    last_round_ms: AtomicU64,
    /// When the last periodic round began (0: none yet).
    periodic_ms: AtomicU64,
    /// When the first round began (0: none yet).
    first_round_ms: AtomicU64,
    /// The last mark of an operator's adjustment the heartbeat read (0: none yet), and when
    /// it was first read (ms).
    adjusted_mark: AtomicU64,
    adjusted_ms: AtomicU64,
    /// `adjusted_ms` as the last round read it: a round that reads it changed visits every
    /// counter (`RuleCounters::drain_in`).
    drained_adjusted_ms: AtomicU64,
    /// What the last heartbeat read of the others' waiting marks; whether it reads them (off
    /// once Redis refused the read: `Heartbeat::hear`).
    waited: parking_lot::Mutex<Arc<Waited>>,
    hear: AtomicBool,
    /// Subscribed to the waits channel (`told`): the heartbeat reads only the marks that were
    /// not published (`Heartbeat::subscribed`).
    subscribed: AtomicBool,
    /// Whether the marks are published (off once Redis refused: `Heartbeat::publish`).
    publish: AtomicBool,
    /// The marks of the round whose `PUBLISH` Redis refused: they say they were published,
    /// so a listening holder's heartbeat passes over them; the next round marks them again,
    /// unpublished (`Round::with_marks`).
    remark: parking_lot::Mutex<Vec<String>>,
    /// A round since the last fully answered one found a server that did not answer, and
    /// when the first of them was drained (ms).
    troubled: AtomicBool,
    trouble_from_ms: AtomicU64,
    /// Where the next periodic round begins: where the part that failed last began (none:
    /// at the start). A round in parts stops at a failed part, and began at the start
    /// again, so that with a part in ten lost, the counters of its last parts were never
    /// reached (the simulation's rounds in parts: their counts never reached Redis).
    resume: parking_lot::Mutex<Option<Cursor>>,
    /// The earliest end of a window a sliding window's record holds a lease of
    /// (`ledger::holds_to_its_end`), as the rounds that visit every counter saw it (`u64::MAX`:
    /// none): a round is due then (`Schedule::due_or_end_ms`), and it visits every counter.
    ends_ms: AtomicU64,
}

impl Accounts {
    pub fn new(
        registry: Arc<CounterRegistry>,
        fleet: Arc<Fleet>,
        clock: Arc<dyn Clock>,
        instance: String,
    ) -> Self {
        Accounts {
            registry,
            fleet,
            clock,
            instance,
            last_round_ms: AtomicU64::new(0),
            periodic_ms: AtomicU64::new(0),
            first_round_ms: AtomicU64::new(0),
            adjusted_mark: AtomicU64::new(0),
            adjusted_ms: AtomicU64::new(0),
            drained_adjusted_ms: AtomicU64::new(0),
            waited: Default::default(),
            hear: AtomicBool::new(true),
            subscribed: AtomicBool::new(false),
            publish: AtomicBool::new(true),
            remark: Default::default(),
            troubled: AtomicBool::new(false),
            trouble_from_ms: AtomicU64::new(0),
            resume: Default::default(),
            ends_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// In how many ms the earliest window a sliding window's record holds a lease of ends
    /// (0: it has ended; `None`: no such record was seen): a round is due then, which rolls
    /// such records and reports them (`ledger::holds_to_its_end`).
    pub fn ends_in_ms(&self) -> Option<u64> {
        match self.ends_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            end => Some(end.saturating_sub(self.now_ms())),
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ns() / NANOS_PER_MS
    }

    /// Drain every counter's asks (and the orphans) into a round. `periodic`: the round of
    /// every `sync_interval`, which reports all counts (early rounds carry only what asks).
    pub fn begin(&self, settings: &RedisSettings, periodic: bool) -> Round {
        self.begin_part(settings, periodic, None, usize::MAX)
    }

    /// Drain counters from `from` on into a round, stopping after the shard in which the
    /// round reached `max_updates` (`Round::rest` says where the next part starts). A round
    /// in parts keeps its memory bounded by `max_updates`, whatever the number of counters
    /// with something to send. Only the first part counts the live instances.
    pub fn begin_part(
        &self,
        settings: &RedisSettings,
        periodic: bool,
        from: Option<Cursor>,
        max_updates: usize,
    ) -> Round {
        let now_ms = self.now_ms();
        let liveness_ms = (3 * settings.sync_interval.as_millis() as u64).max(3000);
        if let Some(from) = from {
            return self
                .drain_into(
                    Round::empty(None, now_ms),
                    settings,
                    (periodic, true, false),
                    from,
                    max_updates,
                    1000,
                )
                .with_marks(|| self.heartbeat(settings, now_ms, false, liveness_ms));
        }
        let last = self.last_round_ms.swap(now_ms, Ordering::Relaxed);
        let since_ms = if last == 0 {
            1000
        } else {
            now_ms.saturating_sub(last)
        };
        self.fleet.take_round_request();
        let first = match self.first_round_ms.load(Ordering::Relaxed) {
            0 => {
                self.first_round_ms.store(now_ms, Ordering::Relaxed);
                now_ms
            }
            t => t,
        };
        // periodic rounds count the live instances; every round does while this instance is
        // new (until the others' heartbeats are all in, what it sees is not the fleet yet)
        let heartbeat = periodic || now_ms < first + liveness_ms;
        let round = Round::empty(
            heartbeat.then(|| self.heartbeat(settings, now_ms, true, liveness_ms)),
            now_ms,
        );
        // a periodic round begins where the last failed part began (it goes to the end; the
        // counters before it were answered then, and the next periodic round begins at the
        // start)
        let start = match periodic {
            true => self.resume.lock().take().unwrap_or_default().around(),
            false => Cursor::default(),
        };
        // an early round visits only the counters reached since the last round or left asking
        // by it (`RuleCounters::drain_in`), unless an operator's reset or grant was heard since
        let adjusted = self.adjusted_ms.load(Ordering::Relaxed);
        // (and so does a round at the end of a window a sliding window's record holds a lease
        // of: `ends_in_ms`)
        let every = periodic
            || self.drained_adjusted_ms.swap(adjusted, Ordering::Relaxed) != adjusted
            || self.ends_in_ms() == Some(0);
        let how = (periodic, every, true);
        let mut round = self.drain_into(round, settings, how, start, max_updates, since_ms);
        round.waits.append(&mut self.remark.lock());
        round.with_marks(|| self.heartbeat(settings, now_ms, false, liveness_ms))
    }

    /// This instance's heartbeat (`beat`: a whole one), without marks yet.
    fn heartbeat(
        &self,
        settings: &RedisSettings,
        now_ms: u64,
        beat: bool,
        liveness_ms: u64,
    ) -> Heartbeat {
        let key = heartbeat_key(settings);
        Heartbeat {
            adjusted_key: backend::adjusted_key(&key),
            waiting_key: backend::waiting_key(&key),
            key,
            waits: Vec::new(),
            channel: backend::waits_channel(&settings.key_prefix),
            publish: self.publish.load(Ordering::Relaxed),
            subscribed: self.subscribed.load(Ordering::Relaxed),
            beat,
            hear: self.hear.load(Ordering::Relaxed),
            instance: self.instance.clone(),
            now_ms,
            liveness_ms,
        }
    }

    /// Drain the counters into `round` from `from` (`every`: each of them, not only the
    /// shards that may ask: `RuleCounters::drain_in`).
    fn drain_into(
        &self,
        mut round: Round,
        settings: &RedisSettings,
        (periodic, every, first): (bool, bool, bool),
        from: Cursor,
        max_updates: usize,
        since_ms: u64,
    ) -> Round {
        let now_ms = round.sent_ms;
        round.start = from;
        let horizon_ms = horizon_ms(settings);
        let max_updates = max_updates.max(1);
        let waited = Arc::clone(&self.waited.lock());
        // (what others wait on is looked for in every counter)
        let every = every || !waited.keys.is_empty();
        if every && from == Cursor::default() {
            // (seen again by this round's visits, which reach every counter)
            self.ends_ms.store(u64::MAX, Ordering::Relaxed);
        }
        let into_interval_ms = if periodic {
            // (a round in parts goes on from where the periodic one began)
            if first {
                self.periodic_ms.store(now_ms, Ordering::Relaxed);
            }
            0
        } else {
            match self.periodic_ms.load(Ordering::Relaxed) {
                0 => 0,
                t => now_ms.saturating_sub(t),
            }
        };
        let when = DrainTime {
            now_ms,
            since_ms,
            horizon_ms,
            periodic,
            into_interval_ms,
            adjusted_ms: self.adjusted_ms.load(Ordering::Relaxed),
            waited: &waited,
        };
        let mut from = from;
        loop {
            if self.drain_lap(&mut round, settings, (every, from), max_updates, when) {
                return round;
            }
            match from.lap {
                // around: from the start up to where the round began
                Lap::To(uid, shard) => {
                    from = Cursor {
                        lap: Lap::Until(uid, shard),
                        ..Cursor::default()
                    }
                }
                _ => return round,
            }
        }
    }

    /// Drain the counters into `round` from `from` to the end (or to where its lap stops);
    /// returns whether the round stopped, at its size (`Round::rest` says where it goes on)
    /// or where its lap stops.
    fn drain_lap(
        &self,
        round: &mut Round,
        settings: &RedisSettings,
        (every, from): (bool, Cursor),
        max_updates: usize,
        when: DrainTime,
    ) -> bool {
        for rc in self.registry.live() {
            if rc.uid < from.uid {
                continue;
            }
            let first_shard = if rc.uid == from.uid { from.shard } else { 0 };
            let counters = Arc::clone(&rc);
            let lists = rc.tiers();
            for shard in first_shard..SHARDS {
                if from.reached(rc.uid, shard) {
                    return true;
                }
                if round.updates.len() >= max_updates {
                    round.rest = Some(Cursor {
                        uid: rc.uid,
                        shard,
                        lap: from.lap,
                    });
                    return true;
                }
                let sliding = rc.algorithm() == Algorithm::SlidingWindow;
                rc.drain_in(shard, every, |key, c| {
                    self.drain_counter(round, settings, (&counters, &lists), (key, c), when);
                    for st in c.tiers.iter().filter(|_| sliding) {
                        if ledger::holds_to_its_end(&st.ledger) {
                            // a round at its window's end visits every counter
                            self.ends_ms.fetch_min(st.window_end_ms, Ordering::Relaxed);
                        }
                    }
                    c.tiers.iter().any(|st| ledger::asks_early(&st.ledger))
                });
            }
            self.push_orphans(round, settings, &rc);
        }
        false
    }

    /// What each tier of one counter asks in this round (`ledger::drain`), pushed to `round`.
    fn drain_counter(
        &self,
        round: &mut Round,
        settings: &RedisSettings,
        (counters, lists): (&Arc<RuleCounters>, &[Vec<Quota>]),
        (key, c): (&[u8], &mut Counter),
        when: DrainTime,
    ) {
        let logged = counters.algorithm() == Algorithm::SlidingLog;
        let assumed = self.fleet.instances_assumed().max(1);
        for (ti, st) in c.tiers.iter_mut().enumerate() {
            let Some(tier) = lists.get(usize::from(c.list)).and_then(|l| l.get(ti)) else {
                continue;
            };
            if let Some(o) = roll_at_its_end(st, tier, counters.algorithm(), when.now_ms) {
                counters.keep_orphan(key, c.list, ti, o);
            }
            // an operator may have reset or granted its window since it last asked: it asks
            st.ledger.asking |= st.ledger.count_full && st.ledger.drained_ms < when.adjusted_ms;
            // an early round carries only what asks: passed over before its sizing is made
            if !(when.periodic || !when.waited.keys.is_empty() || ledger::asks_early(&st.ledger)) {
                continue;
            }
            let end = algorithm::window_end(st, tier);
            let parts = ledger::parts(tier.threshold, counters.algorithm());
            let spare = ledger::spare(tier.threshold, counters.algorithm());
            let sizing = ledger::Sizing {
                now_ms: when.now_ms,
                since_ms: when.since_ms,
                horizon_ms: when.horizon_ms,
                left_ms: end.saturating_sub(when.now_ms),
                periodic: when.periodic,
                bucket: counters.algorithm().is_bucket(),
                spare,
                first_ahead: spare / assumed,
                first_part: u64::from(parts) * tier.threshold / assumed,
                parts,
                interval_ms: settings.sync_interval.as_millis() as u64,
                into_interval_ms: when.into_interval_ms,
                waited_on: waited_on(
                    settings,
                    counters,
                    (key, st, tier, parts),
                    (when.waited, when.now_ms),
                ),
            };
            // its part of a filling window used up (its last answer leased a part), or, holding
            // none, its requests left waiting by the last answer (the others hold the rest)
            let part = st.ledger.split || (sizing.parts && st.ledger.short > 0);
            let asks = ledger::drain(st, sizing);
            if sizing.waited_on && asks[1].is_some() {
                round.heard += 1;
            }
            for mut ask in asks.into_iter().flatten() {
                let waits = part && ask.need > 0 && !ask.previous;
                ask.log = logged;
                // a log's units by bucket, for Redis to count them by instant
                let units = match c.logs.as_deref().and_then(|l| l.get(ti)) {
                    Some(log) => log.by_bucket(
                        ask.window_start_ms,
                        tier.window_end(ask.window_start_ms),
                        ask.used.saturating_sub(ask.confirmed),
                    ),
                    None => Vec::new(),
                };
                self.push(
                    round,
                    settings,
                    counters,
                    (key, c.list, ti),
                    (ask, units),
                    (tier, false),
                );
                if let Some(Update::Lease(u)) = round.updates.last().filter(|_| waits) {
                    // requests wait on the others' parts: they hear of it (`Sizing::waited_on`)
                    round.waits.push(u.key.clone());
                }
            }
        }
    }

    /// The counts the counters of `rc` left behind when they had to make room (`Orphan`),
    /// pushed to `round` as their previous windows' reports.
    fn push_orphans(&self, round: &mut Round, settings: &RedisSettings, rc: &Arc<RuleCounters>) {
        let lists = rc.tiers();
        for o in rc.take_orphans() {
            let OrphanCount {
                key,
                list,
                tier,
                orphan,
            } = o;
            let Some(quota) = lists
                .get(usize::from(list))
                .and_then(|l| l.get(tier as usize))
                .copied()
            else {
                continue;
            };
            let ask = Ask {
                window_start_ms: orphan.window_start_ms,
                gen: orphan.gen,
                used: orphan.used,
                want: orphan.used,
                need: 0,
                confirmed: orphan.sent,
                since_ms: 0,
                previous: true,
                adopt: 0,
                direct: orphan.direct,
                rest: 0,
                count: !orphan.leased,
                first: false,
                log: rc.algorithm() == Algorithm::SlidingLog,
            };
            self.push(
                round,
                settings,
                rc,
                (&key, list, tier as usize),
                (ask, Vec::new()),
                (&quota, true),
            );
        }
    }

    /// Push one record's report (a plain count, or a lease ask) to `round`, with its source.
    /// `orphan`: the record left its counter.
    fn push(
        &self,
        round: &mut Round,
        settings: &RedisSettings,
        counters: &Arc<RuleCounters>,
        (key, list, tier): (&[u8], u16, usize),
        (ask, log_units): (Ask, Vec<(u64, u64)>),
        (quota, orphan): (&Quota, bool),
    ) {
        let id = &counters.identity.id;
        let partition = redis_partition(&counters.identity.per, key);
        let start = ask.window_start_ms;
        // a calendar window's real end (a day of 23 or 25 hours, a month)
        let end = quota.window_end(start);
        let p = end.saturating_sub(start).max(1);
        let sliding = counters.algorithm().is_sliding();
        let contract_key = redis_key(&settings.key_prefix, &partition, id, start, end);
        let keep = if sliding { p } else { 0 };
        let expire_at_ms = end + keep + KEY_GRACE_MS;
        let source = Source {
            counters: Arc::clone(counters),
            key: key.into(),
            list,
            tier,
            ask,
            period_ms: p,
            threshold: quota.threshold,
            orphan,
        };
        if ask.count {
            round.updates.push(Update::Count(CountUpdate {
                key: contract_key,
                delta: ask.used.saturating_sub(ask.confirmed),
                first: ask.first,
                expire_at_ms,
            }));
            round.sources.push(source);
            return;
        }
        let lease = self.lease_update(
            settings,
            (counters, &partition),
            (ask, log_units),
            (quota, p),
            (contract_key, round.sent_ms, expire_at_ms),
        );
        round.updates.push(Update::Lease(lease));
        round.sources.push(source);
    }

    /// The lease ask of a record (its window's count is `contract_key`, its length `p` ms).
    fn lease_update(
        &self,
        settings: &RedisSettings,
        (counters, partition): (&RuleCounters, &str),
        (ask, log_units): (Ask, Vec<(u64, u64)>),
        (quota, p): (&Quota, u64),
        (contract_key, sent_ms, expire_at_ms): (String, u64, u64),
    ) -> LedgerUpdate {
        let start = ask.window_start_ms;
        let logged = counters.algorithm() == Algorithm::SlidingLog;
        let ledger_key = format!("{contract_key}:fleet");
        let bucket = counters.algorithm().is_bucket();
        let (prev_ledger_key, prev_key, weight_ms) = self.previous_keys(
            settings,
            (counters, partition),
            (start, p),
            ask.previous,
            (&contract_key, &ledger_key),
            sent_ms,
        );
        // the script hears of what did not go as plain increments
        let direct = ask.direct.min(ask.used);
        let threshold = quota.threshold;
        let mut u = LedgerUpdate {
            ledger_key,
            key: contract_key,
            prev_ledger_key,
            prev_key,
            member: format!("{}.{}", self.instance, ask.gen),
            used: ask.used - direct,
            want: ask.want.saturating_sub(direct),
            cap: threshold,
            now_ms: sent_ms,
            lease_until_ms: start + p,
            expire_at_ms,
            weight_ms,
            period_ms: p,
            adopt: ask.adopt,
            need: ask.need,
            spare: ledger::spare(threshold, counters.algorithm()),
            confirmed: ask.confirmed.saturating_sub(direct),
            direct_cap: ledger::direct_cap(threshold, counters.algorithm(), self.fleet.instances()),
            instances: self.fleet.instances_assumed(),
            direct_each: ledger::direct_each(threshold, counters.algorithm()),
            rest: ask.rest,
            ..LedgerUpdate::default()
        };
        if bucket {
            (u.bucket_ns, u.tolerance_us) = bucket_args(quota);
            u.since_ms = ask.since_ms;
            // a bucket's record gives its lease back in the next window: it holds until then
            u.lease_until_ms = start + 2 * p;
        }
        if logged {
            u.log = log_report(start, p, sent_ms, log_units);
        }
        u
    }

    /// The keys a lease ask names besides its own and its weight (see `script::Family::keys`):
    /// a bucket's time and the previous window's ledger (buckets); the previous window's
    /// ledger and count, and its weight one round gap ahead (sliding windows; a log's previous
    /// window is weighed by Redis, by bucket); else its own again.
    fn previous_keys(
        &self,
        settings: &RedisSettings,
        (counters, partition): (&RuleCounters, &str),
        (start, p): (u64, u64),
        previous: bool,
        (contract_key, ledger_key): (&str, &str),
        sent_ms: u64,
    ) -> (String, String, u64) {
        let id = &counters.identity.id;
        let algorithm = counters.algorithm();
        let prev_window = || {
            redis_key(
                &settings.key_prefix,
                partition,
                id,
                start.saturating_sub(p),
                start,
            )
        };
        if algorithm.is_bucket() {
            let b = format!("{}:{{{partition}}}:{id}:bucket", settings.key_prefix);
            // the previous window's ledger: the leases its records hold until they move here
            (b, format!("{}:fleet", prev_window()), 0)
        } else if algorithm.is_sliding() && !previous {
            // the weight one round gap ahead: a lease reaches a little past the cap of now (the
            // member keeps the cap of each moment itself, see `ledger::ceiling`)
            let elapsed = (sent_ms + MIN_ROUND_GAP_MS).saturating_sub(start).min(p);
            let prev = prev_window();
            // (a log's previous window is weighed by Redis, by bucket)
            let logged = algorithm == Algorithm::SlidingLog;
            let weight = if logged { 0 } else { (p - elapsed).max(1) };
            (format!("{prev}:fleet"), prev, weight)
        } else {
            (ledger_key.to_string(), contract_key.to_string(), 0)
        }
    }

    /// Apply Redis's answers (or, when it did not answer, keep what was drained for the next
    /// round: the counts themselves never left their counters, and re-sending them is
    /// harmless because they are cumulative).
    pub fn finish(&self, round: Round, outcome: &Result<Exchange, RoundError>) -> Finished {
        let ok = outcome.is_ok();
        if !ok {
            // the next periodic round begins here (or before, where an earlier part failed)
            let mut resume = self.resume.lock();
            let start = round.start.place();
            *resume =
                Some(resume.map_or(start, |r| r.min(start))).filter(|&c| c != Cursor::default());
        }
        let now_ms = self.now_ms();
        // a round that may have been applied although no answer came (a timeout): its plain
        // increments are taken as counted (never twice; they may be lost)
        let maybe_applied = outcome.as_ref().err().is_some_and(|e| !e.unapplied);
        let mut unanswered = false;
        for (i, src) in round.sources.iter().enumerate() {
            let answer: Option<Reply> = outcome
                .as_ref()
                .ok()
                .and_then(|ex| ex.answers.get(i).copied().flatten());
            unanswered |= answer.is_none();
            let counted = src.ask.count && answer.is_none() && maybe_applied;
            let found = !src.orphan
                && src.counters.update(&src.key, |c| {
                    if c.list != src.list {
                        return;
                    }
                    match (c.tiers.get_mut(src.tier), answer) {
                        (Some(st), Some(Reply::Lease(a))) => {
                            ledger::apply(st, &src.ask, a, (src.period_ms, src.threshold))
                        }
                        (Some(st), Some(Reply::Count(total))) => {
                            ledger::apply_count(st, &src.ask, total, src.period_ms)
                        }
                        (Some(st), None) if counted => ledger::assume_counted(st, &src.ask),
                        // the rest of Redis answered, not this counter's node: it falls back
                        // to on_failure alone, until its node answers
                        (Some(st), None) if ok && !src.ask.previous => {
                            st.ledger.unreachable = true;
                        }
                        _ => {}
                    }
                    // a sliding log: when the previous window's units leave the fleet's span
                    if let (Some(Reply::Lease(a)), false) = (answer, src.ask.previous) {
                        let current = c.tiers.get(src.tier).map(|s| s.window_start_ms);
                        let log = c.logs.as_deref_mut().and_then(|l| l.get_mut(src.tier));
                        if let (Some(log), Some(w)) = (log, current) {
                            if w == src.ask.window_start_ms {
                                log.note_fleet(w, src.period_ms, &a, now_ms);
                            }
                        }
                    }
                });
            if (src.orphan || !found) && answer.is_none() && !counted {
                // its counter is gone (evicted, moved to another plan) or it was an orphan:
                // keep it aside until Redis confirms it, while its key can still matter
                if src.ask.window_start_ms + 2 * src.period_ms + KEY_GRACE_MS > now_ms {
                    src.counters.keep_orphan(
                        &src.key,
                        src.list,
                        src.tier,
                        ledger::Orphan {
                            window_start_ms: src.ask.window_start_ms,
                            gen: src.ask.gen,
                            used: src.ask.used,
                            sent: src.ask.confirmed,
                            direct: src.ask.direct,
                            leased: !src.ask.count,
                        },
                    );
                }
            }
        }
        if let Ok(ex) = outcome {
            self.heard(&round, ex, now_ms);
        }
        self.note_trouble(!ok || unanswered, round.sent_ms);
        let changed_from = self.fleet.set_connected(ok);
        Finished { ok, changed_from }
    }

    /// What the round's heartbeat told: the live instances, the others' waits (a whole
    /// heartbeat's), an operator's adjustment.
    fn heard(&self, round: &Round, ex: &Exchange, now_ms: u64) {
        if let Some(instances) = ex.instances {
            self.fleet.set_instances(instances);
        }
        if ex.unheard && self.hear.swap(false, Ordering::Relaxed) {
            // (the refusal is counted and logged as any, once: the reads stop with it)
            log::warn!("redis: the fleet's waiting marks could not be read; from now on this instance does not hear that others wait on its parts of filling windows (the user's ACL needs +zrangebyscore)");
        }
        if ex.unpublished && self.publish.swap(false, Ordering::Relaxed) {
            // (the marks sent with it say they were published: marked again, unpublished,
            // at once; in `tests/fleet.rs`' ACL without `+publish` a burst that waited once
            // was never heard: about 4 runs of 10 beside two CPU hogs)
            if let Some(hb) = &round.heartbeat {
                self.remark.lock().extend(hb.waits.iter().cloned());
                self.fleet.want_round();
            }
            log::warn!("redis: the fleet's waiting marks could not be published; from now on the others hear of this instance's waits at their heartbeats only (the user's ACL needs +publish and the channel {})", round.heartbeat.as_ref().map_or("", |h| h.channel.as_str()));
        }
        if round.heartbeat.as_ref().is_some_and(|h| h.beat && h.hear) {
            self.waits_heard(&ex.waited, round.sent_ms);
        }
        if let Some(mark) = ex.adjusted {
            if self.adjusted_mark.swap(mark, Ordering::Relaxed) != mark {
                // a new adjustment: the next round (now) carries the counters it may concern
                self.adjusted_ms.store(now_ms, Ordering::Relaxed);
                self.fleet.want_round();
            }
        }
    }

    /// Whether this instance is subscribed to the waits channel (then `told` tells it of the
    /// others' published waits, and its heartbeats read only the marks not published).
    pub fn set_subscribed(&self, on: bool) {
        self.subscribed.store(on, Ordering::Relaxed);
    }

    /// What the waits channel told (`backend::subscribe`): others' requests wait on these
    /// count keys now. The holder hears of a wait within a round trip, not at its heartbeat.
    pub fn told(&self, keys: &[String]) {
        self.waits_heard(keys, self.now_ms());
    }

    /// Others' requests wait on these count keys, as heard at `at_ms` (a heartbeat's read:
    /// when its round was drained; the waits channel: when told). Added to those heard within
    /// `WAIT_MARK_MS` before; a record not drained since reports its unused part
    /// (`waited_on`), in a round asked for at once.
    fn waits_heard(&self, keys: &[String], at_ms: u64) {
        if keys.is_empty() {
            return;
        }
        let mut waited = self.waited.lock();
        // the fresh ones heard before, then these (a key heard again: its latest time)
        let mut all: Vec<(String, u64)> = waited
            .keys
            .iter()
            .filter(|&&(_, t)| at_ms < t.saturating_add(backend::WAIT_MARK_MS))
            .cloned()
            .chain(keys.iter().map(|k| (k.clone(), at_ms)))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        all.dedup_by(|later, first| later.0 == first.0);
        *waited = Arc::new(Waited {
            last_ms: waited.last_ms.max(at_ms),
            keys: all,
        });
        drop(waited);
        // the next round (now) carries the parts others wait on
        self.fleet.want_round();
    }

    /// After a round (drained at `sent_ms`) that some server did not answer, the first that
    /// every server answered (the one that failed is back, or a replica took its place) makes
    /// every leased record that Redis answered within `RESYNC_SPAN_MS` before the trouble
    /// began report its whole count again (`ledger::resync`): what the failed server
    /// acknowledged and never passed on reaches Redis again with the next round, whenever it
    /// comes (a round asked for now would come before the others' first reports after the
    /// outage, and a token bucket charges reports in the order they come).
    fn note_trouble(&self, troubled: bool, sent_ms: u64) {
        if troubled {
            if !self.troubled.swap(true, Ordering::Relaxed) {
                self.trouble_from_ms.store(sent_ms, Ordering::Relaxed);
            }
            return;
        }
        if !self.troubled.swap(false, Ordering::Relaxed) {
            return;
        }
        let since_ms = self
            .trouble_from_ms
            .load(Ordering::Relaxed)
            .saturating_sub(RESYNC_SPAN_MS);
        for rc in self.registry.live() {
            rc.for_each(|_, c| {
                for st in c.tiers.iter_mut() {
                    ledger::resync(st, since_ms);
                }
            });
        }
    }

    /// Requests counted here that Redis has not confirmed.
    pub fn outstanding(&self) -> u64 {
        let mut n = 0;
        for rc in self.registry.live() {
            rc.read_each(|_, c| {
                // every tier of a counter counts the same requests: the most any tier waits for
                n += c.tiers.iter().map(|t| t.ledger.unsent()).max().unwrap_or(0);
            });
        }
        n
    }
}

pub struct SyncService {
    /// The running config: the `redis` section is read from it, so a reload that changes it
    /// reconnects (or stops syncing).
    pub shared: SharedSnapshot,
    pub accounts: Arc<Accounts>,
    pub metrics: Arc<Metrics>,
    /// Redis Cluster slots whose last round failed (logged when some fail and when all answer
    /// again, not at every round).
    pub slots_down: std::sync::atomic::AtomicUsize,
    /// The last failure logged: while Redis stays unreachable, a new reason is logged (a
    /// certificate refused, a password wrong), the same one not again.
    pub last_error: parking_lot::Mutex<Option<String>>,
    /// The kinds of error replies Redis answers with now (see `ReplyErrors`).
    pub reply_errors: parking_lot::Mutex<ReplyErrors>,
    /// A terminating process: when its last request is served, and that the last round ended.
    pub leaving: Arc<crate::services::departure::Leaving>,
}

/// The kinds of error replies Redis answers with now, each with its first text (and what to do
/// about it, when known). A kind starts with the first round that has it (logged once, at
/// ERROR), and stops at the first periodic round that ends without it (logged once): a
/// periodic round sends again every count a refused update did not deliver, so it has the
/// kind as long as Redis still refuses them. Early rounds, which carry only some counters,
/// add kinds but never remove one, so that the log does not change with each round's mix.
#[derive(Debug, Default)]
pub struct ReplyErrors {
    kinds: Vec<(ErrorKind, String)>,
}

/// What changed in the error replies after a round, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyChange {
    Started(ErrorKind, String),
    Stopped(ErrorKind),
}

impl ReplyErrors {
    /// Take in a round's error replies (`complete`: a periodic round that Redis answered
    /// whole). Returns what started and what stopped.
    pub fn note(&mut self, refused: &[ReplyError], complete: bool) -> Vec<ReplyChange> {
        let mut changes = Vec::new();
        if complete {
            self.kinds.retain(|(k, _)| {
                let still = refused.iter().any(|r| r.kind == *k);
                if !still {
                    changes.push(ReplyChange::Stopped(*k));
                }
                still
            });
        }
        for r in refused {
            if !self.kinds.iter().any(|(k, _)| *k == r.kind) {
                self.kinds.push((r.kind, r.message.clone()));
                changes.push(ReplyChange::Started(r.kind, r.message.clone()));
            }
        }
        // the first of `ErrorKind::ALL` first: what `/readyz` names
        self.kinds
            .sort_by_key(|(k, _)| ErrorKind::ALL.iter().position(|a| a == k));
        changes
    }

    /// The kind `/readyz` names (the first of `ErrorKind::ALL` among them), with its text.
    pub fn shown(&self) -> Option<(ErrorKind, &str)> {
        self.kinds.first().map(|(k, m)| (*k, m.as_str()))
    }

    /// Add what to do about a kind to its text (the access check's advice).
    pub fn advise(&mut self, kind: ErrorKind, advice: &str) {
        if let Some((_, m)) = self.kinds.iter_mut().find(|(k, _)| *k == kind) {
            if !m.contains(advice) {
                m.push_str(" -- ");
                m.push_str(advice);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }
}

impl SyncService {
    /// One round, in parts of at most `ROUND_PART_UPDATES` updates ([`part_updates`]), one
    /// round trip each; returns whether Redis answered all of them. A part that fails ends the
    /// round: what it did not drain stays in the counters, and the next periodic round begins
    /// where that part began (`Accounts::finish`); `between` hears of each part answered
    /// before the last (a failure after one is a first failure, tried again at once). Between
    /// two parts, a round asked for at once (a request waits on a quiet record's first ask in
    /// its window) runs whole, `between` told of it first (the schedule counts it as an early
    /// round), and the requests held for a round decide again at its end, as at any round's: at 100,000 tenants a
    /// periodic round is some 16 parts and 280 ms, which such a request waited out whole. (Not
    /// at each part's end: a request held again adds its need again when its record's last
    /// answer could not grant it, once per round, and a part may not carry its record.)
    pub async fn round(
        &self,
        settings: &RedisSettings,
        backend: &dyn SyncBackend,
        periodic: bool,
        mut between: Option<&mut (dyn FnMut(BetweenParts) + Send)>,
    ) -> bool {
        let fleet = &self.accounts.fleet;
        let mut at_once = Between::before(fleet, periodic);
        let mut from = None;
        let mut refused = Vec::new();
        loop {
            let part = self
                .accounts
                .begin_part(settings, periodic, from, *PART_UPDATES);
            let rest = part.rest;
            self.metrics.fleet_waits_heard.inc_by(part.heard);
            let ok = self.exchange(settings, backend, part, &mut refused).await;
            let Some(next) = rest.filter(|_| ok) else {
                return self.round_done(settings, periodic, ok, &refused).await;
            };
            from = Some(next);
            let Some(tell) = between.as_deref_mut() else {
                continue;
            };
            tell(BetweenParts::Answered);
            if at_once.at_once(fleet) {
                tell(BetweenParts::AtOnce);
                let began = std::time::Instant::now();
                let _ = Box::pin(self.round(settings, backend, false, None)).await;
                fleet.round_ended(began.elapsed());
            }
        }
    }

    /// The end of a round: the pending deltas read, and its error replies noted.
    async fn round_done(
        &self,
        settings: &RedisSettings,
        periodic: bool,
        ok: bool,
        refused: &[ReplyError],
    ) -> bool {
        // it reads every counter: once a periodic round or a failed one, not per part nor per
        // early round (a busy fleet runs hundreds of those a second)
        if periodic || !ok {
            let unsent = self.accounts.outstanding();
            self.metrics.redis_pending.set(unsent as i64);
        }
        if ok || !refused.is_empty() {
            self.note_refusals(settings, refused, periodic && ok).await;
        }
        ok
    }

    /// Log, count and show the error replies of a round (`complete`: a periodic round Redis
    /// answered whole, which may end a kind).
    async fn note_refusals(
        &self,
        settings: &RedisSettings,
        refused: &[ReplyError],
        complete: bool,
    ) {
        for r in refused {
            self.metrics
                .redis_errors
                .with_label_values(&[r.kind.label()])
                .inc();
        }
        let changes = self.reply_errors.lock().note(refused, complete);
        if changes.is_empty() {
            return;
        }
        let on_failure = settings.on_failure;
        for change in &changes {
            match change {
                ReplyChange::Started(kind, message) => {
                    // a permission: say which command, and what to add
                    let advice = if *kind == ErrorKind::NoPerm {
                        self.access_advice(settings).await
                    } else {
                        None
                    };
                    if let Some(a) = &advice {
                        self.reply_errors.lock().advise(*kind, a);
                    }
                    let advice = advice.map(|a| format!("; {a}")).unwrap_or_default();
                    log::error!(
                        "redis: error replies ({}): {message}{advice}; the counters they concern fall back to on_failure ({on_failure}) until Redis accepts their commands, and their counts go again then",
                        kind.label()
                    );
                }
                ReplyChange::Stopped(kind) => {
                    log::info!("redis: the {} error replies stopped", kind.label());
                }
            }
        }
        let errors = self.reply_errors.lock();
        match errors.shown() {
            Some((kind, message)) => self.accounts.fleet.set_reply_error(Some(ReplyErrorState {
                kind: kind.label(),
                message: message.to_string(),
            })),
            None => {
                self.accounts.fleet.set_reply_error(None);
                log::info!("redis: no more error replies; the fleet's limits apply again");
            }
        }
    }

    /// What the access check says of a NOPERM: the commands the user may not run, and what
    /// to add to its ACL (`None`: it could not tell).
    async fn access_advice(&self, settings: &RedisSettings) -> Option<String> {
        let wait = settings.timeout.max(Duration::from_secs(1));
        let access = backend::access::check(settings, wait).await;
        let report = backend::access::report(settings, &self.algorithms(), &access);
        let lines: Vec<&str> = report
            .errors
            .iter()
            .map(|l| l.strip_prefix("redis: ").unwrap_or(l))
            .collect();
        (!lines.is_empty()).then(|| lines.join("; "))
    }

    /// The algorithms of the running config's rules.
    fn algorithms(&self) -> Vec<Algorithm> {
        let snap = self.shared.load();
        snap.config.rules.iter().map(|r| r.algorithm).collect()
    }

    /// The access check once a new backend first reaches Redis (start-up, a reload that
    /// changed the `redis` section): a command the user may not run is logged at ERROR
    /// (rounds go on, and the counters it concerns fall back to `on_failure` when Redis
    /// refuses it; a fixed ACL needs no restart).
    async fn check_access(&self, settings: &RedisSettings) {
        let wait = settings.timeout.max(Duration::from_secs(1));
        let access = backend::access::check(settings, wait).await;
        let algorithms = self.algorithms();
        let report = backend::access::report(settings, &algorithms, &access);
        report.info.iter().for_each(|l| log::info!("{l}"));
        report.warnings.iter().for_each(|l| log::warn!("{l}"));
        report.errors.iter().for_each(|l| log::error!("{l}"));
    }

    /// Send one round (or part) and apply its answers; returns whether Redis answered (its
    /// error replies go to `refused`).
    async fn exchange(
        &self,
        settings: &RedisSettings,
        backend: &dyn SyncBackend,
        round: Round,
        refused: &mut Vec<ReplyError>,
    ) -> bool {
        let started = Instant::now();
        // nothing to send, nothing to ask: no I/O (an empty cluster round would find no node
        // to answer it, and look like an outage)
        let outcome = if round.updates.is_empty() && round.heartbeat.is_none() {
            Ok(Exchange::default())
        } else {
            tokio::time::timeout(
                backend.deadline(settings.timeout),
                backend.exchange(&round.updates, round.heartbeat.as_ref()),
            )
            .await
            .map_err(|_| RoundError::from(format!("no answer within {:?}", settings.timeout)))
            .and_then(|r| r)
        };
        self.metrics
            .redis_sync_duration
            .observe(started.elapsed().as_secs_f64());
        if let Ok(ex) = &outcome {
            if ex.slots_answered + ex.slots_failed > 0 {
                let m = &self.metrics;
                m.redis_slot_rounds
                    .with_label_values(&["ok"])
                    .inc_by(ex.slots_answered as u64);
                m.redis_slot_rounds
                    .with_label_values(&["error"])
                    .inc_by(ex.slots_failed as u64);
                m.redis_slots_down.set(ex.slots_down as i64);
                let was = self.slots_down.swap(ex.slots_down, Ordering::Relaxed);
                match (was, ex.slots_down) {
                    (0, n) if n > 0 => log::warn!(
                        "redis: {n} cluster slot(s) did not answer ({}); their keys wait for a later round, on_failure applies to them",
                        ex.slot_error.as_deref().unwrap_or("no answer")
                    ),
                    (w, 0) if w > 0 => log::info!("redis: every cluster slot answers again"),
                    _ => {}
                }
            }
        }
        let done = self.accounts.finish(round, &outcome);
        let instances = self.accounts.fleet.instances();
        match (&outcome, done.changed_from) {
            (Ok(ex), changed) => {
                self.last_error.lock().take();
                refused.extend(ex.refused.iter().map(|r| r.error.clone()));
                let result = if ex.refused.is_empty() { "ok" } else { "error" };
                self.metrics.redis_sync.with_label_values(&[result]).inc();
                self.metrics.redis_instances.set(instances as i64);
                if changed.is_some() {
                    log::info!("redis: connected; {instances} instance(s) share the limits");
                }
            }
            (Err(e), changed) => {
                self.metrics.redis_sync.with_label_values(&["error"]).inc();
                if changed.is_some() {
                    // the error text stays in the log; clients never see it
                    let when = if changed == Some(Link::Unknown) {
                        "unreachable at start-up"
                    } else {
                        "sync failed"
                    };
                    log::warn!("redis: {when} ({e}); counting locally, on_failure applies");
                    *self.last_error.lock() = Some(e.message.clone());
                } else {
                    let mut last = self.last_error.lock();
                    if last.as_deref() != Some(e.message.as_str()) {
                        log::warn!("redis: still unreachable ({e})");
                        *last = Some(e.message.clone());
                    }
                }
            }
        }
        done.ok
    }
}

/// What the counters asked of the next round (`FleetState::ask_round`, `ask_at_once`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    Nothing,
    /// An early round.
    Early,
    /// A round at once: a request waits on a record's first ask in its window.
    AtOnce,
}

impl Asked {
    /// What the fleet's counters asked for, and not yet had.
    pub fn of(fleet: &FleetState) -> Asked {
        match (fleet.round_requested(), fleet.round_at_once()) {
            (false, _) => Asked::Nothing,
            (true, false) => Asked::Early,
            (true, true) => Asked::AtOnce,
        }
    }
}

/// When rounds happen: every `sync_interval`, sooner when a counter asks (at least
/// `MIN_ROUND_GAP_MS` after the last such early round, so at most 20 of them a second besides the
/// periodic ones, and only while Redis answers; at once, after the round in flight, when a
/// request waits on a record's first ask in its window: such an ask waits on nothing but
/// Redis, and a request's hold is then one round trip, where the gap made every tenant's
/// first request in a window wait up to 50 ms), later while Redis fails (backing off,
/// doubling up to `MAX_BACKOFF`). The first round that fails after one that did not is tried
/// again at once (`MIN_ROUND_GAP_MS` after its start): a reply lost or late once should not
/// leave on_failure in force, nor a lease granted in it stranded, for a whole interval.
/// Times in ms on any monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub next_ms: u64,
    pub last_ms: Option<u64>,
    last_early_ms: Option<u64>,
    backoff_ms: u64,
    /// The last round failed.
    failing: bool,
}

impl Schedule {
    /// The first round is due at once.
    pub fn new(now_ms: u64) -> Self {
        Schedule {
            next_ms: now_ms,
            last_ms: None,
            last_early_ms: None,
            backoff_ms: 1000,
            failing: false,
        }
    }

    /// The earliest time a round asked for now may start.
    fn early_ms(&self) -> u64 {
        self.last_early_ms.map_or(0, |l| l + MIN_ROUND_GAP_MS)
    }

    /// When the next round is due: `asked`, what the counters asked of it; `healthy`, Redis
    /// answered the last round.
    pub fn due_ms(&self, asked: Asked, healthy: bool) -> u64 {
        match asked {
            _ if !healthy => self.next_ms,
            Asked::Nothing => self.next_ms,
            Asked::Early => self.next_ms.min(self.early_ms()),
            Asked::AtOnce => 0,
        }
    }

    /// When the next round is due, as `due_ms`, or at `end_ms` (a window a sliding window's
    /// record holds a lease of ends then: `Accounts::ends_in_ms`), not sooner than an early
    /// round may start, and only while Redis answers.
    pub fn due_or_end_ms(&self, asked: Asked, healthy: bool, end_ms: Option<u64>) -> u64 {
        let due = self.due_ms(asked, healthy);
        match end_ms {
            // (a round since the end rolled what held it)
            Some(end) if healthy && self.last_ms.is_none_or(|l| l < end) => {
                due.min(end.max(self.early_ms()))
            }
            _ => due,
        }
    }

    /// A round starts: returns whether it is the periodic one (an early round carries only the
    /// counters that ask). A round at once counts as an early round: the next comes the gap
    /// after it (the asks that follow a first answer wait on the others' rounds, not Redis's:
    /// asked again at once, a simulated fleet's waiting requests were refused 3 ms after their
    /// first answer while a lease granted in a lost reply was still stranded).
    pub fn started(&mut self, now_ms: u64) -> bool {
        let periodic = now_ms >= self.next_ms;
        if !periodic {
            self.last_early_ms = Some(now_ms);
        }
        self.last_ms = Some(now_ms);
        periodic
    }

    /// A round asked for at once ran between two parts of the round that started last: the
    /// next early round comes the gap after it.
    pub fn early_between(&mut self, now_ms: u64) {
        self.last_early_ms = Some(now_ms);
    }

    /// Redis answered a part of the round in flight: if a later part fails, it is a first
    /// failure (the next round, at once, begins where that part began), not one in a row
    /// (backing off while parts are answered left the last parts' counters waiting seconds).
    pub fn answered_part(&mut self) {
        self.failing = false;
    }

    /// A round ended. After a periodic round the next is due `interval_ms` after its start;
    /// an early round leaves the periodic one where it was.
    pub fn finished(&mut self, ok: bool, interval_ms: u64, periodic: bool) {
        let last = self.last_ms.unwrap_or(0);
        if ok {
            self.failing = false;
            self.backoff_ms = interval_ms;
            if periodic || self.next_ms <= last {
                self.next_ms = last + interval_ms;
            }
        } else if !self.failing {
            // the first failure: again at once, as a periodic round (it reports every count)
            self.failing = true;
            self.next_ms = last + MIN_ROUND_GAP_MS;
        } else {
            self.next_ms = last + self.backoff_ms;
            self.backoff_ms =
                (self.backoff_ms * 2).min((MAX_BACKOFF.as_millis() as u64).max(interval_ms));
        }
    }
}

impl SyncService {
    /// The backend of the running config's `redis` section (`None`: none, or it cannot be
    /// set up), with its waits channel's listener in place of the last one; the link state
    /// and the error replies of the last one forgotten.
    fn follow(
        &self,
        want: Option<RedisSettings>,
        listener: &mut Option<tokio::task::JoinHandle<()>>,
    ) -> Option<(RedisSettings, Box<dyn SyncBackend>)> {
        let current =
            want.and_then(
                |s| match backend::make_for(&s, Some(&self.accounts.instance)) {
                    Ok(b) => Some((s, b)),
                    Err(e) => {
                        log::error!("redis: cannot set up the sync ({e}); counting locally");
                        None
                    }
                },
            );
        self.accounts.registry.set_syncing(current.is_some());
        if let Some(old) = listener.take() {
            old.abort();
        }
        self.accounts.set_subscribed(false);
        *listener = current.as_ref().map(|(s, _)| self.listen(s));
        self.accounts.fleet.reset_link();
        *self.reply_errors.lock() = ReplyErrors::default();
        current
    }

    /// The waits channel's listener for `settings` (`backend::subscribe`), telling the
    /// accounts what it hears.
    fn listen(&self, settings: &RedisSettings) -> tokio::task::JoinHandle<()> {
        let accounts = Arc::clone(&self.accounts);
        let instance = accounts.instance.clone();
        tokio::spawn(backend::subscribe::listen(
            settings.clone(),
            instance,
            move |heard| match heard {
                backend::subscribe::Heard::Subscribed(on) => accounts.set_subscribed(on),
                backend::subscribe::Heard::Waits(keys) => accounts.told(&keys),
            },
        ))
    }
}

#[async_trait]
impl BackgroundService for SyncService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let fleet = &self.accounts.fleet;
        let base = tokio::time::Instant::now();
        let ms = || base.elapsed().as_millis() as u64;
        let at = |ms: u64| base + Duration::from_millis(ms);
        let mut current: Option<(RedisSettings, Box<dyn SyncBackend>)> = None;
        let mut schedule = Schedule::new(0);
        // the access check of the current backend is still to come
        let mut unchecked = false;
        // the waits channel's listener of the current backend
        let mut listener: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            // follow the running config's `redis` section
            let want = self.shared.load().config.redis.clone();
            if want.as_ref() != current.as_ref().map(|(s, _)| s) {
                current = self.follow(want, &mut listener);
                unchecked = current.is_some();
                schedule = Schedule::new(ms());
            }
            let interval = current
                .as_ref()
                .map_or(1000, |(s, _)| s.sync_interval.as_millis() as u64);
            let healthy = current.is_some() && fleet.is_connected();
            let asked = Asked::of(fleet);
            tokio::select! {
                _ = shutdown.changed() => {
                    // Draining: the requests in flight, and those on kept-alive connections,
                    // still count during `grace_period`. Report now, then once more when the
                    // last of them is served (SIGTERM: the departure says so) or just before
                    // the grace period ends, so that the last counts reach the fleet.
                    if let Some((s, b)) = &current {
                        let grace = self.shared.load().config.server.grace_period;
                        let last = at(ms()) + grace.saturating_sub(LAST_ROUND_MARGIN);
                        let _ = self.round(s, b.as_ref(), true, None).await;
                        tokio::select! {
                            _ = tokio::time::sleep_until(last) => {}
                            _ = self.leaving.served() => {}
                        }
                        let _ = self.round(s, b.as_ref(), true, None).await;
                    }
                    self.leaving.reported();
                    if let Some(l) = listener.take() {
                        l.abort();
                    }
                    return;
                }
                _ = tokio::time::sleep_until(at(schedule.due_or_end_ms(
                    asked,
                    healthy,
                    self.accounts.ends_in_ms().map(|d| ms() + d),
                ))) => {}
                // a counter out of its lease asks for a round, or for one at once (not while
                // backing off): when it is due is seen again
                _ = fleet.wake.notified(), if healthy && asked != Asked::AtOnce => continue,
            }
            let periodic = schedule.started(ms());
            let Some((settings, backend)) = &current else {
                schedule.finished(true, interval, true);
                continue;
            };
            let began = std::time::Instant::now();
            let mut between = |e| match e {
                BetweenParts::Answered => schedule.answered_part(),
                BetweenParts::AtOnce => schedule.early_between(ms()),
            };
            let ok = self
                .round(settings, backend.as_ref(), periodic, Some(&mut between))
                .await;
            fleet.round_ended(began.elapsed());
            schedule.finished(ok, interval, periodic);
            if ok && unchecked {
                unchecked = false;
                self.check_access(settings).await;
            }
        }
    }
}

/// A bucket's time per token (ns) and how far ahead the fleet's bucket may be booked (µs,
/// rounded up: a bucket of one token must hold one).
fn bucket_args(quota: &Quota) -> (u64, u64) {
    use tollgate_limits::algorithm::{fleet_tolerance_ns, interval_ns};
    (
        u64::try_from(interval_ns(quota)).unwrap_or(u64::MAX),
        u64::try_from(fleet_tolerance_ns(quota).div_ceil(1000)).unwrap_or(u64::MAX),
    )
}

/// What a sliding log's ask tells Redis of its units by instant, for the window starting at
/// `start` of `p` ms, sent at `sent_ms`.
fn log_report(start: u64, p: u64, sent_ms: u64, units: Vec<(u64, u64)>) -> LogReport {
    let bucket_ms = sliding_log::bucket_ms(p);
    LogReport {
        bucket_ms,
        // where units Redis hears of without their instants go (lost by a restart of
        // Redis, or left out by the log): the bucket of now, or the window's last
        last: (p - 1).min(sent_ms.saturating_sub(start)) / bucket_ms,
        // the previous window's buckets that end after now - p: still in the span
        from: sent_ms
            .saturating_sub(p)
            .saturating_sub(start.saturating_sub(p))
            / bucket_ms,
        units,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance's accounts on a fake clock at 10 s, with its fleet.
    fn accounts_at_10_s(fleet: Arc<Fleet>) -> (Accounts, Arc<tollgate_limits::clock::FakeClock>) {
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let registry = Arc::new(CounterRegistry::new(
            metrics.evictions.clone(),
            metrics.untracked.clone(),
        ));
        let clock = Arc::new(tollgate_limits::clock::FakeClock::at_ms(10_000));
        (
            Accounts::new(registry, fleet, clock.clone(), "i1".into()),
            clock,
        )
    }

    #[test]
    fn waits_heard_are_kept_500_ms_each_however_long_messages_keep_coming() {
        let (accounts, clock) = accounts_at_10_s(Arc::default());
        let keys = |a: &Accounts| -> Vec<(String, u64)> { a.waited.lock().keys.clone() };
        // a message every 300 ms, each naming a new key: only the last 500 ms's are kept
        for i in 0..10u64 {
            clock.set_ms(10_000 + 300 * i);
            accounts.told(&[format!("k{i}")]);
        }
        assert_eq!(
            keys(&accounts),
            [("k8".to_string(), 12_400), ("k9".to_string(), 12_700)]
        );
        // a key heard again keeps its latest time, sorted by key
        clock.set_ms(12_800);
        accounts.told(&["k8".into(), "a".into()]);
        assert_eq!(
            keys(&accounts),
            [
                ("a".to_string(), 12_800),
                ("k8".to_string(), 12_800),
                ("k9".to_string(), 12_700)
            ]
        );
        assert_eq!(accounts.waited.lock().last_ms, 12_800);
    }

    #[test]
    fn marks_whose_publish_was_refused_are_marked_again_unpublished_in_the_next_round() {
        let fleet: Arc<Fleet> = Arc::default();
        let (accounts, _) = accounts_at_10_s(fleet.clone());
        let text = "server: { listen: [\"127.0.0.1:1\"] }\n\
             upstreams: { app: { servers: [\"127.0.0.1:2\"] } }\n\
             routes: [{ id: all, path: /**, upstream: app }]\n\
             redis: { url: \"redis://127.0.0.1:3\" }\n";
        let cfg = crate::config::load_str(std::path::Path::new("t.yaml"), text).expect("config");
        let settings = cfg.redis.expect("a redis section");
        // a round whose marks went out published (`i1+ <key>`), and Redis refused the PUBLISH
        let mut round = accounts.begin(&settings, true);
        let hb = round.heartbeat.as_mut().expect("a periodic round beats");
        assert!(hb.publish);
        hb.waits = vec!["tg:{a}:r:0:9".into()];
        fleet.take_round_request();
        let refused = Exchange {
            unpublished: true,
            ..Exchange::default()
        };
        accounts.heard(&round, &refused, 10_000);
        // a round at once, whose heartbeat marks the key again, unpublished: the listening
        // holders' heartbeats pass over the published marks alone
        assert!(fleet.round_requested());
        let next = accounts.begin(&settings, false);
        let hb = next.heartbeat.expect("its marks");
        assert_eq!(
            (hb.publish, hb.waits.clone()),
            (false, vec!["tg:{a}:r:0:9".to_string()])
        );
        assert_eq!(hb.wait_member("tg:{a}:r:0:9"), "i1 tg:{a}:r:0:9");
        // once (a new instance's rounds all beat: without marks now)
        let then = accounts.begin(&settings, false).heartbeat;
        assert!(then.is_none_or(|hb| hb.waits.is_empty()));
    }

    #[test]
    fn an_error_reply_is_noted_when_it_starts_and_when_a_periodic_round_ends_without_it() {
        let noperm = ReplyError::new("NOPERM", "no permissions to run the 'hincrby' command");
        let oom = ReplyError::new("OOM", "command not allowed when used memory > 'maxmemory'.");
        let mut e = ReplyErrors::default();
        assert_eq!(
            e.note(std::slice::from_ref(&noperm), false),
            [ReplyChange::Started(
                ErrorKind::NoPerm,
                noperm.message.clone()
            )]
        );
        // again and again: nothing new (one line when it starts, not one per round)
        assert!(e.note(&[noperm.clone(), noperm.clone()], true).is_empty());
        // an early round without it (it carries some counters only) ends nothing
        assert!(e.note(&[], false).is_empty());
        assert_eq!(e.shown().map(|(k, _)| k), Some(ErrorKind::NoPerm));
        // another kind starts; the first kind of `ErrorKind::ALL` is the one shown
        assert_eq!(
            e.note(std::slice::from_ref(&oom), false),
            [ReplyChange::Started(ErrorKind::Oom, oom.message.clone())]
        );
        assert_eq!(e.shown().map(|(k, _)| k), Some(ErrorKind::NoPerm));
        // a periodic round with only OOM: NOPERM stopped
        assert_eq!(
            e.note(std::slice::from_ref(&oom), true),
            [ReplyChange::Stopped(ErrorKind::NoPerm)]
        );
        assert_eq!(e.shown().map(|(k, _)| k), Some(ErrorKind::Oom));
        e.advise(ErrorKind::Oom, "make room");
        assert!(e.shown().is_some_and(|(_, m)| m.ends_with(" -- make room")));
        assert_eq!(e.note(&[], true), [ReplyChange::Stopped(ErrorKind::Oom)]);
        assert!(e.is_empty());
        // the kinds are the metric's labels
        let labels: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(labels, crate::metrics::REDIS_ERROR_KINDS);
    }

    #[test]
    fn rounds_come_every_interval_sooner_when_asked_and_back_off_on_failure() {
        let mut s = Schedule::new(0);
        assert_eq!(
            s.due_ms(Asked::Nothing, false),
            0,
            "the first round at once"
        );
        assert!(s.started(0), "periodic");
        s.finished(true, 1000, true);
        assert_eq!(s.due_ms(Asked::Nothing, true), 1000);
        assert_eq!(s.due_ms(Asked::Early, true), 0, "asked: at once");
        assert_eq!(s.due_ms(Asked::Early, false), 1000, "not while Redis fails");
        assert!(!s.started(10), "an early round");
        s.finished(true, 1000, false);
        assert_eq!(
            s.due_ms(Asked::Nothing, true),
            1000,
            "the periodic round stays"
        );
        assert_eq!(s.due_ms(Asked::AtOnce, true), 0, "a first ask: at once");
        assert_eq!(
            s.due_ms(Asked::AtOnce, false),
            1000,
            "not while Redis fails"
        );
        assert_eq!(
            s.due_ms(Asked::Early, true),
            60,
            "the next early round after the gap"
        );
        assert!(!s.started(60));
        s.finished(false, 1000, false);
        assert_eq!(
            s.due_ms(Asked::Early, false),
            110,
            "the first failure: again at once (a reply lost once)"
        );
        assert!(s.started(110), "as a periodic round");
        s.finished(false, 1000, true);
        assert_eq!(s.due_ms(Asked::Early, false), 1110, "then backing off");
        assert!(s.started(1110));
        s.finished(false, 1000, true);
        assert_eq!(s.next_ms, 3110, "doubled");
        for _ in 0..5 {
            let t = s.next_ms;
            s.started(t);
            s.finished(false, 1000, true);
        }
        let t = s.last_ms.unwrap();
        assert_eq!(s.next_ms - t, 5000, "at most MAX_BACKOFF");
        s.started(s.next_ms);
        s.finished(true, 1000, true);
        let t = s.last_ms.unwrap();
        s.started(t + 1000);
        s.finished(false, 1000, true);
        assert_eq!(
            s.next_ms,
            t + 1050,
            "answers again: the next failure is retried at once"
        );
    }

    #[test]
    fn a_round_at_once_between_a_periodic_rounds_parts_counts_as_an_early_round() {
        let mut s = Schedule::new(0);
        assert!(s.started(0));
        s.finished(true, 1000, true);
        assert!(s.started(1000), "the periodic round");
        // its first part answered, a round at once runs before the second
        s.early_between(1030);
        s.finished(true, 1000, true);
        assert_eq!(
            s.due_ms(Asked::Early, true),
            1080,
            "the next early round the gap after it"
        );
        assert_eq!(
            s.due_ms(Asked::Nothing, true),
            2000,
            "the next periodic round an interval after the periodic one's start"
        );
        assert_eq!(s.due_ms(Asked::AtOnce, true), 0);
    }

    #[test]
    fn a_round_that_fails_after_a_part_was_answered_is_tried_again_at_once() {
        let mut s = Schedule::new(0);
        assert!(s.started(0));
        s.finished(false, 1000, true);
        assert!(s.started(50), "the first failure: at once");
        s.finished(false, 1000, true);
        assert_eq!(s.next_ms, 1050, "one in a row: backing off");
        assert!(s.started(1050));
        s.answered_part();
        s.finished(false, 1000, true);
        assert_eq!(
            s.next_ms, 1100,
            "a part was answered: a first failure again"
        );
        assert!(s.started(1100));
        s.finished(false, 1000, true);
        assert_eq!(
            s.next_ms, 3100,
            "none answered: backing off again, from where it was"
        );
    }

    #[test]
    fn a_round_is_due_at_the_end_of_a_window_a_lease_is_held_of() {
        let mut s = Schedule::new(0);
        assert!(s.started(0));
        s.finished(true, 1000, true);
        let nothing = Asked::Nothing;
        assert_eq!(s.due_or_end_ms(nothing, true, None), 1000, "no such window");
        assert_eq!(s.due_or_end_ms(nothing, true, Some(400)), 400, "at its end");
        assert_eq!(
            s.due_or_end_ms(nothing, true, Some(1500)),
            1000,
            "the periodic round first"
        );
        assert_eq!(
            s.due_or_end_ms(nothing, false, Some(400)),
            1000,
            "only while Redis answers"
        );
        // an early round just before the end: the gap first
        assert!(!s.started(380));
        s.finished(true, 1000, false);
        assert_eq!(s.due_or_end_ms(nothing, true, Some(400)), 430);
        // a round since the end rolled what held it
        assert!(!s.started(430));
        s.finished(true, 1000, false);
        assert_eq!(s.due_or_end_ms(nothing, true, Some(400)), 1000);
    }

    #[test]
    fn a_resumed_round_goes_around_to_where_it_began() {
        let at = |uid, shard| Cursor {
            uid,
            shard,
            lap: Lap::Whole,
        };
        assert_eq!(Cursor::default().around(), Cursor::default(), "whole");
        let began = at(3, 5).around();
        assert_eq!(began.lap, Lap::To(3, 5));
        assert!(!began.reached(9, 0), "the first lap goes to the end");
        let second = Cursor {
            lap: Lap::Until(3, 5),
            ..Cursor::default()
        };
        assert!(!second.reached(0, 0) && !second.reached(3, 4));
        assert!(
            second.reached(3, 5) && second.reached(4, 0),
            "stops where it began"
        );
        assert_eq!(second.place(), Cursor::default(), "resumed without its lap");
        assert_eq!(began.place(), at(3, 5));
    }

    #[test]
    fn a_part_carries_1024_updates_unless_the_environment_says_otherwise() {
        assert_eq!(part_updates(None), ROUND_PART_UPDATES);
        assert_eq!(part_updates(Some("10")), 10);
        assert_eq!(part_updates(Some(" 7 ")), 7);
        assert_eq!(part_updates(Some("0")), ROUND_PART_UPDATES, "at least 1");
        assert_eq!(part_updates(Some("many")), ROUND_PART_UPDATES, "ignored");
    }
}
