//! The running configuration: one immutable snapshot (validated config plus the upstream pools
//! built from it) behind an atomic pointer. A request loads it once and keeps it to the end,
//! so a reload is a swap: in-flight requests finish under the old snapshot.

use crate::config::Config;
use crate::upstream::Pool;
use arc_swap::ArcSwap;
use std::sync::Arc;

pub struct Snapshot {
    pub config: Config,
    /// Indexed like `config.upstreams`.
    pub pools: Vec<Arc<Pool>>,
}

pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

impl Snapshot {
    /// Build the runtime parts (pools) of a validated config.
    pub fn build(config: Config) -> std::io::Result<Snapshot> {
        let pools = config
            .upstreams
            .iter()
            .map(|u| Pool::build(u).map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Snapshot { config, pools })
    }
}
