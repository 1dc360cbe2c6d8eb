//! The quota endpoint's own limit: at most `PROBES_PER_SECOND` answers a second to one caller
//! (its tenant; callers without one share `anonymous`), in bursts of as many (GCRA, on the
//! limiter's clock). Local to each instance: the endpoint reads this instance's counters and
//! sends nothing to Redis, so asking it often costs the fleet nothing, and this limit keeps
//! one caller from spending this instance's time on it. It outlives reloads.

use parking_lot::Mutex;
use std::collections::HashMap;

/// Answers a second (and burst) per caller.
pub const PROBES_PER_SECOND: u64 = 10;
/// Callers remembered at once; past it, those whose bucket is full again are forgotten first,
/// and a new caller waits while none is.
const MAX_CALLERS: usize = 100_000;
const INTERVAL_NS: u64 = 1_000_000_000 / PROBES_PER_SECOND;
const BURST_NS: u64 = 1_000_000_000;

#[derive(Default)]
pub struct ProbeLimit {
    /// Caller -> theoretical arrival time (ns since the epoch).
    tat: Mutex<HashMap<Box<[u8]>, u64>>,
}

impl ProbeLimit {
    /// May `caller` ask now? `Err`: the nanoseconds until it may.
    pub fn admit(&self, caller: &[u8], now_ns: u64) -> Result<(), u64> {
        let mut m = self.tat.lock();
        if m.len() >= MAX_CALLERS && !m.contains_key(caller) {
            m.retain(|_, tat| *tat > now_ns);
            if m.len() >= MAX_CALLERS {
                return Err(INTERVAL_NS);
            }
        }
        let tat = m.get(caller).copied().unwrap_or(0).max(now_ns);
        let next = tat + INTERVAL_NS;
        if next > now_ns + BURST_NS {
            return Err(next - now_ns - BURST_NS);
        }
        match m.get_mut(caller) {
            Some(t) => *t = next,
            None => {
                m.insert(caller.into(), next);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_a_second_per_caller_in_bursts_of_ten() {
        let p = ProbeLimit::default();
        let t0 = 1_800_000_000_000_000_000;
        for _ in 0..PROBES_PER_SECOND {
            assert_eq!(p.admit(b"acme", t0), Ok(()));
        }
        assert_eq!(p.admit(b"acme", t0), Err(INTERVAL_NS));
        // another caller has its own
        assert_eq!(p.admit(b"globex", t0), Ok(()));
        // one more every 100 ms
        assert_eq!(p.admit(b"acme", t0 + INTERVAL_NS), Ok(()));
        assert!(p.admit(b"acme", t0 + INTERVAL_NS).is_err());
        // a second later the burst is back
        for _ in 0..PROBES_PER_SECOND {
            assert_eq!(p.admit(b"acme", t0 + 2 * BURST_NS), Ok(()));
        }
    }
}
