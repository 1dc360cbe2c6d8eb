//! Prometheus metrics, served by the admin listener. No label carries a tenant, a key or a
//! client address: label values come from the config (route and rule ids) or small fixed sets.

use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    /// `tollgate_requests_total{route,status}`; route is `none` when no route matched.
    pub requests: IntCounterVec,
    /// `tollgate_config_reloads_total{result}`
    pub reloads: IntCounterVec,
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
        let reloads = IntCounterVec::new(
            Opts::new(
                "tollgate_config_reloads_total",
                "Config reloads, by result (ok, error)",
            ),
            &["result"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            reloads,
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}
