//! The operator's view on the admin listener: `GET /api/status` (listeners, pools and their
//! servers' health, routes, rules, decisions per second per rule over the last minute, Redis,
//! the last reload) and `GET /api/tenants/<tenant>` (every per-tenant rule's tiers for one
//! tenant, read from the counters without creating any). Tenant ids appear here and nowhere
//! in metrics.

use crate::config::Config;
use crate::limits::fleet::{Fleet, Link};
use crate::metrics::Metrics;
use crate::services::reload::ReloadStatus;
use crate::snapshot::SharedSnapshot;
use crate::snapshot::Snapshot;
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every rule's decision counters at one moment: allowed, denied, shadow_denied, delayed.
type Sample = (Instant, HashMap<String, [u64; 4]>);

/// Samples of every rule's decision counters, one a tick of the `OpsSampler` (a second) for
/// the last minute.
#[derive(Default)]
pub struct DecisionRates {
    samples: Mutex<VecDeque<Sample>>,
}

const RATE_WINDOW: Duration = Duration::from_secs(60);

impl DecisionRates {
    fn sample(&self, shared: &SharedSnapshot) {
        let snap = shared.load();
        let counts = snap
            .limiter
            .rules
            .iter()
            .map(|r| {
                let m = &r.metrics;
                (
                    r.rule.id.clone(),
                    [
                        m.allowed.get(),
                        m.denied.total(),
                        m.shadow_denied.total(),
                        m.delayed.get(),
                    ],
                )
            })
            .collect();
        let now = Instant::now();
        let mut s = self.samples.lock();
        s.push_back((now, counts));
        while s
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            s.pop_front();
        }
    }

    /// Per rule: decisions per second over the samples kept (allowed, denied, shadow_denied,
    /// delayed).
    fn rates(&self) -> HashMap<String, [f64; 4]> {
        let s = self.samples.lock();
        let (Some((t0, first)), Some((t1, last))) = (s.front(), s.back()) else {
            return HashMap::new();
        };
        let secs = t1.duration_since(*t0).as_secs_f64();
        last.iter()
            .map(|(rule, now)| {
                let before = first.get(rule).copied().unwrap_or([0; 4]);
                let mut r = [0.0; 4];
                for i in 0..4 {
                    r[i] = if secs > 0.0 {
                        now[i].saturating_sub(before[i]) as f64 / secs
                    } else {
                        0.0
                    };
                }
                (rule.clone(), r)
            })
            .collect()
    }
}

/// Every `interval` (a second, see `sample_interval`): a sample of the decision counters (for
/// the rates of `/api/status`), and the gauges that describe the present: each upstream
/// server's health and each shaped pool's queue (the running config's only: a server or pool
/// removed by a reload leaves no series), and the Redis link.
pub struct OpsSampler {
    pub shared: SharedSnapshot,
    pub rates: Arc<DecisionRates>,
    pub metrics: Arc<Metrics>,
    pub fleet: Arc<Fleet>,
    pub interval: Duration,
}

/// The sampler's interval when nothing else is asked for.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest interval `TOLLGATE_SAMPLE_INTERVAL_MS` may ask for.
pub const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(10);

/// The `OpsSampler`'s interval, read once at start-up: `SAMPLE_INTERVAL` (1 s), unless the
/// environment variable `TOLLGATE_SAMPLE_INTERVAL_MS` gives another in milliseconds, clamped to
/// at least `MIN_SAMPLE_INTERVAL` (10 ms). A knob for tests, which wait for a sample rather
/// than for whole seconds; not part of the configuration, and an unreadable value is ignored.
pub fn sample_interval(env: Option<&str>) -> Duration {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(SAMPLE_INTERVAL, |ms| {
            Duration::from_millis(ms).max(MIN_SAMPLE_INTERVAL)
        })
}

#[async_trait]
impl BackgroundService for OpsSampler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = crate::ticker::Ticker::every(self.interval);
        let (mut servers_seen, mut pools_seen) = (Vec::new(), Vec::new());
        while ticker.tick(&mut shutdown).await {
            self.rates.sample(&self.shared);
            let snap = self.shared.load();
            let mut health = Vec::new();
            for (spec, pool) in snap.config.upstreams.iter().zip(&snap.pools) {
                for (addr, healthy, skipped) in pool.servers() {
                    let up = i64::from(healthy && !skipped);
                    health.push((vec![spec.name.clone(), addr.to_string()], up));
                }
            }
            set_series(&self.metrics.upstream_healthy, health, &mut servers_seen);
            let depth = snap
                .config
                .upstreams
                .iter()
                .zip(&snap.gates)
                .filter_map(|(spec, gate)| {
                    Some((vec![spec.name.clone()], gate.as_ref()?.depth() as i64))
                })
                .collect();
            set_series(&self.metrics.queue_depth, depth, &mut pools_seen);
            let connected = redis_state(&self.fleet) == "connected";
            self.metrics.redis_connected.set(i64::from(connected));
        }
    }
}

/// Set a gauge's series to `now`, then remove those of the last sample that are gone, so that a
/// scrape never finds a series missing in between (as a `reset` followed by the new values
/// would show it).
fn set_series(
    gauge: &prometheus::IntGaugeVec,
    now: Vec<(Vec<String>, i64)>,
    last: &mut Vec<Vec<String>>,
) {
    fn refs(l: &[String]) -> Vec<&str> {
        l.iter().map(String::as_str).collect()
    }
    for (labels, v) in &now {
        gauge.with_label_values(&refs(labels)).set(*v);
    }
    for gone in last.iter().filter(|l| !now.iter().any(|(n, _)| n == *l)) {
        let _ = gauge.remove_label_values(&refs(gone));
    }
    *last = now.into_iter().map(|(l, _)| l).collect();
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `not_configured`, `connecting`, `connected`, `disconnected`, or `error`: Redis answers,
/// with error replies to some commands (see `redis_error`).
pub fn redis_state(fleet: &Fleet) -> &'static str {
    match (fleet.is_configured(), fleet.link()) {
        (false, _) => "not_configured",
        (true, Link::Up) if fleet.reply_error().is_some() => "error",
        (true, Link::Up) => "connected",
        (true, Link::Down) => "disconnected",
        (true, Link::Unknown) => "connecting",
    }
}

/// The error replies Redis answers with (`null` when none): `{"kind", "message"}`.
pub fn redis_error(fleet: &Fleet) -> Value {
    match fleet.reply_error().filter(|_| fleet.link() == Link::Up) {
        Some(e) => json!({ "kind": e.kind, "message": e.message }),
        None => Value::Null,
    }
}

/// The pools of `/api/status`: each one's servers, health and shaping.
fn pools_status(snap: &Snapshot) -> Vec<Value> {
    let cfg = &snap.config;
    cfg
        .upstreams
        .iter()
        .zip(&snap.pools)
        .enumerate()
        .map(|(i, (spec, pool))| {
            let servers: Vec<Value> = pool
                .servers()
                .into_iter()
                .map(|(addr, healthy, skipped)| {
                    json!({ "addr": addr.to_string(), "healthy": healthy, "skipped_after_failure": skipped })
                })
                .collect();
            let gate = snap.gates.get(i).and_then(Option::as_ref);
            let shaping = spec.shaping.zip(gate).map(|(sh, g)| {
                json!({
                    "max_in_flight": sh.max_in_flight,
                    "in_flight": g.active(),
                    "queue_max": sh.queue_max,
                    "queue_depth": g.depth(),
                    "queue_timeout_ms": sh.queue_timeout.as_millis() as u64,
                })
            });
            json!({
                "name": spec.name,
                "balance": spec.balance.to_string(),
                "health_check": spec.health_check.is_some(),
                "tls": spec.tls.is_some(),
                "servers": servers,
                "shaping": shaping,
            })
        })
        .collect()
}

/// The rules of `/api/status`: what each matches and counts, and its decisions per second.
fn rules_status(snap: &Snapshot, rates: &DecisionRates) -> Vec<Value> {
    let cfg = &snap.config;
    let per_second = rates.rates();
    cfg.rules
        .iter()
        .map(|r| {
            use crate::config::summary::{action_text, charge_text, exempt_text, tiers_text};
            // each tier as -t names it (a calendar window with its zone), and each plan's own
            let tiers: Vec<String> = r
                .tiers
                .iter()
                .map(|t| tiers_text(std::slice::from_ref(t)))
                .collect();
            let plans: serde_json::Map<String, Value> = r
                .plan_tiers
                .iter()
                .enumerate()
                .filter_map(|(i, t)| {
                    let t = t.as_ref()?;
                    Some((cfg.plans.names.get(i)?.clone(), Value::from(tiers_text(t))))
                })
                .collect();
            let rate = per_second.get(&r.id).copied().unwrap_or([0.0; 4]);
            let concurrency = snap
                .limiter
                .concurrency
                .iter()
                .find(|c| c.rule.id == r.id)
                .map(|c| json!({ "max": c.max, "partitions_in_flight": c.table.len() }));
            json!({
                "id": r.id,
                "match": r.matcher.describe(),
                "per": match &r.per {
                    crate::config::model::PartitionBy::Tenant => "tenant".to_string(),
                    crate::config::model::PartitionBy::Ip => "ip".to_string(),
                    crate::config::model::PartitionBy::Global => "global".to_string(),
                    crate::config::model::PartitionBy::Header(h) => format!("header:{h}"),
                },
                "algorithm": r.algorithm.to_string(),
                "action": r.action.to_string(),
                "action_detail": action_text(r),
                "enabled": r.enabled,
                "tiers": tiers,
                "plans": plans,
                "charge": charge_text(r).trim(),
                "exempt": exempt_text(&r.exempt, &cfg.plans).trim(),
                "concurrency": concurrency,
                "per_second": {
                    "allowed": round2(rate[0]),
                    "denied": round2(rate[1]),
                    "shadow_denied": round2(rate[2]),
                    "delayed": round2(rate[3]),
                },
            })
        })
        .collect()
}

/// Redis in `/api/status`: its state and, when configured, its rounds.
fn redis_status(cfg: &Config, fleet: &Fleet, metrics: &Metrics) -> Value {
    match &cfg.redis {
        None => json!({ "state": redis_state(fleet) }),
        Some(r) => {
            let last = fleet.last_round();
            json!({
                "state": redis_state(fleet),
                "error": redis_error(fleet),
                "on_failure": r.on_failure.to_string(),
                "sync_interval_ms": r.sync_interval.as_millis() as u64,
                "last_round_end_ms": last.map(|(end, _)| end),
                "last_round_duration_ms": last.map(|(_, us)| us as f64 / 1000.0),
                "live_instances": fleet.instances(),
                "pending_requests": metrics.redis_pending.get(),
            })
        }
    }
}

/// `GET /api/status`.
pub fn status(
    shared: &SharedSnapshot,
    fleet: &Fleet,
    metrics: &Metrics,
    rates: &DecisionRates,
    reload: &ReloadStatus,
) -> Value {
    let snap = shared.load();
    let cfg = &snap.config;
    let listeners: Vec<Value> = cfg
        .server
        .listen
        .iter()
        .zip(&cfg.server.listen_tls)
        .map(|(a, tls)| json!({ "addr": a.to_string(), "tls": tls, "h2c": cfg.server.h2c && !tls }))
        .collect();
    let pools = pools_status(&snap);
    let routes: Vec<Value> = cfg
        .routes
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "match": r.matcher.describe(),
                "upstream": r.pools_text(&cfg.upstreams),
            })
        })
        .collect();
    let rules = rules_status(&snap, rates);
    let redis = redis_status(cfg, fleet, metrics);
    // the token issuers' keys: how many, when fetched, the last fetch's error
    let jwks: Vec<Value> = cfg
        .tenant
        .jwks
        .iter()
        .map(|j| {
            let fetched = j.keys.fetched_ms.load(std::sync::atomic::Ordering::Relaxed);
            json!({
                "issuer": j.issuer,
                "uri": j.uri.to_string(),
                "keys": j.keys.set.load().keys.len(),
                "fetched_ms": (fetched > 0).then_some(fetched),
                "error": *j.keys.error.lock(),
            })
        })
        .collect();
    json!({
        "config": cfg.file.display().to_string(),
        "listeners": listeners,
        "admin_token": cfg.server.admin_token.is_some(),
        "pools": pools,
        "routes": routes,
        "rules": rules,
        "redis": redis,
        "jwks": jwks,
        "last_reload": reload.last(),
        "tracked_counters": metrics.tracked_counters.get(),
    })
}

/// `GET /api/tenants/<tenant>` (the id percent-decoded); `None` for a tenant this instance
/// knows nothing of: no API key or plan names it, no rule tracks a counter of it and it has no
/// request in flight (the admin listener answers 404).
pub fn tenant(shared: &SharedSnapshot, fleet: &Fleet, tenant: &[u8]) -> Option<Value> {
    let snap = shared.load();
    let cfg = &snap.config;
    let plan = cfg
        .plans
        .plan_of(tenant)
        .and_then(|p| cfg.plans.names.get(p).cloned());
    let rules = snap.limiter.inspect_tenant(tenant, &cfg.plans);
    // requests of this tenant in flight, for each per-tenant concurrency limit
    let mut busy = false;
    let key = tollgate_limits::partition::PartitionValue::Bytes(tenant).key_buf();
    let in_flight: Vec<Value> = snap
        .limiter
        .concurrency
        .iter()
        .filter(|c| c.rule.per == crate::config::model::PartitionBy::Tenant)
        .map(|c| {
            let now = c.table.count(&key);
            busy |= now > 0;
            json!({ "rule": c.rule.id, "max": c.max, "now": now })
        })
        .collect();
    let keyed = cfg.tenant.sources.iter().any(|s| match s {
        crate::config::model::TenantSource::ApiKey { keys, .. } => {
            keys.tenants().any(|t| t.as_bytes() == tenant)
        }
        _ => false,
    });
    let known = plan.is_some() || keyed || rules.iter().any(|r| r.tracked) || busy;
    if !known {
        return None;
    }
    let last = fleet.last_round();
    Some(json!({
        "tenant": String::from_utf8_lossy(tenant),
        "plan": plan,
        "rules": rules,
        "in_flight": in_flight,
        "redis": {
            "state": redis_state(fleet),
            "last_round_end_ms": last.map(|(end, _)| end),
            "live_instances": fleet.instances(),
        },
    }))
}

/// `GET /api/top?rule=<id>&by=denied|usage&n=20`: the partitions of one rule with the most
/// denials, or the highest use of their limit, in the current window of the rule's longest
/// period.
pub fn top(shared: &SharedSnapshot, query: &str) -> Result<Value, String> {
    let mut rule = None;
    let mut by_denied = true;
    let mut n = 20usize;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v)
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or("bad percent-encoding")?;
        match k {
            "rule" => rule = Some(v),
            "by" => match v.as_str() {
                "denied" => by_denied = true,
                "usage" => by_denied = false,
                _ => return Err(format!("by={v}: expected denied or usage")),
            },
            "n" => {
                n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=tollgate_limits::top::CAPACITY).contains(n))
                    .ok_or(format!(
                        "n={v}: expected 1 to {}",
                        tollgate_limits::top::CAPACITY
                    ))?
            }
            _ => return Err(format!("unknown parameter {k:?}: expected rule, by, n")),
        }
    }
    let rule = rule.ok_or("rule=<id> is required")?;
    let snap = shared.load();
    let (cr, limit) = snap
        .limiter
        .rules
        .iter()
        .zip(&snap.limiter.core.limits)
        .find(|(r, _)| r.rule.id == rule)
        .ok_or(format!("no rule {rule:?}"))?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let since = limit.top_window(now_ms);
    let list: Vec<Value> = limit
        .top
        .top(n, by_denied, since)
        .into_iter()
        .map(|e| {
            let shown = match (&cr.rule.per, e.key.split_first()) {
                (crate::config::model::PartitionBy::Tenant, Some((0, raw))) => {
                    String::from_utf8_lossy(raw).into_owned()
                }
                (per, _) => crate::services::fleet_sync::keys::redis_partition(per, &e.key),
            };
            json!({
                "partition": shown,
                "denied": e.denied,
                // at most this many of `denied` may belong to partitions it replaced
                "denied_at_least": e.denied - e.inherited,
                "usage": e.usage_permille as f64 / 1000.0,
            })
        })
        .collect();
    Ok(json!({
        "rule": rule,
        "by": if by_denied { "denied" } else { "usage" },
        "window_start_ms": since,
        "top": list,
    }))
}

/// Percent-decode a path segment (`%3Cscript%3E` -> `<script>`); `None` if malformed.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, sample_interval};
    use std::time::Duration;

    #[test]
    fn the_sample_interval_is_a_second_unless_the_environment_asks_for_another() {
        assert_eq!(sample_interval(None), Duration::from_secs(1));
        assert_eq!(sample_interval(Some("20")), Duration::from_millis(20));
        assert_eq!(
            sample_interval(Some("1")),
            Duration::from_millis(10),
            "clamped"
        );
        assert_eq!(
            sample_interval(Some("0")),
            Duration::from_millis(10),
            "clamped"
        );
        assert_eq!(
            sample_interval(Some("fast")),
            Duration::from_secs(1),
            "ignored"
        );
        assert_eq!(sample_interval(Some("")), Duration::from_secs(1), "ignored");
    }

    #[test]
    fn decodes_escapes() {
        assert_eq!(percent_decode("a%3Cb%3e").unwrap(), b"a<b>");
        assert_eq!(percent_decode("plain").unwrap(), b"plain");
        assert!(percent_decode("bad%2").is_none());
        assert!(percent_decode("bad%zz").is_none());
    }
}
