//! Rate limiting through the real gateway: the decision reaches the client (headers, the 429
//! body, metrics), paths as clients spell them, `delay` on real timers, hostile bytes on the
//! wire and a flood of tenant ids. The rules themselves (tiers, check then commit, plans, per,
//! actions, headers) are tested in-process under a fake clock in `tests/admission.rs`. Rules
//! here are token buckets with long periods: no window edge can fall inside a test, and no
//! token comes back during one.

mod common;
use common::{eventually, Edit, Gateway, Upstream};
use std::time::Duration;

/// Gateway config with the given `limits` list (YAML, indented by two spaces) and extras.
fn config(up: &Upstream, limits: &str, extra: &str) -> String {
    format!(
        r#"{head}{tenancy}limits:
{limits}
{extra}
"#,
        head = common::one_route_config(up.addr, 2, ""),
        tenancy = common::TENANCY
    )
}

fn get(gw: &Gateway, path: &str, tenant: &str) -> common::Response {
    gw.get(path, &[("x-org-id", tenant)])
}

/// The seed's rule, as a token bucket of 5 an hour (one token back every 12 minutes).
const SEED: &str = r#"  - id: get-product
    enabled: true
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    algorithm: token_bucket
    tiers:
      - period: 1h
        threshold: 5"#;

#[test]
fn seed_rule_counts_down_then_429_with_retry_after() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, SEED, ""));
    let path = "/v1/organizations/acme/product/1";
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let r = gw.get(path, &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
        remaining.push(r.header("x-ratelimit-remaining").unwrap().to_string());
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        assert!((1..=3600).contains(&reset), "reset {reset}");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"get-product/1h\";q=5;w=3600")
        );
        assert!(r
            .header("ratelimit")
            .unwrap()
            .starts_with("\"get-product/1h\";r="));
    }
    assert_eq!(remaining, ["4", "3", "2", "1", "0"]);
    let r = gw.get(path, &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    // one token comes back within 12 minutes
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=720).contains(&retry), "retry-after {retry}");
    // the seed's header, beside it
    assert_eq!(
        r.header("x-ratelimit-retry-after"),
        Some(retry.to_string().as_str())
    );
    let j = r.json();
    assert_eq!(
        j["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(j["title"], "Too Many Requests");
    assert_eq!(j["status"], 429);
    assert_eq!(j["detail"], "rate limit get-product exceeded: 5 per 1h");
    assert_eq!(
        j["violated-policies"],
        serde_json::json!(["get-product/1h"])
    );
    assert_eq!(j["retry_after"], retry);
    assert!(r.header("ratelimit").unwrap().contains(";r=0;"));

    let m = gw.metrics();
    assert!(
        m.contains(
            r#"tollgate_ratelimit_decisions_total{decision="allowed",rule="get-product",tier="all"} 5"#
        ),
        "{m}"
    );
    assert!(
        m.contains(r#"tollgate_ratelimit_decisions_total{decision="denied",rule="get-product",tier="1h"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"tollgate_requests_total{route="all",status="429"} 1"#),
        "{m}"
    );
}

#[test]
fn differently_spelled_paths_cannot_dodge_a_rule() {
    let up = Upstream::start("u");
    let limits = "  - id: product\n    methods: [GET]\n    pathPattern: /v1/organizations/*/product/*\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 4 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    let spellings = [
        "/v1/organizations/acme/product/1",
        "//v1/organizations/acme/product/1/",
        "/v1/./organizations/acme/x/../product/1?q=2",
        "/v1/%6Frganizations/acme/product/%31",
    ];
    for s in spellings {
        assert_eq!(gw.get(s, &[]).status, 200, "{s}");
    }
    for s in spellings {
        assert_eq!(gw.get(s, &[]).status, 429, "{s} dodged the rule");
    }
}

#[test]
fn delay_holds_a_request_until_it_fits_or_rejects_past_max_delay() {
    let up = Upstream::start("u");
    // a token a second (the second request waits for it), and one an hour
    let limits = "  - id: smooth\n    pathPattern: /slow/**\n    action: delay\n    max_delay: 1500ms\n    algorithm: token_bucket\n    tiers: [{ period: 1, threshold: 1 }]\n  - id: impatient\n    pathPattern: /fast/**\n    action: delay\n    max_delay: 50ms\n    status: 503\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 1 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    assert_eq!(get(&gw, "/slow/x", "t").status, 200);
    let started = std::time::Instant::now();
    let r = get(&gw, "/slow/x", "t");
    assert_eq!(r.status, 200, "held, then let through");
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "was not held"
    );
    assert!(gw
        .metrics()
        .contains(r#"decision="delayed",rule="smooth",tier="all"} 1"#));
    // a wait longer than max_delay is rejected with the rule's status
    assert_eq!(get(&gw, "/fast/x", "t").status, 200);
    let r = get(&gw, "/fast/x", "t");
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["title"], "Service Unavailable");
    assert!(r.header("retry-after").is_some());
}

#[test]
fn hostile_tenant_ids_get_correct_decisions_and_never_collide() {
    let up = Upstream::start("u");
    let limits = "  - id: api\n    pathPattern: /**\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 1 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    let ids = common::hostile_tenant_ids();
    for id in &ids {
        assert_eq!(get(&gw, "/x", id).status, 200, "first request of {id:.20}");
    }
    for id in &ids {
        assert_eq!(get(&gw, "/x", id).status, 429, "second request of {id:.20}");
    }
    // non-UTF-8 bytes in the header, and CRLF (percent-encoded) in a path tenant
    let raw = |tenant: &[u8]| {
        let mut req = format!(
            "GET /x HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nx-org-id: ",
            gw.addr
        )
        .into_bytes();
        req.extend_from_slice(tenant);
        req.extend_from_slice(b"\r\n\r\n");
        common::request_raw(gw.addr, &req).unwrap().status
    };
    assert_eq!(raw(b"\xff\xfe"), 200);
    assert_eq!(raw(b"\xff\xfd"), 200);
    assert_eq!(raw(b"\xff\xfe"), 429);
    assert_eq!(gw.get("/v1/organizations/a%0D%0Ab/x", &[]).status, 200);
    assert_eq!(gw.get("/v1/organizations/a%0D%0Ab/x", &[]).status, 429);
    assert_eq!(gw.get("/v1/organizations/a%0d%0ac/x", &[]).status, 200);
}

#[test]
fn a_flood_of_tenant_ids_keeps_memory_capped_and_a_busy_counter() {
    let up = Upstream::start("u");
    // a token back every 86.4 s: the busy tenant's count cannot move during the test
    let limits = "  - id: api\n    pathPattern: /**\n    algorithm: token_bucket\n    tiers: [{ period: 24h, threshold: 1000 }]";
    let gw = Gateway::start(&config(&up, limits, "").edit(
        "  threads: 2\n",
        "  threads: 2\n  max_counters_per_rule: 64\n",
    ));
    for _ in 0..10 {
        assert_eq!(get(&gw, "/x", "busy").status, 200);
    }
    // wave 1: one-off ids fill the store with counters of weight 1; the rest are untracked
    for i in 0..1000 {
        assert_eq!(get(&gw, "/x", &format!("flood-{i}")).status, 200);
    }
    // wave 2: new ids seen twice are seen more often than those and evict them
    for i in 0..200 {
        for _ in 0..2 {
            assert_eq!(get(&gw, "/x", &format!("wave-{i}")).status, 200);
        }
    }
    let r = get(&gw, "/x", "busy");
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("989"),
        "busy tenant's counter was kept"
    );
    assert!(eventually(Duration::from_secs(3), || {
        let m = gw.metrics();
        let tracked = m
            .lines()
            .find_map(|l| l.strip_prefix("tollgate_tracked_counters "))
            .and_then(|v| v.parse::<u64>().ok());
        tracked.is_some_and(|t| t > 0 && t <= 64)
    }));
    let m = gw.metrics();
    let metric = |name: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(metric("tollgate_ratelimit_evictions_total ") > 0, "{m}");
    assert!(metric("tollgate_ratelimit_untracked_total ") > 0, "{m}");
}
