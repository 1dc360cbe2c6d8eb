//! Time for the limiter: nanoseconds since the Unix epoch, and waiting until a given instant on
//! the same clock, behind one trait, so that algorithms, counters and the waits of held requests
//! are tested by moving a fake clock instead of sleeping. Fixed windows are aligned to the
//! epoch, so every instance of a fleet agrees on them.
//!
//! The wall clock lives with the runtime whose timers it waits on (the gateway's
//! `limits::wall_clock`); this crate has none.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

pub const NANOS_PER_MS: u64 = 1_000_000;

/// A wait on a [`Clock`]: ready once the clock reads the instant waited for.
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Clock: Send + Sync {
    /// Nanoseconds since the Unix epoch.
    fn now_ns(&self) -> u64;

    /// Wait until `now_ns()` reads `at_ns` or later (ready at once when it already does).
    fn sleep_until(&self, at_ns: u64) -> Sleep<'_>;
}

/// A clock that moves only when told to, or when waited on: a wait moves it to the instant
/// waited for and ends at once (as a paused runtime's clock does when nothing else can run).
#[derive(Debug, Default)]
pub struct FakeClock(AtomicU64);

impl FakeClock {
    pub fn at_ms(ms: u64) -> Self {
        FakeClock(AtomicU64::new(ms * NANOS_PER_MS))
    }
    pub fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms * NANOS_PER_MS, Ordering::SeqCst);
    }
    pub fn set_ms(&self, ms: u64) {
        self.0.store(ms * NANOS_PER_MS, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, at_ns: u64) -> Sleep<'_> {
        self.0.fetch_max(at_ns, Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::task::{Context, Poll, Waker};

    fn ready(mut s: Sleep<'_>) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        s.as_mut().poll(&mut cx) == Poll::Ready(())
    }

    #[test]
    fn a_wait_on_the_fake_clock_ends_at_once_at_the_instant_and_never_moves_it_back() {
        let c = FakeClock::at_ms(1_000);
        assert!(ready(c.sleep_until(1_500 * NANOS_PER_MS)));
        assert_eq!(c.now_ns(), 1_500 * NANOS_PER_MS);
        assert!(ready(c.sleep_until(1_200 * NANOS_PER_MS)));
        assert_eq!(c.now_ns(), 1_500 * NANOS_PER_MS);
    }
}
