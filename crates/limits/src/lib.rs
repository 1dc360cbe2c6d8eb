//! The limits core of Tollgate: what a limit counts and how, knowing nothing of HTTP servers,
//! async runtimes or config files. Its modules depend one way, bottom up:
//!
//! - `clock`: time as nanoseconds since the epoch and waits on it, and a fake clock;
//! - `calendar`: calendar windows (a day, a week, a month in a time zone);
//! - `algorithm`: the five algorithms on one tier's window state (`Quota`, `TierState`);
//! - `record`: the fleet record of one tier (`Ledger`), `ledger`: the fleet's accounting on it,
//!   `sliding_log`: a sliding log's instants;
//! - `partition`: what a counter counts for and its store key;
//! - `store`: the counters of one rule, sharded, bounded, surviving reloads; `in_flight`:
//!   requests in flight per partition; `top`: the partitions closest to their limits;
//! - `decision`: what was decided for one request (its verdict, each tier's report, what it
//!   owes later), plain data for headers, metrics and inspection;
//! - `fleet`: what the decisions know of Redis and the other instances (atomics);
//! - `limiter`: the decision for one request on the rules that apply to it (`Limit`s), check
//!   then commit, and the charges owed until the answer is known.
//!
//! See `ARCHITECTURE.md` beside this crate's `Cargo.toml`.

pub mod algorithm;
pub mod calendar;
pub mod clock;
pub mod decision;
pub mod fleet;
pub mod in_flight;
pub mod ledger;
pub mod limiter;
pub mod partition;
pub mod record;
pub mod sliding_log;
pub mod store;
pub mod top;

pub use algorithm::Algorithm;
pub use clock::{Clock, FakeClock, NANOS_PER_MS};
pub use partition::PartitionBy;
