//! The sliding log's memory: every unit a partition's tier admitted in the last period, by
//! its instant (ns since the epoch), oldest first. A unit is in the span ending at `now` while
//! `now - instant < period`, so a request passes exactly when no span of one period, wherever
//! it starts, would hold more than the threshold (proved by a property test below). At most
//! `threshold` instants are kept (8 bytes each; `MAX_LOG_THRESHOLD` bounds the threshold).

use crate::algorithm::{Quota, TierVerdict};
use crate::clock::NANOS_PER_MS;
use crate::ledger::{Answer, LOG_STEPS};
use std::collections::VecDeque;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    at: VecDeque<u64>,
    /// With Redis: what the fleet's last answer said of the previous window's units still in
    /// the span, and when its next buckets leave it.
    fleet: Option<Box<FleetSpan>>,
}

/// The previous window in the fleet's span, as of an answer: `prev` units (its leases
/// included), of which `steps` leave at these instants (ms; the bucket's end and a period).
/// And of the window itself, what its answers said the fleet had admitted (`samples`: when
/// the answer came, the fleet's count then, by eighth of the window): when it becomes the
/// previous window, before the first answer says more, units counted by an answer leave the
/// span at the latest a period after it came.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FleetSpan {
    /// The window whose previous window this is.
    window_start_ms: u64,
    prev: u64,
    steps: [(u64, u64); LOG_STEPS],
    samples: [(u64, u64); LOG_STEPS],
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

    /// Would `units` more pass at `now_ns`? `reset_ms`: until the oldest unit
    /// of the span (this request's, if it is alone) leaves it; when refused, `retry_after_ms`:
    /// until enough have left for it.
    pub fn evaluate(&self, tier: &Quota, now_ns: u64, units: u64) -> TierVerdict {
        let units = units.max(1);
        let t = tier.threshold;
        let p = period_ns(tier);
        // (what `prune` would forget is skipped: a copy need not be pruned to be read)
        let first = self
            .at
            .partition_point(|&at| now_ns.saturating_sub(at) >= p);
        let count = (self.at.len() - first) as u64;
        let leaves = |i: usize| {
            self.at
                .get(first.saturating_add(i))
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

    /// Keep what an answer for the window starting at `window_start_ms` (of `window_ms`) said
    /// of the previous window's units still in the span.
    /// `now_ms`: when it came (what it counted was admitted before).
    pub fn note_fleet(&mut self, window_start_ms: u64, window_ms: u64, a: &Answer, now_ms: u64) {
        let bucket = bucket_ms(window_ms);
        // a bucket of the previous window leaves the span a period after its end
        let steps = a
            .steps
            .map(|(b, n)| (window_start_ms + (b + 1) * bucket, n));
        let f = self.fleet.get_or_insert_with(|| {
            Box::new(FleetSpan {
                window_start_ms,
                prev: 0,
                steps: Default::default(),
                samples: Default::default(),
            })
        });
        if f.window_start_ms != window_start_ms {
            f.samples = Default::default();
        }
        f.window_start_ms = window_start_ms;
        f.prev = a.prev;
        f.steps = steps;
        let eighth =
            (now_ms.saturating_sub(window_start_ms) * LOG_STEPS as u64 / window_ms.max(1)) as usize;
        f.samples[eighth.min(LOG_STEPS - 1)] = (now_ms, a.total);
    }

    /// Forget every unit (an operator's reset): the span starts empty, and what the fleet
    /// said of the previous window no longer weighs.
    pub fn forget(&mut self) {
        self.at.clear();
        if let Some(f) = self.fleet.as_deref_mut() {
            f.prev = 0;
            f.steps = Default::default();
            f.samples = Default::default();
        }
    }

    /// The window starting at `window_start_ms` began (its previous window counts `prev` at
    /// most, leases included): until an answer for it comes, its previous window leaves the
    /// span as that window's answers counted it.
    pub fn roll_fleet(&mut self, window_start_ms: u64, window_ms: u64, prev: u64) {
        let Some(f) = self.fleet.as_deref_mut() else {
            return;
        };
        if f.window_start_ms == window_start_ms {
            return;
        }
        if f.window_start_ms + window_ms != window_start_ms {
            self.fleet = None;
            return;
        }
        let mut counted = 0;
        let mut steps = [(0, 0); LOG_STEPS];
        for (step, &(at, total)) in steps.iter_mut().zip(f.samples.iter()) {
            if at > 0 && total > counted {
                *step = (at + window_ms, total - counted);
                counted = total;
            }
        }
        *f = FleetSpan {
            window_start_ms,
            prev,
            steps,
            samples: Default::default(),
        };
    }

    /// The previous window's units still in the fleet's span at `now_ms`, as of the last
    /// answer for the window starting at `window_start_ms` (None: no answer for it).
    pub fn fleet_prev(&self, window_start_ms: u64, now_ms: u64) -> Option<u64> {
        let f = self.fleet.as_deref()?;
        if f.window_start_ms != window_start_ms {
            return None;
        }
        let left: u64 = f
            .steps
            .iter()
            .filter(|&&(at, n)| n > 0 && at <= now_ms)
            .map(|&(_, n)| n)
            .sum();
        Some(f.prev.saturating_sub(left))
    }

    /// What Redis hears of the newest `n` units admitted in the window `[start_ms, end_ms)`:
    /// how many fell in each of its buckets (`bucket_ms`, see `bucket_ms`), as (bucket, units),
    /// oldest first. Units the log no longer holds (older than the span) are left out: Redis
    /// puts them in the oldest bucket named, later than they were (see the log's ledger script).
    pub fn by_bucket(&self, start_ms: u64, end_ms: u64, n: u64) -> Vec<(u64, u64)> {
        let bucket = bucket_ms(end_ms.saturating_sub(start_ms));
        let (from, to) = (start_ms * NANOS_PER_MS, end_ms * NANOS_PER_MS);
        let lo = self.at.partition_point(|&t| t < from);
        let hi = self.at.partition_point(|&t| t < to);
        let n = usize::try_from(n).unwrap_or(usize::MAX).min(hi - lo);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &t in self.at.range(hi - n..hi) {
            let b = (t / NANOS_PER_MS).saturating_sub(start_ms) / bucket;
            match out.last_mut() {
                Some((last, count)) if *last == b => *count += 1,
                _ => out.push((b, 1)),
            }
        }
        out
    }
}

/// The fleet counts a sliding log's units in Redis by the hundredth of its window they came
/// in: a unit leaves the fleet's span at the end of its bucket plus a period, at most a
/// hundredth of a period after it leaves it here.
pub const BUCKETS: u64 = 100;

/// The length of one of a window's `BUCKETS` (ms, at least 1).
pub fn bucket_ms(window_ms: u64) -> u64 {
    (window_ms / BUCKETS).max(1)
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
                // a log read without pruning answers as one pruned
                let unpruned = log.evaluate(&q, now, units);
                let v = hit(&mut log, &q, now, units);
                proptest::prop_assert_eq!(unpruned, v);
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
