//! The running configuration: one immutable snapshot (validated config plus the upstream pools
//! built from it) behind an atomic pointer. A request loads it once and keeps it to the end,
//! so a reload is a swap: in-flight requests finish under the old snapshot.

use crate::config::Config;
use crate::limits::fleet::FleetState;
use crate::limits::{Clock, CounterRegistry, Limiter};
use crate::metrics::Metrics;
use crate::upstream::Pool;
use arc_swap::ArcSwap;
use std::sync::Arc;

pub struct Snapshot {
    pub config: Config,
    /// Indexed like `config.upstreams`.
    pub pools: Vec<Arc<Pool>>,
    /// The rate-limit rules, compiled; their counters live in the registry, not here.
    pub limiter: Limiter,
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
    /// Build the runtime parts (pools, limiter) of a validated config.
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
        Ok(Snapshot {
            config,
            pools,
            limiter,
        })
    }
}
