//! Tenant resolution (contract section 2, `tenant`): the sources are tried in order and the
//! first that yields a tenant wins. A tenant id is bytes: a header may carry anything.
//!
//! Trust: an API key and the client address are proof a client cannot forge; a `header` or
//! `path` source is only a claim, believed when the source is `trusted: true` or the request
//! comes from one of `server.trusted_proxies` (which set it). Otherwise the source is skipped,
//! as if the request did not carry it.

use crate::config::model::{TenantMode, TenantSettings, TenantSource};
use crate::tokens::{KeyWait, Outcome, Refusal, Verified};
use http::HeaderMap;
use std::net::IpAddr;
use std::sync::Arc;

/// The tenant given to requests that have none on an `optional` route.
pub const ANONYMOUS: &[u8] = b"anonymous";

/// What the request says about itself, as tenant sources need it.
pub struct RequestFacts<'a> {
    pub headers: &'a HeaderMap,
    pub normalized_path: &'a str,
    pub client_ip: IpAddr,
    /// The socket peer is one of `server.trusted_proxies`: claims are believed.
    pub from_trusted_proxy: bool,
    /// Unix milliseconds (verified tokens are kept until they expire).
    pub now_ms: u64,
}

/// What a request's tenant turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolved {
    Tenant(Vec<u8>),
    /// A verified token named the tenant (its plan and forwarded claims with it).
    Token(Arc<Verified>),
    /// The route does not look for tenants (`tenant: none`): per-tenant rules skip it.
    NotAsked,
    /// An API key was presented and is unknown (401, whatever the route and the later sources
    /// say: a wrong key never becomes another tenant, nor `anonymous`).
    UnknownKey,
    /// A bearer token was presented and is not valid (401 with `WWW-Authenticate: Bearer
    /// error="invalid_token"`, whatever the later sources say), and why (for the log).
    InvalidToken(Refusal, &'static str),
    /// A token whose key id its issuer's keys lack, which are being fetched again: resolve
    /// again once they are (bounded).
    AwaitKeys(KeyWait),
    /// No source yielded a tenant on a route that requires one (401).
    Missing,
}

/// Resolve the tenant of a request on a route whose tenant mode is `mode`.
pub fn resolve(settings: &TenantSettings, mode: TenantMode, req: &RequestFacts) -> Resolved {
    if mode == TenantMode::None {
        return Resolved::NotAsked;
    }
    for source in &settings.sources {
        let found = match source {
            TenantSource::ApiKey { header, keys } => match req.headers.get(header) {
                None => None,
                Some(v) => match v.to_str().ok().and_then(|k| keys.tenant_of(k.trim())) {
                    Some(t) => Some(t.as_bytes().to_vec()),
                    None => return Resolved::UnknownKey,
                },
            },
            TenantSource::Jwt(source) => match source.check(req.headers, req.now_ms) {
                Outcome::Absent => None,
                Outcome::Valid(v) => return Resolved::Token(v),
                Outcome::Invalid(r, why) => return Resolved::InvalidToken(r, why),
                Outcome::AwaitKeys(keys) => return Resolved::AwaitKeys(keys),
            },
            TenantSource::Path { pattern, trusted } if *trusted || req.from_trusted_proxy => {
                pattern
                    .match_capture(req.normalized_path)
                    .flatten()
                    .map(|t| t.as_bytes().to_vec())
            }
            TenantSource::Header { name, trusted } if *trusted || req.from_trusted_proxy => req
                .headers
                .get(name)
                .map(|v| v.as_bytes().trim_ascii())
                .filter(|v| !v.is_empty())
                .map(|v| v.to_vec()),
            TenantSource::Path { .. } | TenantSource::Header { .. } => None,
            TenantSource::ClientIp => Some(req.client_ip.to_string().into_bytes()),
        };
        if let Some(t) = found {
            return Resolved::Tenant(t);
        }
    }
    match mode {
        TenantMode::Required => Resolved::Missing,
        _ => Resolved::Tenant(ANONYMOUS.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::{key_digest, ApiKeys};
    use crate::matching::PathPattern;
    use http::header::HeaderName;
    use http::HeaderValue;

    fn settings(trusted: bool) -> TenantSettings {
        TenantSettings {
            sources: vec![
                TenantSource::ApiKey {
                    header: HeaderName::from_static("x-api-key"),
                    keys: ApiKeys {
                        plain: [("k1".to_string(), "acme".to_string())].into(),
                        hashed: [(key_digest("k2"), "initech".to_string())].into(),
                    },
                },
                TenantSource::Path {
                    pattern: PathPattern::compile("/v1/organizations/{tenant}/**").unwrap(),
                    trusted,
                },
                TenantSource::Header {
                    name: HeaderName::from_static("x-org-id"),
                    trusted,
                },
            ],
            ..TenantSettings::default()
        }
    }

    fn facts<'a>(h: &'a HeaderMap, path: &'a str, proxy: bool) -> RequestFacts<'a> {
        RequestFacts {
            headers: h,
            normalized_path: path,
            client_ip: "127.0.0.1".parse().unwrap(),
            from_trusted_proxy: proxy,
            now_ms: 0,
        }
    }

    fn tenant(t: &[u8]) -> Resolved {
        Resolved::Tenant(t.to_vec())
    }

    #[test]
    fn first_source_wins_and_an_unknown_key_is_refused() {
        let s = settings(true);
        let req = TenantMode::Required;
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        h.insert("x-org-id", HeaderValue::from_static("spoofed"));
        let r = resolve(&s, req, &facts(&h, "/v1/organizations/other/x", false));
        assert_eq!(r, tenant(b"acme"));
        // a key stored as its digest
        h.insert("x-api-key", HeaderValue::from_static("k2"));
        let r = resolve(&s, req, &facts(&h, "/x", false));
        assert_eq!(r, tenant(b"initech"));
        // its digest is not a key
        let digest = crate::config::model::key_digest_text("k2");
        h.insert("x-api-key", HeaderValue::from_str(&digest).unwrap());
        let r = resolve(&s, req, &facts(&h, "/x", false));
        assert_eq!(r, Resolved::UnknownKey);
        // an unknown key is refused, never passed on to the next source
        h.insert("x-api-key", HeaderValue::from_static("nope"));
        let r = resolve(&s, TenantMode::Optional, &facts(&h, "/x", false));
        assert_eq!(r, Resolved::UnknownKey);
        h.remove("x-api-key");
        let r = resolve(&s, req, &facts(&h, "/v1/organizations/globex/x", false));
        assert_eq!(r, tenant(b"globex"));
        assert_eq!(
            resolve(&s, req, &facts(&h, "/other", false)),
            tenant(b"spoofed")
        );
    }

    #[test]
    fn claims_count_only_when_trusted_or_from_a_trusted_proxy() {
        let s = settings(false);
        let mut h = HeaderMap::new();
        h.insert("x-org-id", HeaderValue::from_static("globex"));
        let path = "/v1/organizations/acme/x";
        let req = TenantMode::Required;
        assert_eq!(resolve(&s, req, &facts(&h, path, false)), Resolved::Missing);
        assert_eq!(resolve(&s, req, &facts(&h, path, true)), tenant(b"acme"));
        assert_eq!(resolve(&s, req, &facts(&h, "/x", true)), tenant(b"globex"));
    }

    #[test]
    fn the_route_mode_decides_what_no_tenant_means() {
        let s = settings(true);
        let h = HeaderMap::new();
        let f = facts(&h, "/x", false);
        assert_eq!(resolve(&s, TenantMode::Required, &f), Resolved::Missing);
        assert_eq!(resolve(&s, TenantMode::Optional, &f), tenant(ANONYMOUS));
        let mut h = HeaderMap::new();
        h.insert("x-org-id", HeaderValue::from_static("globex"));
        let f = facts(&h, "/x", false);
        assert_eq!(resolve(&s, TenantMode::None, &f), Resolved::NotAsked);
    }
}
