//! The running configuration: one immutable snapshot (validated config plus the upstream pools
//! built from it) behind an atomic pointer. A request loads it once and keeps it to the end,
//! so a reload is a swap: in-flight requests finish under the old snapshot.

use crate::config::Config;
use crate::limits::fleet::FleetState;
use crate::limits::{Clock, CounterRegistry, Limiter};
use crate::metrics::Metrics;
use crate::upstream::Pool;
use arc_swap::ArcSwap;
use prometheus::{IntCounter, IntCounterVec};
use std::sync::{Arc, OnceLock};

pub struct Snapshot {
    pub config: Config,
    /// Indexed like `config.upstreams`.
    pub pools: Vec<Arc<Pool>>,
    /// The rate-limit rules, compiled; their counters live in the registry, not here.
    pub limiter: Limiter,
    /// `tollgate_requests_total` handles by route and status, resolved on first use.
    pub requests: RequestCounters,
}

/// Statuses 100 to 599 of one route.
type ByStatus = Box<[OnceLock<IntCounter>]>;

/// `tollgate_requests_total{route,status}` handles, looked up once per (route, status) instead
/// of hashing the labels on every request.
pub struct RequestCounters {
    vec: IntCounterVec,
    /// Indexed like `config.routes`, then one for requests no route matched.
    routes: Vec<(String, ByStatus)>,
}

impl RequestCounters {
    fn new(vec: &IntCounterVec, routes: impl Iterator<Item = String>) -> Self {
        let slots = || (100..600).map(|_| OnceLock::new()).collect::<ByStatus>();
        RequestCounters {
            vec: vec.clone(),
            routes: routes
                .chain(std::iter::once("none".to_string()))
                .map(|r| (r, slots()))
                .collect(),
        }
    }

    /// Count one request of `route` (None: no route matched) answered with `status`.
    pub fn inc(&self, route: Option<usize>, status: http::StatusCode) {
        let none = self.routes.len() - 1;
        let (name, slots) = &self.routes[route.unwrap_or(none).min(none)];
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
    pub fleet: Arc<FleetState>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
}

pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

impl Snapshot {
    /// Build the runtime parts (pools, limiter) of a validated config, and set the fleet's mode
    /// from its `redis` section. Start-up and reload both come through here.
    pub fn build(config: Config, rt: &Runtime) -> std::io::Result<Snapshot> {
        let pools = config
            .upstreams
            .iter()
            .map(|u| Pool::build(u).map(Arc::new))
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
            config.routes.iter().map(|r| r.id.clone()),
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
        Ok(Snapshot {
            config,
            pools,
            limiter,
            requests,
        })
    }
}
