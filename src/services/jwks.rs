//! The JWKS fetcher: the keys of every `jwt` issuer with a `jwks_uri`, fetched over HTTPS off
//! the request path. A JWKS is fetched at start-up, again when its cache lifetime ends
//! (`Cache-Control: max-age`, kept within `MIN_LIFETIME`..`MAX_LIFETIME`, `DEFAULT_LIFETIME`
//! without one), and at once when a token names a key id the keys lack, but never twice within
//! `MIN_REFETCH_MS` whatever clients send. A fetch that fails keeps the keys held (the file's
//! copy, or the last fetched), is tried again after `RETRY`, counted in
//! `tollgate_jwks_fetches_total{issuer,result}`, logged once per change of its error, and shown
//! on the status page.

use crate::config::model::JwksFetch;
use crate::metrics::Metrics;
use crate::snapshot::SharedSnapshot;
use crate::tokens::keys::KeySet;
use crate::tokens::MIN_REFETCH_MS;
use async_trait::async_trait;
use pingora::connectors::TransportConnector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::http::v1::client::HttpSession;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Without `Cache-Control: max-age`, a JWKS is fetched again after this.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// A `max-age` is kept within these.
pub const MIN_LIFETIME: Duration = Duration::from_secs(30);
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// After a failed fetch, the next try.
pub const RETRY: Duration = Duration::from_secs(10);
/// One fetch, connection to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWKS read.
pub const MAX_JWKS_BYTES: usize = 1 << 20;
/// How often the fetcher looks for a JWKS that is due or wanted.
const LOOK_EVERY: Duration = Duration::from_millis(50);

pub struct JwksFetcher {
    pub shared: SharedSnapshot,
    pub metrics: Arc<Metrics>,
}

/// A JWKS as fetched: its keys, what was left out, and how long it may be kept.
struct Fetched {
    set: KeySet,
    skipped: Vec<String>,
    lifetime: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl JwksFetcher {
    /// A fetch's outcome: counted, the keys' error noted, and logged once per change (the
    /// first error, a different one, the recovery; the keys' count the first time).
    fn note_outcome(
        &self,
        f: &JwksFetch,
        uri: &str,
        outcome: &Result<usize, String>,
        logged: &mut HashMap<String, Option<String>>,
        first: bool,
    ) {
        let label = match &outcome {
            Ok(_) => "ok",
            Err(_) => "error",
        };
        self.metrics
            .jwks_fetches
            .with_label_values(&[&f.issuer, label])
            .inc();
        let error = outcome.as_ref().err().cloned();
        if let Err(e) = &outcome {
            f.keys.fetch_ends(now_ms(), Err(e.clone()));
        }
        // logged once per change: the first error, a different one, the recovery
        let before = logged.insert(uri.to_string(), error.clone()).flatten();
        match (&before, &error, &outcome) {
            (_, Some(e), _) if before.as_ref() != Some(e) => log::error!(
                "jwks {uri} (issuer {}): cannot fetch the keys: {e}; the keys held are kept",
                f.issuer
            ),
            (Some(_), None, Ok(n)) => {
                log::warn!("jwks {uri} (issuer {}): fetched again: {n} keys", f.issuer)
            }
            (None, None, Ok(n)) if first => {
                log::info!("jwks {uri} (issuer {}): {n} keys", f.issuer)
            }
            _ => {}
        }
    }
}

#[async_trait]
impl BackgroundService for JwksFetcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // made at the first fetch: a config without `jwks_uri` never loads the system's
        // certificate store for it
        let mut connector: Option<TransportConnector> = None;
        // per URI: when it is due next, and the last error logged
        let mut due: HashMap<String, Instant> = HashMap::new();
        let mut logged: HashMap<String, Option<String>> = HashMap::new();
        let mut left_out: HashMap<String, Vec<String>> = HashMap::new();
        loop {
            let snap = self.shared.load_full();
            for f in &snap.config.tenant.jwks {
                let uri = f.uri.to_string();
                let now = Instant::now();
                let is_due = due.get(&uri).is_none_or(|at| now >= *at);
                let wanted = f.keys.wanted.load(std::sync::atomic::Ordering::Acquire)
                    && now_ms().saturating_sub(
                        f.keys
                            .attempted_ms
                            .load(std::sync::atomic::Ordering::Relaxed),
                    ) >= MIN_REFETCH_MS;
                if !is_due && !wanted {
                    continue;
                }
                f.keys.fetch_starts(now_ms());
                let connector = connector.get_or_insert_with(|| TransportConnector::new(None));
                let result = tokio::time::timeout(FETCH_TIMEOUT, fetch(connector, f))
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {FETCH_TIMEOUT:?}")));
                let (next, outcome) = match result {
                    Ok(fetched) => {
                        let lifetime = fetched.lifetime;
                        // keys it cannot use: said once per change of the list
                        if left_out.get(&uri) != Some(&fetched.skipped) {
                            if !fetched.skipped.is_empty() {
                                log::warn!("jwks {uri}: left out: {}", fetched.skipped.join("; "));
                            }
                            left_out.insert(uri.clone(), fetched.skipped.clone());
                        }
                        let n = fetched.set.keys.len();
                        if n == 0 {
                            (RETRY, Err("no key to verify with".to_string()))
                        } else {
                            f.keys.fetch_ends(now_ms(), Ok(fetched.set));
                            (lifetime, Ok(n))
                        }
                    }
                    Err(e) => (RETRY, Err(e)),
                };
                let first = !due.contains_key(&uri);
                self.note_outcome(f, &uri, &outcome, &mut logged, first);
                due.insert(uri, Instant::now() + next);
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }
}

/// One GET of the JWKS over HTTPS, its certificate checked (against `ca`, else the system's
/// roots) and its host name.
async fn fetch(connector: &TransportConnector, f: &JwksFetch) -> Result<Fetched, String> {
    let host = f.uri.host().ok_or("the URI has no host")?;
    let port = f.uri.port_u16().unwrap_or(443);
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    // each address in turn (`localhost` may be ::1 first, with the server on 127.0.0.1 only)
    let mut failed = format!("{host} has no address");
    let mut stream = None;
    for addr in addrs {
        let mut peer = HttpPeer::new(addr, true, host.to_string());
        peer.options.ca = f.ca.clone();
        peer.options.connection_timeout = Some(FETCH_TIMEOUT);
        peer.options.total_connection_timeout = Some(FETCH_TIMEOUT);
        match connector.new_stream(&peer).await {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => failed = format!("cannot connect to {addr}: {e}"),
        }
    }
    let mut session = HttpSession::new(stream.ok_or(failed)?);
    let path = f.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = RequestHeader::build("GET", path.as_bytes(), None)
        .map_err(|e| format!("cannot make the request: {e}"))?;
    let authority = f.uri.authority().map_or(host, |a| a.as_str());
    for (name, value) in [
        ("host", authority),
        ("accept", "application/json, application/jwk-set+json"),
        (
            "user-agent",
            concat!("tollgate/", env!("CARGO_PKG_VERSION")),
        ),
        ("connection", "close"),
    ] {
        req.insert_header(name, value)
            .map_err(|e| format!("cannot make the request: {e}"))?;
    }
    session
        .write_request_header(Box::new(req))
        .await
        .map_err(|e| format!("cannot send the request: {e}"))?;
    session
        .read_response()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let head = session.resp_header().ok_or("no answer")?;
    if head.status != 200 {
        return Err(format!("the answer is {}, not 200", head.status));
    }
    let lifetime = lifetime(head.headers.get(http::header::CACHE_CONTROL));
    let mut body = Vec::new();
    while let Some(chunk) = session
        .read_body_bytes()
        .await
        .map_err(|e| format!("the answer's body: {e}"))?
    {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(format!("the JWKS is larger than {MAX_JWKS_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    let (set, skipped) = KeySet::parse(&body)?;
    Ok(Fetched {
        set,
        skipped,
        lifetime,
    })
}

/// How long a fetched JWKS is kept: its `max-age`, within `MIN_LIFETIME` and `MAX_LIFETIME`;
/// `DEFAULT_LIFETIME` without one.
fn lifetime(cache_control: Option<&http::HeaderValue>) -> Duration {
    max_age(cache_control)
        .unwrap_or(DEFAULT_LIFETIME)
        .clamp(MIN_LIFETIME, MAX_LIFETIME)
}

/// `max-age` of a `Cache-Control` value; `no-store`/`no-cache` are a lifetime of 0 (then
/// `MIN_LIFETIME`).
fn max_age(v: Option<&http::HeaderValue>) -> Option<Duration> {
    let text = v?.to_str().ok()?;
    let mut age = None;
    for d in text.split(',').map(str::trim) {
        let lower = d.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(n) = lower.strip_prefix("max-age=") {
            age = n
                .trim_matches('"')
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs);
        }
    }
    age
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lifetimes() {
        let v = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert_eq!(
            max_age(Some(&v("public, max-age=3600"))),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(max_age(Some(&v("no-store"))), Some(Duration::ZERO));
        assert_eq!(max_age(Some(&v("public"))), None);
        assert_eq!(max_age(None), None);
        // kept within 30 s and 24 h, 5 minutes without one
        assert_eq!(
            lifetime(Some(&v("max-age=3600"))),
            Duration::from_secs(3600)
        );
        assert_eq!(lifetime(Some(&v("max-age=1"))), Duration::from_secs(30));
        assert_eq!(lifetime(Some(&v("no-store"))), Duration::from_secs(30));
        assert_eq!(
            lifetime(Some(&v("max-age=999999"))),
            Duration::from_secs(86_400)
        );
        assert_eq!(lifetime(None), Duration::from_secs(300));
    }
}
