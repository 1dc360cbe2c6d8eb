//! The sliding log's memory: every unit a partition's tier admitted in the last period, by
//! its instant (ns since the epoch), oldest first. A unit is in the span ending at `now` while
//! `now - instant < period`, so a request passes exactly when no span of one period, wherever
//! it starts, would hold more than the threshold (proved by a property test below). At most
//! `threshold` instants are kept (8 bytes each; `MAX_LOG_THRESHOLD` bounds the threshold).

use super::algorithm::{Quota, TierVerdict};
use super::clock::NANOS_PER_MS;
use std::collections::VecDeque;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    at: VecDeque<u64>,
}

fn period_ns(tier: &Quota) -> u64 {
    tier.period_ms.max(1).saturating_mul(NANOS_PER_MS)
}

fn ceil_ms(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_MS).max(1)
}

impl Log {
    /// Forget the units that left the span ending at `now_ns`.
    pub fn prune(&mut self, tier: &Quota, now_ns: u64) {
        let p = period_ns(tier);
        while self
            .at
            .front()
            .is_some_and(|&t| now_ns.saturating_sub(t) >= p)
        {
            self.at.pop_front();
        }
    }

    /// Units in the span (after `prune`).
    pub fn len(&self) -> u64 {
        self.at.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Would `units` more pass at `now_ns` (after `prune`)? `reset_ms`: until the oldest unit
    /// of the span (this request's, if it is alone) leaves it; when refused, `retry_after_ms`:
    /// until enough have left for it.
    pub fn evaluate(&self, tier: &Quota, now_ns: u64, units: u64) -> TierVerdict {
        let units = units.max(1);
        let t = tier.threshold;
        let p = period_ns(tier);
        let count = self.len();
        let leaves = |i: usize| {
            self.at
                .get(i)
                .map_or(p, |&at| at.saturating_add(p).saturating_sub(now_ns))
        };
        if count.saturating_add(units) <= t {
            return TierVerdict {
                allowed: true,
                remaining: t - count - units,
                reset_ms: ceil_ms(leaves(0)),
                retry_after_ms: 0,
            };
        }
        // the k-th oldest unit must leave first (a request larger than the threshold never fits:
        // it is told the whole period)
        let k = count + units - t;
        let wait = if units > t {
            p
        } else {
            leaves(usize::try_from(k - 1).unwrap_or(usize::MAX))
        };
        TierVerdict {
            allowed: false,
            remaining: 0,
            reset_ms: ceil_ms(leaves(0)),
            retry_after_ms: ceil_ms(wait),
        }
    }

    /// Keep `units` admitted at `now_ns` (at most the threshold in all: what a failure mode
    /// lets through beyond it is not remembered).
    pub fn commit(&mut self, tier: &Quota, now_ns: u64, units: u64) {
        let cap = usize::try_from(tier.threshold.max(1)).unwrap_or(usize::MAX);
        let units = usize::try_from(units.max(1)).unwrap_or(usize::MAX).min(cap);
        // instants never go back (a clock step back keeps the order)
        let at = self.at.back().map_or(now_ns, |&last| last.max(now_ns));
        self.at.extend(std::iter::repeat_n(at, units));
        while self.at.len() > cap {
            self.at.pop_front();
        }
    }

    /// The instants of the newest `n` units, oldest first (fewer when the log has fewer).
    pub fn newest(&self, n: u64) -> impl Iterator<Item = u64> + '_ {
        let n = usize::try_from(n).unwrap_or(usize::MAX).min(self.at.len());
        self.at.range(self.at.len() - n..).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 1000; // ms
    const T0: u64 = 1_800_000_000_000 * NANOS_PER_MS;

    fn quota(threshold: u64) -> Quota {
        Quota {
            threshold,
            period_ms: P,
            ..Quota::default()
        }
    }

    fn hit(log: &mut Log, q: &Quota, now: u64, units: u64) -> TierVerdict {
        log.prune(q, now);
        let v = log.evaluate(q, now, units);
        if v.allowed {
            log.commit(q, now, units);
        }
        v
    }

    #[test]
    fn a_unit_leaves_the_span_one_period_after_it_came() {
        let q = quota(2);
        let mut log = Log::default();
        let ms = NANOS_PER_MS;
        assert!(hit(&mut log, &q, T0, 1).allowed);
        assert!(hit(&mut log, &q, T0 + 400 * ms, 1).allowed);
        let refused = hit(&mut log, &q, T0 + 999 * ms, 1);
        assert!(!refused.allowed);
        assert_eq!(
            refused.retry_after_ms, 1,
            "the first leaves at T0 + 1000 ms"
        );
        assert_eq!(refused.reset_ms, 1);
        let v = hit(&mut log, &q, T0 + 1000 * ms, 1);
        assert!(v.allowed);
        assert_eq!(v.reset_ms, 400, "the oldest left is the one of T0 + 400 ms");
        let refused = hit(&mut log, &q, T0 + 1000 * ms, 2);
        assert_eq!(
            refused.retry_after_ms, 1000,
            "two must leave: the second at T0 + 2000"
        );
    }

    proptest::proptest! {
        /// No span of one period, wherever it starts, holds more than the threshold; and a
        /// request is refused only when admitting it would put more than the threshold in the
        /// span ending at its instant. Instants in ns, gaps down to 0, costs up to 3.
        #[test]
        fn no_span_holds_more_than_the_threshold_and_no_refusal_is_needless(
            threshold in 1u64..12,
            arrivals in proptest::collection::vec((0u64..400, 1u64..4), 1..120),
        ) {
            let q = quota(threshold);
            let p = P * NANOS_PER_MS;
            let mut log = Log::default();
            let mut now = T0;
            let mut admitted: Vec<u64> = Vec::new(); // one instant per unit
            for (gap_ms, units) in arrivals {
                now += gap_ms * NANOS_PER_MS / 3 + gap_ms % 7; // ns-level instants too
                let v = hit(&mut log, &q, now, units);
                let in_span = admitted.iter().filter(|&&t| now - t < p).count() as u64;
                if v.allowed {
                    admitted.extend(std::iter::repeat_n(now, units as usize));
                } else {
                    proptest::prop_assert!(in_span + units > threshold,
                        "refused {units} with {in_span} of {threshold} in the span");
                    // and it fits after the wait it was told (when it can fit at all)
                    if units <= threshold {
                        let later = now + v.retry_after_ms * NANOS_PER_MS;
                        let left = admitted.iter().filter(|&&t| later - t < p).count() as u64;
                        proptest::prop_assert!(left + units <= threshold);
                    }
                }
                proptest::prop_assert_eq!(log.len(), in_span + if v.allowed { units } else { 0 });
            }
            // every span [s, s + p): its worst start is an admission instant
            for (i, &s) in admitted.iter().enumerate() {
                let n = admitted[i..].iter().take_while(|&&t| t - s < p).count() as u64;
                proptest::prop_assert!(n <= threshold, "{n} units in the span from {s}");
            }
        }
    }
}
