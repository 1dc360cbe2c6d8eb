//! The background services beside the request path: the [`fleet_sync`] to Redis, the
//! [`reload`]er, the [`upgrade`]r (SIGUSR2), the [`admin`] listener, the counters' [`sweeper`],
//! all on a [`crate::ticker`], the [`jwks`] fetcher of the token issuers' keys, and the
//! [`departure`] that ends a terminating process once nothing is in flight.

pub mod admin;
pub mod departure;
pub mod fleet_sync;
pub mod jwks;
pub mod reload;
pub mod sweeper;
pub mod upgrade;
