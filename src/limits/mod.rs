//! Rate limiting: `algorithm` (pure functions of state and time, behind `clock`), `partition`
//! (what a counter counts for, and its Redis identity), `store` (local counters with bounded
//! memory, kept across reloads), `limiter` (the decision for a request) and `headers` (what the
//! client is told).

pub mod algorithm;
pub mod clock;
pub mod headers;
pub mod limiter;
pub mod partition;
pub mod store;
pub mod sweeper;

pub use clock::{Clock, FakeClock, SystemClock};
pub use limiter::{Decision, LimitRequest, Limiter, Verdict};
pub use store::CounterRegistry;
