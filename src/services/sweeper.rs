//! Background service dropping counters that no window needs any more, and refreshing the
//! tracked-counter gauge.

use crate::ticker::Ticker;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::IntGauge;
use std::sync::Arc;
use std::time::Duration;
use tollgate_limits::clock::{Clock, NANOS_PER_MS};
use tollgate_limits::store::CounterRegistry;

pub struct Sweeper {
    pub registry: Arc<CounterRegistry>,
    pub clock: Arc<dyn Clock>,
    pub tracked: IntGauge,
}

/// How often the sketches of untracked partitions forget (in sweeps).
const SKETCH_RESET_SWEEPS: u64 = 60;

impl Sweeper {
    pub fn sweep_once(&self, round: u64) {
        let now_ms = self.clock.now_ns() / NANOS_PER_MS;
        let mut total = 0;
        for rc in self.registry.live() {
            total += rc.sweep(now_ms);
            if round % SKETCH_RESET_SWEEPS == SKETCH_RESET_SWEEPS - 1 {
                rc.reset_sketch();
            }
        }
        self.tracked.set(total as i64);
    }
}

#[async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = Ticker::every(Duration::from_secs(1));
        let mut round = 0u64;
        while ticker.tick(&mut shutdown).await {
            self.sweep_once(round);
            round += 1;
        }
    }
}
