//! Upstream pools: a pingora load balancer per pool (round robin, random, or consistent hash of
//! the tenant), TCP, HTTP or gRPC (`grpc_health`) health checks, and the peer options
//! (timeouts, keepalive) that every proxied request uses; a pool with `max_in_flight` has a
//! priority queue (`shaping`); a pool with servers given by name follows their addresses
//! (`dns`).

pub mod dns;
pub mod grpc_health;
pub mod shaping;
pub mod tls;

use crate::config::model::{Balance, HealthProbe, UpstreamProtocol, UpstreamSpec};
use crate::ticker::Ticker;
use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck, TcpHealthCheck};
use pingora::lb::selection::{BackendIter, BackendSelection, Consistent, Random, RoundRobin};
use pingora::lb::{Backend, Backends, LoadBalancer};
use pingora::prelude::HttpPeer;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::{Error, ErrorType};
use prometheus::IntCounterVec;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tls::tls_options;

/// How long an idle upstream connection is kept for reuse.
pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How many backends `select` may look at to find a healthy one.
const MAX_SELECT_ITERATIONS: usize = 256;
/// How long a server that refused a connection (or timed out connecting) is skipped, even
/// without a health check.
pub const PASSIVE_DOWN: Duration = Duration::from_secs(5);

enum Balancer {
    RoundRobin(LoadBalancer<RoundRobin>),
    Random(LoadBalancer<Random>),
    Consistent(LoadBalancer<Consistent>),
}

impl Balancer {
    /// Take the set its discovery (`dns::Discovery`) answers now: the update never waits, so
    /// one poll runs it to its end.
    fn update_now(&self) {
        fn once<S>(lb: &LoadBalancer<S>)
        where
            S: BackendSelection + 'static,
            S::Iter: BackendIter,
        {
            use std::future::Future;
            let mut update = std::pin::pin!(lb.update());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let _ = update.as_mut().poll(&mut cx);
        }
        match self {
            Balancer::RoundRobin(lb) => once(lb),
            Balancer::Random(lb) => once(lb),
            Balancer::Consistent(lb) => once(lb),
        }
    }
}

/// A pool's balancer: over its addresses, or, with names, over what `names` publishes.
fn balancer<S>(
    spec: &UpstreamSpec,
    names: Option<&dns::Names>,
    hc: Option<Box<dyn HealthCheck + Send + Sync>>,
) -> std::io::Result<LoadBalancer<S>>
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    let mut lb = match names {
        None => LoadBalancer::try_from_iter(spec.servers.iter().copied())?,
        Some(names) => LoadBalancer::from_backends(Backends::new(names.discovery())),
    };
    if let Some(hc) = hc {
        lb.set_health_check(hc);
    }
    Ok(lb)
}

/// One upstream pool, built from its spec. Rebuilt (with fresh health state) on reload.
pub struct Pool {
    pub spec: UpstreamSpec,
    balancer: Balancer,
    last_check: Mutex<Option<Instant>>,
    checking: AtomicBool,
    /// Servers that failed a connection, until when they are skipped (few; `any_down` keeps
    /// the lock off the request path while there are none).
    passive_down: Mutex<Vec<(std::net::SocketAddr, Instant)>>,
    any_down: AtomicBool,
    /// The one server of a pool without health checks: every selection would pick it (a
    /// passively-down server is still taken when it is the only one), so the balancer is
    /// skipped.
    single: Option<Backend>,
    /// The servers given by name, looked up again in the background; `None` for a pool of
    /// addresses.
    names: Option<dns::Names>,
}

/// A pool's health check, whose log lines name the pool and the server
/// (`upstream products: 127.0.0.1:9001 becomes unhealthy, ...`) instead of pingora's
/// `Backend { addr: Inet(...), weight: 1, ... }`.
struct Named {
    inner: Box<dyn HealthCheck + Send + Sync>,
    pool: String,
}

#[async_trait::async_trait]
impl HealthCheck for Named {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        self.inner.check(target).await
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        self.inner.health_status_change(target, healthy).await
    }

    fn backend_summary(&self, target: &Backend) -> String {
        format!("upstream {}: {}", self.pool, target.addr)
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.inner.health_threshold(success)
    }
}

fn health_check(spec: &UpstreamSpec) -> Option<Box<dyn HealthCheck + Send + Sync>> {
    let hc = spec.health_check.as_ref()?;
    match &hc.probe {
        HealthProbe::Tcp => {
            // a TLS pool's check completes the handshake, verified as requests are
            let mut tcp = match &spec.tls {
                Some(tls) => {
                    let mut t = TcpHealthCheck::new_tls(&tls.sni);
                    tls_options(&mut t.peer_template.options, tls);
                    t
                }
                None => TcpHealthCheck::new(),
            };
            tcp.peer_template.options.connection_timeout = Some(hc.timeout);
            Some(tcp)
        }
        HealthProbe::Http { path, host } => {
            let mut http = HttpHealthCheck::new(host, spec.tls.is_some());
            if let Some(tls) = &spec.tls {
                http.peer_template.sni = tls.sni.clone();
                tls_options(&mut http.peer_template.options, tls);
            }
            if let Ok(mut req) = RequestHeader::build("GET", path.as_bytes(), None) {
                let _ = req.insert_header("Host", host.as_str());
                let _ = req.insert_header("User-Agent", "tollgate-health-check");
                http.req = req;
            }
            if spec.protocol != UpstreamProtocol::Http1 {
                // in the pool's own protocol: an HTTP/2-only server is checked over HTTP/2
                http.peer_template.options.set_http_version(2, 2);
            }
            http.peer_template.options.connection_timeout = Some(hc.timeout);
            http.peer_template.options.read_timeout = Some(hc.timeout);
            http.validator = Some(Box::new(|resp| {
                if resp.status.is_success() {
                    Ok(())
                } else {
                    Error::e_explain(
                        ErrorType::CustomCode("health check status", resp.status.as_u16()),
                        "non-2xx answer to the health check",
                    )
                }
            }));
            Some(Box::new(http))
        }
        HealthProbe::Grpc { service } => Some(Box::new(grpc_health::GrpcHealthCheck::new(
            spec, hc, service,
        ))),
    }
}

impl Pool {
    /// The pool of `spec`; its names, if any, are looked up again with `resolving`.
    pub fn build(spec: &UpstreamSpec, resolving: &Arc<dns::Resolving>) -> std::io::Result<Pool> {
        let names = (!spec.names.is_empty()).then(|| dns::Names::new(spec, Arc::clone(resolving)));
        let hc = health_check(spec).map(|inner| -> Box<dyn HealthCheck + Send + Sync> {
            Box::new(Named {
                inner,
                pool: spec.name.clone(),
            })
        });
        let names_ref = names.as_ref();
        let balancer = match spec.balance {
            Balance::RoundRobin => Balancer::RoundRobin(balancer(spec, names_ref, hc)?),
            Balance::Random => Balancer::Random(balancer(spec, names_ref, hc)?),
            Balance::ConsistentHash => Balancer::Consistent(balancer(spec, names_ref, hc)?),
        };
        if names.is_some() {
            balancer.update_now();
        }
        // a name's addresses change, so a pool with one is never taken as a single server
        let single = match (spec.servers.as_slice(), &spec.health_check, &names) {
            ([addr], None, None) => Some(Backend {
                addr: pingora::protocols::l4::socket::SocketAddr::Inet(*addr),
                weight: 1,
                ext: Default::default(),
            }),
            _ => None,
        };
        Ok(Pool {
            single,
            names,
            spec: spec.clone(),
            balancer,
            last_check: Mutex::new(None),
            checking: AtomicBool::new(false),
            passive_down: Mutex::new(Vec::new()),
            any_down: AtomicBool::new(false),
        })
    }

    /// The names of this pool due for a lookup at `now` (each then marked as under way).
    fn names_due(&self, now: Instant) -> Vec<usize> {
        self.names.as_ref().map_or_else(Vec::new, |n| n.due(now))
    }

    /// Look up name `i` again, and follow its new addresses.
    async fn refresh_name(&self, i: usize, lookups: &IntCounterVec) {
        if let Some(names) = &self.names {
            names
                .refresh(i, &self.spec.name, lookups, || self.balancer.update_now())
                .await;
        }
    }

    /// A connection to `addr` failed: skip it for `PASSIVE_DOWN`.
    pub fn mark_failed(&self, addr: std::net::SocketAddr) {
        let until = Instant::now() + PASSIVE_DOWN;
        let mut down = self.passive_down.lock().unwrap_or_else(|p| p.into_inner());
        match down.iter_mut().find(|(a, _)| *a == addr) {
            Some(d) => d.1 = until,
            None => down.push((addr, until)),
        }
        self.any_down.store(true, Ordering::Relaxed);
    }

    fn passively_down(&self, backend: &Backend) -> bool {
        if !self.any_down.load(Ordering::Relaxed) {
            return false;
        }
        let Some(addr) = backend.addr.as_inet().copied() else {
            return false;
        };
        let now = Instant::now();
        let mut down = self.passive_down.lock().unwrap_or_else(|p| p.into_inner());
        down.retain(|(_, until)| *until > now);
        if down.is_empty() {
            self.any_down.store(false, Ordering::Relaxed);
        }
        down.iter().any(|(a, _)| *a == addr)
    }

    /// Pick a healthy server that has not just failed a connection (if every healthy one has,
    /// any healthy one). `tenant` is the hash key for `consistent_hash`.
    pub fn select(&self, tenant: &[u8]) -> Option<Backend> {
        if let Some(only) = &self.single {
            return Some(only.clone());
        }
        let up = |b: &Backend, healthy: bool| healthy && !self.passively_down(b);
        let pick = |accept: &dyn Fn(&Backend, bool) -> bool| match &self.balancer {
            Balancer::RoundRobin(lb) => lb.select_with(b"", MAX_SELECT_ITERATIONS, accept),
            Balancer::Random(lb) => lb.select_with(b"", MAX_SELECT_ITERATIONS, accept),
            Balancer::Consistent(lb) => lb.select_with(tenant, MAX_SELECT_ITERATIONS, accept),
        };
        pick(&up).or_else(|| pick(&|_, healthy| healthy))
    }

    /// Each server of the pool: healthy (by its health check, or always without one), and
    /// skipped for now after a failed connection.
    pub fn servers(&self) -> Vec<(std::net::SocketAddr, bool, bool)> {
        let backends = match &self.balancer {
            Balancer::RoundRobin(lb) => lb.backends(),
            Balancer::Random(lb) => lb.backends(),
            Balancer::Consistent(lb) => lb.backends(),
        };
        backends
            .get_backend()
            .iter()
            .filter_map(|b| {
                let addr = b.addr.as_inet().copied()?;
                Some((addr, backends.ready(b), self.passively_down(b)))
            })
            .collect()
    }

    /// The peer for a selected server, with this pool's timeouts and connection reuse.
    pub fn peer(&self, backend: Backend) -> HttpPeer {
        let mut peer = match &self.spec.tls {
            None => HttpPeer::new(backend, false, String::new()),
            Some(tls) => {
                let mut peer = HttpPeer::new(backend, true, tls.sni.clone());
                tls_options(&mut peer.options, tls);
                peer
            }
        };
        peer.options.connection_timeout = Some(self.spec.connect_timeout);
        peer.options.total_connection_timeout = Some(self.spec.connect_timeout);
        peer.options.read_timeout = Some(self.spec.read_timeout);
        peer.options.write_timeout = Some(self.spec.read_timeout);
        peer.options.idle_timeout = Some(UPSTREAM_IDLE_TIMEOUT);
        if self.spec.protocol != UpstreamProtocol::Http1 {
            // HTTP/2 only: ALPN h2 over TLS; over plain TCP, prior knowledge (h2c), which
            // Pingora speaks to a peer whose lowest version is 2
            peer.options.set_http_version(2, 2);
            peer.options.max_h2_streams = self.spec.max_streams_per_connection;
        }
        peer
    }

    /// Is a health check due at `now`? Marks it started if so.
    fn start_check_if_due(&self, now: Instant) -> bool {
        let Some(hc) = &self.spec.health_check else {
            return false;
        };
        let Ok(mut last) = self.last_check.lock() else {
            return false;
        };
        let due = last.is_none_or(|t| now.duration_since(t) >= hc.interval);
        if due && !self.checking.swap(true, Ordering::AcqRel) {
            *last = Some(now);
            return true;
        }
        false
    }

    async fn run_health_check(&self) {
        match &self.balancer {
            Balancer::RoundRobin(lb) => lb.backends().run_health_check(true).await,
            Balancer::Random(lb) => lb.backends().run_health_check(true).await,
            Balancer::Consistent(lb) => lb.backends().run_health_check(true).await,
        }
        self.checking.store(false, Ordering::Release);
    }
}

/// Background service running the health checks of the pools that `pools` gives (those of the
/// running config: after a reload, the new ones), each at its own interval.
pub struct HealthChecker<F> {
    pub pools: F,
}

#[async_trait]
impl<F> BackgroundService for HealthChecker<F>
where
    F: Fn() -> Vec<Arc<Pool>> + Send + Sync,
{
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = Ticker::every(Duration::from_millis(50));
        while ticker.tick(&mut shutdown).await {
            let now = Instant::now();
            for pool in &(self.pools)() {
                if pool.start_check_if_due(now) {
                    let pool = Arc::clone(pool);
                    tokio::spawn(async move { pool.run_health_check().await });
                }
            }
        }
    }
}

/// Background service looking up again the names of the pools that `pools` gives (those of
/// the running config: after a reload, the new ones, whose names the reload looked up), each
/// when its answer runs out.
pub struct DnsRefresher<F> {
    pub pools: F,
    /// `tollgate_upstream_dns_lookups_total{pool,result}`
    pub lookups: IntCounterVec,
}

#[async_trait]
impl<F> BackgroundService for DnsRefresher<F>
where
    F: Fn() -> Vec<Arc<Pool>> + Send + Sync,
{
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = Ticker::every(Duration::from_millis(100));
        while ticker.tick(&mut shutdown).await {
            let now = Instant::now();
            for pool in &(self.pools)() {
                for i in pool.names_due(now) {
                    let (pool, lookups) = (Arc::clone(pool), self.lookups.clone());
                    tokio::spawn(async move { pool.refresh_name(i, &lookups).await });
                }
            }
        }
    }
}
