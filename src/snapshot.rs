//! The running configuration: one immutable snapshot (validated config plus the upstream pools
//! built from it) behind an atomic pointer. A request loads it once and keeps it to the end,
//! so a reload is a swap: in-flight requests finish under the old snapshot.

use crate::config::Config;
use crate::grpc;
use crate::limits::fleet::Fleet;
use crate::limits::probe::ProbeLimit;
use crate::limits::{Clock, CounterRegistry, Limiter};
use crate::metrics::Metrics;
use crate::upstream::Pool;
use arc_swap::ArcSwap;
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub struct Snapshot {
    pub config: Config,
    /// Indexed like `config.upstreams`.
    pub pools: Vec<Arc<Pool>>,
    /// Indexed like `config.upstreams`: the gate of pools with `max_in_flight`.
    pub gates: Vec<Option<Arc<crate::upstream::shaping::Gate>>>,
    /// The rate-limit rules, compiled; their counters live in the registry, not here.
    pub limiter: Limiter,
    /// `tollgate_requests_total` handles by route and status, resolved on first use.
    pub requests: RequestCounters,
    /// The quota endpoint's own limit (the runtime's: it outlives snapshots).
    pub probes: Arc<ProbeLimit>,
    /// `tollgate_upstream_requests_total{route,pool}`, indexed like `config.routes`, then
    /// like the route's `upstreams` (one for a route with `upstream`): resolved here, so a
    /// request costs an atomic add.
    pub pool_requests: Vec<Box<[IntCounter]>>,
}

/// Statuses 100 to 599 (or gRPC's 0 to 16) of one route.
type ByStatus = Box<[OnceLock<IntCounter>]>;

/// `tollgate_requests_total{route,status}` handles, looked up once per (route, status) instead
/// of hashing the labels on every request.
pub struct RequestCounters {
    vec: IntCounterVec,
    /// Indexed like `config.routes`, then one for requests no route matched.
    routes: Vec<(String, ByStatus)>,
    /// `tollgate_grpc_requests_total{route,grpc_status}`, indexed like `routes`, then by code.
    grpc_vec: IntCounterVec,
    grpc: Vec<ByStatus>,
    /// `tollgate_request_duration_seconds{route}`, indexed like `routes`.
    durations: Vec<Histogram>,
}

impl RequestCounters {
    fn new(
        vec: &IntCounterVec,
        grpc_vec: &IntCounterVec,
        durations: &HistogramVec,
        routes: Vec<String>,
    ) -> Self {
        let slots = |n| (0..n).map(|_| OnceLock::new()).collect::<ByStatus>();
        let routes: Vec<String> = routes
            .into_iter()
            .chain(std::iter::once("none".to_string()))
            .collect();
        RequestCounters {
            vec: vec.clone(),
            durations: routes
                .iter()
                .map(|r| durations.with_label_values(&[r.as_str()]))
                .collect(),
            grpc_vec: grpc_vec.clone(),
            grpc: routes.iter().map(|_| slots(grpc::NAMES.len())).collect(),
            routes: routes.into_iter().map(|r| (r, slots(500))).collect(),
        }
    }

    /// Count one gRPC call of `route` that ended with `code` (its number; past the known
    /// ones, UNKNOWN).
    pub fn grpc_done(&self, route: Option<usize>, code: u8) {
        let none = self.routes.len() - 1;
        let i = route.unwrap_or(none).min(none);
        let code = if usize::from(code) < grpc::NAMES.len() {
            code
        } else {
            grpc::UNKNOWN
        };
        if let (Some((name, _)), Some(slot)) = (
            self.routes.get(i),
            self.grpc.get(i).and_then(|s| s.get(usize::from(code))),
        ) {
            slot.get_or_init(|| {
                self.grpc_vec
                    .with_label_values(&[name.as_str(), grpc::NAMES[usize::from(code)]])
            })
            .inc();
        }
    }

    /// Count one request of `route` (None: no route matched) answered with `status` after
    /// `elapsed`.
    pub fn done(&self, route: Option<usize>, status: http::StatusCode, elapsed: Duration) {
        let none = self.routes.len() - 1;
        let i = route.unwrap_or(none).min(none);
        if let Some(h) = self.durations.get(i) {
            h.observe(elapsed.as_secs_f64());
        }
        let (name, slots) = &self.routes[i];
        let code = status.as_u16();
        match code
            .checked_sub(100)
            .and_then(|i| slots.get(usize::from(i)))
        {
            Some(slot) => slot
                .get_or_init(|| {
                    self.vec
                        .with_label_values(&[name.as_str(), status.as_str()])
                })
                .inc(),
            None => self
                .vec
                .with_label_values(&[name.as_str(), status.as_str()])
                .inc(),
        }
    }
}

/// What outlives snapshots: the counters, the metrics and the clock.
#[derive(Clone)]
pub struct Runtime {
    pub registry: Arc<CounterRegistry>,
    /// Pools' priority-shaping gates, by pool name.
    pub gates: Arc<crate::upstream::shaping::Gates>,
    pub fleet: Arc<Fleet>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The quota endpoint's own limit.
    pub probes: Arc<ProbeLimit>,
}

pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

impl Snapshot {
    /// Build the runtime parts (pools, limiter) of a validated config, and set the fleet's mode
    /// from its `redis` section. Start-up and reload both come through here.
    pub fn build(config: Config, rt: &Runtime) -> std::io::Result<Snapshot> {
        // one resolver for the pools of this config, whose names it looks up again
        let resolving = Arc::new(crate::upstream::dns::Resolving::new(config.dns.clone()));
        let pools = config
            .upstreams
            .iter()
            .map(|u| Pool::build(u, &resolving).map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        let limiter = Limiter::build(
            &config.rules,
            &config.plans,
            &rt.registry,
            &rt.metrics.decisions,
            config.server.max_counters_per_rule,
            rt.clock.clone(),
            rt.fleet.clone(),
        );
        let requests = RequestCounters::new(
            &rt.metrics.requests,
            &rt.metrics.grpc_requests,
            &rt.metrics.request_duration,
            config.routes.iter().map(|r| r.id.clone()).collect(),
        );
        // the one place where a config's `redis` section sets the fleet's mode (start-up and
        // reload alike); the snapshot is stored right after
        rt.fleet.configure(
            config.redis.is_some(),
            config
                .redis
                .as_ref()
                .map_or(Default::default(), |r| r.on_failure),
        );
        if let Some(r) = &config.redis {
            rt.fleet
                .set_hold(crate::limits::fleet::hold_limit(r.timeout));
            rt.fleet.set_plain_increments(r.plain_increments);
            rt.fleet.set_interval(r.sync_interval.as_millis() as u64);
        }
        let gates = config
            .upstreams
            .iter()
            .map(|u| u.shaping.map(|limits| rt.gates.get(&u.name, limits)))
            .collect();
        pools_series_at_zero(&config, &rt.metrics);
        let pool_requests = pool_requests(&config, &rt.metrics);
        Ok(Snapshot {
            config,
            pools,
            gates,
            limiter,
            requests,
            probes: rt.probes.clone(),
            pool_requests,
        })
    }
}

/// The pools' series that exist from the start, at 0: a named pool's lookups, a shaped pool's
/// queue (for dashboards and alerts).
fn pools_series_at_zero(config: &Config, metrics: &Metrics) {
    // a pool with names has its lookups' series from the start (at 0)
    for u in config.upstreams.iter().filter(|u| !u.names.is_empty()) {
        for result in ["ok", "error"] {
            metrics
                .upstream_dns_lookups
                .with_label_values(&[u.name.as_str(), result]);
        }
    }
    // a shaped pool's series exist from the start (at 0), for dashboards and alerts
    for u in config.upstreams.iter().filter(|u| u.shaping.is_some()) {
        let m = metrics;
        m.queue_depth.with_label_values(&[u.name.as_str()]);
        for reason in ["full", "timeout"] {
            m.queue_refused
                .with_label_values(&[u.name.as_str(), reason]);
        }
        for plan in config
            .plans
            .names
            .iter()
            .map(String::as_str)
            .chain(["none"])
        {
            m.queue_waits.with_label_values(&[u.name.as_str(), plan]);
        }
    }
}

/// `tollgate_upstream_requests_total{route,pool}` of each route's pools (`Snapshot::
/// pool_requests`).
fn pool_requests(config: &Config, metrics: &Metrics) -> Vec<Box<[IntCounter]>> {
    config
        .routes
        .iter()
        .map(|r| {
            let pools = r.split.as_ref().map_or_else(
                || vec![r.upstream],
                |s| s.entries.iter().map(|e| e.pool).collect(),
            );
            pools
                .into_iter()
                .map(|p| {
                    let pool = config.upstreams.get(p).map_or("", |u| u.name.as_str());
                    metrics
                        .pool_requests
                        .with_label_values(&[r.id.as_str(), pool])
                })
                .collect()
        })
        .collect()
}
