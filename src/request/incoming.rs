//! Who is asking: what a request says of itself as read from the connection ([`Incoming`]),
//! its client address (through trusted proxies) and its tenant.

use crate::request::client_addr::{self, X_FORWARDED_FOR};
use crate::request::tenant::{self, RequestFacts, Resolved};
use crate::snapshot::Snapshot;
use http::header;
use std::net::IpAddr;

/// What a request says of itself, as read from the connection.
pub struct Incoming<'a> {
    pub head: &'a http::request::Parts,
    /// The request target as sent (its length counts toward `max_request_header_bytes`).
    pub raw_path: &'a [u8],
    /// The connection's peer.
    pub peer: IpAddr,
}

impl Incoming<'_> {
    /// `Host`, or the authority of an HTTP/2 request (or of an absolute-form target).
    pub fn host(&self) -> Option<&str> {
        self.head
            .headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| self.head.uri.host())
    }
}

/// The client address: the peer, or what a trusted proxy says of it.
pub fn client_ip(req: &Incoming<'_>, cfg: &crate::config::Config) -> IpAddr {
    client_addr::client_ip(
        req.peer,
        req.head
            .headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .map(|v| v.as_bytes()),
        &cfg.server.trusted_proxies,
    )
}

/// The tenant (empty when the route does not look for one), or why the answer is 401.
pub fn tenant_of(
    snap: &Snapshot,
    mode: crate::config::model::TenantMode,
    req: &Incoming<'_>,
    normalized_path: &str,
    client: IpAddr,
) -> Result<Vec<u8>, &'static str> {
    let cfg = &snap.config;
    let facts = RequestFacts {
        headers: &req.head.headers,
        normalized_path,
        client_ip: client,
        from_trusted_proxy: client_addr::trusted(req.peer, &cfg.server.trusted_proxies),
    };
    match tenant::resolve(&cfg.tenant, mode, &facts) {
        Resolved::Tenant(t) => Ok(t),
        // no tenant: per-tenant rules skip the request (an empty id is never a tenant)
        Resolved::NotAsked => Ok(Vec::new()),
        Resolved::UnknownKey => Err("the API key is not valid"),
        Resolved::Missing => Err("this request does not identify a tenant"),
    }
}
