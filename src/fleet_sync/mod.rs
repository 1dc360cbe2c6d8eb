//! The fleet sync: a background service that drains the counts each instance admitted since
//! the last round, sends them to Redis as atomic increments in one pipelined round trip, and
//! feeds the fleet totals back into the local counters. The request path never waits on it.
//!
//! Accuracy by design: between rounds, an instance admits at most its share of what the fleet
//! has left in a window, `ceil((threshold - fleet total) / live instances)` (see
//! `limits::algorithm::local_limit`). An instance that has used its share asks for a round at
//! once (at most 20 extra rounds a second), so a fleet stays within the threshold plus the
//! rounding of the shares (at most one request per instance and window) instead of Kong's
//! (N-1) x rate x interval.

pub mod backend;
pub mod state;

use crate::config::model::{Algorithm, RedisSettings};
use crate::limits::algorithm::TierState;
use crate::limits::clock::{Clock, NANOS_PER_MS};
use crate::limits::partition::{redis_key, redis_partition};
use crate::limits::store::{CounterRegistry, RuleCounters};
use crate::metrics::Metrics;
use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use backend::{Heartbeat, Increment, SyncBackend};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
pub use state::{FleetMode, FleetState};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds asked for early come at least this far apart (so at most 20 extra per second).
pub const MIN_ROUND_GAP: Duration = Duration::from_millis(50);
/// Keys live this long past the last moment they are needed.
pub const KEY_GRACE_MS: u64 = 10_000;
/// Longest wait between retries while Redis is failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

fn period_ms(tier: &crate::config::model::Tier) -> u64 {
    (tier.period.as_millis() as u64).max(1)
}

/// One drained count, remembered until Redis has answered for it.
struct Drained {
    counters: Arc<RuleCounters>,
    key: Box<[u8]>,
    list: u16,
    tier: usize,
    window_start_ms: u64,
    /// The count is for the window before the counter's current one.
    previous: bool,
    delta: u64,
}

pub struct SyncService {
    /// The running config: the `redis` section is read from it, so a reload that changes it
    /// reconnects (or stops syncing).
    pub shared: SharedSnapshot,
    pub registry: Arc<CounterRegistry>,
    pub fleet: Arc<FleetState>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub instance: String,
}

impl SyncService {
    /// Take every count not yet sent (and every counter that asked for a fresh total).
    fn drain(&self, settings: &RedisSettings) -> (Vec<Drained>, Vec<Increment>) {
        let mut drained = Vec::new();
        let mut incs = Vec::new();
        for rc in self.registry.live() {
            let algo = rc.algorithm();
            if algo == Algorithm::TokenBucket {
                continue; // enforced per instance (README: "Fleet sync")
            }
            let id = rc.identity.id.clone();
            let per = rc.identity.per.clone();
            let counters = Arc::clone(&rc);
            rc.for_each(|key, c| {
                let list = c.list;
                for (ti, st) in c.tiers.iter_mut().enumerate() {
                    let Some(tier) = counters.tiers(list).get(ti).copied() else {
                        continue;
                    };
                    let p = period_ms(&tier);
                    let keep = if algo == Algorithm::SlidingWindow {
                        p
                    } else {
                        0
                    };
                    let mut take = |start: u64, delta: u64, previous: bool| {
                        let partition = redis_partition(&per, key);
                        incs.push(Increment {
                            key: redis_key(&settings.key_prefix, &partition, &id, start, start + p),
                            delta,
                            expire_at_ms: start + p + keep + KEY_GRACE_MS,
                        });
                        drained.push(Drained {
                            counters: Arc::clone(&counters),
                            key: key.into(),
                            list,
                            tier: ti,
                            window_start_ms: start,
                            previous,
                            delta,
                        });
                    };
                    if st.prev_pending > 0 {
                        take(st.window_start_ms.saturating_sub(p), st.prev_pending, true);
                        st.prev_pending = 0;
                    }
                    if st.pending > 0 || st.refresh {
                        take(st.window_start_ms, st.pending, false);
                        st.pending = 0;
                        st.refresh = false;
                    }
                }
            });
        }
        (drained, incs)
    }

    /// Change the tier state a drained count came from, if its counter is still tracked with
    /// the same tier list; `f` gets the state and whether the count's window is the current one
    /// (`true`) or, having rolled since, the previous one (`false`). Other windows are gone.
    fn with_window(d: &Drained, f: impl FnOnce(&mut TierState, bool)) {
        d.counters.update(&d.key, |c| {
            if c.list != d.list {
                return;
            }
            let Some(p) = d.counters.tiers(c.list).get(d.tier).map(period_ms) else {
                return;
            };
            let st = &mut c.tiers[d.tier];
            if !d.previous && st.window_start_ms == d.window_start_ms {
                f(st, true);
            } else if st.window_start_ms == d.window_start_ms + p {
                f(st, false);
            }
        });
    }

    /// Feed the fleet totals back: the counter now sees the fleet, plus what it admitted since.
    fn apply(drained: &[Drained], totals: &[u64]) {
        for (d, &total) in drained.iter().zip(totals) {
            Self::with_window(d, |st, current| {
                if current {
                    st.base = total;
                    st.current = total + st.pending;
                } else {
                    st.previous = total + st.prev_pending;
                }
            });
        }
    }

    /// Redis did not answer: the counts go back to wait for the next round.
    fn restore(drained: &[Drained]) -> u64 {
        let mut kept = 0;
        for d in drained.iter().filter(|d| d.delta > 0) {
            Self::with_window(d, |st, current| {
                if current {
                    st.pending += d.delta;
                } else {
                    st.prev_pending += d.delta;
                }
                kept += d.delta;
            });
        }
        kept
    }

    /// One round; returns whether Redis answered.
    pub async fn round(&self, settings: &RedisSettings, backend: &dyn SyncBackend) -> bool {
        let (drained, incs) = self.drain(settings);
        let now_ms = self.clock.now_ns() / NANOS_PER_MS;
        let interval_ms = settings.sync_interval.as_millis() as u64;
        let hb = Heartbeat {
            key: format!("{}:instances", settings.key_prefix),
            instance: self.instance.clone(),
            now_ms,
            liveness_ms: (3 * interval_ms).max(3000),
        };
        let started = Instant::now();
        let outcome = tokio::time::timeout(settings.timeout, backend.exchange(&incs, &hb))
            .await
            .map_err(|_| format!("no answer within {:?}", settings.timeout))
            .and_then(|r| r);
        self.metrics
            .redis_sync_duration
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            Ok((totals, instances)) => {
                Self::apply(&drained, &totals);
                self.fleet.set_instances(instances);
                self.metrics.redis_sync.with_label_values(&["ok"]).inc();
                self.metrics.redis_pending.set(0);
                self.metrics.redis_instances.set(instances as i64);
                if self.fleet.set_connected(true) {
                    log::info!("redis: connected; {instances} instance(s) share the limits");
                }
                true
            }
            Err(e) => {
                let kept = Self::restore(&drained);
                self.metrics.redis_sync.with_label_values(&["error"]).inc();
                self.metrics.redis_pending.set(kept as i64);
                if self.fleet.set_connected(false) {
                    // the error text stays in the log; clients never see it
                    log::warn!("redis: sync failed ({e}); counting locally, on_failure applies");
                }
                false
            }
        }
    }
}

#[async_trait]
impl BackgroundService for SyncService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut current: Option<(RedisSettings, Box<dyn SyncBackend>)> = None;
        let mut backoff = Duration::from_secs(1);
        let mut next = tokio::time::Instant::now();
        let mut last = tokio::time::Instant::now() - MIN_ROUND_GAP;
        loop {
            // follow the running config's `redis` section
            let want = self.shared.load().config.redis.clone();
            if want.as_ref() != current.as_ref().map(|(s, _)| s) {
                current = want.and_then(|s| match backend::make(&s) {
                    Ok(b) => Some((s, b)),
                    Err(e) => {
                        log::error!("redis: cannot set up the sync ({e}); counting locally");
                        None
                    }
                });
                self.registry.set_syncing(current.is_some());
                next = tokio::time::Instant::now();
            }
            let interval = current
                .as_ref()
                .map_or(Duration::from_secs(1), |(s, _)| s.sync_interval);
            let healthy = current.is_some() && self.fleet.is_connected();
            tokio::select! {
                _ = shutdown.changed() => {
                    // last chance for the counts of this instance to reach the fleet
                    if let Some((s, b)) = &current {
                        let _ = self.round(s, b.as_ref()).await;
                    }
                    return;
                }
                _ = tokio::time::sleep_until(next) => {}
                // an instance out of its share asks for a round now (not while backing off)
                _ = self.fleet.wake.notified(), if healthy => {
                    let earliest = last + MIN_ROUND_GAP;
                    if tokio::time::Instant::now() < earliest {
                        tokio::time::sleep_until(earliest).await;
                    }
                }
            }
            last = tokio::time::Instant::now();
            let Some((settings, backend)) = &current else {
                next = last + interval;
                continue;
            };
            if self.round(settings, backend.as_ref()).await {
                backoff = interval;
                next = last + interval;
            } else {
                next = last + backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF.max(interval));
            }
        }
    }
}
