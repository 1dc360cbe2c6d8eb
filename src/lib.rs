//! Tollgate: an edge API gateway on Pingora with tenant-aware, fleet-wide rate limiting.
//!
//! Follow one request: [`config`] (file model -> validated snapshot, held in [`snapshot`]) ->
//! the [`request`] path: one Pingora-free admission (tenant resolution with the client
//! address, routing on [`matching`], the [`limits`] decision on local counters, the
//! [`problem`] answers), then the Pingora adapter that proxies to an [`upstream`] pool
//! (through its shaping queue when it has one) and writes every answer; beside it the
//! background [`services`] on a [`ticker`]: the fleet sync to Redis, the reloader, the admin
//! listener with [`metrics`].
//!
//! The modules form layers, each using only those before it (no cycle, checked by
//! `tests/layout.rs`): `matching`, `problem`, `grpc`, `log_limit`, `ticker`, `tokens`, `metrics` -> `config` -> `limits` ->
//! `upstream` -> `snapshot` -> `request` -> `services` -> `cli`.

pub mod cli;
pub mod config;
pub mod grpc;
pub mod limits;
pub mod log_format;
pub mod log_limit;
pub mod matching;
pub mod metrics;
pub mod problem;
pub mod request;
pub mod services;
pub mod snapshot;
pub mod ticker;
pub mod tokens;
pub mod upstream;
