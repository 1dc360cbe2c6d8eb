//! Rate limiting in the gateway. The limits core is a crate of its own (`crates/limits`,
//! `tollgate_limits`): `algorithm` (pure functions of state and time, behind `clock`), `record`
//! (the fleet record of a tier), `ledger` (fleet accounting on the records: used, confirmed,
//! leased), `sliding_log`, `partition` (what a counter counts for), `store` (local counters with
//! bounded memory, kept across reloads), `in_flight` and `top`; re-exported here by those names.
//! The core's `fleet` and `limiter` decide; here: `fleet` (`Fleet`, the core's fleet state with
//! the runtime's notifications), `limiter` (which rules apply to a request, then the core's
//! decision; what an answer is charged; with its `policy` texts), `concurrency` (limits of
//! requests in flight), `headers` (what the client is told), `decision_metrics`, `inspect`,
//! `probe`, `wall_clock` (the core's clock on the system, waited on with tokio's timers).

pub use tollgate_limits::{
    algorithm, clock, decision, in_flight, ledger, partition, record, sliding_log, store, top,
};

pub mod concurrency;
pub mod decision_metrics;
pub mod fleet;
pub mod headers;
pub mod inspect;
pub mod limiter;
pub mod policy;
pub mod probe;
pub mod wall_clock;

pub use clock::{Clock, FakeClock};
pub use decision::{Decision, Verdict};
pub use limiter::{LimitRequest, Limiter};
pub use store::CounterRegistry;
pub use wall_clock::SystemClock;
