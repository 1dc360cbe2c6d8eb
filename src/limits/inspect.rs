//! What the counters say of one tenant, for the operator (`/api/tenants/<id>`): read-only
//! copies, never a counter created or changed.

use super::limiter::{LimitRequest, Limiter};
use crate::config::model::{Action, Algorithm, PartitionBy, Plans};
use smallvec::SmallVec;
use tollgate_limits::algorithm::{self, Quota, TierState, TierVerdict};
use tollgate_limits::decision::{Decision, TierReport, Verdict};
use tollgate_limits::ledger;
use tollgate_limits::partition::PartitionValue;
use tollgate_limits::store::Counter;

/// One rule's counters for one tenant, as `/api/tenants/<id>` shows them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RuleView {
    pub rule: String,
    #[serde(serialize_with = "display")]
    pub algorithm: Algorithm,
    #[serde(serialize_with = "display")]
    pub action: Action,
    /// The plan whose tiers apply (none: the rule's own tiers).
    pub plan: Option<String>,
    /// Whether this instance holds a counter for the tenant (none yet: nothing counted here).
    pub tracked: bool,
    pub tiers: Vec<TierView>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TierView {
    pub period_ms: u64,
    /// The window: `10s`, or a calendar window in words, `1 day in America/New_York` (a
    /// calendar day in its zone, not 24 hours).
    pub window: String,
    pub threshold: u64,
    /// Granted to the current window by an operator (`POST /api/tenants/{id}/grant`, or a
    /// reset): admitted past the threshold (a bucket's: tokens given back).
    pub granted: u64,
    /// Counted in the current window (with Redis: the fleet's total at the last answer plus
    /// what this instance has not sent yet).
    pub used: u64,
    /// Requests that would still be admitted here now.
    pub remaining: u64,
    pub reset_ms: u64,
    /// With Redis, once it has answered in this window (a lease's answer, or a plain
    /// increment's).
    pub fleet: Option<FleetView>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetView {
    /// The fleet's count at the last answer.
    pub total: u64,
    /// Admitted by this instance in the window.
    pub this_instance: u64,
    /// Of those, not yet confirmed by Redis.
    pub unsent: u64,
    /// What this instance may still admit on its lease (0 for a record far from its limit,
    /// which counts by plain increments and holds no lease).
    pub lease: u64,
}

/// `10s`, `1h`, or a calendar window in words: `1 day in America/New_York`.
pub fn window_of(tier: &Quota) -> String {
    if let Some(c) = &tier.calendar {
        return crate::config::duration::calendar_words(c);
    }
    let mut out = String::new();
    crate::config::duration::write_period(&mut out, tier.period_ms, None);
    out
}

fn display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl Limiter {
    /// What the counters say of one tenant, for the operator (`/api/tenants/<id>`): every rule
    /// that counts per tenant, each tier's threshold, count and reset, and the fleet's view when
    /// Redis syncs. Reads copies of the counters; creates none and changes none.
    pub fn inspect_tenant(&self, tenant: &[u8], plans: &Plans) -> Vec<RuleView> {
        let now = self.core.now_ns();
        let plan = plans.plan_of(tenant);
        let key = PartitionValue::Bytes(tenant).key_buf();
        self.rules
            .iter()
            .zip(&self.core.limits)
            .filter(|(cr, _)| cr.rule.per == PartitionBy::Tenant)
            .map(|(cr, limit)| {
                let rc = &limit.counters;
                let list = cr.list_of(plan);
                let tiers = limit.tiers(list);
                let algo = rc.algorithm();
                let counter = rc.get(&key).filter(|c| c.list == list);
                let tiers = tiers
                    .iter()
                    .enumerate()
                    .map(|(i, tier)| {
                        let (state, v) = tier_now(counter.as_ref(), i, tier, algo, now);
                        let l = &state.ledger;
                        let remaining = v.remaining;
                        TierView {
                            period_ms: tier.period_ms,
                            window: window_of(tier),
                            threshold: tier.threshold,
                            granted: l.grant,
                            used: counted(tier, &state, algo, remaining),
                            remaining,
                            reset_ms: v.reset_ms,
                            // (a lease's answer, or a direct record's plain increment)
                            fleet: (l.fair > 0 || l.keyed).then_some(FleetView {
                                total: l.base.max(l.current.sent),
                                this_instance: l.current.used,
                                unsent: l.unsent(),
                                lease: l.ceiling.saturating_sub(l.current.used).min(remaining),
                            }),
                        }
                    })
                    .collect();
                RuleView {
                    rule: cr.rule.id.clone(),
                    algorithm: algo,
                    action: cr.rule.action,
                    plan: plan
                        .filter(|_| list != 0)
                        .and_then(|p| plans.names.get(p).cloned()),
                    tracked: counter.is_some(),
                    tiers,
                }
            })
            .collect()
    }

    /// What a request would be told of its quota, spending nothing (the quota endpoint): every
    /// tier of every non-shadow rule that applies to `req` (`every_tenant_rule`: instead, every
    /// rule that counts per tenant, whatever its path), its `remaining` the requests left now,
    /// as the quota headers would say it (with the fleet's room where Redis has answered).
    /// Beside it, what each of those tiers has used, in the decision's order: the count the
    /// operator's view shows (`counted`; a bucket: the tokens taken, as it reports them).
    /// Reads copies of the counters; creates none and changes none.
    pub fn peek(
        &self,
        req: &LimitRequest,
        plans: &Plans,
        every_tenant_rule: bool,
    ) -> (Decision, SmallVec<[u64; 6]>) {
        let now = self.core.now_ns();
        let (leased, shared) = self.fleet.mode().ledger_modes();
        let mut arena = SmallVec::<[u8; 256]>::new();
        let mut d = Decision::none();
        let mut used = SmallVec::new();
        let applying: SmallVec<[(u16, u16, std::ops::Range<usize>); 4]> = if every_tenant_rule {
            // every rule counting per tenant, under the tenant's one key
            let plan = req.plan_in(plans);
            PartitionValue::Bytes(req.tenant).store_key(&mut arena);
            self.rules
                .iter()
                .enumerate()
                .filter(|(_, cr)| cr.rule.per == PartitionBy::Tenant && !req.tenant.is_empty())
                .filter(|(_, cr)| !cr.rule.exempt.covers(req.client_ip, req.tenant, plan))
                .map(|(i, cr)| (i as u16, cr.list_of(plan), 0..arena.len()))
                .collect()
        } else {
            self.applying(req, plans, &mut arena)
                .iter()
                .map(|a| (a.rule, a.list, a.key_start..a.key_end))
                .collect()
        };
        for (rule, list, key) in applying {
            let limit = &self.core.limits[usize::from(rule)];
            if limit.is_shadow() {
                continue;
            }
            let algo = limit.counters.algorithm();
            let counter = limit.counters.get(&arena[key]).filter(|c| c.list == list);
            for (i, tier) in limit.tiers(list).iter().enumerate() {
                let (state, mut verdict) = tier_now(counter.as_ref(), i, tier, algo, now);
                let count = counted(tier, &state, algo, verdict.remaining);
                let tier = &ledger::granted(tier, &state, algo);
                if let Some(room) = ledger::room(&state, tier, algo, leased, shared) {
                    verdict.remaining = verdict.remaining.min(room);
                }
                used.push(if algo.is_bucket() {
                    tier.threshold.saturating_sub(verdict.remaining)
                } else {
                    count
                });
                d.tiers.push(TierReport {
                    rule,
                    list,
                    tier: i as u8,
                    threshold: tier.threshold,
                    period_ms: tier.period_ms,
                    calendar: tier.calendar.map(|c| c.unit),
                    verdict,
                    shadow: false,
                });
            }
            d.applied.push((rule, false));
        }
        d.verdict = Verdict::Allow;
        (d, used)
    }
}

/// What a tier has counted, as the operator's view shows it, `remaining` being the tier's own
/// (before the fleet's room): a window's count, which a cost charged once the answer is known,
/// or the units admitted under a grant, may take past the threshold; a sliding log's span (its
/// threshold, widened by a grant, less what is left); a bucket's window count in the fleet's
/// accounting.
fn counted(tier: &Quota, state: &TierState, algo: Algorithm, remaining: u64) -> u64 {
    if algo == Algorithm::SlidingLog {
        ledger::granted(tier, state, algo)
            .threshold
            .saturating_sub(remaining)
    } else {
        state.current
    }
}

/// One tier of a counter (a copy; none yet: a fresh state) as of `now`, and its verdict with
/// `remaining` what is left now: nothing spent, nothing changed.
fn tier_now(
    counter: Option<&Counter>,
    i: usize,
    tier: &Quota,
    algo: Algorithm,
    now: u64,
) -> (TierState, TierVerdict) {
    let mut state = counter
        .and_then(|c| c.tiers.get(i).copied())
        .unwrap_or_default();
    algorithm::roll(&mut state, tier, algo, now);
    // (what an operator granted to the window widens it)
    let tier = &ledger::granted(tier, &state, algo);
    // a sliding log: its span, not its window's count
    let log = counter
        .and_then(|c| c.logs.as_deref())
        .and_then(|l| l.get(i));
    let mut v = match log {
        Some(log) => log.evaluate(tier, now, 1),
        None => algorithm::evaluate(&state, tier, algo, now, 1),
    };
    v.remaining = if v.allowed { v.remaining + 1 } else { 0 };
    (state, v)
}
