//! The limits core's clock on the system: the wall clock for its readings, tokio's timers for
//! its waits (a wait of `at - now` on tokio's monotonic clock: a step of the wall clock moves
//! the readings, not a wait already begun).

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tollgate_limits::clock::{Clock, Sleep};

/// The system's wall clock, waited on with tokio's timers.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }

    fn sleep_until(&self, at_ns: u64) -> Sleep<'_> {
        let wait = Duration::from_nanos(at_ns.saturating_sub(self.now_ns()));
        Box::pin(tokio::time::sleep(wait))
    }
}
