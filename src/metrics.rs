//! Prometheus metrics, served by the admin listener. No label carries a tenant, a key or a
//! client address: label values come from the config (route and rule ids) or small fixed sets.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// `tollgate_requests_total{route,status}`; route is `none` when no route matched.
    pub requests: IntCounterVec,
    /// `tollgate_request_duration_seconds{route}`: from the request's headers read to the end
    /// of its answer.
    pub request_duration: HistogramVec,
    /// `tollgate_ratelimit_decision_duration_seconds`: the limiter's decision for one request
    /// (a held request's wait not included).
    pub decision_duration: Histogram,
    /// `tollgate_config_reloads_total{result}`
    pub reloads: IntCounterVec,
    /// `tollgate_ratelimit_decisions_total{rule,decision,tier}`
    pub decisions: IntCounterVec,
    /// `tollgate_tracked_counters`
    pub tracked_counters: IntGauge,
    /// `tollgate_ratelimit_evictions_total`
    pub evictions: IntCounter,
    /// `tollgate_ratelimit_untracked_total`
    pub untracked: IntCounter,
    /// `tollgate_redis_sync_total{result}`
    pub redis_sync: IntCounterVec,
    /// `tollgate_redis_sync_duration_seconds`
    pub redis_sync_duration: Histogram,
    /// `tollgate_redis_pending_deltas`
    pub redis_pending: IntGauge,
    /// `tollgate_fleet_held_total`
    pub fleet_held: IntCounter,
    /// `tollgate_redis_live_instances`
    pub redis_instances: IntGauge,
    /// `tollgate_redis_cluster_slots_down`: Redis Cluster slots whose node did not answer.
    pub redis_slots_down: IntGauge,
    /// `tollgate_redis_cluster_slot_rounds_total{result}`: slots' pipelines sent.
    pub redis_slot_rounds: IntCounterVec,
    /// `tollgate_redis_connected`: 1 while the last round reached Redis.
    pub redis_connected: IntGauge,
    /// `tollgate_upstream_server_healthy{pool,server}`: 1 healthy, 0 down or skipped.
    pub upstream_healthy: IntGaugeVec,
    /// `tollgate_pool_queue_depth{pool}`: requests waiting for a full pool (refreshed every
    /// second).
    pub queue_depth: IntGaugeVec,
    /// `tollgate_pool_queue_waits_total{pool,plan}`: requests that waited and got in.
    pub queue_waits: IntCounterVec,
    /// `tollgate_pool_queue_refused_total{pool,reason}`: 503s of a full queue or a timeout.
    pub queue_refused: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "tollgate_requests_total",
                "Requests answered, by route and status",
            ),
            &["route", "status"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "tollgate_request_duration_seconds",
                "Time from a request's headers read to the end of its answer, by route (none: no route matched)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ]),
            &["route"],
        )?;
        let decision_duration = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_ratelimit_decision_duration_seconds",
                "Time the limiter takes to decide one request (every applying rule and tier; a held request's wait not included)",
            )
            .buckets(vec![
                0.000_001, 0.000_002_5, 0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1,
                0.000_25, 0.001,
            ]),
        )?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "tollgate_config_reloads_total",
                "Config reloads, by result (ok, error)",
            ),
            &["result"],
        )?;
        let decisions = IntCounterVec::new(
            Opts::new(
                "tollgate_ratelimit_decisions_total",
                "Rate-limit decisions, by rule, decision (allowed, denied, shadow_denied, delayed, unavailable: refused under on_failure: deny) and tier (the period of the first tier exceeded; all: admitted, none: unavailable)",
            ),
            &["rule", "decision", "tier"],
        )?;
        let tracked_counters = IntGauge::new(
            "tollgate_tracked_counters",
            "Rate-limit counters held in memory (refreshed every second)",
        )?;
        let evictions = IntCounter::new(
            "tollgate_ratelimit_evictions_total",
            "Counters dropped to admit a new partition while at max_counters_per_rule",
        )?;
        let untracked = IntCounter::new(
            "tollgate_ratelimit_untracked_total",
            "Decisions made on the sketch estimate because the counter cap was reached",
        )?;
        let redis_sync = IntCounterVec::new(
            Opts::new(
                "tollgate_redis_sync_total",
                "Redis sync rounds, by result (ok, error)",
            ),
            &["result"],
        )?;
        let redis_sync_duration = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_redis_sync_duration_seconds",
                "Duration of a Redis sync round (one pipelined round trip)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ]),
        )?;
        let redis_pending = IntGauge::new(
            "tollgate_redis_pending_deltas",
            "Requests counted here that Redis has not confirmed yet, after the last round (per counter, the most any of its tiers waits for)",
        )?;
        let fleet_held = IntCounter::new(
            "tollgate_fleet_held_total",
            "Requests under their limits that waited for a sync round because this instance's lease of the fleet's quota was used (admitted or refused after)",
        )?;
        let redis_instances = IntGauge::new(
            "tollgate_redis_live_instances",
            "Gateway instances sharing the limits, as last seen in Redis",
        )?;
        let redis_connected = IntGauge::new(
            "tollgate_redis_connected",
            "1 while the last sync round reached Redis, 0 otherwise (also without a redis section)",
        )?;
        let upstream_healthy = IntGaugeVec::new(
            Opts::new(
                "tollgate_upstream_server_healthy",
                "Each upstream server: 1 healthy, 0 down (health check) or skipped after a failed connection (refreshed every second)",
            ),
            &["pool", "server"],
        )?;
        let redis_slots_down = IntGauge::new(
            "tollgate_redis_cluster_slots_down",
            "Redis Cluster slots whose node did not answer the last round that went to them (their keys wait; on_failure applies to them)",
        )?;
        let redis_slot_rounds = IntCounterVec::new(
            Opts::new(
                "tollgate_redis_cluster_slot_rounds_total",
                "Pipelines sent to Redis Cluster slots (one per slot a round goes to), by result (ok, error: no answer within the timeout, refused, moved or not connected)",
            ),
            &["result"],
        )?;
        registry.register(Box::new(redis_slots_down.clone()))?;
        registry.register(Box::new(redis_slot_rounds.clone()))?;
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "tollgate_pool_queue_depth",
                "Requests waiting in a full pool's queue (max_in_flight), by pool (refreshed every second)",
            ),
            &["pool"],
        )?;
        let queue_waits = IntCounterVec::new(
            Opts::new(
                "tollgate_pool_queue_waits_total",
                "Requests that waited in a pool's queue and got in, by pool and plan (none: no plan)",
            ),
            &["pool", "plan"],
        )?;
        let queue_refused = IntCounterVec::new(
            Opts::new(
                "tollgate_pool_queue_refused_total",
                "Requests refused by a full pool with 503, by pool and reason (full: the queue was full; timeout: waited queue.timeout)",
            ),
            &["pool", "reason"],
        )?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(queue_waits.clone()))?;
        registry.register(Box::new(queue_refused.clone()))?;
        // series with a fixed set of labels exist from the start (at 0), so that dashboards
        // and alerts see them before the first reload or round
        for result in ["ok", "error"] {
            reloads.with_label_values(&[result]);
            redis_sync.with_label_values(&[result]);
        }
        registry.register(Box::new(redis_connected.clone()))?;
        registry.register(Box::new(upstream_healthy.clone()))?;
        registry.register(Box::new(redis_sync.clone()))?;
        registry.register(Box::new(redis_sync_duration.clone()))?;
        registry.register(Box::new(redis_pending.clone()))?;
        registry.register(Box::new(fleet_held.clone()))?;
        registry.register(Box::new(redis_instances.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(decision_duration.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(tracked_counters.clone()))?;
        registry.register(Box::new(evictions.clone()))?;
        registry.register(Box::new(untracked.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            request_duration,
            decision_duration,
            reloads,
            decisions,
            tracked_counters,
            evictions,
            untracked,
            redis_sync,
            redis_sync_duration,
            redis_pending,
            fleet_held,
            redis_instances,
            redis_connected,
            upstream_healthy,
            queue_depth,
            queue_waits,
            queue_refused,
            redis_slots_down,
            redis_slot_rounds,
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}
