//! The decision for one request, once the gateway knows which rules apply to it: whether every
//! tier of every applying rule lets it through. Check, then commit: a request denied by any
//! tier consumes nothing from any tier.
//!
//! Concurrency: the shards of all applying rules are locked together, always in the order of
//! their counters' `uid` (stable across reloads), so check-then-commit is exact and two requests
//! can never deadlock, even when one runs under an older config than the other.
//!
//! The steps of `decide`, in order: lock; `check` each applying rule (`check_tier` each tier:
//! roll its window, the sliding log's bookkeeping, the algorithm's verdict, the demand noted
//! for the fleet, `fleet_ceiling`); `verdict` from the violated rules' enforcements; `commit`
//! what is admitted (`commit_tiers`), and keep what is owed later (`Decision::late`,
//! `Decision::queued`).

use crate::algorithm::{self, Algorithm, Quota, TierState, TierVerdict};
use crate::clock::{Clock, NANOS_PER_MS};
use crate::decision::{Decision, Late, Queued, TierReport, Verdict};
use crate::fleet::{FleetMode, FleetState};
use crate::ledger::{self, Admitted, Ceiling};
use crate::sliding_log::Log;
use crate::store::{Counter, RuleCounters, Shard, Untracked};
use crate::top;
use smallvec::SmallVec;
use std::sync::Arc;

/// What a rule does to a request over one of its tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// Refused with `status`.
    Reject { status: u16 },
    /// Held until the tier has room, at most `max_delay_ms` (then refused with `status`).
    Delay { max_delay_ms: u64, status: u16 },
    /// Nothing: counted and reported only.
    Shadow,
    /// Answered by the rule itself, as if served.
    Shadowban,
    /// Let through, its answer paced to `bytes_per_sec`.
    Throttle { bytes_per_sec: u64 },
}

/// One rule as the limiter knows it: its counters, its tier lists, what it enforces.
pub struct Limit {
    pub counters: Arc<RuleCounters>,
    pub enforcement: Enforcement,
    /// Charged once the answer is known (`Limiter::charge_late`), not when admitted.
    pub charges_late: bool,
    /// The partitions denied most, or closest to their limit, in the current window of the
    /// rule's longest period (every tier list's).
    pub top: top::TopPartitions,
    pub top_period_ms: u64,
    /// The tiers of each list, with this config's thresholds (the counters' identity holds
    /// only the periods).
    tier_lists: Vec<Vec<Quota>>,
}

impl Limit {
    pub fn new(
        counters: Arc<RuleCounters>,
        tier_lists: Vec<Vec<Quota>>,
        enforcement: Enforcement,
        charges_late: bool,
    ) -> Limit {
        let top_period_ms = tier_lists
            .iter()
            .flatten()
            .map(|t| t.period_ms)
            .max()
            .unwrap_or(1)
            .max(1);
        Limit {
            counters,
            enforcement,
            charges_late,
            top: Default::default(),
            top_period_ms,
            tier_lists,
        }
    }

    /// The tiers of list `list` (0: the rule's own tiers, then plans' own).
    pub fn tiers(&self, list: u16) -> &[Quota] {
        self.tier_lists
            .get(usize::from(list))
            .map_or(&[][..], |l| &l[..])
    }

    pub fn is_shadow(&self) -> bool {
        self.enforcement == Enforcement::Shadow
    }

    /// The start of `/api/top`'s current window at `now_ms`: aligned to the rule's longest
    /// period, so that an hourly tier's denials are still there after its 1 s tier rolled.
    pub fn top_window(&self, now_ms: u64) -> u64 {
        now_ms / self.top_period_ms * self.top_period_ms
    }
}

/// How long a request has waited for the fleet (`Verdict::Hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Not held yet: a hold counts it in the next ask.
    First,
    /// Held, and decided again after a round.
    Again,
    /// Held as long as it may: it is not held again.
    Over,
}

/// A rule that applies to the request being decided (the gateway matched it).
#[derive(Debug, Clone, Copy)]
pub struct Applying {
    /// The rule's index in `Limiter::limits`.
    pub rule: u16,
    pub list: u16,
    /// The units the request takes from each tier (`cost`).
    pub units: u64,
    /// The partition key's hash (`RuleCounters::hash_of`).
    pub hash: u64,
    /// Its counters' `uid`: the order shards are locked in.
    pub uid: u64,
    /// Where the partition key lies in the keys passed with it.
    pub key_start: usize,
    pub key_end: usize,
}

/// The rate limiter of one config snapshot. Its counters outlive it (see `CounterRegistry`).
pub struct Limiter {
    /// By rule index (the gateway's compiled rules are in the same order).
    pub limits: Vec<Limit>,
    clock: Arc<dyn Clock>,
    fleet: Arc<FleetState>,
}

/// Where a decision commits: a tracked counter, or nothing for an untracked partition (its
/// tier states are stand-ins built from the sketch estimate, checked and dropped in `check`).
/// Two words: a slot is moved once per applying rule.
enum Slot<'g> {
    Tracked(&'g mut Counter),
    Untracked,
}

/// What `Limiter::check` knows of one applying rule for each of its tiers.
struct RuleCheck {
    algo: Algorithm,
    units: u64,
    now: u64,
    mode: FleetMode,
    patience: Patience,
    shadow: bool,
}

/// One tier's outcome in `Limiter::check_tier`.
struct TierCheck {
    verdict: TierVerdict,
    /// What the tier counts with this request (if it admits it).
    used: u64,
    /// A leaky bucket's wait for the request's turn.
    wait_ns: u64,
    /// A fleet round is wanted now.
    wake: bool,
}

/// A sliding log at `now`: pruned, its fleet span moved to the tier's window, and the
/// previous window's bound lowered as the fleet's previous window leaves the span.
fn roll_log(l: &mut Log, state: &mut TierState, tier: &Quota, now: u64) {
    l.prune(tier, now);
    l.roll_fleet(
        state.window_start_ms,
        tier.period_ms,
        state.ledger.prev_bound,
    );
    // the fleet's previous window leaves the span bucket by bucket
    if let Some(p) = l.fleet_prev(state.window_start_ms, now / NANOS_PER_MS) {
        if p < state.ledger.prev_bound {
            // room came back: a request past the lease waits for the next answer
            // again rather than being refused as if the fleet were full
            state.ledger.prev_bound = p;
            state.ledger.short = 0;
        }
    }
}

/// State standing in for an untracked partition that has been seen `seen` times (this request
/// included): as if its earlier requests all fell in the current window.
fn stand_in(tier: &Quota, algo: Algorithm, now_ns: u64, seen: u64) -> TierState {
    let before = seen.saturating_sub(1);
    let p_ms = (tier.period_ms).max(1);
    let mut s = TierState {
        window_start_ms: (now_ns / NANOS_PER_MS) / p_ms * p_ms,
        current: before,
        ..TierState::default()
    };
    // never committed, never sent: the sketch count stands for what this instance admitted
    s.ledger.current.gen = 1;
    s.ledger.current.used = before;
    if algo.is_bucket() {
        let interval = (p_ms * NANOS_PER_MS / tier.threshold.max(1)).max(1);
        s.tat_ns = now_ns.saturating_add(before.saturating_mul(interval));
    }
    s
}

impl Limiter {
    pub fn new(limits: Vec<Limit>, clock: Arc<dyn Clock>, fleet: Arc<FleetState>) -> Limiter {
        Limiter {
            limits,
            clock,
            fleet,
        }
    }

    /// The limiter's clock: nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn fleet(&self) -> &FleetState {
        &self.fleet
    }

    /// Decide for the `applying` rules of one request (their partition keys in `keys`), at
    /// `now`, into `decision` (cleared by the caller): lock their counters in `uid` order,
    /// check every tier, choose the verdict, commit if it admits. `now` is read by the caller
    /// once, before the rules were matched: a request that waited for a lock counts where the
    /// window stood when it came. Returns whether a fleet round is wanted now.
    pub fn decide(
        &self,
        applying: &mut [Applying],
        keys: &[u8],
        now: u64,
        (mode, patience): (FleetMode, Patience),
        decision: &mut Decision,
    ) -> bool {
        // lock in uid order
        applying.sort_unstable_by_key(|a| a.uid);
        let mut guards: SmallVec<[_; 4]> = applying
            .iter()
            .map(|a| {
                self.limits[a.rule as usize]
                    .counters
                    .lock(RuleCounters::shard_of_hash(a.hash))
            })
            .collect();
        let mut slots: SmallVec<[Slot; 4]> = SmallVec::new();
        let mut wake = false;
        for (a, guard) in applying.iter().zip(guards.iter_mut()) {
            let key = &keys[a.key_start..a.key_end];
            let (slot, w) = self.check(a, (guard, key), (now, mode, patience), decision);
            wake |= w;
            slots.push(slot);
        }
        decision.verdict = self.verdict(decision, mode);
        if decision.held && decision.verdict.admits() {
            decision.verdict = Verdict::Hold;
        }
        if !decision.verdict.admits() {
            decision.wait_ns = 0;
        }
        if decision.verdict.admits() {
            wake |= self.commit(applying, &mut slots, decision, now, mode);
            if decision.wait_ns > 0 {
                self.note_turns(applying, &slots, keys, decision);
            }
            // a rule is charged only what it would let through, late or not
            for (a, &(_, violated)) in applying.iter().zip(&decision.applied) {
                if !violated && self.limits[a.rule as usize].charges_late {
                    decision.late.push(Late {
                        rule: a.rule,
                        list: a.list,
                        hash: a.hash,
                        key: keys[a.key_start..a.key_end].into(),
                        units: a.units,
                        reserved: matches!(mode, FleetMode::Leased { .. }),
                    });
                }
            }
        }
        drop(slots);
        drop(guards);
        wake
    }

    /// Keep the turns an admitted request took in leaky buckets (see `Decision::queued`).
    fn note_turns(
        &self,
        applying: &[Applying],
        slots: &[Slot],
        keys: &[u8],
        decision: &mut Decision,
    ) {
        for ((a, slot), &(_, violated)) in applying.iter().zip(slots).zip(&decision.applied) {
            let cr = &self.limits[a.rule as usize];
            if violated || cr.is_shadow() || cr.counters.algorithm() != Algorithm::LeakyBucket {
                continue;
            }
            if let Slot::Tracked(c) = slot {
                decision.queued.push(Queued {
                    rule: a.rule,
                    list: a.list,
                    hash: a.hash,
                    key: keys[a.key_start..a.key_end].into(),
                    units: a.units,
                    tats: c.tiers.iter().map(|t| t.tat_ns).collect(),
                });
            }
        }
    }

    /// A request that waited for its turn left before it came (the client went away): each
    /// leaky bucket it took a turn in takes it back where nobody took a later one. (The
    /// fleet's accounting still counts it.)
    pub fn leave_queue(&self, d: &mut Decision) {
        for q in std::mem::take(&mut d.queued) {
            let Some(cr) = self.limits.get(usize::from(q.rule)) else {
                continue;
            };
            let rc = &cr.counters;
            let mut shard = rc.lock(RuleCounters::shard_of_hash(q.hash));
            let Ok(c) = rc.counter(&mut shard, &q.key, q.hash, q.list, self.clock.now_ns()) else {
                continue;
            };
            for ((state, tier), &tat) in c.tiers.iter_mut().zip(cr.tiers(q.list)).zip(&q.tats) {
                if state.tat_ns == tat {
                    let back = algorithm::interval_ns(tier).saturating_mul(u128::from(q.units));
                    state.tat_ns = tat.saturating_sub(u64::try_from(back).unwrap_or(u64::MAX));
                }
            }
        }
        d.wait_ns = 0;
    }

    /// Check every tier of one applying rule (its shard locked); report each tier in
    /// `decision`. Returns the slot to commit to, and whether a fleet round is wanted now.
    fn check<'g>(
        &self,
        a: &Applying,
        (shard, key): (&'g mut Shard, &[u8]),
        (now, mode, patience): (u64, FleetMode, Patience),
        decision: &mut Decision,
    ) -> (Slot<'g>, bool) {
        let cr = &self.limits[a.rule as usize];
        let rc = &cr.counters;
        let tiers = cr.tiers(a.list);
        let cx = RuleCheck {
            algo: rc.algorithm(),
            units: a.units,
            now,
            mode,
            patience,
            shadow: cr.is_shadow(),
        };
        let mut stand_ins: SmallVec<[TierState; 2]> = SmallVec::new();
        let mut slot = match rc.counter(shard, key, a.hash, a.list, now) {
            Ok(c) => Slot::Tracked(c),
            Err(Untracked(seen)) => {
                stand_ins.extend(tiers.iter().map(|t| stand_in(t, cx.algo, now, seen)));
                Slot::Untracked
            }
        };
        let tracked = matches!(slot, Slot::Tracked(_));
        let (states, mut logs): (&mut [TierState], Option<&mut [Log]>) = match &mut slot {
            Slot::Tracked(c) => (&mut c.tiers, c.logs.as_deref_mut().map(Vec::as_mut_slice)),
            Slot::Untracked => (&mut stand_ins, None),
        };
        let (mut violated, mut wake) = (false, false);
        // for `/api/top`: the highest use of a limit among the tiers
        let mut usage_permille = 0u32;
        // a leaky bucket: the longest wait for a turn among the tiers
        let mut wait_ns = 0;
        for (ti, (state, tier)) in states.iter_mut().zip(tiers).enumerate() {
            if let Some(orphan) = algorithm::roll(state, tier, cx.algo, now) {
                if tracked {
                    rc.keep_orphan(key, a.list, ti, orphan);
                }
            }
            let log = logs.as_deref_mut().and_then(|l| l.get_mut(ti));
            // (an operator's grant widens the window's threshold)
            let tier = &ledger::granted(tier, state, cx.algo);
            let t = self.check_tier(&cx, state, tier, log, &mut decision.held);
            wake |= t.wake;
            violated |= !t.verdict.allowed;
            wait_ns = wait_ns.max(t.wait_ns);
            let permille = t.used.saturating_mul(1000) / tier.threshold.max(1);
            usage_permille = usage_permille.max(permille.min(u64::from(u32::MAX)) as u32);
            decision.tiers.push(TierReport {
                rule: a.rule,
                list: a.list,
                tier: ti as u8,
                threshold: tier.threshold,
                period_ms: tier.period_ms,
                calendar: tier.calendar.map(|c| c.unit),
                verdict: t.verdict,
                shadow: cx.shadow,
            });
        }
        let now_ms = now / NANOS_PER_MS;
        if violated {
            cr.top.denied(key, cr.top_window(now_ms), usage_permille);
        } else if usage_permille >= top::USAGE_FLOOR {
            cr.top.usage(key, cr.top_window(now_ms), usage_permille);
        }
        if !violated && !cx.shadow {
            decision.wait_ns = decision.wait_ns.max(wait_ns);
        }
        decision.applied.push((a.rule, violated));
        (slot, wake)
    }

    /// One tier of an applying rule, its window rolled: the sliding log's bookkeeping, the
    /// algorithm's verdict, the demand noted for the fleet, then what the fleet says of it.
    fn check_tier(
        &self,
        cx: &RuleCheck,
        state: &mut TierState,
        tier: &Quota,
        mut log: Option<&mut Log>,
        held: &mut bool,
    ) -> TierCheck {
        let (algo, now) = (cx.algo, cx.now);
        if let Some(l) = log.as_deref_mut() {
            roll_log(l, state, tier, now);
        }
        let counted = log.as_deref().map_or(state.current, Log::len);
        let mut verdict = match log.as_deref() {
            Some(l) => l.evaluate(tier, now, cx.units),
            None => algorithm::evaluate(state, tier, algo, now, cx.units),
        };
        let wait_ns = if algo == Algorithm::LeakyBucket {
            algorithm::queue_wait_ns(state, now)
        } else {
            0
        };
        ledger::note_demand(state, cx.units, algo);
        if !self.fleet.plain_increments() {
            // a Redis Cluster: every record leases (see `FleetState::plain_increments`)
            state.ledger.current.leased = true;
        }
        // a counter whose cluster node is down while the rest of Redis answers
        let (leased, shared) =
            if state.ledger.unreachable && matches!(cx.mode, FleetMode::Leased { .. }) {
                self.fleet.unreachable_mode().ledger_modes()
            } else {
                cx.mode.ledger_modes()
            };
        if !verdict.allowed && leased.is_some() {
            ledger::note_count_full(state);
        }
        let wake = self.fleet_ceiling(cx, state, tier, (leased, shared), (&mut verdict, held));
        let used = counted + if verdict.allowed { cx.units } else { 0 };
        TierCheck {
            verdict,
            used,
            wait_ns,
            wake,
        }
    }

    /// What the fleet says of a tier the local count admits: room left (the remaining count
    /// as the fleet knows it), a hold for the next round (this instance's lease is used), or
    /// a refusal (the fleet is full; this instance's share is used while Redis is away).
    /// Returns whether a round must be asked for at once.
    fn fleet_ceiling(
        &self,
        cx: &RuleCheck,
        state: &mut TierState,
        tier: &Quota,
        (leased, shared): (Option<u64>, Option<u64>),
        (verdict, held): (&mut TierVerdict, &mut bool),
    ) -> bool {
        let (units, algo, patience, shadow) = (cx.units, cx.algo, cx.patience, cx.shadow);
        let now_ms = cx.now / NANOS_PER_MS;
        let mut wake = false;
        let fleet = match verdict.allowed {
            false => Ceiling::Open,
            true => match ledger::ceiling(state, tier, algo, now_ms, leased, shared, units) {
                // held as long as it may while Redis answered: if an answer could not
                // grant what waited here, the fleet is full; if none said so, the rounds
                // were only slow (a busy machine, a stalling Redis): it takes its part of
                // what the last answer left (`ledger::fits_after_hold`)
                Ceiling::LeaseUsed if patience == Patience::Over => {
                    let n = self.fleet.instances();
                    if state.ledger.short == 0
                        && ledger::fits_after_hold(state, tier, algo, (now_ms, n), units)
                    {
                        Ceiling::Open
                    } else {
                        Ceiling::FleetFull
                    }
                }
                c => c,
            },
        };
        match fleet {
            Ceiling::Open => {
                // what the fleet has left, as this instance knows it
                if let Some(room) = ledger::room(state, tier, algo, leased, shared) {
                    verdict.remaining = verdict.remaining.min(room.saturating_sub(units));
                }
            }
            // a shadow rule never holds a request: it counts past the lease
            Ceiling::LeaseUsed if shadow => {}
            Ceiling::LeaseUsed => {
                // under the limit, but this instance's lease is used: the request waits for
                // the next round, which asks for it (it is never refused for this); at once
                // for a quiet record's first ask in its window
                self.ask_at_once_if_first(state, algo, tier);
                ledger::note_hold(state, patience == Patience::First, units);
                *held = true;
                verdict.remaining = 0;
                wake = true;
            }
            Ceiling::FleetFull => {
                // the last round could not grant what waited here: the others hold or
                // admitted the rest of the window (a bucket: its tokens). A round asks
                // again (see `note_full`), so that room that comes back is seen.
                wake |= ledger::note_full(state, algo);
                let retry_after_ms = if algo.is_bucket() {
                    (tier.period_ms / tier.threshold.max(1)).max(1)
                } else {
                    verdict.reset_ms
                };
                *verdict = TierVerdict {
                    allowed: false,
                    remaining: 0,
                    retry_after_ms,
                    ..*verdict
                };
            }
            Ceiling::ShareUsed => {
                // no room before the window ends (or Redis is back)
                *verdict = TierVerdict {
                    allowed: false,
                    remaining: 0,
                    retry_after_ms: verdict.reset_ms,
                    ..*verdict
                };
            }
        }
        wake
    }

    /// A request is held on `state`: the round that asks for it starts at once if this is a
    /// quiet record's first ask in its window (`ledger::asks_at_once`).
    fn ask_at_once_if_first(&self, state: &TierState, algo: Algorithm, tier: &Quota) {
        let (instances, interval_ms) = (self.fleet.instances(), self.fleet.interval_ms());
        let quota = (tier.threshold, tier.period_ms);
        if ledger::asks_at_once(state, algo, quota, instances, interval_ms) {
            self.fleet.ask_at_once();
        }
    }

    /// The verdict from the violated rules' enforcements and the fleet's state.
    fn verdict(&self, decision: &Decision, mode: FleetMode) -> Verdict {
        let mut reject: Option<u16> = None;
        let mut shadowban: Option<u16> = None;
        let mut throttle: Option<u64> = None; // the slowest pace
        let mut delay: Option<(u64, u16)> = None; // (smallest max_delay, status)
        for &(rule, violated) in &decision.applied {
            if !violated {
                continue;
            }
            match self.limits[rule as usize].enforcement {
                Enforcement::Shadow => {}
                Enforcement::Reject { status } => {
                    reject.get_or_insert(status);
                }
                Enforcement::Shadowban => {
                    shadowban.get_or_insert(rule);
                }
                Enforcement::Throttle { bytes_per_sec } => {
                    throttle = Some(throttle.map_or(bytes_per_sec, |t| t.min(bytes_per_sec)));
                }
                Enforcement::Delay {
                    max_delay_ms: md,
                    status,
                } => {
                    delay = Some(match delay {
                        Some((d, s)) if d <= md => (d, s),
                        _ => (md, status),
                    });
                }
            }
        }
        let enforced = decision
            .applied
            .iter()
            .any(|&(r, _)| !self.limits[r as usize].is_shadow());
        // reject, then shadowban, then delay, then throttle
        match (reject, delay) {
            _ if mode == FleetMode::AllowAll => Verdict::Allow,
            _ if mode == FleetMode::DenyAll && enforced => Verdict::Reject { status: 503 },
            (Some(status), _) => Verdict::Reject { status },
            _ if shadowban.is_some() => Verdict::Shadowban {
                rule: shadowban.unwrap_or(0),
            },
            (None, Some((max_delay_ms, status))) => {
                let wait_ms = decision.retry_after_ms();
                if wait_ms <= max_delay_ms {
                    Verdict::Delay {
                        wait_ms,
                        max_delay_ms,
                        status,
                    }
                } else {
                    Verdict::Reject { status }
                }
            }
            (None, None) => match throttle {
                Some(bytes_per_sec) => Verdict::Throttle { bytes_per_sec },
                None => Verdict::Allow,
            },
        }
    }

    /// Commit an admitted request (allowed, or throttled) to every tracked counter of the rules
    /// it is not over (a throttle rule it is over, like a shadow rule it is over, is skipped).
    /// The remaining counts reported were computed as if committed.
    /// Returns whether a fleet round is wanted now.
    /// Count one request of `units` in every tier of one counter (its states rolled to `now`);
    /// the fleet's ledger counts units too.
    fn commit_tiers(
        cr: &Limit,
        c: &mut Counter,
        now: u64,
        leased: Option<u64>,
        units: u64,
    ) -> bool {
        let now_ms = now / NANOS_PER_MS;
        let algo = cr.counters.algorithm();
        let mut wake = false;
        let mut logs = c.logs.as_deref_mut();
        for (ti, (state, tier)) in c.tiers.iter_mut().zip(cr.tiers(c.list)).enumerate() {
            let tier = &ledger::granted(tier, state, algo);
            if let Some(log) = logs.as_deref_mut().and_then(|l| l.get_mut(ti)) {
                log.prune(tier, now);
                log.commit(tier, now, units);
            }
            // as `check` found it (the state has not changed since)
            let how = match leased.filter(|_| !state.ledger.unreachable) {
                Some(n) => ledger::direct(state, tier, algo, now_ms, n, units)
                    .map_or(Admitted::Leased, Admitted::Direct),
                None => Admitted::Unsynced {
                    direct_capable: ledger::direct_capable(tier, algo),
                },
            };
            algorithm::commit(state, tier, algo, now, units);
            wake |= ledger::commit(state, how, units) && leased.is_some();
        }
        wake
    }

    /// Charge a forwarded request to the rules that charge once its answer is known: each entry
    /// of `d.late` is charged `charge_of(entry)` units (`None`: not yet, it stays owed). Charged
    /// entries leave `d.late` (a second call charges nothing), and the quota reports of their
    /// rules are corrected to the charge (admission assumed the units it checked). Late: the
    /// count may pass a threshold by what the requests in flight when it filled are charged.
    /// Returns whether a fleet round is wanted now.
    pub fn charge_late(
        &self,
        d: &mut Decision,
        mut charge_of: impl FnMut(&Late) -> Option<u64>,
    ) -> bool {
        if d.late.is_empty() {
            return false;
        }
        let now = self.clock.now_ns();
        let (leased, _) = self.fleet.mode().ledger_modes();
        let mut wake = false;
        // charged entries leave; those still owed stay where they are (no new list for them)
        let mut owed = std::mem::take(&mut d.late);
        owed.retain(|late| {
            let Some(cr) = self.limits.get(usize::from(late.rule)) else {
                return false;
            };
            let Some(charge) = charge_of(late) else {
                return true;
            };
            for t in d.tiers.iter_mut().filter(|t| t.rule == late.rule) {
                t.verdict.remaining = (t.verdict.remaining + late.units)
                    .saturating_sub(charge)
                    .min(t.threshold);
            }
            wake |= self.charge(cr, late, charge, now, leased);
            false
        });
        d.late = owed;
        wake
    }

    /// Count `units` of a late charge in its counter, rolled to `now`. Returns whether a fleet
    /// round is wanted now.
    fn charge(&self, cr: &Limit, late: &Late, units: u64, now: u64, leased: Option<u64>) -> bool {
        if units == 0 && !late.reserved {
            // nothing to count, nothing to release (an answer `count_when` does not name)
            return false;
        }
        let rc = &cr.counters;
        let algo = rc.algorithm();
        let mut shard = rc.lock(RuleCounters::shard_of_hash(late.hash));
        // an untracked partition (the store at its cap) is judged on its estimate alone
        let Ok(c) = rc.counter(&mut shard, &late.key, late.hash, late.list, now) else {
            return false;
        };
        for (ti, (state, tier)) in c.tiers.iter_mut().zip(cr.tiers(late.list)).enumerate() {
            if let Some(orphan) = algorithm::roll(state, tier, algo, now) {
                rc.keep_orphan(&late.key, late.list, ti, orphan);
            }
            if late.reserved {
                ledger::note_answer(state, units);
            }
        }
        units > 0 && Self::commit_tiers(cr, c, now, leased, units)
    }

    /// An operator's adjustment of one tier (`ti`) of one partition (`key`, tier list
    /// `list`) of the limit `rule`: the window rolled to now, then `ledger::adjust` (a reset
    /// also empties a sliding log's span). A reset touches only a partition counted here; a
    /// grant makes its counter if there is none yet. Returns whether a counter was changed.
    pub fn adjust(
        &self,
        rule: u16,
        (key, list): (&[u8], u16),
        ti: usize,
        how: ledger::Adjust,
    ) -> bool {
        let Some(cr) = self.limits.get(usize::from(rule)) else {
            return false;
        };
        let Some(tier) = cr.tiers(list).get(ti).copied() else {
            return false;
        };
        let rc = &cr.counters;
        let algo = rc.algorithm();
        let now = self.clock.now_ns();
        let reset = matches!(
            how,
            ledger::Adjust::Reset | ledger::Adjust::Fleet { reset: true, .. }
        );
        let hash = rc.hash_of(key);
        let mut shard = rc.lock(RuleCounters::shard_of_hash(hash));
        if how == ledger::Adjust::Reset && !shard.holds(key, hash) {
            return false;
        }
        let Ok(c) = rc.counter(&mut shard, key, hash, list, now) else {
            return false;
        };
        let Some(state) = c.tiers.get_mut(ti) else {
            return false;
        };
        if let Some(orphan) = algorithm::roll(state, &tier, algo, now) {
            rc.keep_orphan(key, list, ti, orphan);
        }
        ledger::adjust(state, algo, how, (tier.period_ms, tier.threshold));
        if let Some(log) = c.logs.as_deref_mut().and_then(|l| l.get_mut(ti)) {
            if reset {
                log.forget();
            }
        }
        true
    }

    fn commit(
        &self,
        applying: &[Applying],
        slots: &mut [Slot],
        decision: &Decision,
        now: u64,
        mode: FleetMode,
    ) -> bool {
        let (leased, _) = mode.ledger_modes();
        let mut wake = false;
        for ((a, slot), &(_, violated)) in
            applying.iter().zip(slots.iter_mut()).zip(&decision.applied)
        {
            if violated && mode != FleetMode::AllowAll {
                continue;
            }
            let Slot::Tracked(c) = slot else {
                continue;
            };
            let cr = &self.limits[a.rule as usize];
            if cr.charges_late {
                // charged once the answer is known (`charge_late`)
                continue;
            }
            wake |= Self::commit_tiers(cr, c, now, leased, a.units);
        }
        wake
    }
}

#[cfg(test)]
mod tests {
    //! The limiter on its own, as a caller outside the gateway uses it: limits built from the
    //! store, the applying rules found by the caller, decisions under a fake clock.
    use super::*;
    use crate::clock::FakeClock;
    use crate::partition::{PartitionBy, PartitionValue};
    use crate::store::{CounterRegistry, RuleIdentity};
    use std::time::Duration;

    const T0: u64 = 1_800_000_000_000;

    struct Rig {
        limiter: Limiter,
        clock: Arc<FakeClock>,
    }

    /// One limit per (id, threshold per second, enforcement), per tenant, fixed windows.
    fn rig(limits: &[(&str, u64, Enforcement)]) -> Rig {
        rig_of(Algorithm::FixedWindow, limits)
    }

    /// The same, of one algorithm.
    fn rig_of(algorithm: Algorithm, limits: &[(&str, u64, Enforcement)]) -> Rig {
        let counter = |name: &str| prometheus::IntCounter::new(name, "test").expect("counter");
        let registry = CounterRegistry::new(counter("evictions"), counter("untracked"));
        let limits = limits
            .iter()
            .map(|&(id, threshold, enforcement)| {
                let quota = Quota {
                    threshold,
                    period_ms: 1000,
                    calendar: None,
                    queue: None,
                };
                let identity = RuleIdentity::of(
                    id,
                    algorithm,
                    &PartitionBy::Tenant,
                    [(None, vec![(Duration::from_secs(1), None)])],
                );
                let counters = registry.get_or_create(identity, vec![vec![quota]], 1000);
                Limit::new(counters, vec![vec![quota]], enforcement, false)
            })
            .collect();
        let clock = Arc::new(FakeClock::at_ms(T0));
        let fleet = Arc::new(FleetState::new(300));
        Rig {
            limiter: Limiter::new(limits, clock.clone(), fleet),
            clock,
        }
    }

    impl Rig {
        /// A request of `tenant` to which every limit applies.
        fn decide(&self, tenant: &str) -> Decision {
            let mut keys: SmallVec<[u8; 64]> = SmallVec::new();
            PartitionValue::Bytes(tenant.as_bytes()).store_key(&mut keys);
            let mut applying: SmallVec<[Applying; 4]> = self
                .limiter
                .limits
                .iter()
                .enumerate()
                .map(|(i, l)| Applying {
                    rule: i as u16,
                    list: 0,
                    units: 1,
                    hash: l.counters.hash_of(&keys),
                    uid: l.counters.uid,
                    key_start: 0,
                    key_end: keys.len(),
                })
                .collect();
            let mut d = Decision::none();
            let mode = self.limiter.fleet().mode();
            let now = self.limiter.now_ns();
            self.limiter
                .decide(&mut applying, &keys, now, (mode, Patience::First), &mut d);
            d
        }
    }

    const REJECT: Enforcement = Enforcement::Reject { status: 429 };

    /// Requests of `tenant` admitted in a row, up to `most`.
    fn admitted_in_a_row(r: &Rig, tenant: &str, most: u32) -> u32 {
        (0..most)
            .take_while(|_| r.decide(tenant).verdict == Verdict::Allow)
            .count() as u32
    }

    #[test]
    fn a_reset_starts_the_window_again_and_a_grant_admits_that_many_more_in_it_alone() {
        for algo in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
        ] {
            let r = rig_of(algo, &[("api", 10, REJECT)]);
            let mut key: SmallVec<[u8; 64]> = SmallVec::new();
            PartitionValue::Bytes(b"acme").store_key(&mut key);
            // a reset of a partition not counted here changes nothing, and makes no counter
            assert!(
                !r.limiter.adjust(0, (&key, 0), 0, ledger::Adjust::Reset),
                "{algo}"
            );
            assert!(r.limiter.limits[0].counters.get(&key).is_none());
            assert_eq!(admitted_in_a_row(&r, "acme", 20), 10, "{algo}");
            assert!(r.limiter.adjust(0, (&key, 0), 0, ledger::Adjust::Reset));
            assert_eq!(
                admitted_in_a_row(&r, "acme", 20),
                10,
                "{algo}: after a reset"
            );
            assert!(r.limiter.adjust(0, (&key, 0), 0, ledger::Adjust::Grant(5)));
            assert_eq!(
                admitted_in_a_row(&r, "acme", 20),
                5,
                "{algo}: after a grant"
            );
            // another tenant's counters are its own
            assert_eq!(admitted_in_a_row(&r, "other", 20), 10, "{algo}");
            // a grant is for the window it was made in (a bucket: tokens, up to full)
            r.clock.advance_ms(2000);
            assert_eq!(
                admitted_in_a_row(&r, "acme", 20),
                10,
                "{algo}: the next window"
            );
            assert!(r.limiter.adjust(0, (&key, 0), 0, ledger::Adjust::Grant(3)));
            let more = admitted_in_a_row(&r, "acme", 20);
            assert_eq!(more, 3, "{algo}: a grant on a full window");
        }
    }

    #[test]
    fn a_sliding_window_weighs_only_what_came_after_its_reset() {
        for algo in [Algorithm::SlidingWindow, Algorithm::SlidingLog] {
            let r = rig_of(algo, &[("api", 10, REJECT)]);
            let mut key: SmallVec<[u8; 64]> = SmallVec::new();
            PartitionValue::Bytes(b"acme").store_key(&mut key);
            r.clock.advance_ms(900);
            assert_eq!(admitted_in_a_row(&r, "acme", 20), 10, "{algo}");
            r.clock.advance_ms(200);
            // the previous window weighs nearly all: one passes at most
            assert!(admitted_in_a_row(&r, "acme", 20) <= 1, "{algo}");
            assert!(r.limiter.adjust(0, (&key, 0), 0, ledger::Adjust::Reset));
            assert_eq!(
                admitted_in_a_row(&r, "acme", 20),
                10,
                "{algo}: after a reset"
            );
            // a grant admits its units in its window, and weighs nothing on the next
            assert!(r.limiter.adjust(0, (&key, 0), 0, ledger::Adjust::Grant(4)));
            assert_eq!(
                admitted_in_a_row(&r, "acme", 20),
                4,
                "{algo}: after a grant"
            );
            // a tenth into the next window: a sliding window weighs the 10 counted besides the
            // grant nine tenths (the 14 would let none pass); a log's span holds none of them
            r.clock.advance_ms(1000);
            let next = admitted_in_a_row(&r, "acme", 20);
            let expected = if algo == Algorithm::SlidingLog { 10 } else { 1 };
            assert_eq!(next, expected, "{algo}: the next window");
        }
    }

    #[test]
    fn a_request_held_on_a_quiet_records_first_ask_asks_for_a_round_at_once() {
        for (algo, at_once) in [
            (Algorithm::FixedWindow, true),
            (Algorithm::SlidingWindow, true),
            (Algorithm::SlidingLog, true),
            (Algorithm::TokenBucket, false),
        ] {
            let r = rig_of(algo, &[("api", 10, REJECT)]);
            let fleet = r.limiter.fleet();
            fleet.configure(true, crate::fleet::OnFailure::LocalShare);
            fleet.set_instances(2);
            assert_eq!(
                r.decide("acme").verdict,
                Verdict::Hold,
                "{algo}: no lease yet"
            );
            // (the caller asks for the round: `decide` returns that it is to)
            assert_eq!(fleet.round_at_once(), at_once, "{algo}");
            fleet.take_round_request();
            assert!(!fleet.round_at_once(), "{algo}: taken with the round");
        }
    }

    #[test]
    fn a_request_over_one_limit_takes_nothing_from_the_others_until_the_window_rolls() {
        let r = rig(&[("narrow", 2, REJECT), ("wide", 100, REJECT)]);
        for _ in 0..2 {
            assert_eq!(r.decide("acme").verdict, Verdict::Allow);
        }
        for _ in 0..5 {
            let d = r.decide("acme");
            assert_eq!(d.verdict, Verdict::Reject { status: 429 });
            // the wide limit counted the two admitted only: 97 would be left after this one
            assert_eq!(d.tiers[1].verdict.remaining, 97, "{:?}", d.tiers);
        }
        r.clock.advance_ms(1000);
        let d = r.decide("acme");
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(d.tiers[1].verdict.remaining, 99, "{:?}", d.tiers);
        // another tenant has its own counters
        assert_eq!(r.decide("other").verdict, Verdict::Allow);
    }

    #[test]
    fn reject_beats_delay_and_a_shadow_limit_never_decides() {
        let delay = Enforcement::Delay {
            max_delay_ms: 5000,
            status: 503,
        };
        let r = rig(&[("shadow", 1, Enforcement::Shadow), ("slow", 1, delay)]);
        assert_eq!(r.decide("acme").verdict, Verdict::Allow);
        let d = r.decide("acme");
        assert!(
            matches!(d.verdict, Verdict::Delay { status: 503, .. }),
            "{:?}",
            d.verdict
        );
        let r = rig(&[("slow", 1, delay), ("hard", 1, REJECT)]);
        r.decide("acme");
        assert_eq!(r.decide("acme").verdict, Verdict::Reject { status: 429 });
    }
}
