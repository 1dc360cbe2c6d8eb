//! The background services beside the request path: the [`fleet_sync`] to Redis, the
//! [`reload`]er, the [`upgrade`]r (SIGUSR2), the [`admin`] listener, the counters' [`sweeper`],
//! all on a [`crate::ticker`], and the [`jwks`] fetcher of the token issuers' keys.

pub mod admin;
pub mod fleet_sync;
pub mod jwks;
pub mod reload;
pub mod sweeper;
pub mod upgrade;
