//! Who is asking: what a request says of itself as read from the connection ([`Incoming`]),
//! its client address (through trusted proxies) and its tenant.

use crate::metrics::Metrics;
use crate::request::answer::Answer;
use crate::request::client_addr::{self, X_FORWARDED_FOR};
use crate::request::tenant::{self, RequestFacts, Resolved};
use crate::snapshot::Snapshot;
use crate::tokens::{KeyWait, Refusal, Verified};
use http::header;
use std::net::IpAddr;
use std::sync::Arc;

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

/// Why a request is refused for its tenant (401).
#[derive(Debug, PartialEq, Eq)]
pub struct NoTenant {
    pub detail: &'static str,
    /// A bearer token was refused: the answer carries `WWW-Authenticate: Bearer
    /// error="invalid_token"` (RFC 6750); why, for the metrics and the log only.
    pub bearer: Option<(Refusal, &'static str)>,
    /// The token's key id is not among its issuer's keys, which are being fetched again: the
    /// request may wait for them (bounded) and be admitted again.
    pub wait: Option<KeyWait>,
}

impl NoTenant {
    /// The 401 answer; a refused token's reason is counted and logged (never the token).
    pub fn answer(&self, metrics: &Metrics) -> Answer {
        let mut answer = Answer::problem(401, self.detail);
        if let Some((refusal, why)) = self.bearer {
            metrics.token_refused(refusal);
            log::warn!("401: a bearer token was refused: {why}");
            answer.headers.insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static(INVALID_TOKEN),
            );
        }
        answer
    }
}

/// RFC 6750 section 3.1.
pub const INVALID_TOKEN: &str = "Bearer error=\"invalid_token\"";

/// The tenant (empty when the route does not look for one) and the verified token that named
/// it, or why the answer is 401.
pub fn tenant_of(
    snap: &Snapshot,
    mode: crate::config::model::TenantMode,
    req: &Incoming<'_>,
    normalized_path: &str,
    client: IpAddr,
) -> Result<(Vec<u8>, Option<Arc<Verified>>), NoTenant> {
    let cfg = &snap.config;
    let facts = RequestFacts {
        headers: &req.head.headers,
        normalized_path,
        client_ip: client,
        from_trusted_proxy: client_addr::trusted(req.peer, &cfg.server.trusted_proxies),
        now_ms: if cfg.tenant.has_tokens() {
            snap.limiter.now_ns() / 1_000_000
        } else {
            0
        },
    };
    let refuse = |detail| NoTenant {
        detail,
        bearer: None,
        wait: None,
    };
    match tenant::resolve(&cfg.tenant, mode, &facts) {
        Resolved::Tenant(t) => Ok((t, None)),
        Resolved::Token(v) => Ok((v.tenant.to_vec(), Some(v))),
        // no tenant: per-tenant rules skip the request (an empty id is never a tenant)
        Resolved::NotAsked => Ok((Vec::new(), None)),
        Resolved::UnknownKey => Err(refuse("the API key is not valid")),
        Resolved::InvalidToken(refusal, why) => Err(NoTenant {
            detail: "the bearer token is not valid",
            bearer: Some((refusal, why)),
            wait: None,
        }),
        Resolved::AwaitKeys(keys) => Err(NoTenant {
            detail: "the bearer token is not valid",
            bearer: Some((
                Refusal::Key,
                "no key of its issuer has its key id (`kid`), not even after a fetch",
            )),
            wait: Some(keys),
        }),
        Resolved::Missing => Err(refuse("this request does not identify a tenant")),
    }
}
