//! The decision metrics of each rule (`tollgate_ratelimit_decisions_total{rule,decision,tier}`)
//! and the shadow rules' log lines: what `Limiter::record` counts once a request's outcome is
//! known.

use crate::config::model::{Action, Rule, Tier};
use prometheus::{IntCounter, IntCounterVec};
use std::sync::atomic::{AtomicU64, Ordering};
use tollgate_limits::decision::Decision;

/// Decision metrics of one rule (`tollgate_ratelimit_decisions_total{rule,decision,tier}`).
/// Denials carry the first tier exceeded (its period: `1s`, `1h`); admitted requests
/// `tier="all"`, refusals of `on_failure: deny` `tier="none"`.
pub struct RuleMetrics {
    pub allowed: IntCounter,
    pub denied: ByTier,
    pub shadow_denied: ByTier,
    pub shadowbanned: ByTier,
    pub throttled: ByTier,
    pub delayed: IntCounter,
    pub unavailable: IntCounter,
    /// Shadow denials not yet logged, and when the last log line was written (ms).
    shadow_unlogged: AtomicU64,
    shadow_logged_ms: AtomicU64,
}

impl RuleMetrics {
    /// The series of rule `rule_id`, whose tier lists are `lists`.
    pub fn new<'a>(
        decisions: &IntCounterVec,
        rule_id: &str,
        lists: impl Iterator<Item = &'a [Tier]> + Clone,
    ) -> RuleMetrics {
        let m = |d: &str, t: &str| decisions.with_label_values(&[rule_id, d, t]);
        let by_tier = |d: &str| ByTier::new(lists.clone(), |t| m(d, t));
        RuleMetrics {
            allowed: m("allowed", "all"),
            denied: by_tier("denied"),
            shadow_denied: by_tier("shadow_denied"),
            shadowbanned: by_tier("shadowbanned"),
            throttled: by_tier("throttled"),
            delayed: m("delayed", "all"),
            unavailable: m("unavailable", "none"),
            shadow_unlogged: AtomicU64::new(0),
            shadow_logged_ms: AtomicU64::new(0),
        }
    }
}

/// The `decision` label values of `tollgate_ratelimit_decisions_total`.
pub const DECISIONS: [&str; 7] = [
    "allowed",
    "denied",
    "shadow_denied",
    "delayed",
    "unavailable",
    "shadowbanned",
    "throttled",
];

/// One decision's counters of one rule, by tier list then tier (lists that share a period
/// share its series).
pub struct ByTier {
    pub lists: Vec<Vec<IntCounter>>,
    /// One handle per distinct series, for the rule's total.
    distinct: Vec<IntCounter>,
}

impl ByTier {
    fn new<'a>(
        lists: impl Iterator<Item = &'a [Tier]>,
        series: impl Fn(&str) -> IntCounter,
    ) -> ByTier {
        let mut labels: Vec<(String, IntCounter)> = Vec::new();
        let lists = lists
            .map(|tiers| {
                tiers
                    .iter()
                    .map(|t| {
                        let l = t.label();
                        if let Some((_, c)) = labels.iter().find(|(x, _)| *x == l) {
                            return c.clone();
                        }
                        let c = series(&l);
                        labels.push((l, c.clone()));
                        c
                    })
                    .collect()
            })
            .collect();
        ByTier {
            lists,
            distinct: labels.into_iter().map(|(_, c)| c).collect(),
        }
    }

    /// All tiers together.
    pub fn total(&self) -> u64 {
        self.distinct.iter().map(IntCounter::get).sum()
    }

    fn inc(&self, list: usize, tier: usize) {
        if let Some(c) = self.lists.get(list).and_then(|l| l.get(tier)) {
            c.inc();
        }
    }
}

/// The `tier` label values of one rule's decision series (for removing them on reload).
pub fn tier_labels(rule: &Rule) -> Vec<String> {
    let mut out = vec![
        "all".to_string(),
        "none".to_string(),
        "concurrency".to_string(),
    ];
    for t in rule
        .tiers
        .iter()
        .chain(rule.plan_tiers.iter().flatten().flatten())
    {
        let l = t.label();
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// Count the final outcome of a request in the decision metrics. `admitted`: the request goes
/// to the upstream (allowed, or throttled). `rule`: an applying rule's metrics, action and id,
/// by its index; `now_ms`: the clock, read only for a shadow rule's log line.
pub fn record<'r>(
    d: &Decision,
    admitted: bool,
    was_delayed: bool,
    rule: impl Fn(u16) -> Option<(&'r RuleMetrics, Action, &'r str)>,
    now_ms: impl Fn() -> u64,
) {
    let any_violated = d.applied.iter().any(|&(_, v)| v);
    // the first tier of `rule` that was exceeded: (list, tier)
    let exceeded = |rule: u16| {
        d.tiers
            .iter()
            .find(|t| t.rule == rule && !t.verdict.allowed)
            .map_or((0, 0), |t| (usize::from(t.list), usize::from(t.tier)))
    };
    let inc = |by: &ByTier, rule: u16| {
        let (list, tier) = exceeded(rule);
        by.inc(list, tier);
    };
    for &(index, violated) in &d.applied {
        let Some((m, action, id)) = rule(index) else {
            continue;
        };
        match (action, admitted, violated) {
            (Action::Shadow, _, true) => {
                inc(&m.shadow_denied, index);
                m.log_shadow(id, now_ms());
            }
            (Action::Shadow, _, false) => m.allowed.inc(),
            (Action::Shadowban, _, true) => inc(&m.shadowbanned, index),
            (Action::Throttle, _, true) => inc(&m.throttled, index),
            (Action::Delay, true, _) if was_delayed => m.delayed.inc(),
            (_, true, _) => m.allowed.inc(),
            (_, false, true) => inc(&m.denied, index),
            // refused although no tier was exceeded: `on_failure: deny` without Redis
            (_, false, false) if !any_violated => m.unavailable.inc(),
            (_, false, false) => {}
        }
    }
}

impl RuleMetrics {
    /// Log shadow denials: at most one line per rule per second, with the count since the last.
    fn log_shadow(&self, rule_id: &str, now_ms: u64) {
        let pending = self.shadow_unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        let last = self.shadow_logged_ms.load(Ordering::Relaxed);
        if now_ms >= last + 1000
            && self
                .shadow_logged_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let n = self
                .shadow_unlogged
                .swap(0, Ordering::Relaxed)
                .max(pending.min(1));
            log::info!(
                "shadow rule {rule_id} would have denied {n} request(s) since its last report"
            );
        }
    }
}
