//! Tollgate: an edge API gateway on Pingora with tenant-aware, fleet-wide rate limiting.
//!
//! Follow one request: [`config`] (file model -> validated snapshot, held in [`snapshot`]) ->
//! [`tenant`] resolution (with the [`client_addr`]) -> [`routing`] on [`matching`] -> the
//! [`limits`] decision on local counters -> [`proxy`] to an [`upstream`] pool (through its
//! [`shaping`] queue when it has one) -> [`problem`] answers on errors; beside it the [`admin`]
//! listener and [`metrics`], the [`fleet_sync`] to Redis, and the [`reload`]er.

pub mod admin;
pub mod cli;
pub mod client_addr;
pub mod client_limits;
pub mod config;
pub mod fleet_sync;
pub mod header_deadline;
pub mod limits;
pub mod matching;
pub mod metrics;
pub mod problem;
pub mod proxy;
pub mod reload;
pub mod routing;
pub mod shaping;
pub mod snapshot;
pub mod tenant;
pub mod ticker;
pub mod tls;
pub mod upstream;
