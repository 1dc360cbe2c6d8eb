//! The loop of the periodic background services (health checks, counter sweeper, reloader):
//! a tick every `period` (missed ticks skipped) until the server shuts down.

use pingora::server::ShutdownWatch;
use std::time::Duration;
use tokio::time::{interval, Interval, MissedTickBehavior};

pub struct Ticker {
    interval: Interval,
}

impl Ticker {
    pub fn every(period: Duration) -> Self {
        let mut interval = interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        Ticker { interval }
    }

    /// Wait for the next tick; `false` once the server is shutting down.
    pub async fn tick(&mut self, shutdown: &mut ShutdownWatch) -> bool {
        tokio::select! {
            _ = shutdown.changed() => false,
            _ = self.interval.tick() => true,
        }
    }
}
