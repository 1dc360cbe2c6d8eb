//! Rate limiting through the real gateway (contract sections 3-5): decisions, tiers with
//! check-then-commit, plans, actions, partitions, headers and hostile input.

mod common;
use common::{avoid_window_edge, eventually, request, Edit, Gateway, Upstream};
use std::time::Duration;

/// Gateway config with the given `limits` list (YAML, indented by two spaces) and extras.
fn config(up: &Upstream, limits: &str, extra: &str) -> String {
    format!(
        r#"{head}tenant:
  from:
    - api_key: {{ header: x-api-key, keys: {{ "k-7f3a": acme }} }}
    - path: /v1/organizations/{{tenant}}/**
      trusted: true
    - header: x-org-id
      trusted: true
  required: false
plans:
  premium: [globex]
limits:
{limits}
{extra}
"#,
        head = common::one_route_config(up.addr, 2, "")
    )
}

/// Make sure at least `margin_ms` remain in the current epoch-aligned window of `period_ms`,
/// so a test's requests all fall in one window.
fn get(gw: &Gateway, path: &str, tenant: &str) -> common::Response {
    gw.get(path, &[("x-org-id", tenant)])
}

const SEED: &str = r#"  - id: get-product
    enabled: true
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    tiers:
      - period: 10
        threshold: 5
  - id: put-product
    enabled: true
    methods: [PUT]
    pathPattern: /v1/organizations/*/product/*
    tiers:
      - period: 10
        threshold: 2"#;

#[test]
fn seed_rule_counts_down_then_429_with_retry_after() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, SEED, ""));
    avoid_window_edge(10_000, 3_000);
    let path = "/v1/organizations/acme/product/1";
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let r = gw.get(path, &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
        remaining.push(r.header("x-ratelimit-remaining").unwrap().to_string());
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        assert!((1..=10).contains(&reset), "reset {reset}");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"get-product/10s\";q=5;w=10")
        );
        assert!(r
            .header("ratelimit")
            .unwrap()
            .starts_with("\"get-product/10s\";r="));
    }
    assert_eq!(remaining, ["4", "3", "2", "1", "0"]);
    let r = gw.get(path, &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "retry-after {retry}");
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
    assert_eq!(j["detail"], "rate limit get-product exceeded: 5 per 10s");
    assert_eq!(
        j["violated-policies"],
        serde_json::json!(["get-product/10s"])
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
        m.contains(r#"tollgate_ratelimit_decisions_total{decision="denied",rule="get-product",tier="10s"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"tollgate_requests_total{route="all",status="429"} 1"#),
        "{m}"
    );
}

#[test]
fn tenants_are_isolated_and_get_and_put_count_apart() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, SEED, ""));
    avoid_window_edge(10_000, 3_000);
    let acme = "/v1/organizations/acme/product/1";
    for _ in 0..5 {
        assert_eq!(gw.get(acme, &[]).status, 200);
    }
    assert_eq!(gw.get(acme, &[]).status, 429);
    // another tenant is untouched
    let r = gw.get("/v1/organizations/initech/product/1", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
    // PUT has its own rule and counter
    let put = request(gw.addr, "PUT", acme, &[("content-length", "0")]).unwrap();
    assert_eq!(put.status, 200);
    assert_eq!(put.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(put.header("x-ratelimit-remaining"), Some("1"));
}

#[test]
fn no_rate_headers_when_no_rule_applies() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, SEED, ""));
    let r = gw.get("/v1/organizations/acme/orders", &[]);
    assert_eq!(r.status, 200);
    for h in ["x-ratelimit-limit", "ratelimit-policy", "ratelimit"] {
        assert!(r.header(h).is_none(), "{h} present");
    }
}

#[test]
fn every_tier_must_pass_and_a_denial_consumes_nothing() {
    let up = Upstream::start("u");
    let limits = "  - id: burst\n    pathPattern: /**\n    tiers:\n      - { period: 1, threshold: 2 }\n      - { period: 1h, threshold: 3 }";
    let gw = Gateway::start(&config(&up, limits, ""));
    // the long window first: waiting for the short one cannot then cross the hour
    avoid_window_edge(3_600_000, 5_000);
    avoid_window_edge(1000, 600);
    let a = get(&gw, "/x", "t");
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"burst/1s\";q=2;w=1, \"burst/1h\";q=3;w=3600")
    );
    assert_eq!(get(&gw, "/x", "t").status, 200);
    // the 1 s tier denies; the 1 h tier (2 used of 3) must not be charged for it
    for _ in 0..3 {
        let d = get(&gw, "/x", "t");
        assert_eq!(d.status, 429);
        assert_eq!(
            d.json()["violated-policies"],
            serde_json::json!(["burst/1s"])
        );
    }
    // next second: the hour tier still has exactly one left
    assert!(eventually(Duration::from_millis(1500), || {
        let r = get(&gw, "/x", "t");
        r.status == 200
            && r.header("x-ratelimit-remaining") == Some("0")
            && r.header("x-ratelimit-limit") == Some("3")
    }));
    let d = get(&gw, "/x", "t");
    assert_eq!(d.status, 429);
    assert_eq!(
        d.json()["violated-policies"],
        serde_json::json!(["burst/1h"])
    );
}

#[test]
fn plans_give_their_tenants_other_tiers() {
    let up = Upstream::start("u");
    let limits = "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]\n    plans:\n      premium: [{ period: 1h, threshold: 5 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(3_600_000, 5_000);
    let r = get(&gw, "/x", "globex");
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
    let r = get(&gw, "/x", "acme");
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(get(&gw, "/x", "acme").status, 200);
    assert_eq!(get(&gw, "/x", "acme").status, 429);
    for _ in 0..4 {
        assert_eq!(get(&gw, "/x", "globex").status, 200);
    }
    assert_eq!(get(&gw, "/x", "globex").status, 429);
}

#[test]
fn shadow_counts_and_reports_but_never_blocks() {
    let up = Upstream::start("u");
    let limits = "  - id: trial\n    pathPattern: /**\n    action: shadow\n    tiers: [{ period: 1h, threshold: 2 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(3_600_000, 5_000);
    for _ in 0..5 {
        let r = get(&gw, "/x", "t");
        assert_eq!(r.status, 200);
        assert!(
            r.header("x-ratelimit-limit").is_none(),
            "shadow rules are not shown to clients"
        );
    }
    let m = gw.metrics();
    assert!(
        m.contains(
            r#"tollgate_ratelimit_decisions_total{decision="allowed",rule="trial",tier="all"} 2"#
        ),
        "{m}"
    );
    assert!(
        m.contains(
            r#"tollgate_ratelimit_decisions_total{decision="shadow_denied",rule="trial",tier="1h"} 3"#
        ),
        "{m}"
    );
}

#[test]
fn per_ip_and_global_partitions() {
    let up = Upstream::start("u");
    let limits = "  - id: by-ip\n    pathPattern: /ip/**\n    per: ip\n    tiers: [{ period: 1h, threshold: 2 }]\n  - id: everyone\n    pathPattern: /global/**\n    per: global\n    tiers: [{ period: 1h, threshold: 3 }]\n  - id: by-header\n    pathPattern: /hdr/**\n    per: header:x-client\n    tiers: [{ period: 1h, threshold: 1 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(3_600_000, 5_000);
    // per ip: different tenants from one address share the count
    assert_eq!(get(&gw, "/ip/a", "t1").status, 200);
    assert_eq!(get(&gw, "/ip/a", "t2").status, 200);
    assert_eq!(get(&gw, "/ip/a", "t3").status, 429);
    // global: everyone shares
    for t in ["a", "b", "c"] {
        assert_eq!(get(&gw, "/global/x", t).status, 200);
    }
    assert_eq!(get(&gw, "/global/x", "d").status, 429);
    // per header: by the header's value; without the header the rule does not apply
    let h = |v: &str| gw.get("/hdr/x", &[("x-client", v)]).status;
    assert_eq!(h("one"), 200);
    assert_eq!(h("one"), 429);
    assert_eq!(h("two"), 200);
    assert_eq!(gw.get("/hdr/x", &[]).status, 200);
    assert_eq!(gw.get("/hdr/x", &[]).status, 200);
}

#[test]
fn differently_spelled_paths_cannot_dodge_a_rule() {
    let up = Upstream::start("u");
    let limits = "  - id: product\n    methods: [GET]\n    pathPattern: /v1/organizations/*/product/*\n    tiers: [{ period: 1h, threshold: 4 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(3_600_000, 5_000);
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
fn an_api_keys_tenant_wins_over_a_spoofed_header() {
    let up = Upstream::start("u");
    let limits = "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(3_600_000, 5_000);
    let key = ("x-api-key", "k-7f3a");
    assert_eq!(gw.get("/x", &[key]).status, 200);
    assert_eq!(gw.get("/x", &[key]).status, 200);
    // acme is exhausted; claiming another tenant in a header does not help
    assert_eq!(
        gw.get("/x", &[key, ("x-org-id", "someone-else")]).status,
        429
    );
    assert_eq!(gw.get("/x", &[("x-org-id", "someone-else")]).status, 200);
}

#[test]
fn delay_holds_a_request_until_it_fits_or_rejects_past_max_delay() {
    let up = Upstream::start("u");
    let limits = "  - id: smooth\n    pathPattern: /slow/**\n    action: delay\n    max_delay: 1500ms\n    tiers: [{ period: 1, threshold: 1 }]\n  - id: impatient\n    pathPattern: /fast/**\n    action: delay\n    max_delay: 50ms\n    status: 503\n    tiers: [{ period: 1h, threshold: 1 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(1000, 900);
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
    avoid_window_edge(3_600_000, 5_000);
    assert_eq!(get(&gw, "/fast/x", "t").status, 200);
    let r = get(&gw, "/fast/x", "t");
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["title"], "Service Unavailable");
    assert!(r.header("retry-after").is_some());
}

#[test]
fn header_families_can_be_switched_off() {
    let up = Upstream::start("u");
    let limits = "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1 }]";
    let gw = Gateway::start(&config(
        &up,
        limits,
        "headers:\n  x_ratelimit: false\n  ietf: true",
    ));
    avoid_window_edge(3_600_000, 5_000);
    let r = get(&gw, "/x", "t");
    assert!(r.header("x-ratelimit-limit").is_none());
    assert!(r.header("ratelimit").is_some());
    let denied = get(&gw, "/x", "t");
    assert_eq!(denied.status, 429);
    assert!(denied.header("retry-after").is_some());
    assert!(denied.header("x-ratelimit-retry-after").is_none());
    let gw = Gateway::start(&config(
        &up,
        limits,
        "headers:\n  x_ratelimit: true\n  ietf: false",
    ));
    let r = get(&gw, "/x", "t");
    assert!(r.header("x-ratelimit-limit").is_some());
    assert!(r.header("ratelimit-policy").is_none());
}

#[test]
fn hostile_tenant_ids_get_correct_decisions_and_never_collide() {
    let up = Upstream::start("u");
    let limits = "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1 }]";
    let gw = Gateway::start(&config(&up, limits, ""));
    avoid_window_edge(3_600_000, 5_000);
    let long = "x".repeat(10_000);
    let long2 = format!("{}y", "x".repeat(9_999));
    let ids = [
        "a:b",
        "a%3Ab",
        "a{b}",
        "a%7Bb%7D",
        "%",
        "%25",
        "a b",
        long.as_str(),
        long2.as_str(),
    ];
    for id in ids {
        assert_eq!(get(&gw, "/x", id).status, 200, "first request of {id:.20}");
    }
    for id in ids {
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
    let limits = "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1000 }]";
    let gw = Gateway::start(&config(&up, limits, "").edit(
        "  threads: 2\n",
        "  threads: 2\n  max_counters_per_rule: 64\n",
    ));
    avoid_window_edge(3_600_000, 30_000);
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
