//! Time for the limiter: nanoseconds since the Unix epoch, behind a trait so that algorithms
//! and counters are tested by moving a fake clock instead of sleeping. Fixed windows are aligned
//! to the epoch, so every instance of a fleet agrees on them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub const NANOS_PER_MS: u64 = 1_000_000;

pub trait Clock: Send + Sync {
    /// Nanoseconds since the Unix epoch.
    fn now_ns(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// A clock that moves only when told to.
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
}
