//! A route's `upstreams` (issue 41 item 3): a weighted split between pools (a 5% canary),
//! sticky per tenant, a split by plan, tenant or header, counted by pool in the metrics and
//! changed by a reload.

mod common;

use common::*;
use std::collections::HashMap;
use std::net::TcpStream;

/// Two pools, `v1` and `v2`, and one route `orders` whose `upstreams` are `split`.
fn config(v1: &Upstream, v2: &Upstream, split: &str) -> String {
    format!(
        r#"server:
  listen: ["{{LISTEN}}"]
  admin: "{{ADMIN}}"
  threads: 2
upstreams:
  v1:
    servers: ["{}"]
  v2:
    servers: ["{}"]
routes:
  - id: orders
    path: /**
{split}tenant:
  from: [{{ header: x-org-id, trusted: true }}]
plans:
  beta: [early]
"#,
        v1.addr, v2.addr
    )
}

/// Which upstream served each of `n` requests on one connection, with `headers`.
fn served(gw: &Gateway, n: usize, headers: &[(&str, &str)]) -> HashMap<String, usize> {
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let mut by = HashMap::new();
    for _ in 0..n {
        let (status, body) = get_on(&mut s, "/orders", headers);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        *by.entry(v["server"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    by
}

fn count(by: &HashMap<String, usize>, server: &str) -> usize {
    by.get(server).copied().unwrap_or(0)
}

#[test]
fn a_five_percent_canary_gets_five_percent_and_the_metrics_show_it() {
    let (v1, v2) = (Upstream::start("v1"), Upstream::start("v2"));
    let split =
        "    upstreams:\n      - { pool: v1, weight: 95 }\n      - { pool: v2, weight: 5 }\n";
    let gw = Gateway::start(&config(&v1, &v2, split));
    let n = 10_000;
    let by = served(&gw, n, &[]);
    let canary = count(&by, "v2");
    assert_eq!(count(&by, "v1") + canary, n, "{by:?}");
    // binomial(10,000, 0.05): mean 500, sd 21.8; 5 sd either way (a false alarm once in
    // 1.7 million runs)
    assert!(
        (391..=609).contains(&canary),
        "{canary} of {n} to the canary"
    );
    let m = gw.metrics();
    let metric = |pool: &str| {
        metric_sum(
            &m,
            &format!("tollgate_upstream_requests_total{{pool=\"{pool}\",route=\"orders\"}}"),
        ) as usize
    };
    assert_eq!((metric("v1"), metric("v2")), (n - canary, canary), "{m}");
}

#[test]
fn sticky_keeps_each_tenant_on_one_pool() {
    let (v1, v2) = (Upstream::start("v1"), Upstream::start("v2"));
    let split = "    upstreams:\n      - { pool: v1, weight: 1 }\n      - { pool: v2, weight: 1 }\n    sticky: tenant\n";
    let gw = Gateway::start(&config(&v1, &v2, split));
    let mut pools = HashMap::new();
    for t in 0..40 {
        let tenant = format!("tenant-{t}");
        let by = served(&gw, 10, &[("x-org-id", &tenant)]);
        assert_eq!(by.len(), 1, "{tenant} went to {by:?}");
        *pools
            .entry(by.into_keys().next().unwrap_or_default())
            .or_insert(0) += 1;
    }
    // 40 tenants on a 50/50 split: both pools have some (all on one: 2 in 10^12)
    assert_eq!(pools.len(), 2, "{pools:?}");
    // without a tenant, requests are spread
    let spread = served(&gw, 200, &[]);
    assert_eq!(spread.len(), 2, "{spread:?}");
}

#[test]
fn a_plan_a_tenant_or_a_header_picks_its_pool_and_a_reload_changes_the_split() {
    let (v1, v2) = (Upstream::start("v1"), Upstream::start("v2"));
    let split = r#"    upstreams:
      - { pool: v2, when: { plan: beta } }
      - { pool: v2, when: { tenant: [acme, globex] } }
      - { pool: v2, when: { header: { x-canary: "always" } } }
      - { pool: v1 }
"#;
    let gw = Gateway::start(&config(&v1, &v2, split));
    // `early` is on the beta plan
    assert_eq!(count(&served(&gw, 50, &[("x-org-id", "early")]), "v2"), 50);
    assert_eq!(count(&served(&gw, 50, &[("x-org-id", "globex")]), "v2"), 50);
    assert_eq!(count(&served(&gw, 50, &[("x-canary", "always")]), "v2"), 50);
    assert_eq!(count(&served(&gw, 50, &[("x-canary", "never")]), "v1"), 50);
    assert_eq!(
        count(&served(&gw, 50, &[("x-org-id", "initech")]), "v1"),
        50
    );
    // the status API shows the split
    let status = request(gw.admin, "GET", "/api/status", &[]).unwrap().json();
    let shown = status["routes"][0]["upstream"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        shown.contains("v2 1 when plan beta") && shown.ends_with("v1 1"),
        "{shown}"
    );
    let (code, out, err) = run_tollgate(&["-t", "-c", &gw.config.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("-> {shown} (tenant optional)")),
        "{out}"
    );
    // a reload sends everyone to v2
    let all_v2 =
        "    upstreams:\n      - { pool: v1, weight: 0 }\n      - { pool: v2, weight: 1 }\n";
    assert!(gw.reload(&config(&v1, &v2, all_v2)));
    assert_eq!(
        count(&served(&gw, 50, &[("x-org-id", "initech")]), "v2"),
        50
    );
}
