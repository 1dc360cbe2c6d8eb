//! Prometheus metrics, served by the admin listener. No label carries a tenant, a key or a
//! client address: label values come from the config (route and rule ids) or small fixed sets.

use crate::tokens::Refusal;
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
    /// `tollgate_redis_errors_total{kind}`: error replies to sync rounds.
    pub redis_errors: IntCounterVec,
    /// `tollgate_redis_sync_duration_seconds`
    pub redis_sync_duration: Histogram,
    /// `tollgate_redis_pending_deltas`
    pub redis_pending: IntGauge,
    /// `tollgate_fleet_held_total`
    pub fleet_held: IntCounter,
    /// `tollgate_fleet_hold_seconds`: how long each held request waited for the fleet
    pub fleet_hold: Histogram,
    /// `tollgate_fleet_waits_heard_total`: parts reported for the others' waiting requests
    pub fleet_waits_heard: IntCounter,
    /// `tollgate_trace_spans_dropped_total`
    pub trace_spans_dropped: IntCounter,
    /// `tollgate_queue_waited_total`, `tollgate_queue_left_total`
    pub queue_waited: IntCounter,
    pub queue_left: IntCounter,
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
    /// `tollgate_upstream_dns_lookups_total{pool,result}`: lookups of the servers a pool gives
    /// by name, made while it runs.
    pub upstream_dns_lookups: IntCounterVec,
    /// `tollgate_pool_queue_depth{pool}`: requests waiting for a full pool (refreshed every
    /// second).
    pub queue_depth: IntGaugeVec,
    /// `tollgate_pool_queue_waits_total{pool,plan}`: requests that waited and got in.
    pub queue_waits: IntCounterVec,
    /// `tollgate_pool_queue_refused_total{pool,reason}`: 503s of a full queue or a timeout.
    pub queue_refused: IntCounterVec,
    /// `tollgate_upstream_requests_total{route,pool}`: requests sent to each pool of a route
    /// (a split's shares; retries not counted again).
    pub pool_requests: IntCounterVec,
    /// `tollgate_client_errors_total{kind}`: what clients did wrong, counted instead of logged
    /// one line each ([`ClientError`]).
    pub client_errors: IntCounterVec,
    /// Its series, one per [`ClientError`] (in `ClientError::ALL` order), resolved once: a flood
    /// of client errors costs an atomic add each, not a label lookup.
    client_error_series: Vec<IntCounter>,
    /// `tollgate_jwks_fetches_total{issuer,result}`: fetches of the issuers' JWKS.
    pub jwks_fetches: IntCounterVec,
    /// `tollgate_usage_archive_total{result}`: ended windows this instance archived
    /// (`copied`), found archived by another (`elsewhere`), or failed to (`error`).
    pub usage_archive: IntCounterVec,
    /// `tollgate_tokens_refused_total{reason}`: bearer tokens refused (401), by why.
    pub tokens_refused: IntCounterVec,
    /// Its series, one per [`Refusal`] (in `Refusal::ALL` order), resolved once.
    token_refusal_series: Vec<IntCounter>,
    /// `tollgate_grpc_requests_total{route,grpc_status}`: gRPC calls by the status they ended
    /// with (`CANCELLED` when the client left first).
    pub grpc_requests: IntCounterVec,
    /// `tollgate_connections{listener}`: client connections open now.
    pub connections: IntGaugeVec,
    /// `tollgate_connections_refused_total{listener,reason}`: connections closed at once
    /// (`listener_full`, `per_ip`).
    pub connections_refused: IntCounterVec,
}

/// The kinds of `tollgate_client_errors_total`: a small fixed set, never a client's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// An HTTP/2 stream reset by the client before its answer was complete.
    Reset,
    /// A connection closed by the client, or a read or write on it that failed, mid-request.
    Closed,
    /// A client too slow: no request header, TLS handshake or HTTP/2 preface in time, or a write
    /// to it that made no progress for `send_timeout`.
    Timeout,
    /// A request or HTTP/2 frame that breaks the protocol.
    Protocol,
    /// HTTP/2 streams refused past the connection's `max_streams_per_second`.
    Refused,
    /// HTTP/2 connections closed with GOAWAY for too many premature resets.
    Goaway,
}

impl ClientError {
    pub const ALL: [ClientError; 6] = [
        ClientError::Reset,
        ClientError::Closed,
        ClientError::Timeout,
        ClientError::Protocol,
        ClientError::Refused,
        ClientError::Goaway,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ClientError::Reset => "reset",
            ClientError::Closed => "closed",
            ClientError::Timeout => "timeout",
            ClientError::Protocol => "protocol",
            ClientError::Refused => "refused",
            ClientError::Goaway => "goaway",
        }
    }
}

/// The `kind` labels of `tollgate_redis_errors_total`, a bounded set.
pub const REDIS_ERROR_KINDS: [&str; 6] = [
    "noperm",
    "oom",
    "readonly",
    "wrongtype",
    "noscript",
    "other",
];

fn reg_counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    registered(r, IntCounter::new(name, help))
}

fn reg_gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    registered(r, IntGauge::new(name, help))
}

/// Make a metric and register it.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: Result<M, prometheus::Error>,
) -> Result<M, prometheus::Error> {
    let m = metric?;
    registry.register(Box::new(m.clone()))?;
    Ok(m)
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> prometheus::Result<Histogram> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let r = Registry::new();
        let mut m = Metrics {
            requests: registered(
                &r,
                counter_vec(
                    "tollgate_requests_total",
                    "Requests answered, by route and status",
                    &["route", "status"],
                ),
            )?,
            request_duration: registered(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "tollgate_request_duration_seconds",
                        "Time from a request's headers read to the end of its answer, by route (none: no route matched)",
                    )
                    .buckets(vec![
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0,
                    ]),
                    &["route"],
                ),
            )?,
            decision_duration: registered(
                &r,
                histogram(
                    "tollgate_ratelimit_decision_duration_seconds",
                    "Time the limiter takes to decide one request (every applying rule and tier; a held request's wait not included)",
                    &[
                        0.000_001, 0.000_002_5, 0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1,
                        0.000_25, 0.001,
                    ],
                ),
            )?,
            reloads: registered(
                &r,
                counter_vec(
                    "tollgate_config_reloads_total",
                    "Config reloads, by result (ok, error)",
                    &["result"],
                ),
            )?,
            decisions: registered(
                &r,
                counter_vec(
                    "tollgate_ratelimit_decisions_total",
                    "Rate-limit decisions, by rule, decision (allowed, denied, shadow_denied, delayed, unavailable: refused under on_failure: deny) and tier (the period of the first tier exceeded; all: admitted, none: unavailable)",
                    &["rule", "decision", "tier"],
                ),
            )?,
            tracked_counters: reg_gauge(
                &r,
                "tollgate_tracked_counters",
                "Rate-limit counters held in memory (refreshed every second)",
            )?,
            evictions: reg_counter(
                &r,
                "tollgate_ratelimit_evictions_total",
                "Counters dropped to admit a new partition while at max_counters_per_rule",
            )?,
            untracked: reg_counter(
                &r,
                "tollgate_ratelimit_untracked_total",
                "Decisions made on the sketch estimate because the counter cap was reached",
            )?,
            redis_sync: registered(
                &r,
                counter_vec(
                    "tollgate_redis_sync_total",
                    "Redis sync rounds, by result (ok, error)",
                    &["result"],
                ),
            )?,
            redis_errors: registered(
                &r,
                counter_vec(
                    "tollgate_redis_errors_total",
                    "Error replies to sync rounds' commands, by kind (noperm, oom, readonly, wrongtype, noscript, other); their counters fall back to on_failure",
                    &["kind"],
                ),
            )?,
            redis_sync_duration: registered(
                &r,
                histogram(
                    "tollgate_redis_sync_duration_seconds",
                    "Duration of a Redis sync round (one pipelined round trip)",
                    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
                ),
            )?,
            redis_pending: reg_gauge(
                &r,
                "tollgate_redis_pending_deltas",
                "Requests counted here that Redis has not confirmed yet, after the last periodic or failed round (per counter, the most any of its tiers waits for)",
            )?,
            fleet_held: reg_counter(
                &r,
                "tollgate_fleet_held_total",
                "Requests under their limits that waited for a sync round because this instance's lease of the fleet's quota was used (admitted or refused after)",
            )?,
            fleet_hold: registered(
                &r,
                histogram(
                    "tollgate_fleet_hold_seconds",
                    "How long a request held for the fleet waited, from its first hold to its final decision (one observation per tollgate_fleet_held_total)",
                    &[
                        0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    ],
                ),
            )?,
            fleet_waits_heard: reg_counter(
                &r,
                "tollgate_fleet_waits_heard_total",
                "Parts of filling fixed windows this instance reported at once because another instance's requests waited on the window (the fleet's waiting marks), so that Redis could re-split them",
            )?,
            trace_spans_dropped: reg_counter(
                &r,
                "tollgate_trace_spans_dropped_total",
                "Spans dropped because 2,048 already waited for export (a collector down or slow); requests are never held for spans",
            )?,
            queue_waited: reg_counter(
                &r,
                "tollgate_queue_waited_total",
                "Requests that waited for their turn in a leaky bucket before going on",
            )?,
            queue_left: reg_counter(
                &r,
                "tollgate_queue_left_total",
                "Requests whose client went away while they waited for their turn in a leaky bucket (their turn went back)",
            )?,
            redis_instances: reg_gauge(
                &r,
                "tollgate_redis_live_instances",
                "Gateway instances sharing the limits, as last seen in Redis",
            )?,
            redis_connected: reg_gauge(
                &r,
                "tollgate_redis_connected",
                "1 while the last sync round reached Redis, 0 otherwise (also without a redis section)",
            )?,
            upstream_healthy: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "tollgate_upstream_server_healthy",
                        "Each upstream server: 1 healthy, 0 down (health check) or skipped after a failed connection (refreshed every second)",
                    ),
                    &["pool", "server"],
                ),
            )?,
            upstream_dns_lookups: registered(
                &r,
                counter_vec(
                    "tollgate_upstream_dns_lookups_total",
                    "Lookups of the upstream servers a pool gives by name, made when their answer runs out, by pool and result (ok; error: no address or no answer, the last addresses stay)",
                    &["pool", "result"],
                ),
            )?,
            queue_depth: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "tollgate_pool_queue_depth",
                        "Requests waiting in a full pool's queue (max_in_flight), by pool (refreshed every second)",
                    ),
                    &["pool"],
                ),
            )?,
            queue_waits: registered(
                &r,
                counter_vec(
                    "tollgate_pool_queue_waits_total",
                    "Requests that waited in a pool's queue and got in, by pool and plan (none: no plan)",
                    &["pool", "plan"],
                ),
            )?,
            queue_refused: registered(
                &r,
                counter_vec(
                    "tollgate_pool_queue_refused_total",
                    "Requests refused by a full pool with 503, by pool and reason (full: the queue was full; timeout: waited queue.timeout)",
                    &["pool", "reason"],
                ),
            )?,
            pool_requests: registered(
                &r,
                counter_vec(
                    "tollgate_upstream_requests_total",
                    "Requests sent to a pool, by route and pool (with a route's upstreams: how the split went); a retry is not counted again",
                    &["route", "pool"],
                ),
            )?,
            redis_slots_down: reg_gauge(
                &r,
                "tollgate_redis_cluster_slots_down",
                "Redis Cluster slots whose node did not answer the last round that went to them (their keys wait; on_failure applies to them)",
            )?,
            redis_slot_rounds: registered(
                &r,
                counter_vec(
                    "tollgate_redis_cluster_slot_rounds_total",
                    "Pipelines sent to Redis Cluster slots (one per slot a round goes to), by result (ok, error: no answer within the timeout, refused, moved or not connected)",
                    &["result"],
                ),
            )?,
            client_errors: registered(
                &r,
                counter_vec(
                    "tollgate_client_errors_total",
                    "What clients did wrong, by kind (reset: an HTTP/2 stream reset before its answer; closed: gone mid-request; timeout: too slow to send or to read; protocol: a malformed request or frame; refused: HTTP/2 streams past max_streams_per_second; goaway: connections closed for too many premature resets)",
                    &["kind"],
                ),
            )?,
            jwks_fetches: registered(
                &r,
                counter_vec(
                    "tollgate_jwks_fetches_total",
                    "Fetches of a jwt issuer's JWKS (jwks_uri), by issuer and result (ok, error: the keys held are kept)",
                    &["issuer", "result"],
                ),
            )?,
            usage_archive: registered(
                &r,
                counter_vec(
                    "tollgate_usage_archive_total",
                    "Ended long windows handled by the usage archive, by result (copied: by this instance; elsewhere: another instance copied it; error: not copied, logged)",
                    &["result"],
                ),
            )?,
            tokens_refused: registered(
                &r,
                counter_vec(
                    "tollgate_tokens_refused_total",
                    "Bearer tokens refused with 401, by reason (malformed, json, algorithm, issuer, key, signature, expired, not_yet_valid, audience, claims)",
                    &["reason"],
                ),
            )?,
            token_refusal_series: Vec::new(),
            grpc_requests: registered(
                &r,
                counter_vec(
                    "tollgate_grpc_requests_total",
                    "gRPC calls (content-type application/grpc) by route and the gRPC status they ended with (the upstream's, or that of the answer the gateway made; CANCELLED: the client left first)",
                    &["route", "grpc_status"],
                ),
            )?,
            connections: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "tollgate_connections",
                        "Client connections open now, by listener",
                    ),
                    &["listener"],
                ),
            )?,
            connections_refused: registered(
                &r,
                counter_vec(
                    "tollgate_connections_refused_total",
                    "Client connections closed as soon as accepted, by listener and reason (listener_full: max_connections reached; per_ip: max_connections_per_ip reached)",
                    &["listener", "reason"],
                ),
            )?,
            client_error_series: Vec::new(),
            registry: r,
        };
        m.client_error_series = ClientError::ALL
            .iter()
            .map(|k| m.client_errors.with_label_values(&[k.label()]))
            .collect();
        m.token_refusal_series = Refusal::ALL
            .iter()
            .map(|r| m.tokens_refused.with_label_values(&[r.code()]))
            .collect();
        // series with a fixed set of labels exist from the start (at 0), so that dashboards
        // and alerts see them before the first reload or round
        for result in ["ok", "error"] {
            m.reloads.with_label_values(&[result]);
            m.redis_sync.with_label_values(&[result]);
        }
        for kind in REDIS_ERROR_KINDS {
            m.redis_errors.with_label_values(&[kind]);
        }
        Ok(m)
    }

    /// Count what a client did wrong.
    pub fn client_error(&self, kind: ClientError) {
        if let Some(c) = self.client_error_series.get(kind as usize) {
            c.inc();
        }
    }

    /// Count a refused bearer token.
    pub fn token_refused(&self, why: Refusal) {
        if let Some(c) = self.token_refusal_series.get(why.index()) {
            c.inc();
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_error_counts_in_its_own_series() {
        let m = Metrics::new().expect("metrics");
        for (i, kind) in ClientError::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "ALL is in declaration order");
            m.client_error(*kind);
            m.client_error(*kind);
            assert_eq!(m.client_errors.with_label_values(&[kind.label()]).get(), 2);
        }
    }
}
