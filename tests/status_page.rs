//! The operator's view (issue 12): `/api/tenants/<tenant>` in a fleet of two, `/api/status`,
//! the admin token, and the status page rendered by headless Chromium (Debian package
//! `chromium`, installed by `make test`), with a screenshot kept under `target/`.

mod common;

use common::browser::{Browser, CHROMIUM};
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMITS: &str = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\nlimits:\n  - id: per-org\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 4 }]\n";

/// A gateway whose admin listener wants a token, after one request of tenant `acme`.
fn with_admin_token(up: &Upstream) -> (Gateway, &'static str) {
    let token = "0123456789abcdef0123";
    let gw = Gateway::start(
        &(one_route_config(up.addr, 1, &format!("  admin_token: \"{token}\"")) + LIMITS),
    );
    gw.get("/x", &[("x-org-id", "acme")]);
    (gw, token)
}

fn api(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> Response {
    request(gw.admin, "GET", path, headers).expect("admin answers")
}

/// `LIMITS` with a period of about an hour whose window has `room_s` seconds left now (the
/// test's requests all fall in it): the config and the period.
fn limits_with_room(room_s: u64) -> (String, u64) {
    let p = period_with_room(3600, room_s);
    (LIMITS.edit("period: 1h", &format!("period: {p}")), p)
}

/// Two gateways sharing a Redis, with `LIMITS`' threshold set to `threshold` and a window
/// with room for the start-up and the test, and still a minute at its end.
fn fleet_of_two(threshold: u64) -> (RedisServer, Upstream, Gateway, Gateway) {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let (limits, _) = limits_with_room(120);
    let cfg = one_route_config(up.addr, 1, "")
        + &limits.edit("threshold: 4", &format!("threshold: {threshold}"))
        + &format!("redis:\n  url: {}\n  key_prefix: tg\n", redis.url());
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"));
    }
    (redis, up, a, b)
}

#[test]
fn tenant_lookup_in_a_fleet_of_two_shows_the_tenant_at_its_limit() {
    let (_redis, _up, a, b) = fleet_of_two(4);
    let mut admitted = 0;
    for i in 0..12 {
        let gw = if i % 2 == 0 { &a } else { &b };
        if gw.get("/x", &[("x-org-id", "acme")]).status == 200 {
            admitted += 1;
        }
        // pacing: requests alternate between the instances over time, as clients' would
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(admitted, 4);
    // both instances have heard the fleet's total
    assert!(eventually(Duration::from_secs(5), || {
        [&a, &b].iter().all(|gw| {
            let v = api(gw, "/api/tenants/acme", &[]).json();
            v["rules"][0]["tiers"][0]["fleet"]["total"] == 4
        })
    }));
    let v = api(&a, "/api/tenants/acme", &[]).json();
    println!("{}", serde_json::to_string_pretty(&v).unwrap());
    let tier = &v["rules"][0]["tiers"][0];
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["rules"][0]["rule"], "per-org");
    assert_eq!(tier["threshold"], 4);
    assert_eq!(tier["remaining"], 0, "{v}");
    assert!(tier["reset_ms"].as_u64().unwrap() > 60_000);
    assert_eq!(v["redis"]["state"], "connected");
    assert_eq!(v["redis"]["live_instances"], 2);
    let here = tier["fleet"]["this_instance"].as_u64().unwrap();
    let there = api(&b, "/api/tenants/acme", &[]).json()["rules"][0]["tiers"][0]["fleet"]
        ["this_instance"]
        .as_u64()
        .unwrap();
    assert_eq!(here + there, 4, "each instance's share of the fleet's 4");

    // looking a tenant up creates no counter
    let tracked = || metric_sum(&a.metrics(), "tollgate_tracked_counters");
    let before = tracked();
    // and a tenant nothing has counted, and no key or plan names, is not found
    let r = api(&a, "/api/tenants/nobody%20here", &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(tracked(), before);
    // and tenant ids never reach the metrics
    assert!(!a.metrics().contains("acme"));
}

#[test]
fn tenant_lookup_shows_the_fleets_view_far_from_the_limit_too() {
    // 100,000 an hour: far from it, each instance counts by plain increments (no lease)
    let (_redis, _up, a, b) = fleet_of_two(100_000);
    let fleet = |gw: &Gateway| {
        api(gw, "/api/tenants/acme", &[]).json()["rules"][0]["tiers"][0]["fleet"].clone()
    };
    // each instance hears the fleet's total from its next round's plain increment: 3 on a,
    // then 5 on b (8), then 1 more on a (9)
    for (gw, n, total) in [(&a, 3, 3), (&b, 5, 8), (&a, 1, 9)] {
        for _ in 0..n {
            assert_eq!(gw.get("/x", &[("x-org-id", "acme")]).status, 200);
        }
        assert!(
            eventually(Duration::from_secs(5), || fleet(gw)["total"] == total),
            "{}",
            fleet(gw)
        );
    }
    for (gw, n) in [(&a, 4), (&b, 5)] {
        let f = fleet(gw);
        assert_eq!(f["this_instance"], n, "{f}");
        assert_eq!(f["unsent"], 0, "{f}");
        assert_eq!(f["lease"], 0, "no lease far from the limit: {f}");
    }
}

#[test]
fn status_lists_pools_rules_rates_redis_and_the_last_reload() {
    let up = Upstream::start("u");
    // all of the test's requests in one window
    let (limits, p) = limits_with_room(30);
    let gw = Gateway::start_with_env(
        &(one_route_config(up.addr, 1, "") + &limits),
        &[FAST_SAMPLER],
    );
    for _ in 0..6 {
        gw.get("/x", &[("x-org-id", "acme")]);
    }
    let s = api(&gw, "/api/status", &[]).json();
    assert_eq!(s["listeners"][0]["addr"], gw.addr.to_string());
    assert_eq!(s["pools"][0]["name"], "app");
    assert_eq!(s["pools"][0]["servers"][0]["addr"], up.addr.to_string());
    assert_eq!(s["pools"][0]["servers"][0]["healthy"], true);
    assert_eq!(s["routes"][0]["id"], "all");
    assert_eq!(s["rules"][0]["id"], "per-org");
    assert_eq!(s["rules"][0]["tiers"][0], format!("4/{}", period_label(p)));
    assert_eq!(s["redis"]["state"], "not_configured");
    assert!(s["last_reload"].is_null());
    // denials after a sample of the counters (the sampler, every 20 ms here, sets the health
    // gauge right after each), within the samples kept: rates above zero once the next sample
    // is taken
    let healthy = format!(
        "tollgate_upstream_server_healthy{{pool=\"app\",server=\"{}\"}} 1",
        up.addr
    );
    assert!(eventually(Duration::from_secs(5), || gw
        .metrics()
        .contains(&healthy)));
    for _ in 0..4 {
        gw.get("/x", &[("x-org-id", "acme")]);
    }
    let denied = || {
        api(&gw, "/api/status", &[]).json()["rules"][0]["per_second"]["denied"]
            .as_f64()
            .unwrap()
    };
    assert!(
        eventually(Duration::from_secs(5), || denied() > 0.0),
        "{}",
        api(&gw, "/api/status", &[]).body
    );

    // a broken file on disk: the last reload says so, and the process stays ready
    std::fs::write(&gw.config, "server: [").unwrap();
    let pid = gw.child.id().to_string();
    Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        api(&gw, "/api/status", &[]).json()["last_reload"]["ok"] == false
    }));
    let s = api(&gw, "/api/status", &[]).json();
    let error = s["last_reload"]["error"].as_str().unwrap();
    assert!(error.contains("gateway.yaml:1:"), "{error}");
    let ready = api(&gw, "/readyz", &[]);
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["last_reload"], "failed");
}

#[test]
fn the_admin_token_guards_the_operator_endpoints_only() {
    let up = Upstream::start("u");
    let (gw, token) = with_admin_token(&up);
    for path in ["/", "/api/status", "/api/tenants/acme"] {
        let r = api(&gw, path, &[]);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r
            .header("www-authenticate")
            .is_some_and(|v| v.starts_with("Basic")));
        assert_eq!(
            api(
                &gw,
                path,
                &[("authorization", "Bearer wrong-token-0000000")]
            )
            .status,
            401
        );
        let bearer = format!("Bearer {token}");
        assert_eq!(
            api(&gw, path, &[("authorization", &bearer)]).status,
            200,
            "{path}"
        );
    }
    // a browser sends the token as the password of Basic authentication
    let basic = format!("Basic {}", base64(&format!("ops:{token}")));
    assert_eq!(
        api(&gw, "/api/status", &[("authorization", &basic)]).status,
        200
    );
    // probes and scrapers need none
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(api(&gw, path, &[]).status, 200, "{path}");
    }
}

fn base64(s: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Headless Chromium with `args`, its standard output.
fn chromium(dir: &Path, args: &[&str]) -> String {
    // bounded: a page that opened a dialog would otherwise hold the browser forever
    let out = Command::new("timeout")
        .args(["60", "chromium"])
        .args(CHROMIUM)
        .arg("--virtual-time-budget=4000")
        .arg(format!("--user-data-dir={}", dir.display()))
        .args(args)
        .output()
        .expect("chromium (Debian package chromium; make test installs it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_status_page_renders_in_a_browser_and_escapes_what_it_shows() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + LIMITS));
    let evil = "<script>document.title='owned'</script><img src=x onerror=alert(1)>";
    for _ in 0..5 {
        gw.get("/x", &[("x-org-id", evil)]);
    }
    let encoded: String = evil
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let url = format!("http://{}/#tenant={encoded}", gw.admin);
    let profile = TempDir::new();
    let dom = chromium(&profile.0, &["--dump-dom", &url]);
    // the page rendered the status: pools, rules, routes, from /api/status
    assert!(dom.contains("Tollgate"), "{dom}");
    assert!(
        dom.contains(&up.addr.to_string()),
        "pool server shown: {dom}"
    );
    assert!(dom.contains("per-org"), "rule shown: {dom}");
    assert!(dom.contains("4/1h"), "tiers shown: {dom}");
    assert!(dom.contains("healthy"), "{dom}");
    // the tenant lookup for the hostile id: shown as text, at its limit
    assert!(
        dom.contains("tenant &lt;script&gt;document.title='owned'&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"),
        "the id is text, escaped: {dom}"
    );
    assert!(
        !dom.contains("<img src=\"x\""),
        "no element injected: {dom}"
    );
    assert!(
        dom.contains("<title>Tollgate status</title>"),
        "title untouched: {dom}"
    );
    // it refreshes itself every 2 s: 4 s of the browser's virtual time see the first load and
    // at least one refresh
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(refreshes >= 2, "refreshes: {refreshes}");
    // screenshots for docs/operations.md and for people, on a laptop's screen and on a phone's
    let url = format!("http://{}/#tenant=acme", gw.admin);
    let png = screenshot(&url, "1280,1000", "target/status-page.png");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    assert!(png.len() > 10_000, "not a blank page: {} bytes", png.len());
    let png = screenshot(&url, "390,844", "target/status-page-phone.png");
    assert!(png.len() > 10_000, "not a blank page: {} bytes", png.len());
}

/// The page opened with the admin token in its URL (`http://admin:TOKEN@host/`, the way a
/// browser is given Basic credentials) renders the status: its requests go to the page's
/// origin without the credentials in the URL, which `fetch` refuses.
#[test]
fn the_status_page_works_with_the_token_in_its_url() {
    let up = Upstream::start("u");
    let (gw, token) = with_admin_token(&up);
    let profile = TempDir::new();
    let url = format!("http://admin:{token}@{}/#tenant=acme", gw.admin);
    let dom = chromium(&profile.0, &["--dump-dom", &url]);
    assert!(
        dom.contains(&up.addr.to_string()),
        "pool server shown: {dom}"
    );
    assert!(dom.contains("4/1h"), "tiers shown: {dom}");
    assert!(
        dom.contains("tenant acme"),
        "the tenant lookup shown: {dom}"
    );
}

/// A screenshot of `url` at `size` ("W,H"), kept at `file` (relative to the crate); its bytes.
fn screenshot(url: &str, size: &str, file: &str) -> Vec<u8> {
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    // an earlier run's picture must not pass for this one's
    let _ = std::fs::remove_file(&shot);
    let profile = TempDir::new();
    chromium(
        &profile.0,
        &[
            &format!("--window-size={size}"),
            &format!("--screenshot={}", shot.display()),
            url,
        ],
    );
    std::fs::read(&shot).expect("a screenshot")
}

#[test]
fn a_short_admin_token_is_a_config_error() {
    let dir = TempDir::new();
    let text = "server:\n  listen: [\"127.0.0.1:1\"]\n  admin: \"127.0.0.1:2\"\n  admin_token: \"short\"\nupstreams:\n  app:\n    servers: [\"127.0.0.1:3\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n";
    let f = dir.write("gateway.yaml", text);
    let (code, _, err) = run_tollgate(&["-t", "-c", f.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("gateway.yaml:4:16: server.admin_token: must be at least 16"),
        "{err}"
    );
}

/// Every metric the shipped Grafana dashboard queries exists in `/metrics` of a gateway with
/// Redis, a health-checked and shaped pool and a rule (histograms by their `_bucket`, `_sum`,
/// `_count`).
#[test]
fn the_grafana_dashboard_queries_only_metrics_that_exist() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = one_route_config(up.addr, 1, "").edit(
        &format!("    servers: [\"{}\"]\n", up.addr),
        &format!(
            "    servers: [\"{}\"]\n    health_check: {{ interval: 200ms }}\n    max_in_flight: 100\n    queue: {{ max: 10 }}\n",
            up.addr
        ),
    ) + LIMITS
        + &format!("redis:\n  url: {}\n", redis.url());
    let gw = Gateway::start_with_env(&cfg, &[FAST_SAMPLER]);
    assert!(wait_redis_state(&gw, "connected"));
    gw.get("/x", &[("x-org-id", "acme")]);
    // until the sampler (every 20 ms here) has set its gauges: the Redis link, the server's
    // health and the shaped pool's queue
    let healthy = format!(
        "tollgate_upstream_server_healthy{{pool=\"app\",server=\"{}\"}} 1",
        up.addr
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            let m = gw.metrics();
            m.contains("tollgate_redis_connected 1")
                && m.contains(&healthy)
                && m.contains("tollgate_pool_queue_depth{pool=\"app\"}")
        }),
        "{}",
        gw.metrics()
    );
    let metrics = gw.metrics();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ops/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let mut queried = std::collections::BTreeSet::new();
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            let mut rest = expr;
            while let Some(i) = rest.find("tollgate_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[i + name.len()..];
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|b| metrics.contains(&format!("# TYPE {b} histogram")))
                    .unwrap_or(&name)
                    .to_string();
                queried.insert(base);
            }
        }
    }
    for m in [
        "tollgate_redis_connected",
        "tollgate_upstream_server_healthy",
        "tollgate_ratelimit_decisions_total",
        "tollgate_redis_sync_duration_seconds",
        "tollgate_ratelimit_decision_duration_seconds",
        "tollgate_request_duration_seconds",
        "tollgate_pool_queue_depth",
        "tollgate_pool_queue_refused_total",
    ] {
        assert!(queried.contains(m), "the dashboard shows {m}");
    }
    // a labelled metric has no series before its first event (a token issuer's fetch, an
    // error reply): it is then registered (src/metrics.rs names it), if not yet in /metrics
    let registered =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs"))
            .unwrap_or_default();
    for name in &queried {
        assert!(
            metrics.contains(&format!("# TYPE {name} "))
                || registered.contains(&format!("\"{name}\"")),
            "{name} is queried but not in /metrics:\n{metrics}"
        );
    }
    assert!(metrics.contains("tollgate_redis_connected 1"), "{metrics}");
    assert!(metrics.contains(&healthy), "{metrics}");
}

#[test]
fn top_names_who_is_limited_now_from_bounded_memory() {
    let up = Upstream::start("u");
    // an hourly tier behind a 1 s one: the hour's denials are listed after the second rolled
    // (a period of about an hour whose window has room for the test)
    let p = period_with_room(3600, 60);
    let limits = LIMITS.edit(
        "tiers: [{ period: 1h, threshold: 4 }]",
        &format!("tiers: [{{ period: 1s, threshold: 1000 }}, {{ period: {p}, threshold: 4 }}]"),
    );
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + &limits));
    // "heavy" is denied 6 times, "medium" twice, "light" never; many others make 1 request
    for (tenant, n) in [("heavy", 10), ("medium", 6), ("light", 3)] {
        for _ in 0..n {
            gw.get("/x", &[("x-org-id", tenant)]);
        }
    }
    for i in 0..200 {
        gw.get("/x", &[("x-org-id", &format!("other-{i}"))]);
    }
    // until the 1 s window rolled: "heavy" has used none of the new one
    assert!(eventually(Duration::from_secs(3), || api(
        &gw,
        "/api/tenants/heavy",
        &[]
    )
    .json()["rules"][0]["tiers"][0]["used"]
        == 0));
    let t = api(&gw, "/api/top?rule=per-org&by=denied&n=5", &[]).json();
    let top = t["top"].as_array().unwrap();
    assert_eq!(top[0]["partition"], "heavy", "{t}");
    assert_eq!(top[0]["denied"], 6);
    assert_eq!(top[1]["partition"], "medium");
    assert_eq!(top[1]["denied"], 2);
    assert_eq!(top.len(), 2, "only those denied: {t}");
    let u = api(&gw, "/api/top?rule=per-org&by=usage", &[]).json();
    let names: Vec<&str> = u["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["partition"].as_str().unwrap())
        .collect();
    assert_eq!(&names[..3], ["heavy", "medium", "light"], "{u}");
    assert_eq!(u["top"][2]["usage"], 0.75);
    // bad questions get a 400 problem
    for q in [
        "",
        "?rule=nope",
        "?rule=per-org&by=size",
        "?rule=per-org&n=0",
    ] {
        let r = api(&gw, &format!("/api/top{q}"), &[]);
        assert_eq!(r.status, 400, "{q}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
}

/// The page's reset and grant buttons (issue 43): a support desk resets a tenant at its limit
/// and grants it more, with the admin token the browser was given.
#[test]
fn the_status_page_resets_and_grants_a_tenant() {
    let up = Upstream::start("u");
    let token = "0123456789abcdef0123";
    let (limits, _) = limits_with_room(120);
    let gw = Gateway::start(
        &(one_route_config(up.addr, 1, &format!("  admin_token: \"{token}\"")) + &limits),
    );
    let admitted = || {
        (0..10)
            .take_while(|_| gw.get("/x", &[("x-org-id", "acme")]).status == 200)
            .count()
    };
    assert_eq!(admitted(), 4);
    let mut page = Browser::open(&format!("http://admin:{token}@{}/#tenant=acme", gw.admin));
    assert!(page.until(r#"document.querySelector('button[data-action="reset"]') !== null"#));
    // the page asks before it acts: the test answers its dialogs
    page.eval(r#"window.confirm = () => true; window.prompt = () => "3"; document.querySelector('button[data-action="reset"]').click(); true"#);
    assert!(
        page.until(r#"document.getElementById("tenant-action").textContent === "reset of per-org done, on this instance""#),
        "{}",
        page.eval(r#"document.getElementById("tenant-action").textContent"#)
    );
    assert_eq!(admitted(), 4);
    page.eval(r#"document.querySelector('button[data-action="grant"]').click(); true"#);
    assert!(
        page.until(r#"document.getElementById("tenant-action").textContent === "grant of per-org (3) done, on this instance""#),
        "{}",
        page.eval(r#"document.getElementById("tenant-action").textContent"#)
    );
    // the lookup shows the grant
    assert!(page.until(r#"document.getElementById("tenant-result").textContent.includes("+3")"#));
    assert_eq!(admitted(), 3);
    assert!(gw.log().contains("by status page"), "{}", gw.log());
}

/// `/api/status` tells each rule whole (issue 45): its tiers with a calendar window in words and
/// its zone, each plan's own tiers, what a request costs, who is exempt, its algorithm and what
/// its action does; a tenant's view names a calendar window (`1 day in America/New_York`), not
/// 24 hours; the page (in headless Chromium) shows all of it.
#[test]
fn status_tells_every_rule_whole_and_calendar_windows_by_name() {
    let up = Upstream::start("u");
    let cfg = one_route_config(up.addr, 1, "")
        + r#"tenant:
  from: [{ header: x-org-id, trusted: true }]
plans:
  gold: [acme]
limits:
  - id: daily
    pathPattern: /**
    calendar: { tz: America/New_York }
    tiers: [{ period: 1d, threshold: 10 }]
    plans:
      gold: [{ period: 1d, threshold: 100 }]
    cost: 2
    exempt: { tenants: [ops] }
"#;
    let gw = Gateway::start(&cfg);
    assert_eq!(gw.get("/x", &[("x-org-id", "initech")]).status, 200);
    let status = request(gw.admin, "GET", "/api/status", &[]).unwrap().json();
    let rule = &status["rules"][0];
    assert_eq!(rule["tiers"][0], "10/1 day in America/New_York", "{rule}");
    assert_eq!(
        rule["plans"]["gold"], "100/1 day in America/New_York",
        "{rule}"
    );
    assert_eq!(rule["algorithm"], "fixed_window", "{rule}");
    assert_eq!(rule["action"], "reject", "{rule}");
    assert_eq!(rule["action_detail"], "reject with 429", "{rule}");
    assert_eq!(rule["charge"], "cost 2", "{rule}");
    assert_eq!(rule["exempt"], "exempt: tenants [ops]", "{rule}");
    let tenant = request(gw.admin, "GET", "/api/tenants/initech", &[])
        .unwrap()
        .json();
    let tier = &tenant["rules"][0]["tiers"][0];
    assert_eq!(tier["window"], "1 day in America/New_York", "{tenant}");
    assert_eq!(tier["used"], 2, "{tenant}");
    let mut page = Browser::open(&format!("http://{}/#tenant=initech", gw.admin));
    let rules = r#"document.getElementById("rules").textContent"#;
    assert!(
        page.until(&format!(
            "{rules}.includes('daily* /**tenantfixed_window10/1 day in America/New_York; plan gold: 100/1 day in America/New_York; cost 2; exempt: tenants [ops]reject with 429')"
        )),
        "{}",
        page.eval(rules)
    );
    let lookup = r#"document.getElementById("tenant-result").textContent"#;
    assert!(
        page.until(&format!(
            "{lookup}.includes('daily1 day in America/New_York10')"
        )),
        "{}",
        page.eval(lookup)
    );
}
