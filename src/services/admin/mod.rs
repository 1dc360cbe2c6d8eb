//! The admin listener: `/healthz`, `/readyz`, `/metrics` for probes and scrapers; the
//! operator's view (`/`, a status page, and `/api/status`, `/api/tenants/<tenant>`; see `api`),
//! behind `server.admin_token` when one is set.

pub mod adjust;
pub mod api;
pub mod usage;

use crate::limits::fleet::{Fleet, Link};
use crate::metrics::Metrics;
use crate::services::reload::ReloadStatus;
use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Admin {
    pub shared: SharedSnapshot,
    pub reload: Arc<ReloadStatus>,
    pub rates: Arc<api::DecisionRates>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    /// Set by SIGTERM (drain, then exit) and SIGQUIT (hand the listeners over, then exit).
    pub draining: Arc<AtomicBool>,
    pub fleet: Arc<Fleet>,
    /// Client connections per listener: a full listener makes the process not ready.
    pub connections: Arc<crate::request::connections::Connections>,
}

/// A flag raised when the process starts leaving: SIGTERM or SIGQUIT. Pingora handles those
/// signals itself (it stops accepting, serves what is open for at most `grace_period`, then
/// exits; after SIGTERM, `services::departure` ends the process once nothing is open);
/// this second handler lets `/readyz` say 503 from the first moment on connections that are
/// kept alive, so that load balancers stop sending traffic.
pub fn install_drain_signals() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGQUIT] {
        let raised = Arc::clone(&flag);
        // SAFETY: the action only stores to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook_registry::register(sig, move || raised.store(true, Ordering::SeqCst))?;
        }
    }
    Ok(flag)
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .body(body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

const PAGE: &str = include_str!("page.html");

/// Does the request carry the admin token? `Authorization: Bearer <token>` (curl, scripts), or
/// `Basic` with the token as password (a browser asks for it and sends it with the page's own
/// requests). Compared in constant time.
fn authorized(req: &pingora::http::RequestHeader, token: &str) -> bool {
    let Some(value) = req
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let given: Vec<u8> = if let Some(t) = value.strip_prefix("Bearer ") {
        t.trim().as_bytes().to_vec()
    } else if let Some(b) = value.strip_prefix("Basic ") {
        match base64_decode(b.trim()) {
            Some(pair) => match pair.iter().position(|&c| c == b':') {
                Some(i) => pair[i + 1..].to_vec(),
                None => return false,
            },
            None => return false,
        }
    } else {
        return false;
    };
    let want = token.as_bytes();
    given.len() == want.len()
        && given
            .iter()
            .zip(want)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    Some(out)
}

fn problem(status: StatusCode, detail: &str) -> Response<Vec<u8>> {
    let title = status.canonical_reason().unwrap_or("Error");
    reply(
        status,
        crate::problem::CONTENT_TYPE,
        crate::problem::body(status.as_u16(), title, detail, "about:blank", &[]).to_vec(),
    )
}

impl Admin {
    /// `/readyz`: ready once every listener accepts, not draining and none at its connection
    /// limit; with what Redis and the last reload say.
    fn readyz(&self) -> Response<Vec<u8>> {
        let draining = self.draining.load(Ordering::SeqCst);
        let full: Vec<String> = self
            .connections
            .full()
            .iter()
            .map(ToString::to_string)
            .collect();
        let ready = self.ready.load(Ordering::Acquire) && !draining && full.is_empty();
        let last = self.reload.last();
        let body = serde_json::json!({
            "ready": ready,
            "draining": draining,
            // listeners at server.max_connections: they close new connections at once
            "listeners_full": full,
            "config": "loaded",
            "redis": api::redis_state(&self.fleet),
            // Redis answers, refusing some commands: which kind, and why
            "redis_error": api::redis_error(&self.fleet),
            // a broken file on disk does not make the running process unready
            "last_reload": last.map(|l| if l.ok { "ok" } else { "failed" }),
        });
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        reply(status, "application/json", body.to_string().into_bytes())
    }
}

/// The largest body `/reset` and `/grant` read.
const MAX_ADJUST_BODY: usize = 16 * 1024;

impl Admin {
    /// `POST /api/tenants/{id}/reset` and `/grant` (see `adjust`): POST only, and only with
    /// `server.admin_token` set (the token was checked before).
    async fn adjust(&self, session: &mut ServerSession, path: &str) -> Response<Vec<u8>> {
        let (raw, action) = match path.strip_suffix("/reset") {
            Some(r) => (r, adjust::Action::Reset),
            None => (
                path.strip_suffix("/grant").unwrap_or(path),
                adjust::Action::Grant,
            ),
        };
        if session.req_header().method != http::Method::POST {
            let mut r = problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "a reset or a grant is a POST",
            );
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
            return r;
        }
        if self.shared.load().config.server.admin_token.is_none() {
            return problem(
                StatusCode::FORBIDDEN,
                "resets and grants need server.admin_token: without it anyone who reaches the admin listener could use them",
            );
        }
        let tenant = match api::percent_decode(&raw["/api/tenants/".len()..]) {
            Some(id) if !id.is_empty() && !id.contains(&b'/') => id,
            _ => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "expected /api/tenants/<tenant id, percent-encoded>/reset or /grant",
                )
            }
        };
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    body.extend_from_slice(&chunk);
                    if body.len() > MAX_ADJUST_BODY {
                        return problem(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            &format!("the body is over {MAX_ADJUST_BODY} bytes"),
                        );
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    return problem(
                        StatusCode::BAD_REQUEST,
                        &format!("the body could not be read: {e}"),
                    )
                }
            }
        }
        let peer = session
            .client_addr()
            .map_or_else(|| "-".to_string(), ToString::to_string);
        match adjust::adjust(&self.shared, &tenant, action, &body, &peer).await {
            Ok(v) => reply(
                StatusCode::OK,
                "application/json",
                v.to_string().into_bytes(),
            ),
            Err((status, detail)) => problem(status, &detail),
        }
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        let operator = path == "/" || path.starts_with("/api/");
        if operator {
            let token = self.shared.load().config.server.admin_token.clone();
            if let Some(token) = token {
                if !authorized(session.req_header(), &token) {
                    let mut r = problem(
                        StatusCode::UNAUTHORIZED,
                        "this endpoint needs the admin token: Authorization: Bearer <token>",
                    );
                    r.headers_mut().insert(
                        http::header::WWW_AUTHENTICATE,
                        http::HeaderValue::from_static(
                            "Basic realm=\"tollgate\", charset=\"UTF-8\"",
                        ),
                    );
                    return r;
                }
            }
        }
        match path.as_str() {
            "/" => reply(StatusCode::OK, "text/html; charset=utf-8", PAGE.as_bytes().to_vec()),
            "/api/status" => {
                let body = api::status(&self.shared, &self.fleet, &self.metrics, &self.rates, &self.reload);
                reply(StatusCode::OK, "application/json", body.to_string().into_bytes())
            }
            "/api/top" => {
                let query = session.req_header().uri.query().unwrap_or("").to_string();
                match api::top(&self.shared, &query) {
                    Ok(body) => reply(StatusCode::OK, "application/json", body.to_string().into_bytes()),
                    Err(why) => problem(StatusCode::BAD_REQUEST, &why),
                }
            }
            "/api/usage" => {
                let query = session.req_header().uri.query().unwrap_or("").to_string();
                match usage::usage(&self.shared, &query).await {
                    Ok((content_type, body, link)) => {
                        let mut r = reply(StatusCode::OK, content_type, body);
                        if let Some(v) = link.and_then(|l| http::HeaderValue::from_str(&l).ok()) {
                            r.headers_mut().insert(http::header::LINK, v);
                        }
                        r
                    }
                    Err((status, why)) => problem(status, &why),
                }
            }
            p if p.starts_with("/api/tenants/") && (p.ends_with("/reset") || p.ends_with("/grant")) => {
                self.adjust(session, p).await
            }
            p if p.starts_with("/api/tenants/") => {
                let raw = &p["/api/tenants/".len()..];
                match api::percent_decode(raw) {
                    Some(id) if !id.is_empty() => {
                        match api::tenant(&self.shared, &self.fleet, &id) {
                            Some(body) => reply(StatusCode::OK, "application/json", body.to_string().into_bytes()),
                            None => problem(StatusCode::NOT_FOUND, "no such tenant here: no API key or plan names it and no rule has counted it"),
                        }
                    }
                    _ => problem(StatusCode::BAD_REQUEST, "expected /api/tenants/<tenant id, percent-encoded>"),
                }
            }
            "/healthz" => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
            "/readyz" => self.readyz(),
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                self.metrics.render(),
            ),
            _ => problem(
                StatusCode::NOT_FOUND,
                "admin endpoints: /, /api/status, /api/tenants/<tenant> (and POST .../reset, .../grant), /api/top?rule=<id>, /api/usage?rule=<id>, /healthz, /readyz, /metrics",
            ),
        }
    }
}

/// Marks the process ready once every data plane listener accepts connections and, with a
/// `redis` section, the first sync round has ended (so the fleet's size is known, or the
/// failure logged and `on_failure` in force); at most `FIRST_ROUND_WAIT` is spent on that.
pub struct ReadinessProbe {
    pub listen: Vec<SocketAddr>,
    /// Per listener: whether it speaks TLS (the probe then completes a handshake, so the
    /// listener does not log a failed one for the probe's connection).
    pub listen_tls: Vec<bool>,
    pub ready: Arc<AtomicBool>,
    pub fleet: Arc<Fleet>,
    /// `tracing` is configured: ready once requests are traced (or `FIRST_ROUND_WAIT`).
    pub tracing: bool,
    /// The keys of the `jwt` issuers with a `jwks_uri`: ready once each was fetched (or
    /// `FIRST_ROUND_WAIT`: then with the keys of `jwks_file`, if any).
    pub jwks: Vec<Arc<crate::tokens::IssuerKeys>>,
}

/// Longest wait for the first sync round before the process says it is ready anyway.
pub const FIRST_ROUND_WAIT: Duration = Duration::from_secs(5);

fn dialable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// Complete a TLS handshake on the probe's connection and close it cleanly: a connection
/// dropped before its handshake is logged by the listener as a failed handshake, an error at
/// every start. Nothing is verified: the probe only needs the listener to be up.
async fn tls_goodbye(tcp: tokio::net::TcpStream) {
    use pingora::tls::ssl::{SslConnector, SslMethod, SslVerifyMode};
    let Ok(mut builder) = SslConnector::builder(SslMethod::tls_client()) else {
        return;
    };
    builder.set_verify(SslVerifyMode::NONE);
    let Ok(ssl) = builder.build().configure().and_then(|c| {
        c.verify_hostname(false)
            .use_server_name_indication(false)
            .into_ssl("localhost")
    }) else {
        return;
    };
    let Ok(mut stream) = pingora::tls::tokio_ssl::SslStream::new(ssl, tcp) else {
        return;
    };
    let handshake = std::pin::Pin::new(&mut stream).connect();
    if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(2), handshake).await {
        until_closed(stream).await;
    }
}

/// Close the probe's side of a connection and wait, at most `PROBE_CLOSE_WAIT`, until the
/// listener has closed its own: only then has the listener's count of connections let go of
/// the probe's (`server.max_connections`), which would otherwise take the place of a client's
/// for as long as a busy process takes to serve it.
async fn until_closed<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let drained = async {
        let _ = stream.shutdown().await;
        let mut buf = [0u8; 512];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(PROBE_CLOSE_WAIT, drained).await;
}

/// The longest the readiness probe waits for a listener to close the probe's connection.
const PROBE_CLOSE_WAIT: Duration = Duration::from_secs(2);

#[async_trait]
impl BackgroundService for ReadinessProbe {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        for (i, addr) in self.listen.iter().enumerate() {
            loop {
                if let Ok(tcp) = tokio::net::TcpStream::connect(dialable(*addr)).await {
                    if self.listen_tls.get(i).copied().unwrap_or(false) {
                        tls_goodbye(tcp).await;
                    } else {
                        until_closed(tcp).await;
                    }
                    break;
                }
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        }
        let started = tokio::time::Instant::now();
        while self.fleet.is_configured()
            && self.fleet.link() == Link::Unknown
            && started.elapsed() < FIRST_ROUND_WAIT
        {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        while self
            .jwks
            .iter()
            .any(|k| k.fetched_ms.load(Ordering::Relaxed) == 0)
            && started.elapsed() < FIRST_ROUND_WAIT
        {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        while self.tracing
            && crate::request::trace::traces().is_none()
            && started.elapsed() < FIRST_ROUND_WAIT
        {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        self.ready.store(true, Ordering::Release);
        log::info!("ready: listening on {:?}", self.listen);
    }
}
