//! The quota endpoint (`server.quota_endpoint`, off by default): a client asks, with its usual
//! credentials, how much it has left without spending any, as GitHub's `GET /rate_limit` does.
//! `GET /quota` answers every rule that counts per tenant; `GET
//! /quota?method=PUT&path=/v1/orders` the rules of that request (each partitioned as that
//! request would be: tenant, client address, header, global). Per tier: the limit, what is
//! used and what remains as this instance knows it (with the fleet's room once Redis has
//! answered), and the seconds to the reset; the quota headers of that probe beside it. Nothing
//! is counted, and nothing goes to Redis; the endpoint is itself limited per caller
//! (`limits::probe`).

use crate::config::duration::write_period;
use crate::config::model::TenantMode;
use crate::limits::headers;
use crate::limits::probe::PROBES_PER_SECOND;
use crate::limits::LimitRequest;
use crate::matching::{normalize_path, Segments};
use crate::metrics::Metrics;
use crate::request::answer::Answer;
use crate::request::incoming::{client_ip, tenant_of, Incoming};
use crate::snapshot::Snapshot;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method};
use serde_json::{json, Value};
use std::net::IpAddr;

/// The answer of the quota endpoint, and who asked (for the access log).
pub struct Quota {
    pub answer: Answer,
    pub tenant: Vec<u8>,
    pub client_ip: IpAddr,
    /// Refused by the endpoint's own limit.
    pub refused: bool,
}

/// Answer a `GET` of the quota endpoint (`path`: the request's normalized path).
pub fn answer(snap: &Snapshot, req: &Incoming<'_>, path: &str, metrics: &Metrics) -> Quota {
    let cfg = &snap.config;
    let client = client_ip(req, cfg);
    let mode = if cfg.tenant.required {
        TenantMode::Required
    } else {
        TenantMode::Optional
    };
    let quota = |answer, tenant, refused| Quota {
        answer,
        tenant,
        client_ip: client,
        refused,
    };
    let (tenant, plan) = match tenant_of(snap, mode, req, path, client) {
        Ok((t, token)) => (t, token.and_then(|v| v.plan)),
        Err(no) => return quota(no.answer(metrics), Vec::new(), false),
    };
    // (never empty: without a tenant source the caller is `anonymous`)
    if let Err(wait_ns) = snap.probes.admit(&tenant, snap.limiter.now_ns()) {
        let detail = format!(
            "the quota endpoint answers one caller at most {PROBES_PER_SECOND} times a second"
        );
        let secs = wait_ns.div_ceil(1_000_000_000).max(1);
        let answer = Answer::problem(429, &detail).retry_after(secs, cfg.headers.x_ratelimit);
        return quota(answer, tenant, true);
    }
    match probe(req.head.uri.query()) {
        Ok(p) => {
            let answer = report(snap, req, client, (&tenant, plan), p);
            quota(answer, tenant, false)
        }
        Err(detail) => quota(Answer::problem(400, detail), tenant, false),
    }
}

/// The rules of `probe` (none: every rule counting per tenant) for `tenant`, as JSON, and the
/// quota headers of the probe.
fn report(
    snap: &Snapshot,
    req: &Incoming<'_>,
    client: IpAddr,
    (tenant, plan): (&[u8], Option<usize>),
    probe: Option<(Method, String)>,
) -> Answer {
    let cfg = &snap.config;
    let probe_path = probe.as_ref().map_or(String::new(), |(_, p)| p.clone());
    let normalized = normalize_path(&probe_path);
    let segments = Segments::new(&normalized);
    let lreq = LimitRequest {
        method: probe.as_ref().map_or(&Method::GET, |(m, _)| m),
        host: req.host(),
        path: &segments,
        tenant,
        plan,
        client_ip: client,
        headers: &req.head.headers,
    };
    let limiter = &snap.limiter;
    let (d, used) = limiter.peek(&lreq, &cfg.plans, probe.is_none());
    let mut rules: Vec<Value> = Vec::new();
    for &(rule, _) in &d.applied {
        let Some(cr) = limiter.rules.get(usize::from(rule)) else {
            continue;
        };
        let tiers: Vec<Value> = d
            .tiers
            .iter()
            .zip(&used)
            .filter(|(t, _)| t.rule == rule)
            .map(|(t, &used)| {
                let mut period = String::new();
                write_period(&mut period, t.period_ms, t.calendar);
                json!({
                    "policy": format!("{}/{period}", cr.rule.id),
                    "limit": t.threshold,
                    // the tier's count, as the operator's view shows it: past `limit` where
                    // a cost charged after the answer took it there
                    "used": used,
                    "remaining": t.verdict.remaining,
                    "reset": t.verdict.reset_ms.div_ceil(1000),
                    "period_ms": t.period_ms,
                })
            })
            .collect();
        rules.push(json!({
            "rule": cr.rule.id,
            "algorithm": cr.rule.algorithm.to_string(),
            "tiers": tiers,
        }));
    }
    let plan = cfg
        .plans
        .plan_of(tenant)
        .and_then(|p| cfg.plans.names.get(p));
    let body = json!({
        "tenant": String::from_utf8_lossy(tenant),
        "plan": plan,
        "request": probe.as_ref().map(|(m, p)| json!({ "method": m.as_str(), "path": p })),
        "rules": rules,
    });
    let body = bytes::Bytes::from(body.to_string());
    let mut h = HeaderMap::with_capacity(8);
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers::apply(&mut h, limiter, &d, cfg.headers, false);
    Answer {
        status: 200,
        headers: h,
        body,
        close: false,
        by_limit: false,
    }
}

/// The request a client asks about: `?method=PUT&path=/v1/orders` (method `GET` by default);
/// none without `path`.
fn probe(query: Option<&str>) -> Result<Option<(Method, String)>, &'static str> {
    let (mut method, mut path) = (None, None);
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "method" => method = Some(v.into_owned()),
            "path" => path = Some(v.into_owned()),
            _ => return Err("the quota endpoint takes `method` and `path` only"),
        }
    }
    let Some(path) = path else {
        return match method {
            Some(_) => Err("`method` needs the `path` of the request to ask about"),
            None => Ok(None),
        };
    };
    if !path.starts_with('/') {
        return Err("`path` is a request path, starting with /");
    }
    let method = match method {
        None => Method::GET,
        Some(m) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| "`method` is not an HTTP method")?,
    };
    Ok(Some((method, path)))
}

#[cfg(test)]
mod tests {
    use super::probe;
    use http::Method;

    #[test]
    fn a_probe_is_a_method_and_a_path() {
        assert_eq!(probe(None), Ok(None));
        assert_eq!(probe(Some("")), Ok(None));
        assert_eq!(
            probe(Some("path=%2Fv1%2Forders%2F7")),
            Ok(Some((Method::GET, "/v1/orders/7".to_string())))
        );
        assert_eq!(
            probe(Some("method=put&path=/v1/x")),
            Ok(Some((Method::PUT, "/v1/x".to_string())))
        );
        assert!(probe(Some("method=PUT")).is_err());
        assert!(probe(Some("path=v1")).is_err());
        assert!(probe(Some("path=/x&method=G%20T")).is_err());
        assert!(probe(Some("tenant=other")).is_err());
    }
}
