//! Answers beyond reject (contract section 4): `shadowban` (a fake success, the upstream never
//! reached), `throttle` (proxied, the response body paced), `concurrency` (requests in
//! flight per partition) and priority shaping of a full pool by plan. Real gateway, real
//! example upstream with its `/delay/MS` and `/bytes/N` modes.

mod common;
use common::{avoid_window_edge, metric_sum, one_route_config, request, Gateway, Upstream};
use std::time::{Duration, Instant};

const TENANT: &str = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n";

fn hits(up: &Upstream) -> u64 {
    request(up.addr, "GET", "/hits", &[])
        .expect("upstream answers")
        .json()["hits"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn shadowban_answers_its_own_reply_and_the_upstream_never_sees_the_excess() {
    let up = Upstream::start("u");
    let limits = "limits:\n  - id: scraper\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]\n    action: shadowban\n    shadowban: { status: 200, body: '{\"items\":[]}', content_type: application/json }\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "  access_log: true")
    ));
    avoid_window_edge(3_600_000, 10_000);
    let t = [("x-org-id", "mallory")];
    for _ in 0..2 {
        let r = gw.get("/x", &t);
        assert_eq!(r.status, 200);
        assert!(
            r.body.contains("\"server\""),
            "the upstream's answer: {}",
            r.body
        );
    }
    let before = hits(&up);
    for _ in 0..5 {
        let r = gw.get("/x", &t);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "{\"items\":[]}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        for h in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "ratelimit",
            "ratelimit-policy",
            "retry-after",
        ] {
            assert!(r.header(h).is_none(), "{h} would reveal the ban");
        }
    }
    assert_eq!(hits(&up), before, "the upstream's hit count did not move");
    // another tenant is served as usual
    assert!(gw
        .get("/x", &[("x-org-id", "alice")])
        .body
        .contains("\"server\""));
    let m = gw.metrics();
    assert_eq!(
        metric_sum(&m, "tollgate_ratelimit_decisions_total{decision=\"shadowbanned\",rule=\"scraper\",tier=\"1h\"}"),
        5.0,
        "{m}"
    );
    assert!(common::eventually(Duration::from_secs(2), || gw
        .log()
        .lines()
        .any(
            |l| l.contains("tenant=\"mallory\"") && l.contains("decision=shadowbanned")
        )));
}

#[test]
fn throttle_paces_an_over_limit_download_and_leaves_others_alone() {
    let up = Upstream::start("u");
    // 1 MiB at 512 KiB/s: 2 s
    let limits = "limits:\n  - id: downloads\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1 }]\n    action: throttle\n    throttle: { rate: 512KiB/s }\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "")
    ));
    avoid_window_edge(3_600_000, 10_000);
    let size = 1 << 20;
    let path = format!("/bytes/{size}");
    let t = [("x-org-id", "bulk")];
    let timed = || {
        let start = Instant::now();
        let r = gw.get(&path, &t);
        (r, start.elapsed())
    };
    let (r, fast) = timed();
    assert_eq!((r.status, r.body.len()), (200, size));
    let (r, paced) = timed();
    assert_eq!(
        (r.status, r.body.len()),
        (200, size),
        "throttled, not refused"
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let expected = size as f64 / (512.0 * 1024.0);
    eprintln!("unthrottled {fast:?}, paced {paced:?}, expected {expected:.2} s");
    assert!(
        fast.as_secs_f64() < 0.5 * expected,
        "unthrottled took {fast:?}"
    );
    assert!(
        paced.as_secs_f64() >= 0.7 * expected && paced.as_secs_f64() <= 2.0 * expected,
        "paced download took {paced:?}, expected about {expected:.2} s"
    );
    let m = gw.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total{decision=\"throttled\""
        ),
        1.0,
        "{m}"
    );
}
