//! Access lists and exemptions through the real gateway (docs/configuration.md "Access lists
//! and exemptions"): a route's `allow` and `deny` judge the client address as the tenant section
//! defines it (X-Forwarded-For believed from a trusted proxy only); a refused request gets 403
//! problem+json, never reaches the upstream, and is counted and logged; a rule's `exempt`
//! requests are neither counted nor refused by it and get no quota headers from it. The rules
//! themselves are tested in-process in `tests/admission.rs`.

mod common;
use common::{metric_sum, one_route_config, Edit, Gateway, Upstream};
use std::time::Duration;

const TENANT: &str =
    "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\nplans:\n  premium: [globex]\n";

#[test]
fn a_route_refuses_networks_with_403_and_exempt_requests_are_left_alone() {
    let up = Upstream::start("u");
    let cfg = one_route_config(
        up.addr,
        1,
        "  trusted_proxies: [\"127.0.0.1\"]\n  access_log: true",
    )
    .edit(
        "    upstream: app\n",
        "    upstream: app\n    allow: [\"10.0.0.0/8\"]\n    deny: [\"10.66.0.0/16\"]\n",
    );
    // a long token bucket: 1 an hour, no window edge inside the test
    let limits = "limits:\n  - id: api\n    pathPattern: /**\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 1 }]\n    exempt: { tenants: [vip], plans: [premium], ips: [\"10.1.0.0/16\"] }\n";
    let gw = Gateway::start(&format!("{cfg}{TENANT}{limits}"));
    let from = |client: &str, tenant: &str| {
        gw.get("/x", &[("x-forwarded-for", client), ("x-org-id", tenant)])
    };
    let before = up.hits();
    for client in ["10.66.1.1", "192.168.1.1"] {
        let r = from(client, "t");
        assert_eq!(r.status, 403, "{client}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(
            r.json()["detail"],
            "this client address may not use this route"
        );
        assert!(r.header("x-ratelimit-limit").is_none());
    }
    assert_eq!(
        up.hits(),
        before,
        "a refused request never reaches the upstream"
    );
    // exempt: a tenant, a plan's tenant, a network; as often as they like, no quota headers
    for (client, tenant) in [
        ("10.2.0.1", "vip"),
        ("10.2.0.1", "globex"),
        ("10.1.9.9", "t"),
    ] {
        for _ in 0..3 {
            let r = from(client, tenant);
            assert_eq!(r.status, 200, "{client} {tenant}");
            assert!(r.header("x-ratelimit-limit").is_none(), "{tenant}");
            assert!(r.header("ratelimit").is_none(), "{tenant}");
        }
    }
    // anyone else is limited by the rule
    let r = from("10.2.0.1", "t");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(from("10.2.0.1", "t").status, 429);
    let m = gw.metrics();
    assert_eq!(
        metric_sum(&m, "tollgate_requests_total{route=\"all\",status=\"403\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total{decision=\"allowed\",rule=\"api\""
        ),
        1.0,
        "exempt requests are not counted: {m}"
    );
    assert!(common::eventually(Duration::from_secs(3), || {
        gw.log().lines().any(|l| {
            l.contains("tollgate::access") && l.contains("status=403") && l.contains("route=all")
        })
    }));
}
