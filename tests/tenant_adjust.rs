//! `POST /api/tenants/{id}/reset` and `/grant` (issue 43 item 7): a support desk's reset of a
//! tenant's quota and a grant of more units in the current window, on one instance without
//! Redis, and fleet-wide through a real redis-server (every instance honours it within a
//! round, the window's count in Redis still what the fleet admitted, refused requests never
//! charged to a grant).

mod common;
use common::{
    eventually, period_with_room, request_raw, wait_redis_state, Cluster, Gateway, RedisServer,
    Response, Upstream,
};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

/// The fleet cases take turns (two gateways and Redis each, on a 2-core machine).
static FLEET: Mutex<()> = Mutex::new(());

const TOKEN: &str = "0123456789abcdef0123";

/// Rules on their own paths (fixed window, sliding window, sliding log, token bucket), each per
/// tenant and of a period of about an hour with `room_s` seconds left in its window; a monthly
/// calendar window (a support desk's "monthly quota"); one rule per address, and one of two
/// tiers.
/// `redis`: the endpoint's line (`url: ...`, `cluster: [...]`), or none.
fn config(up: &Upstream, server_extra: &str, redis: Option<&str>, room_s: u64) -> String {
    let p = period_with_room(3600, room_s);
    let mut cfg = common::one_route_config(up.addr, 1, server_extra)
        + &format!(
            r#"tenant:
  from:
    - header: x-org-id
      trusted: true
limits:
  - id: fixed
    pathPattern: /fixed/**
    tiers: [{{ period: {p}, threshold: 6 }}]
  - id: sliding
    pathPattern: /sliding/**
    algorithm: sliding_window
    tiers: [{{ period: {p}, threshold: 6 }}]
  - id: log
    pathPattern: /log/**
    algorithm: sliding_log
    tiers: [{{ period: {p}, threshold: 6 }}]
  - id: monthly
    pathPattern: /monthly/**
    calendar: {{ tz: Europe/Berlin }}
    tiers: [{{ period: 1mo, threshold: 6 }}]
  - id: bucket
    pathPattern: /bucket/**
    algorithm: token_bucket
    tiers: [{{ period: {p}, threshold: 4 }}]
  - id: two-tiers
    pathPattern: /two/**
    tiers: [{{ period: {p}, threshold: 5 }}, {{ period: {}, threshold: 9 }}]
  - id: by-ip
    pathPattern: /ip/**
    per: ip
    tiers: [{{ period: {p}, threshold: 5 }}]
"#,
            2 * p
        );
    if let Some(endpoint) = redis {
        // (a timeout of a second: a request waiting for a round on a busy machine is held
        // that long rather than refused; the fleet's own checks are elsewhere)
        cfg += &format!(
            "redis:\n  {endpoint}\n  key_prefix: tg\n  sync_interval: 200ms\n  timeout: 1s\n"
        );
    }
    cfg
}

/// A POST with a JSON body to the admin listener, with the token unless `token` is false.
fn post(admin: SocketAddr, path: &str, body: &str, token: bool) -> Response {
    let auth = if token {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    request_raw(admin, raw.as_bytes()).expect("the admin listener answers")
}

/// Requests of `tenant` on `path`, alternating between `gws`, until `refused` in a row are
/// refused (each refused one with 429): how many were admitted.
fn admitted_until_refused(gws: &[&Gateway], path: &str, tenant: &str, refused: usize) -> usize {
    let (mut admitted, mut in_a_row, mut i) = (0, 0, 0);
    while in_a_row < refused {
        let r = gws[i % gws.len()].get(path, &[("x-org-id", tenant)]);
        i += 1;
        match r.status {
            200 => {
                admitted += 1;
                in_a_row = 0;
            }
            429 => in_a_row += 1,
            s => panic!("{path}: status {s}"),
        }
        assert!(i < 1000, "{path}: never refused");
    }
    admitted
}

#[test]
fn an_operator_resets_and_grants_on_one_instance_without_redis() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(
        &up,
        &format!("  admin_token: \"{TOKEN}\""),
        None,
        120,
    ));
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 5), 6);

    // the token is needed, and the method is POST
    assert_eq!(
        post(gw.admin, "/api/tenants/acme/reset", "", false).status,
        401
    );
    let got = common::request(
        gw.admin,
        "GET",
        "/api/tenants/acme/reset",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .expect("answers");
    assert_eq!(got.status, 405);
    assert_eq!(got.header("allow"), Some("POST"));

    // a reset of one rule: six more, and the other tenant's counters are its own
    let r = post(
        gw.admin,
        "/api/tenants/acme/reset",
        r#"{"rule": "fixed", "by": "desk"}"#,
        true,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["action"], "reset");
    assert_eq!(v["fleet"], false);
    assert_eq!(v["tiers"][0]["rule"], "fixed");
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 5), 6);
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "other", 1), 6);

    // refused requests (the ten above, and these) are never charged to a grant
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 20), 0);
    let r = post(
        gw.admin,
        "/api/tenants/acme/grant",
        r#"{"rule": "fixed", "units": 3, "by": "alice@desk\nadmin: forged"}"#,
        true,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 5), 3);
    let log = gw.log();
    assert!(
        log.contains(
            "admin: grant of 3 for tenant \"acme\" by alice@desk\\nadmin: forged from 127.0.0.1:"
        ) && log.contains("[fixed/0], this instance (no redis)"),
        "{log}"
    );
    assert!(
        log.contains("admin: reset for tenant \"acme\" by desk"),
        "{log}"
    );

    // a reset without a rule: every rule counting per tenant, every tier
    assert_eq!(admitted_until_refused(&[&gw], "/sliding/a", "acme", 3), 6);
    assert_eq!(admitted_until_refused(&[&gw], "/bucket/a", "acme", 3), 4);
    let r = post(gw.admin, "/api/tenants/acme/reset", "", true);
    assert_eq!(r.status, 200, "{}", r.body);
    let rules: Vec<String> = r.json()["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .map(|t| format!("{}/{}", t["rule"].as_str().unwrap_or(""), t["tier"]))
        .collect();
    assert_eq!(
        rules,
        [
            "fixed/0",
            "sliding/0",
            "log/0",
            "monthly/0",
            "bucket/0",
            "two-tiers/0",
            "two-tiers/1"
        ]
    );
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 3), 6);
    assert_eq!(admitted_until_refused(&[&gw], "/sliding/a", "acme", 3), 6);
    assert_eq!(admitted_until_refused(&[&gw], "/bucket/a", "acme", 3), 4);

    // a grant of a rule of two tiers names its tier, and widens that tier alone
    assert_eq!(admitted_until_refused(&[&gw], "/two/a", "acme", 3), 5);
    let r = post(
        gw.admin,
        "/api/tenants/acme/grant",
        r#"{"rule": "two-tiers", "units": 2}"#,
        true,
    );
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("name one with \\\"tier\\\""), "{}", r.body);
    let r = post(
        gw.admin,
        "/api/tenants/acme/grant",
        r#"{"rule": "two-tiers", "tier": 0, "units": 2}"#,
        true,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admitted_until_refused(&[&gw], "/two/a", "acme", 3), 2);

    // what cannot be done is refused with a problem, and changes nothing
    for (path, body, status, says) in [
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "fixed"}"#,
            422,
            "units",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "fixed", "units": 0}"#,
            422,
            "units",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "fixed", "units": 1000000000001}"#,
            422,
            "units",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"units": 4}"#,
            422,
            "names its",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "nope", "units": 4}"#,
            422,
            "no rule",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "by-ip", "units": 4}"#,
            422,
            "per ip",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "bucket", "units": 4}"#,
            422,
            "takes no grant",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "fixed", "tier": 1, "units": 4}"#,
            422,
            "tier",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "fixed", "units": -4}"#,
            400,
            "body",
        ),
        (
            "/api/tenants/acme/grant",
            r#"{"rule": "fixed", "unit": 4}"#,
            400,
            "unknown field",
        ),
        (
            "/api/tenants/acme/reset",
            r#"{"rule": "fixed", "units": 4}"#,
            422,
            "no \\\"units\\\"",
        ),
        ("/api/tenants/acme/reset", "not json", 400, "body"),
        ("/api/tenants//reset", "", 400, "expected"),
    ] {
        let r = post(gw.admin, path, body, true);
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.body.contains(says), "{path} {body}: {}", r.body);
    }
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 3), 0);

    // units granted and not used stay granted through a reset
    let r = post(
        gw.admin,
        "/api/tenants/acme/grant",
        r#"{"rule": "fixed", "units": 2}"#,
        true,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        gw.admin,
        "/api/tenants/acme/reset",
        r#"{"rule": "fixed"}"#,
        true,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 3), 6 + 2);
}

#[test]
fn without_an_admin_token_resets_and_grants_are_forbidden() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, "", None, 60));
    let r = post(gw.admin, "/api/tenants/acme/reset", "", false);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("server.admin_token"), "{}", r.body);
}

#[test]
fn a_reset_and_a_grant_reach_every_instance_of_the_fleet_within_a_round() {
    let _turn = FLEET.lock().unwrap_or_else(|e| e.into_inner());
    let redis = RedisServer::start();
    let (_up, a, b) = pair(&format!("url: {}", redis.url()));
    reset_and_grant_across(
        &a,
        &b,
        &[
            ("/fixed/a", 6),
            ("/sliding/a", 6),
            ("/log/a", 6),
            ("/monthly/a", 6),
            ("/bucket/a", 4),
        ],
    );
    // the window's count in Redis is still what the fleet admitted (contract section 6); the
    // grants are beside it, in the window's ledger
    let key = |rule: &str| {
        let keys = redis.counter_keys(&format!("tg:{{acme}}:{rule}:*"));
        assert_eq!(keys.len(), 1, "{rule}: {keys:?}");
        keys[0].clone()
    };
    assert!(eventually(Duration::from_secs(5), || redis
        .int(&["GET", &key("fixed")])
        == 6 + 6 + 3));
    let fixed = key("fixed");
    assert_eq!(
        redis.int(&["HGET", &format!("{fixed}:fleet"), "g:"]),
        6 + 3,
        "the reset forgave 6, the grant added 3"
    );
    assert!(redis.int(&["PTTL", &format!("{fixed}:fleet")]) > 0);
    // units granted and not used stay granted through a reset
    for (action, body) in [
        ("grant", r#"{"rule": "fixed", "units": 2}"#),
        ("reset", r#"{"rule": "fixed"}"#),
    ] {
        let r = post(a.admin, &format!("/api/tenants/acme/{action}"), body, true);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let mut after = 0;
    assert!(eventually(Duration::from_secs(5), || {
        after += usize::from(b.get("/fixed/a", &[("x-org-id", "acme")]).status == 200);
        after > 0
    }));
    after += admitted_until_refused(&[&a, &b], "/fixed/a", "acme", 4);
    assert_eq!(after, 6 + 2);
    // the mark that tells the heartbeats expires too
    let mark = redis.keys("tg:instances:adjusted*");
    assert_eq!(mark.len(), 1, "{mark:?}");
    assert!(redis.int(&["PTTL", &mark[0]]) > 0);
}

#[test]
fn a_reset_and_a_grant_reach_the_fleet_through_a_redis_cluster() {
    let _turn = FLEET.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(3, 0);
    let (_up, a, b) = pair(&format!("cluster: {}", cluster.seeds()));
    reset_and_grant_across(&a, &b, &[("/fixed/a", 6), ("/bucket/a", 4)]);
}

/// Until every count `gws` admitted has reached Redis.
fn settled(gws: &[&Gateway]) {
    for gw in gws {
        assert!(eventually(Duration::from_secs(10), || common::metric_sum(
            &gw.metrics(),
            "tollgate_redis_pending_deltas"
        ) == 0.0));
    }
}

/// Two gateways with the admin token on the Redis `endpoint` (its config line), connected.
fn pair(endpoint: &str) -> (Upstream, Gateway, Gateway) {
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("  admin_token: \"{TOKEN}\""),
        Some(endpoint),
        150,
    );
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
    }
    (up, a, b)
}

/// For each (path, threshold): the tenant fills its window on both instances, a reset through
/// `b` gives the fleet the threshold again (no more), a grant of 3 through `a` three more (a
/// bucket takes no grant).
fn reset_and_grant_across(a: &Gateway, b: &Gateway, rules: &[(&str, usize)]) {
    for &(path, threshold) in rules {
        let rule = path.trim_start_matches('/').trim_end_matches("/a");
        // the tenant fills its window on both instances
        assert_eq!(
            admitted_until_refused(&[a, b], path, "acme", 4),
            threshold,
            "{rule}"
        );
        // (every count in Redis first: one reported after a reset counts after it)
        settled(&[a, b]);
        // reset through b; a, whose count refuses, hears of it from its next rounds
        let r = post(
            b.admin,
            "/api/tenants/acme/reset",
            &format!(r#"{{"rule": "{rule}"}}"#),
            true,
        );
        assert_eq!(r.status, 200, "{rule}: {}", r.body);
        assert_eq!(r.json()["fleet"], true);
        let mut after = 0;
        assert!(
            eventually(Duration::from_secs(5), || {
                after += usize::from(a.get(path, &[("x-org-id", "acme")]).status == 200);
                after > 0
            }),
            "{rule}: a never heard of the reset; log:\n{}",
            a.log()
        );
        // and the fleet admits the threshold again, no more
        after += admitted_until_refused(&[a, b], path, "acme", 4);
        assert_eq!(after, threshold, "{rule}: after the reset");

        if path.starts_with("/bucket") {
            continue;
        }
        // a grant through a: exactly that many more, on either instance
        let r = post(
            a.admin,
            "/api/tenants/acme/grant",
            &format!(r#"{{"rule": "{rule}", "units": 3, "by": "desk"}}"#),
            true,
        );
        assert_eq!(r.status, 200, "{rule}: {}", r.body);
        let mut granted = 0;
        assert!(eventually(Duration::from_secs(5), || {
            granted += usize::from(b.get(path, &[("x-org-id", "acme")]).status == 200);
            granted > 0
        }));
        granted += admitted_until_refused(&[a, b], path, "acme", 4);
        assert_eq!(granted, 3, "{rule}: after the grant");
    }
}

#[test]
fn while_redis_is_down_a_reset_is_refused_and_changes_nothing() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let endpoint = format!("url: {}", redis.url());
    let cfg = config(
        &up,
        &format!("  admin_token: \"{TOKEN}\""),
        Some(&endpoint),
        120,
    );
    let gw = Gateway::start(&cfg);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    assert_eq!(admitted_until_refused(&[&gw], "/fixed/a", "acme", 3), 6);
    redis.kill();
    let r = post(
        gw.admin,
        "/api/tenants/acme/reset",
        r#"{"rule": "fixed"}"#,
        true,
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.body.contains("Redis did not take the reset"),
        "{}",
        r.body
    );
    assert!(r.body.contains("done for [] only"), "{}", r.body);
    // (Redis is down: on_failure counts alone, and the window was full)
    assert_eq!(gw.get("/fixed/a", &[("x-org-id", "acme")]).status, 429);
    assert!(gw.log().contains("Redis did not take it"), "{}", gw.log());
}
