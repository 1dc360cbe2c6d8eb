//! The quota endpoint through the real gateway (docs/configuration.md "The quota endpoint"):
//! `GET /quota` with the caller's usual credentials answers JSON of its rules and the IETF
//! headers, spends nothing, never reaches an upstream, and is limited per caller; `used` is the
//! count the operator's view (`/api/tenants/<t>`) shows, past the limit too. The answers'
//! content is tested in-process in `tests/admission.rs`.

mod common;
use common::{metric_sum, one_route_config, period_with_room, request, Gateway, Upstream};

const TENANT: &str =
    "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n  required: true\n";

#[test]
fn get_quota_answers_what_is_left_spends_nothing_and_is_limited_per_caller() {
    let up = Upstream::start("u");
    // a long token bucket: no token comes back during the test
    let limits = "limits:\n  - id: api\n    pathPattern: /**\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 5 }]\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "  quota_endpoint: /quota")
    ));
    let t = [("x-org-id", "acme")];
    for _ in 0..2 {
        assert_eq!(gw.get("/x", &t).status, 200);
    }
    let before = up.hits();
    let q = gw.get("/quota", &t);
    assert_eq!(q.status, 200, "{}", q.body);
    assert_eq!(q.header("content-type"), Some("application/json"));
    assert_eq!(q.header("cache-control"), Some("no-store"));
    let j = q.json();
    assert_eq!(j["tenant"], "acme");
    let tier = &j["rules"][0]["tiers"][0];
    assert_eq!(j["rules"][0]["rule"], "api");
    assert_eq!(
        (&tier["limit"], &tier["used"], &tier["remaining"]),
        (&5.into(), &2.into(), &3.into())
    );
    assert_eq!(q.header("x-ratelimit-remaining"), Some("3"));
    assert!(q
        .header("ratelimit")
        .is_some_and(|v| v.starts_with("\"api/1h\";r=3;")));
    // a probe of another request
    let p = gw.get("/quota?method=PUT&path=/v1/orders", &t).json();
    assert_eq!(p["request"]["method"], "PUT");
    // nothing spent, nothing proxied
    assert_eq!(
        gw.get("/quota", &t).json()["rules"][0]["tiers"][0]["used"],
        2
    );
    assert_eq!(up.hits(), before);
    // without credentials: 401
    assert_eq!(gw.get("/quota", &[]).status, 401);
    // ten answers a second per caller: asked quickly, one is refused with Retry-After
    let refused = (0..100).find_map(|_| {
        let r = gw.get("/quota", &t);
        (r.status == 429).then_some(r)
    });
    let r = refused.expect("a 429 within 100 quick asks");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // the other caller still gets its answer, and the requests counted where no route is
    assert_eq!(gw.get("/quota", &[("x-org-id", "globex")]).status, 200);
    let m = gw.metrics();
    assert!(
        metric_sum(&m, "tollgate_requests_total{route=\"none\",status=\"200\"}") >= 4.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total{decision=\"allowed\",rule=\"api\""
        ),
        2.0,
        "asking is not a request of the rule: {m}"
    );
}

const ADMIN_TOKEN: &str = "0123456789abcdef0123";

/// `/quota`'s tier and `/api/tenants/acme`'s, of the one rule.
fn both_views(gw: &Gateway) -> (serde_json::Value, serde_json::Value) {
    let q = gw.get("/quota", &[("x-org-id", "acme")]);
    assert_eq!(q.status, 200, "{}", q.body);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let a = request(
        gw.admin,
        "GET",
        "/api/tenants/acme",
        &[("authorization", &bearer)],
    )
    .expect("the admin listener answers");
    assert_eq!(a.status, 200, "{}", a.body);
    (
        q.json()["rules"][0]["tiers"][0].clone(),
        a.json()["rules"][0]["tiers"][0].clone(),
    )
}

/// `used` is the tier's count, the number the operator's view shows, also past the limit: a
/// cost the answer names is charged after it, whatever room was left (at most a threshold's
/// worth an answer), and a grant widens the limit without changing the count; `remaining` is
/// what is left.
#[test]
fn used_is_the_count_the_operator_sees_past_the_limit_and_under_a_grant() {
    let up = Upstream::start("u");
    // an hour-long window (or a bit longer) with a minute of it left at least
    let p = period_with_room(3600, 60);
    let limits = format!(
        "limits:\n  - id: tokens\n    pathPattern: /**\n    unit: tokens\n    cost: {{ response_header: x-usage-tokens, default: 1 }}\n    tiers: [{{ period: {p}, threshold: 10000 }}]\n"
    );
    let server = format!("  quota_endpoint: /quota\n  admin_token: \"{ADMIN_TOKEN}\"");
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, &server)
    ));
    // 9,000, then 5,700 more: admitted with 1,000 left, charged once answered
    for used in [9000, 5700] {
        let r = gw.get(&format!("/v1/usage/{used}"), &[("x-org-id", "acme")]);
        assert_eq!(r.status, 200);
    }
    let (q, a) = both_views(&gw);
    assert_eq!(a["used"], 14_700, "{a}");
    assert_eq!(
        (&q["limit"], &q["used"], &q["remaining"]),
        (&10_000.into(), &a["used"], &0.into()),
        "{q}"
    );
    let grant = |units: u64| {
        let body = format!(r#"{{"rule": "tokens", "units": {units}, "by": "test"}}"#);
        let raw = format!(
            "POST /api/tenants/acme/grant HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let r = common::request_raw(gw.admin, raw.as_bytes()).expect("the admin listener answers");
        assert_eq!(r.status, 200, "{}", r.body);
    };
    // a grant still short of the count: the limit widens, nothing is left, the count stays
    grant(1000);
    let (q, a) = both_views(&gw);
    assert_eq!(
        (&a["used"], &a["granted"]),
        (&14_700.into(), &1000.into()),
        "{a}"
    );
    assert_eq!(
        (&q["limit"], &q["used"], &q["remaining"]),
        (&11_000.into(), &a["used"], &0.into()),
        "{q}"
    );
    // past the count: 1,300 left
    grant(5000);
    let (q, a) = both_views(&gw);
    assert_eq!(a["used"], 14_700, "{a}");
    assert_eq!(
        (&q["limit"], &q["used"], &q["remaining"]),
        (&16_000.into(), &a["used"], &1300.into()),
        "{q}"
    );
    assert_eq!(a["remaining"], 1300, "{a}");
}

/// The demo (`conf/gateway.yaml`, as `make run` starts it) answers `/quota` itself: the caller's
/// rules, never the upstream's echo.
#[test]
fn the_demo_enables_the_quota_endpoint() {
    let (up, up2) = (Upstream::start("demo"), Upstream::start("demo-2"));
    let gw = common::DemoGateway::start(&[
        ("127.0.0.1:9001", up.addr),
        ("127.0.0.1:9002", up2.addr),
        ("127.0.0.1:9003", up.addr),
    ]);
    assert!(gw.ready, "the demo gateway did not start");
    let r = common::request(gw.listen, "GET", "/quota", &[("x-api-key", "k-7f3a")]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["tenant"], "acme", "{}", r.body);
    assert!(
        v["rules"].is_array() && v.get("server").is_none(),
        "{}",
        r.body
    );
    assert_eq!(up.hits() + up2.hits(), 0);
}
