//! The request path. `admission` decides what happens to a request (which route, which tenant,
//! which limits, which answer) knowing nothing of Pingora, out of [`client_addr`], [`tenant`],
//! [`routing`] on [`matching`], and [`crate::limits`]; `proxy` is the Pingora adapter around it
//! (one phase each: admit, the [`shaping`] gate, the [`upstream`] pool, headers, [`problem`]
//! answers), with the edge's [`tls`] certificate callback, [`client_limits`] and the
//! [`header_deadline`].

pub mod client_addr;
pub mod client_limits;
pub mod header_deadline;
pub mod proxy;
pub mod routing;
pub mod tenant;
pub mod tls;
