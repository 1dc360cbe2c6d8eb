//! The decision for one request: which rules apply, and whether every tier of every applying
//! rule lets it through. Check, then commit: a request denied by any tier consumes nothing from
//! any tier.
//!
//! Concurrency: the shards of all applying rules are locked together, always in the order of
//! their counters' `uid` (stable across reloads), so check-then-commit is exact and two requests
//! can never deadlock, even when one runs under an older config than the other.

use super::concurrency;
use super::decision_metrics::{self, RuleMetrics};
use super::fleet::{FleetMode, FleetState};
use super::policy::{tier_texts, PolicyCache, TierText};
use crate::config::model::{Action, Algorithm, Cost, HeaderCost, PartitionBy, Plans, Rule, Tier};
use crate::matching::Segments;
use http::{HeaderMap, Method};
use prometheus::IntCounterVec;
use smallvec::SmallVec;
use std::net::IpAddr;
use std::sync::Arc;
use tollgate_limits::algorithm::{self, Quota, TierState, TierVerdict};
use tollgate_limits::clock::{Clock, NANOS_PER_MS};
use tollgate_limits::decision::{Answered, Decision, Late, Queued, TierReport, Verdict};
use tollgate_limits::in_flight;
use tollgate_limits::ledger::{self, Admitted, Ceiling};
use tollgate_limits::partition::PartitionValue;
use tollgate_limits::sliding_log::Log;
use tollgate_limits::store::{
    Counter, CounterRegistry, RuleCounters, RuleIdentity, Shard, Untracked,
};
use tollgate_limits::top;

pub struct CompiledRule {
    pub rule: Arc<Rule>,
    pub counters: Arc<RuleCounters>,
    /// For each config plan (by index): the tier list of `counters` its tenants use.
    pub(super) plan_lists: Vec<u16>,
    pub metrics: RuleMetrics,
    /// Header texts of each tier, by tier list then tier, made once per config.
    pub texts: Vec<Vec<TierText>>,
    /// The partitions denied most, or closest to their limit, in the current window of the
    /// rule's longest period (every tier list's).
    pub top: top::TopPartitions,
    pub top_period_ms: u64,
    /// The tiers of each list, with this config's thresholds (the counters' identity holds
    /// only the periods).
    tier_lists: Vec<Vec<Quota>>,
}

impl CompiledRule {
    /// The tiers of list `list` (0: the rule's `tiers`, then plans' own).
    pub fn tiers(&self, list: u16) -> &[Quota] {
        self.tier_lists
            .get(usize::from(list))
            .map_or(&[][..], |l| &l[..])
    }

    /// The tier list a tenant of `plan` uses (0: the rule's own `tiers`).
    pub fn list_of(&self, plan: Option<usize>) -> u16 {
        plan.and_then(|p| self.plan_lists.get(p).copied())
            .unwrap_or(0)
    }

    /// The start of `/api/top`'s current window at `now_ms`: aligned to the rule's longest
    /// period, so that an hourly tier's denials are still there after its 1 s tier rolled.
    pub fn top_window(&self, now_ms: u64) -> u64 {
        now_ms / self.top_period_ms * self.top_period_ms
    }
}

impl From<&Tier> for Quota {
    fn from(tier: &Tier) -> Quota {
        Quota {
            threshold: tier.threshold,
            period_ms: tier.period.as_millis() as u64,
            calendar: tier.calendar,
            queue: tier.queue,
        }
    }
}

/// The rate limiter of one config snapshot. Its counters outlive it (see `CounterRegistry`).
pub struct Limiter {
    pub rules: Vec<CompiledRule>,
    /// Rules with `concurrency`: requests in flight per partition.
    pub concurrency: Vec<concurrency::ConcurrencyRule>,
    pub(super) clock: Arc<dyn Clock>,
    pub(crate) fleet: Arc<FleetState>,
    /// `RateLimit-Policy` values by the set of tiers that applied (bounded).
    pub(crate) policy_cache: PolicyCache,
    /// Some rule takes its cost from a request header (`cost_refusal` has work to do).
    header_costs: bool,
}

/// What the limiter needs to know about a request.
pub struct LimitRequest<'a> {
    pub method: &'a Method,
    pub host: Option<&'a str>,
    /// The normalized path, split into segments.
    pub path: &'a Segments<'a>,
    pub tenant: &'a [u8],
    /// The plan the request's verified token names (`jwt.plan_claim`), which outranks the
    /// tenant's configured plan for this request.
    pub plan: Option<usize>,
    pub client_ip: IpAddr,
    pub headers: &'a HeaderMap,
}

impl LimitRequest<'_> {
    /// The request's plan: its token's, else its tenant's.
    pub fn plan_in(&self, plans: &Plans) -> Option<usize> {
        if self.tenant.is_empty() {
            return None;
        }
        self.plan.or_else(|| plans.plan_of(self.tenant))
    }
}

/// How long a request has waited for the fleet (`Verdict::Hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Patience {
    /// Not held yet: a hold counts it in the next ask.
    First,
    /// Held, and decided again after a round.
    Again,
    /// Held as long as it may: it is not held again.
    Over,
}

/// An applying rule during one decision.
pub(super) struct Applying {
    pub(super) rule: u16,
    pub(super) list: u16,
    /// The units the request takes from each tier (`cost`).
    units: u64,
    hash: u64,
    /// Its counters' `uid`: the order shards are locked in.
    uid: u64,
    pub(super) key_start: usize,
    pub(super) key_end: usize,
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

/// The fleet's mode as the ledger takes it: (leased by instances, shared by instances).
fn fleet_modes(mode: FleetMode) -> (Option<u64>, Option<u64>) {
    match mode {
        FleetMode::Leased { instances } => (Some(instances), None),
        FleetMode::Shared { instances } => (None, Some(instances)),
        _ => (None, None),
    }
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
    s.ledger.gen = 1;
    s.ledger.used = before;
    if algo.is_bucket() {
        let interval = (p_ms * NANOS_PER_MS / tier.threshold.max(1)).max(1);
        s.tat_ns = now_ns.saturating_add(before.saturating_mul(interval));
    }
    s
}

impl Limiter {
    /// Count the final outcome of a request in the decision metrics (`decision_metrics`).
    /// `admitted`: the request goes to the upstream (allowed, or throttled).
    pub fn record(&self, d: &Decision, admitted: bool, was_delayed: bool) {
        decision_metrics::record(
            d,
            admitted,
            was_delayed,
            |r| {
                let cr = self.rules.get(usize::from(r))?;
                Some((&cr.metrics, cr.rule.action, &*cr.rule.id))
            },
            || self.clock.now_ns() / NANOS_PER_MS,
        );
    }

    /// The first exceeded rule that enforces (its index), and the first exceeded shadow rule:
    /// what the access log names.
    pub fn deciding_rules(&self, d: &Decision) -> (Option<u16>, Option<u16>) {
        let violated = |shadow: bool| {
            d.applied
                .iter()
                .filter(|&&(_, v)| v)
                .map(|&(r, _)| r)
                .find(|&r| {
                    self.rules
                        .get(usize::from(r))
                        .is_some_and(|cr| (cr.rule.action == Action::Shadow) == shadow)
                })
        };
        (violated(false), violated(true))
    }

    /// Compile the rules of a config, reusing the counters of rules whose identity is unchanged.
    pub fn build(
        rules: &[Arc<Rule>],
        plans: &Plans,
        registry: &CounterRegistry,
        decisions: &IntCounterVec,
        cap_per_rule: usize,
        clock: Arc<dyn Clock>,
        fleet: Arc<FleetState>,
    ) -> Limiter {
        let compiled: Vec<CompiledRule> = rules
            .iter()
            // rules with tiers (a rule with only `concurrency` is `InFlightLimits`')
            .filter(|r| r.enabled && !r.tiers.is_empty())
            .map(|r| {
                let mut lists = vec![(None, r.tiers.clone())];
                let mut plan_lists = vec![0u16; plans.names.len()];
                for (p, tiers) in r.plan_tiers.iter().enumerate() {
                    if let Some(t) = tiers {
                        plan_lists[p] = lists.len() as u16;
                        lists.push((Some(plans.names[p].clone()), t.clone()));
                    }
                }
                let texts = lists
                    .iter()
                    .map(|(_, t)| tier_texts(&r.id, t, r.unit.as_deref()))
                    .collect();
                let top_period_ms = lists
                    .iter()
                    .flat_map(|(_, t)| t.iter())
                    .map(|t| t.period.as_millis() as u64)
                    .max()
                    .unwrap_or(1)
                    .max(1);
                let metrics = RuleMetrics::new(decisions, &r.id, lists.iter().map(|(_, t)| &t[..]));
                let identity = RuleIdentity::of(
                    &r.id,
                    r.algorithm,
                    &r.per,
                    lists.iter().map(|(n, t)| (n.clone(), Tier::periods(t))),
                );
                let tier_lists: Vec<Vec<Quota>> = lists
                    .iter()
                    .map(|(_, t)| t.iter().map(Quota::from).collect())
                    .collect();
                CompiledRule {
                    texts,
                    top: Default::default(),
                    top_period_ms,
                    rule: Arc::clone(r),
                    counters: registry.get_or_create(identity, tier_lists.clone(), cap_per_rule),
                    tier_lists,
                    plan_lists,
                    metrics,
                }
            })
            .collect();
        let concurrency = rules
            .iter()
            .filter(|r| r.enabled)
            .filter_map(|r| {
                Some(concurrency::ConcurrencyRule {
                    rule: Arc::clone(r),
                    max: r.concurrency?,
                    table: registry.in_flight.get_or_create(&r.id, &r.per),
                    denied: decisions.with_label_values(&[r.id.as_str(), "denied", "concurrency"]),
                })
            })
            .collect();
        let header_costs = compiled
            .iter()
            .any(|cr| matches!(cr.rule.cost, Cost::Header { .. }));
        Limiter {
            rules: compiled,
            concurrency,
            clock,
            fleet,
            policy_cache: PolicyCache::default(),
            header_costs,
        }
    }

    /// The limiter's clock: nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// No rule limits anything (neither rates nor requests in flight).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.concurrency.is_empty()
    }

    /// Take a slot in every `concurrency` limit that applies to the request (see `in_flight`).
    pub fn acquire(
        &self,
        req: &LimitRequest,
        plans: &Plans,
    ) -> Result<SmallVec<[in_flight::Slot; 1]>, concurrency::Refusal> {
        concurrency::acquire(&self.concurrency, |r| {
            let exempt = !r.exempt.is_empty() && Self::exempt(r, req, req.plan_in(plans));
            if r.matcher.matches(req.method, req.host, req.path) && !exempt {
                Self::partition(r, req)
            } else {
                None
            }
        })
    }

    /// A request whose cost header is over a matching rule's `max`: what to tell the client
    /// (400), before anything is counted.
    pub fn cost_refusal(&self, req: &LimitRequest) -> Option<String> {
        if !self.header_costs {
            return None;
        }
        self.rules.iter().find_map(|cr| {
            let r = &cr.rule;
            let Cost::Header { name, max, .. } = &r.cost else {
                return None;
            };
            match r.cost.of(req.headers) {
                HeaderCost::TooHigh(v) if r.matcher.matches(req.method, req.host, req.path) => {
                    Some(format!(
                        "{name} is {v}, over the most a request may cost here ({max})"
                    ))
                }
                _ => None,
            }
        })
    }

    /// Does `rule` leave this request alone (`exempt`)?
    fn exempt(rule: &Rule, req: &LimitRequest, plan: Option<usize>) -> bool {
        !rule.exempt.is_empty() && rule.exempt.covers(req.client_ip, req.tenant, plan)
    }

    fn partition<'a>(rule: &Rule, req: &LimitRequest<'a>) -> Option<PartitionValue<'a>> {
        Some(match &rule.per {
            // a route with `tenant: none` has no tenant: per-tenant rules do not count it
            PartitionBy::Tenant if req.tenant.is_empty() => return None,
            PartitionBy::Tenant => PartitionValue::Bytes(req.tenant),
            PartitionBy::Ip => PartitionValue::Ip(req.client_ip),
            PartitionBy::Global => PartitionValue::Global,
            // a request without the header is not counted by that rule
            PartitionBy::Header(h) => PartitionValue::Bytes(req.headers.get(h)?.as_bytes()),
        })
    }

    /// Decide, and commit if the request is allowed: find the applying rules, lock their
    /// counters, check every tier, choose the verdict, commit. `Verdict::Hold`: wait for the
    /// next sync round, then decide again (`decide_after_hold` once the wait is over).
    pub fn decide(&self, req: &LimitRequest, plans: &Plans) -> Decision {
        let mut d = Decision::none();
        self.decide_in(req, plans, self.fleet.mode(), Patience::First, &mut d);
        d
    }

    /// [`Limiter::decide`] written to `out` (cleared first), as the request path calls it:
    /// the decision is neither moved nor boxed. Returns how long it took (ns, on the
    /// limiter's clock, whose reading the decision takes anyway).
    pub fn decide_into(&self, req: &LimitRequest, plans: &Plans, out: &mut Decision) -> u64 {
        let start = self.decide_in(req, plans, self.fleet.mode(), Patience::First, out);
        start.map_or(0, |t| self.clock.now_ns().saturating_sub(t))
    }

    /// Decide again for a request that was held, after a round ended: it may be held again,
    /// but the next round already asks for it.
    pub fn decide_again(&self, req: &LimitRequest, plans: &Plans) -> Decision {
        let mut d = Decision::none();
        self.decide_in(req, plans, self.fleet.mode(), Patience::Again, &mut d);
        d
    }

    /// Decide for a request that was held as long as it may (`FleetState::hold_ms`): never
    /// held again. If Redis did not answer meanwhile, `on_failure` decides; if an answer could
    /// not grant what waited, the fleet is full (refused); else the rounds were only slow, and
    /// it takes its part of what the last answer left (`ledger::fits_after_hold`).
    pub fn decide_after_hold(&self, req: &LimitRequest, plans: &Plans) -> Decision {
        let mut d = Decision::none();
        let mode = self.fleet.mode_without_answer();
        self.decide_in(req, plans, mode, Patience::Over, &mut d);
        d
    }

    /// Decide into `decision` (cleared first). Returns the clock's reading the decision was
    /// taken at (read once, before the rules are matched and their counters locked: a
    /// request that waited for a lock counts where the window stood when it came).
    fn decide_in(
        &self,
        req: &LimitRequest,
        plans: &Plans,
        mode: FleetMode,
        patience: Patience,
        decision: &mut Decision,
    ) -> Option<u64> {
        decision.clear();
        if self.rules.is_empty() {
            return None;
        }
        let now = self.clock.now_ns();
        let mut arena: SmallVec<[u8; 256]> = SmallVec::new();
        let mut applying = self.applying(req, plans, &mut arena);
        if applying.is_empty() {
            return Some(now);
        }
        // lock in uid order
        applying.sort_unstable_by_key(|a| a.uid);
        let mut guards: SmallVec<[_; 4]> = applying
            .iter()
            .map(|a| {
                self.rules[a.rule as usize]
                    .counters
                    .lock(RuleCounters::shard_of_hash(a.hash))
            })
            .collect();
        let mut slots: SmallVec<[Slot; 4]> = SmallVec::new();
        let mut wake = false;
        for (a, guard) in applying.iter().zip(guards.iter_mut()) {
            let key = &arena[a.key_start..a.key_end];
            let (slot, w) = self.check(a, guard, key, now, mode, patience, decision);
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
            wake |= self.commit(&applying, &mut slots, decision, now, mode);
            if decision.wait_ns > 0 {
                self.note_turns(&applying, &slots, &arena, decision);
            }
            // a rule is charged only what it would let through, late or not
            for (a, &(_, violated)) in applying.iter().zip(&decision.applied) {
                if !violated && self.rules[a.rule as usize].rule.charges_late() {
                    decision.late.push(Late {
                        rule: a.rule,
                        list: a.list,
                        hash: a.hash,
                        key: arena[a.key_start..a.key_end].into(),
                        units: a.units,
                        reserved: matches!(mode, FleetMode::Leased { .. }),
                    });
                }
            }
        }
        if wake {
            self.fleet.want_round();
        }
        drop(slots);
        drop(guards);
        Some(now)
    }

    /// Keep the turns an admitted request took in leaky buckets (see `Decision::queued`).
    fn note_turns(
        &self,
        applying: &[Applying],
        slots: &[Slot],
        arena: &[u8],
        decision: &mut Decision,
    ) {
        for ((a, slot), &(_, violated)) in applying.iter().zip(slots).zip(&decision.applied) {
            let cr = &self.rules[a.rule as usize];
            if violated
                || cr.rule.action == Action::Shadow
                || cr.counters.algorithm() != Algorithm::LeakyBucket
            {
                continue;
            }
            if let Slot::Tracked(c) = slot {
                decision.queued.push(Queued {
                    rule: a.rule,
                    list: a.list,
                    hash: a.hash,
                    key: arena[a.key_start..a.key_end].into(),
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
            let Some(cr) = self.rules.get(usize::from(q.rule)) else {
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

    /// The applying rules, with their partition keys in one arena.
    pub(super) fn applying(
        &self,
        req: &LimitRequest,
        plans: &Plans,
        arena: &mut SmallVec<[u8; 256]>,
    ) -> SmallVec<[Applying; 4]> {
        let plan = if plans.names.is_empty() {
            None
        } else {
            req.plan_in(plans)
        };
        let mut applying = SmallVec::new();
        for (i, cr) in self.rules.iter().enumerate() {
            let r = &cr.rule;
            if !r.matcher.matches(req.method, req.host, req.path) || Self::exempt(r, req, plan) {
                continue;
            }
            let Some(part) = Self::partition(r, req) else {
                continue;
            };
            let key_start = arena.len();
            part.store_key(arena);
            let list = match r.per {
                PartitionBy::Tenant => cr.list_of(plan),
                _ => 0,
            };
            let units = match r.cost.of(req.headers) {
                HeaderCost::Units(u) => u,
                // refused before any decision (`cost_refusal`)
                HeaderCost::TooHigh(_) => u64::MAX,
            };
            applying.push(Applying {
                rule: i as u16,
                list,
                units,
                hash: cr.counters.hash_of(&arena[key_start..]),
                uid: cr.counters.uid,
                key_start,
                key_end: arena.len(),
            });
        }
        applying
    }

    /// Check every tier of one applying rule (its shard locked); report each tier in
    /// `decision`. Returns the slot to commit to, and whether a fleet round is wanted now.
    #[allow(clippy::too_many_arguments)]
    fn check<'g>(
        &self,
        a: &Applying,
        shard: &'g mut Shard,
        key: &[u8],
        now: u64,
        mode: FleetMode,
        patience: Patience,
        decision: &mut Decision,
    ) -> (Slot<'g>, bool) {
        let cr = &self.rules[a.rule as usize];
        let rc = &cr.counters;
        let tiers = cr.tiers(a.list);
        let cx = RuleCheck {
            algo: rc.algorithm(),
            units: a.units,
            now,
            mode,
            patience,
            shadow: cr.rule.action == Action::Shadow,
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
            Slot::Tracked(c) => (&mut c.tiers, c.logs.as_deref_mut()),
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
        ledger::note_demand(state, cx.units);
        if !self.fleet.plain_increments() {
            // a Redis Cluster: every record leases (see `FleetState::plain_increments`)
            state.ledger.leased = true;
        }
        // a counter whose cluster node is down while the rest of Redis answers
        let (leased, shared) =
            if state.ledger.unreachable && matches!(cx.mode, FleetMode::Leased { .. }) {
                fleet_modes(self.fleet.unreachable_mode())
            } else {
                fleet_modes(cx.mode)
            };
        let wake = self.fleet_ceiling(
            state,
            (tier, cx.units),
            algo,
            now / NANOS_PER_MS,
            (leased, shared),
            cx.patience,
            cx.shadow,
            &mut verdict,
            held,
        );
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
    #[allow(clippy::too_many_arguments)]
    fn fleet_ceiling(
        &self,
        state: &mut TierState,
        (tier, units): (&Quota, u64),
        algo: Algorithm,
        now_ms: u64,
        (leased, shared): (Option<u64>, Option<u64>),
        patience: Patience,
        shadow: bool,
        verdict: &mut TierVerdict,
        held: &mut bool,
    ) -> bool {
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
                        && ledger::fits_after_hold(state, tier, algo, n, units)
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
            // a shadow rule never holds a request: it runs on credit
            Ceiling::LeaseUsed if shadow => {}
            Ceiling::LeaseUsed => {
                // under the limit, but this instance's lease is used: the request waits for
                // the next round, which asks for it (it is never refused for this)
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

    /// The verdict from the violated rules' actions and the fleet's state.
    fn verdict(&self, decision: &Decision, mode: FleetMode) -> Verdict {
        let mut reject: Option<u16> = None;
        let mut shadowban: Option<u16> = None;
        let mut throttle: Option<u64> = None; // the slowest pace
        let mut delay: Option<(u64, u16)> = None; // (smallest max_delay, status)
        for &(rule, violated) in &decision.applied {
            let r = &self.rules[rule as usize].rule;
            if !violated {
                continue;
            }
            match r.action {
                Action::Shadow => {}
                Action::Reject => {
                    reject.get_or_insert(r.status);
                }
                Action::Shadowban => {
                    shadowban.get_or_insert(rule);
                }
                Action::Throttle => {
                    throttle = Some(throttle.map_or(r.throttle_bps, |t| t.min(r.throttle_bps)));
                }
                Action::Delay => {
                    let md = r.max_delay.as_millis() as u64;
                    delay = Some(match delay {
                        Some((d, s)) if d <= md => (d, s),
                        _ => (md, r.status),
                    });
                }
            }
        }
        let enforced = decision
            .applied
            .iter()
            .any(|&(r, _)| self.rules[r as usize].rule.action != Action::Shadow);
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
        cr: &CompiledRule,
        c: &mut Counter,
        now: u64,
        leased: Option<u64>,
        units: u64,
    ) -> bool {
        let now_ms = now / NANOS_PER_MS;
        let algo = cr.counters.algorithm();
        let mut wake = false;
        if let Some(logs) = c.logs.as_deref_mut() {
            for (log, tier) in logs.iter_mut().zip(cr.tiers(c.list)) {
                log.prune(tier, now);
                log.commit(tier, now, units);
            }
        }
        for (state, tier) in c.tiers.iter_mut().zip(cr.tiers(c.list)) {
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

    /// Charge a forwarded request to the rules that charge once its answer is known: its
    /// `status` (`count_when`) and its `headers` (a cost the answer carries; without it, the
    /// rule's `default`). Charged entries leave `d.late` (a second call charges nothing), and
    /// the quota reports of their rules are corrected to the charge (admission assumed the
    /// units it checked). Late: the count may pass a threshold by what the requests in flight
    /// when it filled are charged.
    pub fn charge_late(&self, d: &mut Decision, status: u16, headers: &HeaderMap) {
        self.charge_answer(
            d,
            &Answered {
                status,
                grpc: crate::grpc::status_in(headers),
                fields: headers,
                ended: true,
            },
        );
    }

    /// [`Limiter::charge_late`] with what is known of the answer so far: before it has ended
    /// (`ended` false: its head), the rules that wait for its trailers
    /// (`Rule::waits_for_trailers`) stay owed.
    pub fn charge_answer(&self, d: &mut Decision, answer: &Answered<'_>) {
        if d.late.is_empty() {
            return;
        }
        let (status, headers) = (answer.status, answer.fields);
        let now = self.clock.now_ns();
        let (leased, _) = fleet_modes(self.fleet.mode());
        let mut wake = false;
        // charged entries leave; those waiting for the trailers stay where they are (no new
        // list for them)
        let mut owed = std::mem::take(&mut d.late);
        owed.retain(|late| {
            let Some(cr) = self.rules.get(usize::from(late.rule)) else {
                return false;
            };
            let r = &cr.rule;
            if !answer.ended && r.waits_for_trailers() {
                return true;
            }
            let charge = if r.count_when.is_some_and(|c| !c.counts(status, answer.grpc)) {
                0
            } else {
                match &r.cost {
                    Cost::Response { default, .. } => r.cost.of_answer(headers).unwrap_or(*default),
                    _ => late.units,
                }
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
        if wake {
            self.fleet.want_round();
        }
    }

    /// Count `units` of a late charge in its counter, rolled to `now`. Returns whether a fleet
    /// round is wanted now.
    fn charge(
        &self,
        cr: &CompiledRule,
        late: &Late,
        units: u64,
        now: u64,
        leased: Option<u64>,
    ) -> bool {
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
                ledger::release(state, late.units, units);
            }
        }
        units > 0 && Self::commit_tiers(cr, c, now, leased, units)
    }

    fn commit(
        &self,
        applying: &[Applying],
        slots: &mut [Slot],
        decision: &Decision,
        now: u64,
        mode: FleetMode,
    ) -> bool {
        let (leased, _) = fleet_modes(mode);
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
            let cr = &self.rules[a.rule as usize];
            if cr.rule.charges_late() {
                // charged once the answer is known (`charge_late`); until then, with Redis, it
                // holds the credit it may have taken
                if leased.is_some() {
                    for state in c.tiers.iter_mut() {
                        ledger::reserve(state, a.units);
                    }
                }
                continue;
            }
            wake |= Self::commit_tiers(cr, c, now, leased, a.units);
        }
        wake
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The limiter alone, on a fake clock: which rules apply, check then commit, plans, the
    //! verdict of several actions. (The request path around it: `tests/admission.rs`.)
    use super::*;
    use crate::limits::FakeClock;
    use crate::matching::Segments;
    use std::path::Path;

    const T0: u64 = 1_800_000_000_000;

    pub(crate) struct Rig {
        pub(crate) limiter: Limiter,
        pub(crate) cfg: crate::config::Config,
        clock: Arc<FakeClock>,
        _metrics: crate::metrics::Metrics,
    }

    pub(crate) fn rig(limits: &str) -> Rig {
        let text = format!(
            "server: {{ listen: [\"127.0.0.1:1\"] }}\n\
             upstreams: {{ app: {{ servers: [\"127.0.0.1:2\"] }} }}\n\
             routes: [{{ id: all, path: /**, upstream: app }}]\n\
             plans:\n  premium: [globex]\n\
             limits:\n{limits}"
        );
        let cfg = crate::config::load_str(Path::new("t.yaml"), &text).expect("valid config");
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let registry = CounterRegistry::new(metrics.evictions.clone(), metrics.untracked.clone());
        let clock = Arc::new(FakeClock::at_ms(T0));
        let limiter = Limiter::build(
            &cfg.rules,
            &cfg.plans,
            &registry,
            &metrics.decisions,
            1000,
            clock.clone(),
            Arc::new(FleetState::default()),
        );
        Rig {
            limiter,
            cfg,
            clock,
            _metrics: metrics,
        }
    }

    impl Rig {
        fn decide_with(&self, path: &str, tenant: &str, headers: &HeaderMap) -> Decision {
            let segments = Segments::new(path);
            let req = LimitRequest {
                method: &Method::GET,
                host: None,
                path: &segments,
                tenant: tenant.as_bytes(),
                plan: None,
                client_ip: "10.0.0.1".parse().expect("ip"),
                headers,
            };
            self.limiter.decide(&req, &self.cfg.plans)
        }

        pub(crate) fn decide(&self, path: &str, tenant: &str) -> Decision {
            self.decide_with(path, tenant, &HeaderMap::new())
        }

        fn used(&self, tenant: &str, rule: &str) -> u64 {
            self.limiter
                .inspect_tenant(tenant.as_bytes(), &self.cfg.plans)
                .iter()
                .find(|r| r.rule == rule)
                .map_or(0, |r| r.tiers[0].used)
        }
    }

    pub(crate) fn rule(id: &str, extra: &str, period: &str, threshold: u64) -> String {
        format!(
            "  - id: {id}\n    pathPattern: /**\n{extra}    tiers: [{{ period: {period}, threshold: {threshold} }}]\n"
        )
    }

    #[test]
    fn a_denial_by_one_rule_charges_no_other() {
        let r = rig(&(rule("wide", "", "1h", 3) + &rule("narrow", "", "1h", 1)));
        let d = r.decide("/x", "t");
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(&d.applied[..], &[(0, false), (1, false)]);
        let d = r.decide("/x", "t");
        assert_eq!(d.verdict, Verdict::Reject { status: 429 });
        assert_eq!(&d.applied[..], &[(0, false), (1, true)]);
        assert_eq!((r.used("t", "wide"), r.used("t", "narrow")), (1, 1));
    }

    #[test]
    fn a_window_ends_on_the_clock_and_says_when() {
        let r = rig(&rule("api", "", "1", 2));
        r.clock.set_ms(T0 + 400);
        for _ in 0..2 {
            assert_eq!(r.decide("/x", "t").verdict, Verdict::Allow);
        }
        let d = r.decide("/x", "t");
        assert_eq!(d.verdict, Verdict::Reject { status: 429 });
        assert_eq!(d.retry_after_ms(), 600);
        r.clock.set_ms(T0 + 1000);
        assert_eq!(r.decide("/x", "t").verdict, Verdict::Allow);
    }

    #[test]
    fn a_plan_tenant_gets_its_plans_tiers() {
        let r = rig(
            "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]\n    plans:\n      premium: [{ period: 1h, threshold: 5 }]\n",
        );
        assert_eq!(r.decide("/x", "globex").tiers[0].threshold, 5);
        assert_eq!(r.decide("/x", "acme").tiers[0].threshold, 2);
    }

    #[test]
    fn reject_beats_shadowban_beats_delay_beats_throttle() {
        let delay = "    action: delay\n    max_delay: 5s\n";
        let throttle = "    action: throttle\n    throttle: { rate: 1KiB/s }\n";
        let shadowban = "    action: shadowban\n";
        let over = |rules: &[(&str, &str)]| {
            let text: String = rules
                .iter()
                // 2 s windows: a delay fits in `max_delay`
                .map(|(id, extra)| rule(id, extra, "2", 1))
                .collect();
            let r = rig(&text);
            assert_eq!(r.decide("/x", "t").verdict, Verdict::Allow);
            r.decide("/x", "t").verdict
        };
        assert_eq!(
            over(&[("t", throttle), ("d", delay), ("s", shadowban), ("r", "")]),
            Verdict::Reject { status: 429 }
        );
        assert_eq!(
            over(&[("t", throttle), ("d", delay), ("s", shadowban)]),
            Verdict::Shadowban { rule: 2 }
        );
        assert!(matches!(
            over(&[("t", throttle), ("d", delay)]),
            Verdict::Delay {
                wait_ms: 2000,
                max_delay_ms: 5000,
                status: 429
            }
        ));
        assert_eq!(
            over(&[("t", throttle)]),
            Verdict::Throttle {
                bytes_per_sec: 1024
            }
        );
    }

    #[test]
    fn a_delay_waits_until_the_window_has_room_and_no_longer_than_max_delay() {
        let r = rig(&rule(
            "smooth",
            "    action: delay\n    max_delay: 1500ms\n",
            "1",
            1,
        ));
        r.clock.set_ms(T0 + 250);
        assert_eq!(r.decide("/x", "t").verdict, Verdict::Allow);
        assert_eq!(
            r.decide("/x", "t").verdict,
            Verdict::Delay {
                wait_ms: 750,
                max_delay_ms: 1500,
                status: 429
            }
        );
    }

    #[test]
    fn a_header_rule_skips_requests_without_the_header_and_counts_by_its_value() {
        let r = rig(&rule("by-key", "    per: header:x-client\n", "1h", 1));
        assert!(r.decide("/x", "t").applied.is_empty());
        let mut h = HeaderMap::new();
        h.insert("x-client", "one".parse().expect("value"));
        assert_eq!(r.decide_with("/x", "t", &h).verdict, Verdict::Allow);
        assert_eq!(
            r.decide_with("/x", "u", &h).verdict,
            Verdict::Reject { status: 429 },
            "the header's value is the partition, not the tenant"
        );
    }

    #[test]
    fn a_shadow_rule_never_decides_and_is_charged_only_what_it_would_admit() {
        let r = rig(&rule("trial", "    action: shadow\n", "1h", 1));
        for _ in 0..3 {
            let d = r.decide("/x", "t");
            assert_eq!(d.verdict, Verdict::Allow);
            assert!(d.tiers.iter().all(|t| t.shadow));
        }
        assert_eq!(r.used("t", "trial"), 1);
    }
}
