//! Rate limiting: `record` (the fleet record of a tier), `algorithm` (pure functions of state
//! and time, behind `clock`), `ledger` (fleet accounting on the records: used, confirmed,
//! leased; `fleet` is what the request path knows of the fleet), `partition` (what a counter
//! counts for, and its Redis identity), `store` (local counters with bounded memory, kept
//! across reloads), `limiter` (the decision for a request, with its `policy` texts), `decision`
//! (what it decided) and `headers` (what the client is told).

pub mod algorithm;
pub mod clock;
pub mod decision;
pub mod decision_metrics;
pub mod fleet;
pub mod headers;
pub mod in_flight;
pub mod inspect;
pub mod ledger;
pub mod limiter;
pub mod partition;
pub mod policy;
pub mod probe;
pub mod record;
pub mod sliding_log;
pub mod store;
pub mod top;

pub use clock::{Clock, FakeClock, SystemClock};
pub use decision::{Decision, Verdict};
pub use limiter::{LimitRequest, Limiter};
pub use store::CounterRegistry;
