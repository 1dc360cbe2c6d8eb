//! The admin listener: `/healthz`, `/readyz`, `/metrics`.

use crate::limits::fleet::{FleetState, Link};
use crate::metrics::Metrics;
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
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    /// Set by SIGTERM (drain, then exit) and SIGQUIT (hand the listeners over, then exit).
    pub draining: Arc<AtomicBool>,
    pub fleet: Arc<FleetState>,
}

/// A flag raised when the process starts leaving: SIGTERM or SIGQUIT. Pingora handles those
/// signals itself (it stops accepting, serves what is open for `grace_period`, then exits);
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

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path();
        match path {
            "/healthz" => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
            "/readyz" => {
                let draining = self.draining.load(Ordering::SeqCst);
                let ready = self.ready.load(Ordering::Acquire) && !draining;
                let redis = match (self.fleet.is_configured(), self.fleet.link()) {
                    (false, _) => "not_configured",
                    (true, Link::Up) => "connected",
                    (true, Link::Down) => "disconnected",
                    (true, Link::Unknown) => "connecting",
                };
                let body = serde_json::json!({
                    "ready": ready,
                    "draining": draining,
                    "config": "loaded",
                    "redis": redis,
                });
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                reply(status, "application/json", body.to_string().into_bytes())
            }
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                self.metrics.render(),
            ),
            _ => reply(
                StatusCode::NOT_FOUND,
                crate::problem::CONTENT_TYPE,
                crate::problem::body(
                    404,
                    "Not Found",
                    "admin endpoints: /healthz, /readyz, /metrics",
                    "about:blank",
                    &[],
                )
                .to_vec(),
            ),
        }
    }
}

/// Marks the process ready once every data plane listener accepts connections and, with a
/// `redis` section, the first sync round has ended (so the fleet's size is known, or the
/// failure logged and `on_failure` in force); at most `FIRST_ROUND_WAIT` is spent on that.
pub struct ReadinessProbe {
    pub listen: Vec<SocketAddr>,
    pub ready: Arc<AtomicBool>,
    pub fleet: Arc<FleetState>,
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

#[async_trait]
impl BackgroundService for ReadinessProbe {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        for addr in &self.listen {
            loop {
                if tokio::net::TcpStream::connect(dialable(*addr))
                    .await
                    .is_ok()
                {
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
        self.ready.store(true, Ordering::Release);
        log::info!("ready: listening on {:?}", self.listen);
    }
}
