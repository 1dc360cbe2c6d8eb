//! The request path. [`admission`] decides what happens to a request (which route, which
//! tenant, which limits, which [`answer`]) knowing nothing of Pingora, out of [`client_limits`],
//! [`client_addr`], [`tenant`], [`routing`] and [`crate::limits`]; [`proxy`] is the Pingora
//! adapter around it (a few lines a phase: admit, the shaping gate, the upstream pool, the
//! quota headers, the answers), inside the [`edge`] (with its [`header_deadline`] and the [`connections`] it counts) and beside
//! the [`tls`] certificate callback.

pub mod admission;
pub mod answer;
pub mod client_addr;
pub mod client_limits;
pub mod connections;
pub mod cors;
pub mod edge;
pub mod header_deadline;
pub mod incoming;
pub mod proxy;
pub mod quota;
pub mod request_id;
pub mod rewrite;
pub mod routing;
pub mod split;
pub mod tenant;
pub mod tls;
pub mod trace;
