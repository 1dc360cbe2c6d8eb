//! Counting by outcome through real processes (docs/configuration.md "Counting by outcome"): a
//! `count_when` rule checks before forwarding and counts a request once its answer's status
//! is known. The example upstream answers `/status/NNN` with that status, and `/usage/N` with
//! `x-usage-tokens: N` (a cost the answer carries, docs/configuration.md "Cost from the
//! answer"). The rules themselves are tested in-process in `tests/admission.rs`, their bounds
//! fleet-wide in `tests/fleet_sim.rs`. Also costs in units, on one gateway and on two sharing
//! Redis, and late charges on two sharing Redis.

mod common;
use common::{
    eventually, metric_sum, one_route_config, period_with_room, wait_redis_state, Edit, Gateway,
    RedisServer, Upstream,
};
use std::time::Duration;

const TENANT: &str = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n";

fn rule(period_s: u64, threshold: u64) -> String {
    format!(
        "limits:\n  - id: failures\n    pathPattern: /**\n    tiers: [{{ period: {period_s}, threshold: {threshold} }}]\n    count_when: {{ status: [401, 5xx] }}\n"
    )
}

/// Send `path` to `a`, then `b`, and again, until both refuse (429); returns the units charged:
/// `units` for each answer with status `charged`.
fn alternate_until_both_refuse(
    a: &Gateway,
    b: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    (charged, units): (u16, i64),
) -> i64 {
    let mut total = 0;
    let mut send = |gw: &Gateway| {
        let status = gw.get(path, headers).status;
        if status == charged {
            total += units;
        }
        status
    };
    assert!(eventually(Duration::from_secs(10), || {
        let (sa, sb) = (send(a), send(b));
        sa == 429 && sb == 429
    }));
    total
}

/// The count Redis holds for tenant acme's rule `rule` (its one window key).
fn count_in(redis: &RedisServer, rule: &str) -> Option<i64> {
    redis
        .counter_keys(&format!("tg:{{acme}}:{rule}:*"))
        .first()
        .map(|k| redis.int(&["GET", k]))
}

#[test]
fn only_the_statuses_named_are_counted_and_the_next_request_is_refused() {
    let up = Upstream::start("u");
    // and a route to a pool nobody listens on: the gateway's own 502
    let dead = format!("127.0.0.1:{}", common::free_port());
    let cfg = one_route_config(up.addr, 1, "").edit(
        "routes:\n",
        &format!("  gone:\n    servers: [\"{dead}\"]\n    retries: 0\nroutes:\n  - id: broken\n    path: /broken/**\n    upstream: gone\n"),
    );
    let gw = Gateway::start(&format!(
        "{cfg}{TENANT}{}",
        rule(period_with_room(3600, 20), 3)
    ));
    let t = [("x-org-id", "acme")];
    // successes and other failures are never counted: far more than 3 pass
    for (path, status) in [("/x", 200), ("/status/404", 404), ("/status/403", 403)].repeat(4) {
        assert_eq!(
            gw.get(path, &t).status,
            status,
            "{path}: nothing is counted yet"
        );
    }
    // three counted answers (each counted once its answer has gone)
    for (path, status) in [
        ("/status/401", 401),
        ("/status/503", 503),
        ("/status/500", 500),
    ] {
        assert_eq!(gw.get(path, &t).status, status);
    }
    // the quota is full: refused before the upstream, whatever the path
    assert!(eventually(Duration::from_secs(3), || gw
        .get("/x", &t)
        .status
        == 429));
    let r = gw.get("/status/401", &t);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // another tenant is untouched
    assert_eq!(gw.get("/x", &[("x-org-id", "globex")]).status, 200);
    let m = gw.metrics();
    assert!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total{decision=\"denied\",rule=\"failures\""
        ) >= 2.0,
        "{m}"
    );
}

/// docs/configuration.md "Cost per request", through the real gateway: a constant cost and a
/// cost from a request header, in units; over `max` is 400 and reaches no upstream.
#[test]
fn a_request_takes_its_cost_in_units_through_the_gateway() {
    let up = Upstream::start("u");
    // long token buckets: no unit comes back during the test
    let limits = "limits:\n  - id: exports\n    pathPattern: /export/**\n    algorithm: token_bucket\n    cost: 40\n    tiers: [{ period: 1h, threshold: 100 }]\n  - id: tokens\n    pathPattern: /llm/**\n    algorithm: token_bucket\n    cost: { header: x-tokens, max: 500 }\n    tiers: [{ period: 1h, threshold: 1000 }]\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "")
    ));
    let t = |extra: &'static [(&'static str, &'static str)]| {
        let mut h = vec![("x-org-id", "acme")];
        h.extend_from_slice(extra);
        h
    };
    let r = gw.get("/export/a", &t(&[]));
    assert_eq!(
        (r.status, r.header("x-ratelimit-remaining")),
        (200, Some("60"))
    );
    assert_eq!(gw.get("/export/a", &t(&[])).status, 200);
    assert_eq!(gw.get("/export/a", &t(&[])).status, 429, "80 + 40 > 100");
    let r = gw.get("/llm/chat", &t(&[("x-tokens", "400")]));
    assert_eq!(
        (r.status, r.header("x-ratelimit-remaining")),
        (200, Some("600"))
    );
    let r = gw.get("/llm/chat", &t(&[("x-tokens", "501")]));
    assert_eq!(r.status, 400);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let r = gw.get("/llm/chat", &t(&[]));
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("599"),
        "no header: 1"
    );
}

/// Costs across a fleet: two gateways sharing Redis count units; Redis holds exactly the units
/// admitted, and the fleet stops within its bound in units (docs/fleet.md "The bound": past the
/// threshold by at most one request on credit per instance, here 30 units each).
#[test]
fn a_fleet_counts_costs_in_units() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let period = period_with_room(3600, 30);
    let cfg = format!(
        "{}{TENANT}limits:\n  - id: tokens\n    pathPattern: /**\n    cost: {{ header: x-tokens, max: 50 }}\n    tiers: [{{ period: {period}, threshold: 100 }}]\nredis:\n  url: {}\n  key_prefix: tg\n  sync_interval: 50ms\n",
        one_route_config(up.addr, 1, ""),
        redis.url()
    );
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"));
    }
    let headers = [("x-org-id", "acme"), ("x-tokens", "30")];
    let used = alternate_until_both_refuse(&a, &b, "/llm", &headers, (200, 30));
    assert!((90..=160).contains(&used), "admitted {used} units of 100");
    let key = || count_in(&redis, "tokens");
    assert!(
        eventually(Duration::from_secs(5), || key() == Some(used)),
        "Redis {:?}, admitted {used}",
        key()
    );
    // the refusals took nothing
    assert_eq!(a.get("/llm", &headers).status, 429);
    assert!(eventually(Duration::from_secs(3), || key() == Some(used)));
}

/// docs/configuration.md "Quota headers", units: a tokens rule charged from the answer beside
/// a requests rule on one route, through the real gateway. `RateLimit` tells each unit's most
/// restrictive tier in its own terms (requests first), `x-ratelimit-*` the requests tier; a
/// denial by tokens tells the violated tier alone, with nothing left.
#[test]
fn the_quota_headers_tell_each_unit_in_its_own_terms() {
    let up = Upstream::start("u");
    let period = period_with_room(3600, 20);
    let gw = Gateway::start(&format!(
        "{}{TENANT}limits:\n  - id: calls\n    pathPattern: /v1/**\n    tiers: [{{ period: {period}, threshold: 10 }}]\n  - id: tokens\n    pathPattern: /v1/**\n    unit: tokens\n    cost: {{ response_header: x-usage-tokens, default: 50 }}\n    tiers: [{{ period: {period}, threshold: 1000 }}]\n",
        one_route_config(up.addr, 1, "")
    ));
    let t = [("x-org-id", "acme")];
    let items = |r: &common::Response| -> Vec<String> {
        let v = r.header("ratelimit").unwrap_or("").to_string();
        v.split(", ").map(str::to_string).collect()
    };
    // 9 requests left, 600 tokens: fewer requests, yet both are told, each in its own unit
    let r = gw.get("/v1/chat/usage/400", &t);
    assert_eq!(r.status, 200);
    let rl = items(&r);
    assert_eq!(rl.len(), 2, "{rl:?}");
    assert!(
        rl[0].starts_with("\"calls/") && rl[0].contains(";r=9;"),
        "{rl:?}"
    );
    assert!(
        rl[1].starts_with("\"tokens/") && rl[1].contains(";r=600;"),
        "{rl:?}"
    );
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
    let policy = r.header("ratelimit-policy").unwrap_or("");
    assert!(
        policy.contains(";q=1000;") && policy.contains("qu=\"tokens\""),
        "{policy}"
    );
    // fewer tokens left than requests: the order stays, requests first
    let r = gw.get("/v1/chat/usage/595", &t);
    let rl = items(&r);
    assert!(rl[0].contains(";r=8;") && rl[1].contains(";r=5;"), "{rl:?}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("8"));
    // 700 more charged (admitted: 5 tokens left), then the next is refused by tokens
    assert_eq!(gw.get("/v1/chat/usage/700", &t).status, 200);
    let r = gw.get("/v1/chat/usage/1", &t);
    assert_eq!(r.status, 429);
    let rl = items(&r);
    assert_eq!(rl.len(), 1, "{rl:?}");
    assert!(
        rl[0].starts_with("\"tokens/") && rl[0].contains(";r=0;"),
        "{rl:?}"
    );
    assert_eq!(r.header("x-ratelimit-limit"), Some("1000"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(up.hits(), 3);
}

/// docs/configuration.md "Cost from the answer", through the real gateway: admitted while the
/// window has room, charged what the answer's `x-usage-tokens` says (its quota headers show
/// it), an answer without it costs `default`, and past the threshold by the one in flight the
/// next is refused.
#[test]
fn a_cost_from_the_answer_is_charged_through_the_gateway() {
    let up = Upstream::start("u");
    let period = period_with_room(3600, 20);
    // and a route to a pool nobody listens on: the gateway's own 502
    let dead = format!("127.0.0.1:{}", common::free_port());
    let cfg = one_route_config(up.addr, 1, "").edit(
        "routes:\n",
        &format!("  gone:\n    servers: [\"{dead}\"]\n    retries: 0\nroutes:\n  - id: broken\n    path: /v1/broken/**\n    upstream: gone\n"),
    );
    let gw = Gateway::start(&format!(
        "{cfg}{TENANT}limits:\n  - id: tokens\n    pathPattern: /v1/**\n    cost: {{ response_header: x-usage-tokens, default: 50 }}\n    tiers: [{{ period: {period}, threshold: 1000 }}]\n"
    ));
    let t = [("x-org-id", "acme")];
    let r = gw.get("/v1/chat/usage/400", &t);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-usage-tokens"),
        Some("400"),
        "the client sees it too"
    );
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("600"),
        "the charge shown"
    );
    let r = gw.get("/v1/chat", &t);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("550"),
        "no header: default, 50"
    );
    // the gateway's own answer (no server answers) costs the default too
    assert_eq!(gw.get("/v1/broken/x", &t).status, 502);
    let r = gw.get("/v1/chat/usage/0", &t);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("450"),
        "502: 50, then 0: 50"
    );
    let r = gw.get("/v1/chat/usage/900", &t);
    assert_eq!(r.status, 200, "admitted: the window had room");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let r = gw.get("/v1/chat/usage/1", &t);
    assert_eq!(
        r.status, 429,
        "1450 of 1000 charged: refused until the window ends"
    );
    assert!(r.header("retry-after").is_some());
    assert_eq!(up.hits(), 4);
}

/// Late charges across a fleet (docs/fleet.md "Late charges"): two gateways sharing Redis,
/// one rule counting 5xx answers and one charging what the answers carry. Redis holds exactly
/// what was charged, and both gateways refuse once the fleet's count is full.
#[test]
fn a_fleet_takes_late_charges() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let period = period_with_room(3600, 30);
    let cfg = format!(
        "{}{TENANT}limits:\n  - id: errors\n    pathPattern: /status/**\n    count_when: {{ status: [5xx] }}\n    tiers: [{{ period: {period}, threshold: 6 }}]\n  - id: tokens\n    pathPattern: /v1/**\n    cost: {{ response_header: x-usage-tokens }}\n    tiers: [{{ period: {period}, threshold: 100 }}]\nredis:\n  url: {}\n  key_prefix: tg\n  sync_interval: 50ms\n",
        one_route_config(up.addr, 1, ""),
        redis.url()
    );
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"));
    }
    let t = [("x-org-id", "acme")];
    let key = |rule: &str| count_in(&redis, rule);
    // successes are not counted
    for (n, gw) in [&a, &b].into_iter().enumerate() {
        for i in 0..4 {
            let r = gw.get("/status/200", &t);
            assert_eq!(
                r.status,
                200,
                "gateway {n}, request {i}: {:?}\nA:\n{}\nB:\n{}",
                r.headers,
                a.log(),
                b.log()
            );
        }
    }
    // 5xx answers are, alternating, until both gateways refuse (even an answer that would
    // have succeeded); under 100, within one request per instance of the threshold
    let counted = alternate_until_both_refuse(&a, &b, "/status/503", &t, (503, 1));
    assert!((4..=8).contains(&counted), "counted {counted}");
    assert!(
        eventually(Duration::from_secs(5), || key("errors") == Some(counted)),
        "Redis holds {:?}, counted {counted}",
        key("errors")
    );
    for gw in [&a, &b] {
        assert_eq!(gw.get("/status/200", &t).status, 429);
    }
    // the answers' costs: 30 a request, alternating, until both refuse
    // past 100 by at most what was in flight when each instance's share filled (one request
    // each here: they go one at a time)
    let used = alternate_until_both_refuse(&a, &b, "/v1/usage/30", &t, (200, 30));
    assert!((90..=160).contains(&used), "charged {used} of 100");
    assert!(
        eventually(Duration::from_secs(5), || key("tokens") == Some(used)),
        "Redis {:?}, charged {used}",
        key("tokens")
    );
}

/// README "Quotas": the config block there, run as written, does what the README says of it.
#[test]
fn the_readmes_quota_examples_hold() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## Quotas\n")
        .nth(1)
        .expect("a Quotas section");
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its yaml block");
    let up = Upstream::start("u");
    let gw = Gateway::start(&format!(
        "{}{TENANT}{block}",
        one_route_config(up.addr, 1, "  quota_endpoint: /quota")
    ));
    let t = [("x-org-id", "acme")];
    // the block's windows are a minute and an hour, aligned to the epoch: start with ten
    // seconds of both left, so that none ends during the test
    assert!(eventually(Duration::from_secs(15), || {
        let ms = common::now_ms();
        ms % 60_000 < 50_000 && ms % 3_600_000 < 3_590_000
    }));
    // tokens: admitted while there is room, charged what the answer says, shown at once
    let r = gw.get("/v1/chat/usage/40000", &t);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("60000"));
    let policy = r.header("ratelimit-policy").unwrap_or_default();
    assert!(
        policy.contains("\"llm-tokens/1m\";q=100000;w=60;qu=\"tokens\""),
        "{policy}"
    );
    // the month: a calendar window, no one length (`w` left out)
    assert!(
        policy.contains("\"llm-tokens/1mo\";q=20000000;qu=\"tokens\""),
        "{policy}"
    );
    let r = gw.get("/v1/chat", &t);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("59500"),
        "500 without it"
    );
    let r = gw.get("/v1/chat/usage/70000", &t);
    assert_eq!(r.status, 200, "room for it when admitted");
    assert_eq!(gw.get("/v1/chat/usage/1", &t).status, 429);
    // the month counts down to midnight on the 1st in Berlin (as `date` has it)
    let berlin = |args: &[&str]| {
        let out = std::process::Command::new("date")
            .env("TZ", "Europe/Berlin")
            .args(args)
            .output()
            .expect("date");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let first = berlin(&["+%Y-%m-01"]);
    let end_s: u64 = berlin(&["-d", &format!("{first} +1 month"), "+%s"])
        .parse()
        .expect("seconds");
    let q = gw.get("/quota?path=/v1/chat", &t).json();
    let month = &q["rules"][0]["tiers"][1];
    assert_eq!(month["policy"], "llm-tokens/1mo", "{q}");
    assert_eq!(month["used"], 110_500, "{q}");
    let left = end_s - common::now_ms() / 1000;
    let reset = month["reset"].as_u64().expect("a reset");
    assert!(
        reset.abs_diff(left) <= 2,
        "reset {reset}, {left} s to the 1st"
    );
    // failed logins: successes never count; ten 401s fill the hour; the 11th is refused
    let login = |status: &str| gw.get("/login", &[("x-answer-status", status)]).status;
    for _ in 0..20 {
        assert_eq!(login("200"), 200);
    }
    for _ in 0..10 {
        assert_eq!(login("401"), 401);
    }
    let hits = up.hits();
    assert_eq!(login("200"), 429);
    assert_eq!(up.hits(), hits, "refused before the upstream sees it");
    // exports: 50 units each, 500 an hour: ten, then refused whole
    for i in 0..10 {
        assert_eq!(gw.get("/export/x", &t).status, 200, "export {i}");
    }
    let r = gw.get("/export/x", &t);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
}

/// docs/configuration.md "Calendar windows", with Redis: a month in Berlin is counted under a
/// key that carries its real start and end (midnight on the 1st, Berlin time, as `date`
/// computes it), which expires after its end, and the quota headers count down to that end.
#[test]
fn a_calendar_months_redis_key_carries_its_real_start_and_end() {
    let date = |args: &[&str]| -> u64 {
        let out = std::process::Command::new("date")
            .env("TZ", "Europe/Berlin")
            .args(args)
            .output()
            .expect("date");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("seconds")
    };
    let month = std::process::Command::new("date")
        .env("TZ", "Europe/Berlin")
        .arg("+%Y-%m-01")
        .output()
        .expect("date");
    let first = String::from_utf8_lossy(&month.stdout).trim().to_string();
    let start = date(&["-d", &format!("{first} 00:00"), "+%s"]) * 1000;
    let end = date(&["-d", &format!("{first} +1 month"), "+%s"]) * 1000;
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let gw = Gateway::start(&format!(
        "{}{TENANT}limits:\n  - id: monthly\n    pathPattern: /**\n    calendar: {{ tz: Europe/Berlin }}\n    tiers: [{{ period: 1mo, threshold: 1000000 }}]\nredis:\n  url: {}\n  key_prefix: tg\n  sync_interval: 50ms\n",
        one_route_config(up.addr, 1, ""),
        redis.url()
    ));
    assert!(wait_redis_state(&gw, "connected"));
    let r = gw.get("/x", &[("x-org-id", "acme")]);
    assert_eq!(r.status, 200);
    let reset: u64 = r
        .header("x-ratelimit-reset")
        .and_then(|v| v.parse().ok())
        .expect("a reset");
    let left = (end - common::now_ms()) / 1000;
    assert!(
        reset.abs_diff(left) <= 2,
        "reset {reset}, {left} s to the 1st"
    );
    let key = format!("tg:{{acme}}:monthly:{start}:{end}");
    assert!(
        eventually(Duration::from_secs(5), || redis.keys("tg:*").contains(&key)),
        "{:?}, expected {key}",
        redis.keys("tg:*")
    );
    assert_eq!(redis.int(&["GET", &key]), 1);
    let expire_at = redis.int(&["PEXPIRETIME", &key]) as u64;
    assert!(
        (end..=end + 60_000).contains(&expire_at),
        "expires at {expire_at}, the window ends at {end}"
    );
}

/// A charge on its way survives a reload, as counts do (docs/configuration.md "Cost from the
/// answer"): a
/// request admitted under one config and answered after a reload that keeps the rule's periods
/// is charged to the counter the new config uses.
#[test]
fn a_charge_on_its_way_survives_a_reload() {
    let up = Upstream::start("u");
    let period = period_with_room(3600, 20);
    let cfg = |threshold: u64| {
        format!(
            "{}{TENANT}limits:\n  - id: tokens\n    pathPattern: /v1/**\n    cost: {{ response_header: x-usage-tokens }}\n    tiers: [{{ period: {period}, threshold: {threshold} }}]\n  - id: in-flight\n    pathPattern: /v1/**\n    concurrency: 10\n",
            one_route_config(up.addr, 1, "")
        )
    };
    let gw = Gateway::start(&cfg(1000));
    let in_flight = || {
        common::request(gw.admin, "GET", "/api/tenants/acme", &[])
            .map(|r| r.json()["in_flight"][0]["now"].as_u64().unwrap_or(0))
            .unwrap_or(0)
    };
    let addr = gw.addr;
    let slow = std::thread::spawn(move || {
        common::request(
            addr,
            "GET",
            "/v1/delay/1500/usage/300",
            &[("x-org-id", "acme")],
        )
        .map(|r| r.status)
    });
    assert!(eventually(Duration::from_secs(5), || in_flight() == 1));
    // the threshold changes, the period stays: counts are kept
    assert!(gw.reload(&cfg(2000)));
    assert_eq!(slow.join().expect("the request").ok(), Some(200));
    // the new config's counter has the charge: 2000 - 300 (- 1 for this request's check)
    let r = gw.get("/v1/x", &[("x-org-id", "acme")]);
    assert_eq!(r.header("x-ratelimit-limit"), Some("2000"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1699"));
}
