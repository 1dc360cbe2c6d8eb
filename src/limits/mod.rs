//! Rate limiting in the gateway. The limits core is a crate of its own (`crates/limits`,
//! `tollgate_limits`): `algorithm` (pure functions of state and time, behind `clock`), `record`
//! (the fleet record of a tier), `ledger` (fleet accounting on the records: used, confirmed,
//! leased), `sliding_log`, `partition` (what a counter counts for), `store` (local counters with
//! bounded memory, kept across reloads), `in_flight` and `top`; re-exported here by those names.
//! Here: `fleet` (what the request path knows of the fleet), `limiter` (the decision for a
//! request, with its `policy` texts, written to the core's `decision`), `concurrency` (limits of
//! requests in flight), `headers` (what the client is told), `decision_metrics`, `inspect`,
//! `probe`.

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

pub use clock::{Clock, FakeClock, SystemClock};
pub use decision::{Decision, Verdict};
pub use limiter::{LimitRequest, Limiter};
pub use store::CounterRegistry;
