//! Tenant resolution (contract section 2, `tenant`): the sources are tried in order and the
//! first that yields a tenant wins. A tenant id is bytes: a header may carry anything.

use crate::config::model::{TenantSettings, TenantSource};
use http::HeaderMap;
use std::net::IpAddr;

/// The tenant given to requests that have none when `required: false`.
pub const ANONYMOUS: &[u8] = b"anonymous";

/// What the request says about itself, as tenant sources need it.
pub struct RequestFacts<'a> {
    pub headers: &'a HeaderMap,
    pub normalized_path: &'a str,
    pub client_ip: IpAddr,
}

/// Resolve the tenant, or None when no source yields one.
pub fn resolve(settings: &TenantSettings, req: &RequestFacts) -> Option<Vec<u8>> {
    for source in &settings.sources {
        let found = match source {
            TenantSource::ApiKey { header, keys } => req
                .headers
                .get(header)
                .and_then(|v| v.to_str().ok())
                .and_then(|k| keys.get(k.trim()))
                .map(|t| t.as_bytes().to_vec()),
            TenantSource::Path(pattern) => pattern
                .match_capture(req.normalized_path)
                .flatten()
                .map(|t| t.as_bytes().to_vec()),
            TenantSource::Header(name) => req
                .headers
                .get(name)
                .map(|v| v.as_bytes().trim_ascii())
                .filter(|v| !v.is_empty())
                .map(|v| v.to_vec()),
            TenantSource::ClientIp => Some(req.client_ip.to_string().into_bytes()),
        };
        if found.is_some() {
            return found;
        }
    }
    if settings.required {
        None
    } else {
        Some(ANONYMOUS.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matching::PathPattern;
    use http::header::HeaderName;
    use http::HeaderValue;

    fn settings(required: bool) -> TenantSettings {
        TenantSettings {
            sources: vec![
                TenantSource::ApiKey {
                    header: HeaderName::from_static("x-api-key"),
                    keys: [("k1".to_string(), "acme".to_string())].into(),
                },
                TenantSource::Path(PathPattern::compile("/v1/organizations/{tenant}/**").unwrap()),
                TenantSource::Header(HeaderName::from_static("x-org-id")),
            ],
            required,
            ..TenantSettings::default()
        }
    }

    fn facts<'a>(h: &'a HeaderMap, path: &'a str) -> RequestFacts<'a> {
        RequestFacts {
            headers: h,
            normalized_path: path,
            client_ip: "127.0.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn first_source_wins() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        h.insert("x-org-id", HeaderValue::from_static("spoofed"));
        assert_eq!(
            resolve(&settings(true), &facts(&h, "/v1/organizations/other/x")).unwrap(),
            b"acme"
        );
        // unknown key: falls through to the next source
        h.insert("x-api-key", HeaderValue::from_static("nope"));
        assert_eq!(
            resolve(&settings(true), &facts(&h, "/v1/organizations/globex/x")).unwrap(),
            b"globex"
        );
        assert_eq!(
            resolve(&settings(true), &facts(&h, "/other")).unwrap(),
            b"spoofed"
        );
    }

    #[test]
    fn required_or_anonymous() {
        let h = HeaderMap::new();
        assert_eq!(resolve(&settings(true), &facts(&h, "/x")), None);
        assert_eq!(
            resolve(&settings(false), &facts(&h, "/x")).unwrap(),
            ANONYMOUS
        );
    }
}
