//! The five algorithms, as pure functions of (state, tier, now, units). No clock, no storage,
//! no locking here: the store owns the state, the limiter owns the clock. A request takes one
//! unit (a rule's `cost` passes more): `n` units behave exactly as `n` requests at the same
//! instant (a property test below).
//!
//! - `fixed_window`: windows aligned to the epoch, start = floor(now_ms / period_ms) * period_ms.
//! - `sliding_window`: the previous window's count weighted by the part of it still inside the
//!   sliding window, plus the current window's count.
//! - `token_bucket`: GCRA. `threshold` tokens, refilled evenly, `threshold` every `period`.
//! - `leaky_bucket`: the same GCRA with a burst of `queue + 1`: the state is the next free
//!   departure slot; a request takes the slot (`queue_wait_ns`: how long it waits for it) and
//!   is refused when more than `queue` requests' worth wait ahead of it.
//! - `sliding_log`: exact. Every unit admitted in the last period is kept (`Log`, outside the
//!   `Copy` state); a request passes when the units of the span ending now, its own included,
//!   stay within the threshold. Its windowed counts (`current`, `previous`) are kept as a
//!   sliding window's, for the fleet's accounting.
//!
//! `evaluate` answers "would one more request pass?" without consuming anything; `commit`
//! consumes. A request is committed only when every tier of every rule passed.

use crate::calendar::Calendar;
use crate::clock::NANOS_PER_MS;
use crate::record::{Ledger, Orphan};

/// The five algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    #[default]
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    /// Exact: the admission instants of the last period, one per unit.
    SlidingLog,
    /// A queue leaking `threshold` per `period`: requests wait their turn.
    LeakyBucket,
}

impl std::fmt::Display for Algorithm {
    /// The algorithm's name in a config file and the contract.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::LeakyBucket => "leaky_bucket",
        })
    }
}

impl Algorithm {
    /// GCRA state (`tat`): a token bucket, or a leaky bucket (a token bucket whose burst is
    /// its queue, and whose requests wait for their turn).
    pub fn is_bucket(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }

    /// Counts per window weighed over the previous one: the sliding window, and (for the
    /// fleet's accounting) the sliding log.
    pub fn is_sliding(self) -> bool {
        matches!(self, Algorithm::SlidingWindow | Algorithm::SlidingLog)
    }
}

/// The state of one tier of one counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierState {
    /// Windows: start of the current window (ms since the epoch).
    pub window_start_ms: u64,
    /// Windows: its end (0: not known yet; `roll` sets it).
    pub window_end_ms: u64,
    /// Windows: requests counted in the current window.
    pub current: u64,
    /// Sliding window: requests counted in the previous window.
    pub previous: u64,
    /// Token bucket: the theoretical arrival time (ns since the epoch).
    pub tat_ns: u64,
    /// Fleet accounting (windows): what this instance admitted, sent and was leased.
    pub ledger: Ledger,
}

/// The answer of one tier for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierVerdict {
    pub allowed: bool,
    /// Requests still allowed after this one (0 when denied).
    pub remaining: u64,
    /// Milliseconds until the window resets (token bucket: until the bucket is full again).
    pub reset_ms: u64,
    /// When denied: milliseconds until one request would pass.
    pub retry_after_ms: u64,
}

/// What one tier allows, in the algorithms' own terms: `threshold` requests per `period_ms`
/// (the limiter compiles a config tier into one). A calendar tier's windows are the
/// calendar's (`period_ms` is then its usual length).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Quota {
    pub threshold: u64,
    pub period_ms: u64,
    pub calendar: Option<Calendar>,
    /// A leaky bucket's queue: how many requests may wait their turn.
    pub queue: Option<u64>,
}

impl Quota {
    /// The window holding `now_ms`: start and end (end excluded). Fixed lengths are aligned
    /// to the epoch; calendar windows to local midnight, Monday, the 1st.
    pub fn window_of(&self, now_ms: u64) -> (u64, u64) {
        match &self.calendar {
            Some(c) => c.window_of(now_ms),
            None => {
                let p = period_ms(self);
                let start = now_ms / p * p;
                (start, start + p)
            }
        }
    }

    /// The end of the window that starts at `start_ms`.
    pub fn window_end(&self, start_ms: u64) -> u64 {
        match &self.calendar {
            Some(c) => c.window_of(start_ms).1,
            None => start_ms + period_ms(self),
        }
    }
}

fn period_ms(tier: &Quota) -> u64 {
    tier.period_ms.max(1)
}

/// A bucket's time per unit, in ns (`period / threshold`).
pub fn interval_ns(tier: &Quota) -> u128 {
    (period_ms(tier) as u128 * NANOS_PER_MS as u128 / tier.threshold.max(1) as u128).max(1)
}

/// How far ahead of now a bucket may be booked, in ns: a token bucket's whole period (its
/// burst is the threshold); a leaky bucket's queue and the slot leaving now.
pub fn tolerance_ns(tier: &Quota) -> u128 {
    match tier.queue {
        Some(q) => (q as u128 + 1) * interval_ns(tier),
        None => period_ms(tier) as u128 * NANOS_PER_MS as u128,
    }
}

/// How far ahead the fleet's bucket in Redis may be booked, in ns: a token bucket's period; a
/// leaky bucket's queue and turn, or a fiftieth of its threshold if that is more, so that
/// leases can flow between sync rounds however small the queue (each instance keeps its own
/// queue exact; the fleet admits at most `threshold + max(queue + 1, threshold / 50)` a
/// period).
pub fn fleet_tolerance_ns(tier: &Quota) -> u128 {
    match tier.queue {
        Some(q) => (q + 1).max(tier.threshold / 50) as u128 * interval_ns(tier),
        None => tolerance_ns(tier),
    }
}

/// A leaky bucket: how long a request admitted now waits for its slot (call before `commit`).
pub fn queue_wait_ns(state: &TierState, now_ns: u64) -> u64 {
    state.tat_ns.saturating_sub(now_ns)
}

fn ceil_div(a: u128, b: u128) -> u128 {
    a.div_ceil(b.max(1))
}

/// Move the windows of `state` to `now` (forgetting windows that have passed; a token bucket
/// only moves its fleet ledger's window). Consumes nothing: safe to call before a check that
/// ends in a denial. Returns the fleet record that had to make room with counts Redis has not
/// confirmed (they must still be sent).
pub fn roll(
    state: &mut TierState,
    tier: &Quota,
    algorithm: Algorithm,
    now_ns: u64,
) -> Option<Orphan> {
    let now_ms = now_ns / NANOS_PER_MS;
    if now_ms < state.window_end_ms {
        return None;
    }
    let (start, end) = tier.window_of(now_ms);
    if start <= state.window_start_ms {
        // the same window, its end not known yet (a state made elsewhere)
        state.window_end_ms = end;
        return None;
    }
    // token buckets keep their state; their fleet ledger still counts per window
    let old_end = window_end(state, tier);
    let adjacent = old_end == start;
    state.window_end_ms = end;
    if !algorithm.is_bucket() {
        // (what was granted to the old window is forgiven there: it weighs on no other)
        state.previous = if adjacent {
            state.current.saturating_sub(state.ledger.grant)
        } else {
            0
        };
        state.current = 0;
    }
    let old = std::mem::replace(&mut state.window_start_ms, start);
    let orphan = state.ledger.roll(old, algorithm.is_bucket(), adjacent);
    // requests held in the old window ask again in the new one (a sliding log's: not; its
    // span still holds the old window, leases included, until the other instances give
    // theirs back, and asking at once would find it full)
    state.ledger.rehold = algorithm != Algorithm::SlidingLog;
    orphan
}

/// Would a request of `units` pass (one request costs 1), for this instance alone? Call `roll`
/// first. `remaining` is what is left after it, in units. A sliding log is judged on its
/// `Log` (`Log::evaluate`); here, without one (a partition the store does not track), on its
/// window's count, as a fixed window.
pub fn evaluate(
    state: &TierState,
    tier: &Quota,
    algorithm: Algorithm,
    now_ns: u64,
    units: u64,
) -> TierVerdict {
    let units = units.max(1);
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog => {
            evaluate_fixed(state, tier, now_ns / NANOS_PER_MS, units)
        }
        Algorithm::SlidingWindow => evaluate_sliding(state, tier, now_ns / NANOS_PER_MS, units),
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            evaluate_bucket(state, tier, now_ns, units)
        }
    }
}

/// A fixed window (and a sliding log's window count): room while the count and `units` fit.
fn evaluate_fixed(state: &TierState, tier: &Quota, now_ms: u64, units: u64) -> TierVerdict {
    let threshold = tier.threshold;
    let reset_ms = window_end(state, tier).saturating_sub(now_ms).max(1);
    let allowed = state.current.saturating_add(units) <= threshold;
    TierVerdict {
        allowed,
        remaining: if allowed {
            threshold - state.current - units
        } else {
            0
        },
        reset_ms,
        retry_after_ms: if allowed { 0 } else { reset_ms },
    }
}

/// A sliding window: the previous window's count weighs by the part of it still in the
/// period, compared in integers.
fn evaluate_sliding(state: &TierState, tier: &Quota, now_ms: u64, units: u64) -> TierVerdict {
    let p = period_ms(tier) as u128;
    let elapsed = (now_ms.saturating_sub(state.window_start_ms) as u128).min(p);
    let reset_ms = (p - elapsed).max(1) as u64;
    let prev = state.previous as u128;
    let cur = state.current as u128;
    let t = tier.threshold as u128;
    let u = units as u128;
    // estimate * p = prev * (p - elapsed) + cur * p, compared in integers
    let weighted = prev * (p - elapsed) + cur * p;
    let budget = t * p;
    let allowed = weighted + u * p <= budget;
    let remaining = if allowed {
        ((budget - weighted - u * p) / p) as u64
    } else {
        0
    };
    let retry_after_ms = if allowed {
        0
    } else if cur + u <= t {
        // wait until enough of the previous window has slid out:
        // prev * (p - e) <= (t - cur - u) * p
        let room = (t - cur - u) * p;
        let e_needed = p - room / prev.max(1);
        ceil_div(e_needed.saturating_sub(elapsed), 1) as u64
    } else {
        // the current window is too full: wait for the next one, where it weighs as
        // `previous`: cur * (p - e) <= (t - u) * p
        let to_next = p - elapsed;
        let e_needed = p - (t.saturating_sub(u) * p) / cur.max(1);
        (to_next + e_needed) as u64
    };
    TierVerdict {
        allowed,
        remaining,
        reset_ms,
        retry_after_ms: retry_after_ms.max(if allowed { 0 } else { 1 }),
    }
}

/// A token or leaky bucket (GCRA): room while the theoretical arrival time after `units`
/// stays within the tolerance.
fn evaluate_bucket(state: &TierState, tier: &Quota, now_ns: u64, units: u64) -> TierVerdict {
    let p_ns = tolerance_ns(tier);
    let interval = interval_ns(tier); // one token every `interval`
    let now = now_ns as u128;
    let tat = (state.tat_ns as u128).max(now);
    let new_tat = tat + units as u128 * interval;
    let allowed = new_tat - now <= p_ns;
    let ms = NANOS_PER_MS as u128;
    if allowed {
        TierVerdict {
            allowed,
            remaining: ((p_ns - (new_tat - now)) / interval) as u64,
            reset_ms: ceil_div(new_tat - now, ms).max(1) as u64,
            retry_after_ms: 0,
        }
    } else {
        TierVerdict {
            allowed,
            remaining: 0,
            reset_ms: ceil_div(tat - now, ms).max(1) as u64,
            retry_after_ms: ceil_div((new_tat - now).saturating_sub(p_ns), ms).max(1) as u64,
        }
    }
}

/// Consume a request of `units`. Call only after `evaluate` allowed it (for every tier).
pub fn commit(state: &mut TierState, tier: &Quota, algorithm: Algorithm, now_ns: u64, units: u64) {
    let units = units.max(1);
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            state.current = state.current.saturating_add(units);
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let interval = interval_ns(tier);
            let tat = (state.tat_ns as u128).max(now_ns as u128);
            state.tat_ns = u64::try_from(tat + units as u128 * interval).unwrap_or(u64::MAX);
        }
    }
}

/// The end of the state's current window (as `roll` set it, or, not set yet, the tier's
/// window that starts where it starts).
pub fn window_end(state: &TierState, tier: &Quota) -> u64 {
    match state.window_end_ms {
        0 => tier.window_end(state.window_start_ms),
        e => e,
    }
}

/// Until when (ms since the epoch) this state still matters; after that it can be dropped.
pub fn needed_until_ms(state: &TierState, tier: &Quota, algorithm: Algorithm) -> u64 {
    let p = period_ms(tier);
    match algorithm {
        Algorithm::FixedWindow => window_end(state, tier),
        // (a log's newest instant is in the current window: it leaves the span within a
        // period after the window's end)
        Algorithm::SlidingWindow | Algorithm::SlidingLog => state.window_start_ms + 2 * p,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => state.tat_ns / NANOS_PER_MS + 1,
    }
}

/// The weight of a state for eviction: how much would be lost by forgetting it at `now`.
pub fn weight(state: &TierState, tier: &Quota, algorithm: Algorithm, now_ns: u64) -> u64 {
    let mut s = *state;
    roll(&mut s, tier, algorithm, now_ns);
    match algorithm {
        Algorithm::FixedWindow => s.current,
        Algorithm::SlidingWindow | Algorithm::SlidingLog => s.current + s.previous,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let interval = interval_ns(tier);
            ((s.tat_ns as u128).saturating_sub(now_ns as u128) / interval) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, FakeClock};

    fn tier(period_s: u64, threshold: u64) -> Quota {
        Quota {
            period_ms: period_s * 1000,
            threshold,
            ..Quota::default()
        }
    }

    /// Send one request at the clock's time; return its verdict (committed if allowed).
    fn hit(s: &mut TierState, t: &Quota, a: Algorithm, clock: &FakeClock) -> TierVerdict {
        let now = clock.now_ns();
        roll(s, t, a, now);
        let v = evaluate(s, t, a, now, 1);
        if v.allowed {
            commit(s, t, a, now, 1);
        }
        v
    }

    #[test]
    fn fixed_window_counts_down_and_resets_on_epoch_boundary() {
        let t = tier(10, 5);
        let clock = FakeClock::at_ms(162_731_878_077); // the seed's example: window 162731870000..162731880000
        let mut s = TierState::default();
        let remaining: Vec<u64> = (0..5)
            .map(|_| hit(&mut s, &t, Algorithm::FixedWindow, &clock).remaining)
            .collect();
        assert_eq!(remaining, vec![4, 3, 2, 1, 0]);
        assert_eq!(s.window_start_ms, 162_731_870_000);
        let denied = hit(&mut s, &t, Algorithm::FixedWindow, &clock);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 162_731_880_000 - 162_731_878_077);
        assert_eq!(s.current, 5, "a denial consumes nothing");
        clock.set_ms(162_731_880_000); // next window
        assert_eq!(hit(&mut s, &t, Algorithm::FixedWindow, &clock).remaining, 4);
    }

    #[test]
    fn sliding_window_weighs_previous_window() {
        let t = tier(10, 10);
        let clock = FakeClock::at_ms(100_000);
        let mut s = TierState::default();
        for _ in 0..10 {
            assert!(hit(&mut s, &t, Algorithm::SlidingWindow, &clock).allowed);
        }
        assert!(!hit(&mut s, &t, Algorithm::SlidingWindow, &clock).allowed);
        // 5 s into the next window, half of the previous 10 still count: 5 left
        clock.set_ms(115_000);
        let allowed = (0..10)
            .filter(|_| hit(&mut s, &t, Algorithm::SlidingWindow, &clock).allowed)
            .count();
        assert_eq!(allowed, 5);
        // a fixed window would have allowed all 10 here
        let mut f = TierState::default();
        clock.set_ms(100_000);
        (0..10).for_each(|_| {
            hit(&mut f, &t, Algorithm::FixedWindow, &clock);
        });
        clock.set_ms(115_000);
        assert_eq!(
            (0..10)
                .filter(|_| hit(&mut f, &t, Algorithm::FixedWindow, &clock).allowed)
                .count(),
            10
        );
    }

    #[test]
    fn sliding_window_retry_after_is_when_a_request_fits() {
        let t = tier(10, 10);
        let clock = FakeClock::at_ms(100_000);
        let mut s = TierState::default();
        (0..10).for_each(|_| {
            hit(&mut s, &t, Algorithm::SlidingWindow, &clock);
        });
        clock.set_ms(112_000); // 2 s into next window: prev 10 weighs 8
        (0..2).for_each(|_| assert!(hit(&mut s, &t, Algorithm::SlidingWindow, &clock).allowed));
        let d = hit(&mut s, &t, Algorithm::SlidingWindow, &clock);
        assert!(!d.allowed);
        clock.advance_ms(d.retry_after_ms - 1);
        let mut probe = s;
        roll(&mut probe, &t, Algorithm::SlidingWindow, clock.now_ns());
        assert!(!evaluate(&probe, &t, Algorithm::SlidingWindow, clock.now_ns(), 1).allowed);
        clock.advance_ms(1);
        assert!(
            hit(&mut s, &t, Algorithm::SlidingWindow, &clock).allowed,
            "fits exactly at retry_after"
        );
    }

    #[test]
    fn token_bucket_bursts_then_refills_evenly() {
        let t = tier(10, 5); // one token every 2 s, burst of 5
        let clock = FakeClock::at_ms(1_000_000);
        let mut s = TierState::default();
        let remaining: Vec<u64> = (0..5)
            .map(|_| hit(&mut s, &t, Algorithm::TokenBucket, &clock).remaining)
            .collect();
        assert_eq!(remaining, vec![4, 3, 2, 1, 0]);
        let d = hit(&mut s, &t, Algorithm::TokenBucket, &clock);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, 2000);
        clock.advance_ms(1999);
        assert!(!hit(&mut s, &t, Algorithm::TokenBucket, &clock).allowed);
        clock.advance_ms(1);
        assert!(hit(&mut s, &t, Algorithm::TokenBucket, &clock).allowed);
        // after a full period the bucket is full again
        clock.advance_ms(10_000);
        assert_eq!(hit(&mut s, &t, Algorithm::TokenBucket, &clock).remaining, 4);
    }

    #[test]
    fn windows_forget_old_counts_and_report_reset() {
        let t = tier(1, 2);
        let clock = FakeClock::at_ms(5_250);
        let mut s = TierState::default();
        let v = hit(&mut s, &t, Algorithm::FixedWindow, &clock);
        assert_eq!(v.reset_ms, 750);
        clock.set_ms(9_000); // several windows later: previous is not the adjacent window
        roll(&mut s, &t, Algorithm::SlidingWindow, clock.now_ns());
        assert_eq!((s.current, s.previous), (0, 0));
        assert_eq!(needed_until_ms(&s, &t, Algorithm::FixedWindow), 10_000);
        assert_eq!(needed_until_ms(&s, &t, Algorithm::SlidingWindow), 11_000);
    }

    #[test]
    fn a_leaky_bucket_gives_turns_a_period_over_threshold_apart_and_refuses_past_its_queue() {
        let t = Quota {
            queue: Some(3),
            ..tier(1, 5) // one every 200 ms
        };
        let a = Algorithm::LeakyBucket;
        let clock = FakeClock::at_ms(1_000_000);
        let mut s = TierState::default();
        let mut waits = Vec::new();
        for _ in 0..4 {
            let now = clock.now_ns();
            assert!(evaluate(&s, &t, a, now, 1).allowed);
            waits.push(queue_wait_ns(&s, now) / NANOS_PER_MS);
            commit(&mut s, &t, a, now, 1);
        }
        assert_eq!(
            waits,
            vec![0, 200, 400, 600],
            "the first leaves now, three wait"
        );
        let full = evaluate(&s, &t, a, clock.now_ns(), 1);
        assert!(!full.allowed, "a fifth would be the fourth waiting");
        assert_eq!(
            full.retry_after_ms, 200,
            "until the first waiting one leaves"
        );
        clock.advance_ms(200);
        assert!(evaluate(&s, &t, a, clock.now_ns(), 1).allowed);
        assert_eq!(queue_wait_ns(&s, clock.now_ns()) / NANOS_PER_MS, 600);
        // queue 0: only on its turn
        let t0 = Quota {
            queue: Some(0),
            ..tier(1, 5)
        };
        let mut s = TierState::default();
        assert!(evaluate(&s, &t0, a, clock.now_ns(), 1).allowed);
        commit(&mut s, &t0, a, clock.now_ns(), 1);
        assert!(!evaluate(&s, &t0, a, clock.now_ns(), 1).allowed);
        clock.advance_ms(200);
        assert!(evaluate(&s, &t0, a, clock.now_ns(), 1).allowed);
    }

    proptest::proptest! {
        /// A request of n units is exactly n requests of one at the same instant: allowed
        /// when all n would be, leaving what the last leaves, and committing the same state.
        #[test]
        fn n_units_are_n_requests_at_once(
            algo in 0u8..4,
            period_s in 1u64..60,
            threshold in 1u64..40,
            queue in 0u64..50,
            history in proptest::collection::vec((0u64..3_000, 1u64..4), 0..40),
            at in 0u64..3_000,
            n in 1u64..40,
        ) {
            let a = [
                Algorithm::FixedWindow,
                Algorithm::SlidingWindow,
                Algorithm::TokenBucket,
                Algorithm::LeakyBucket,
            ][usize::from(algo)];
            let t = Quota {
                queue: (a == Algorithm::LeakyBucket).then_some(queue),
                ..tier(period_s, threshold)
            };
            let start = 1_800_000_000_000u64;
            let mut s = TierState::default();
            let mut now = start;
            for (gap, k) in history {
                now += gap * period_s / 3;
                let ns = now * NANOS_PER_MS;
                roll(&mut s, &t, a, ns);
                for _ in 0..k {
                    if evaluate(&s, &t, a, ns, 1).allowed {
                        commit(&mut s, &t, a, ns, 1);
                    }
                }
            }
            let ns = (now + at) * NANOS_PER_MS;
            roll(&mut s, &t, a, ns);
            let whole = evaluate(&s, &t, a, ns, n);
            let mut singles = s;
            let mut all = true;
            let mut last = None;
            for _ in 0..n {
                let v = evaluate(&singles, &t, a, ns, 1);
                if !v.allowed {
                    all = false;
                    break;
                }
                commit(&mut singles, &t, a, ns, 1);
                last = Some(v);
            }
            proptest::prop_assert_eq!(whole.allowed, all);
            if all {
                proptest::prop_assert_eq!(Some(whole.remaining), last.map(|v| v.remaining));
                commit(&mut s, &t, a, ns, n);
                proptest::prop_assert_eq!(s, singles);
            } else {
                proptest::prop_assert!(whole.retry_after_ms >= 1);
                // and after the wait it says, it fits (when it can fit at all)
                if n <= t.queue.map_or(threshold, |q| q + 1) {
                    let later = ns + whole.retry_after_ms * NANOS_PER_MS;
                    let mut s2 = s;
                    roll(&mut s2, &t, a, later);
                    proptest::prop_assert!(
                        evaluate(&s2, &t, a, later, n).allowed,
                        "{:?} after {} ms: {:?}", a, whole.retry_after_ms, s2
                    );
                }
            }
        }
    }
}
