//! The decision for one request, the gateway's side: which rules apply (their paths, methods
//! and hosts, exemptions, partition keys, plans and costs), then the limits core decides on them
//! (`tollgate_limits::limiter`: check, then commit, every tier of every applying rule). Here
//! too: what is charged once the answer is known, the metrics of each outcome, and the
//! `concurrency` limits.

use super::concurrency;
use super::decision_metrics::{self, RuleMetrics};
use super::fleet::{Fleet, FleetMode};
use super::policy::{tier_texts, PolicyCache, TierText};
use crate::config::model::{Action, Cost, HeaderCost, PartitionBy, Plans, Rule, Tier};
use crate::matching::Segments;
use http::{HeaderMap, Method};
use prometheus::IntCounterVec;
use smallvec::SmallVec;
use std::net::IpAddr;
use std::sync::Arc;
use tollgate_limits::algorithm::Quota;
use tollgate_limits::clock::{Clock, NANOS_PER_MS};
use tollgate_limits::decision::{Answered, Decision};
use tollgate_limits::in_flight;
pub use tollgate_limits::limiter::{Applying, Enforcement, Limit, Patience};
use tollgate_limits::partition::PartitionValue;
use tollgate_limits::store::{CounterRegistry, RuleIdentity};

/// A rule of the config as the gateway serves it; its `Limit` (counters, tiers, enforcement)
/// is the limits core's, at the same index of `Limiter::core`.
pub struct CompiledRule {
    pub rule: Arc<Rule>,
    /// For each config plan (by index): the tier list of the counters its tenants use.
    pub(super) plan_lists: Vec<u16>,
    pub metrics: RuleMetrics,
    /// Header texts of each tier, by tier list then tier, made once per config.
    pub texts: Vec<Vec<TierText>>,
    /// What its quota counts, by number: 0 for requests, then each other `unit` of the config
    /// in the order the rules name them (the quota headers tell each unit apart).
    pub unit: u16,
}

impl CompiledRule {
    /// The tier list a tenant of `plan` uses (0: the rule's own `tiers`).
    pub fn list_of(&self, plan: Option<usize>) -> u16 {
        plan.and_then(|p| self.plan_lists.get(p).copied())
            .unwrap_or(0)
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

/// Number the units the rules count in (`CompiledRule::unit`: 0 for requests, then each other
/// unit in rule order). Returns how many distinct units there are.
fn number_units(rules: &mut [CompiledRule]) -> usize {
    let mut names: Vec<Box<str>> = Vec::new();
    for cr in rules.iter_mut() {
        let n = match cr.rule.unit.as_deref() {
            None => 0,
            Some(u) => match names.iter().position(|x| &**x == u) {
                Some(i) => i + 1,
                None => {
                    names.push(u.into());
                    names.len()
                }
            },
        };
        cr.unit = u16::try_from(n).unwrap_or(u16::MAX);
    }
    let requests = rules.iter().any(|cr| cr.unit == 0);
    names.len() + usize::from(requests)
}

/// What a rule does over its limit, in the core's terms.
fn enforcement(r: &Rule) -> Enforcement {
    match r.action {
        Action::Reject => Enforcement::Reject { status: r.status },
        Action::Delay => Enforcement::Delay {
            max_delay_ms: r.max_delay.as_millis() as u64,
            status: r.status,
        },
        Action::Shadow => Enforcement::Shadow,
        Action::Shadowban => Enforcement::Shadowban,
        Action::Throttle => Enforcement::Throttle {
            bytes_per_sec: r.throttle_bps,
        },
    }
}

/// The rate limiter of one config snapshot. Its counters outlive it (see `CounterRegistry`).
pub struct Limiter {
    pub rules: Vec<CompiledRule>,
    /// The limits core on the same rules (by the same index).
    pub core: tollgate_limits::limiter::Limiter,
    /// Rules with `concurrency`: requests in flight per partition.
    pub concurrency: Vec<concurrency::ConcurrencyRule>,
    pub(crate) fleet: Arc<Fleet>,
    /// `RateLimit-Policy` values by the set of tiers that applied (bounded).
    pub(crate) policy_cache: PolicyCache,
    /// Some rule takes its cost from a request header (`cost_refusal` has work to do).
    header_costs: bool,
    /// The rules count in more than one unit (requests and tokens, say): the quota headers
    /// tell each unit's most restrictive tier.
    pub mixed_units: bool,
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
        plans.plan_for(self.tenant, self.plan)
    }
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
            || self.core.now_ns() / NANOS_PER_MS,
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
        fleet: Arc<Fleet>,
    ) -> Limiter {
        let (compiled, limits): (Vec<CompiledRule>, Vec<Limit>) = rules
            .iter()
            // rules with tiers (a rule with only `concurrency` is `InFlightLimits`')
            .filter(|r| r.enabled && r.counts_rates())
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
                let counters = registry.get_or_create(identity, tier_lists.clone(), cap_per_rule);
                let compiled = CompiledRule {
                    texts,
                    rule: Arc::clone(r),
                    plan_lists,
                    metrics,
                    unit: 0,
                };
                let limit = Limit::new(counters, tier_lists, enforcement(r), r.charges_late());
                (compiled, limit)
            })
            .unzip();
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
        let mut compiled = compiled;
        let units = number_units(&mut compiled);
        Limiter {
            rules: compiled,
            core: tollgate_limits::limiter::Limiter::new(limits, clock, Arc::clone(&fleet.state)),
            concurrency,
            fleet,
            policy_cache: PolicyCache::default(),
            header_costs,
            mixed_units: units > 1,
        }
    }

    /// The limiter's clock: nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        self.core.now_ns()
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
        start.map_or(0, |t| self.core.now_ns().saturating_sub(t))
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

    /// Decide into `decision` (cleared first): the applying rules, then the core's decision.
    /// Returns the clock's reading the decision was taken at (read once, before the rules are
    /// matched and their counters locked: a request that waited for a lock counts where the
    /// window stood when it came).
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
        let now = self.core.now_ns();
        let mut arena: SmallVec<[u8; 256]> = SmallVec::new();
        let mut applying = self.applying(req, plans, &mut arena);
        if !applying.is_empty()
            && self
                .core
                .decide(&mut applying, &arena, now, (mode, patience), decision)
        {
            self.fleet.want_round();
        }
        Some(now)
    }

    /// A request that waited for its turn left before it came (the client went away): each
    /// leaky bucket it took a turn in takes it back where nobody took a later one. (The
    /// fleet's accounting still counts it.)
    pub fn leave_queue(&self, d: &mut Decision) {
        self.core.leave_queue(d);
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
        for (i, (cr, limit)) in self.rules.iter().zip(&self.core.limits).enumerate() {
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
                hash: limit.counters.hash_of(&arena[key_start..]),
                uid: limit.counters.uid,
                key_start,
                key_end: arena.len(),
            });
        }
        applying
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
        let wake = self.core.charge_late(d, |late| {
            let r = &self.rules.get(usize::from(late.rule))?.rule;
            if !answer.ended && r.waits_for_trailers() {
                return None;
            }
            Some(
                if r.count_when
                    .is_some_and(|c| !c.counts(answer.status, answer.grpc))
                {
                    0
                } else {
                    match &r.cost {
                        Cost::Response { default, .. } => {
                            r.cost.of_answer(answer.fields).unwrap_or(*default)
                        }
                        _ => late.units,
                    }
                },
            )
        });
        if wake {
            self.fleet.want_round();
        }
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
    use tollgate_limits::decision::Verdict;

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
            Arc::new(Fleet::default()),
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
    fn a_rule_without_tiers_limits_only_the_plans_it_gives_tiers() {
        let r = rig(
            "  - id: api\n    pathPattern: /**\n    plans:\n      premium: [{ period: 1h, threshold: 1 }]\n",
        );
        assert_eq!(r.decide("/x", "globex").tiers[0].threshold, 1);
        assert_eq!(
            r.decide("/x", "globex").verdict,
            Verdict::Reject { status: 429 }
        );
        // a tenant in no plan, and a request of no tenant: the rule does not apply
        for tenant in ["acme", ""] {
            for _ in 0..3 {
                let d = r.decide("/x", tenant);
                assert_eq!(d.verdict, Verdict::Allow);
                assert!(d.applied.is_empty() && d.tiers.is_empty(), "{tenant:?}");
            }
        }
        // nor is it counted for them
        assert!(r
            .limiter
            .inspect_tenant(b"acme", &r.cfg.plans)
            .iter()
            .all(|rule| rule.tiers.iter().all(|t| t.used == 0)));
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
