//! Answers beyond reject (contract section 4): `shadowban` (a fake success, the upstream never
//! reached), `throttle` (proxied, the response body paced), `concurrency` (requests in
//! flight per partition) and priority shaping of a full pool by plan. Real gateway, real
//! example upstream with its `/delay/MS` and `/bytes/N` modes.

mod common;
use common::{metric_sum, one_route_config, request, Edit, Gateway, Upstream};
use std::time::{Duration, Instant};

const TENANT: &str = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n";

#[test]
fn shadowban_answers_its_own_reply_and_the_upstream_never_sees_the_excess() {
    let up = Upstream::start("u");
    let limits = "limits:\n  - id: scraper\n    pathPattern: /**\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 2 }]\n    action: shadowban\n    shadowban: { status: 200, body: '{\"items\":[]}', content_type: application/json }\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "  access_log: true")
    ));
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
    let before = up.hits();
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
    assert_eq!(up.hits(), before, "the upstream's hit count did not move");
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
    let limits = "limits:\n  - id: downloads\n    pathPattern: /**\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 1 }]\n    action: throttle\n    throttle: { rate: 512KiB/s }\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "")
    ));
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

/// Requests of `tenant` in flight at the gateway (its `concurrency` rule's count).
fn in_flight(gw: &Gateway, tenant: &str) -> u64 {
    request(gw.admin, "GET", &format!("/api/tenants/{tenant}"), &[])
        .map(|r| r.json()["in_flight"][0]["now"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

/// Requests in a shaped pool: in flight to it and waiting in its queue.
fn in_pool(gw: &Gateway) -> u64 {
    request(gw.admin, "GET", "/api/status", &[]).map_or(0, |r| {
        let s = &r.json()["pools"][0]["shaping"];
        s["in_flight"].as_u64().unwrap_or(0) + s["queue_depth"].as_u64().unwrap_or(0)
    })
}

/// Start requests one after another, each once the previous one is at the gateway or
/// answered: `at_gateway()` (requests counted there now) plus those already answered reach
/// `i + 1`.
fn in_order<T: Send + 'static>(
    n: usize,
    start: impl Fn(usize) -> std::thread::JoinHandle<T>,
    at_gateway: impl Fn() -> u64,
) -> Vec<std::thread::JoinHandle<T>> {
    let mut handles: Vec<std::thread::JoinHandle<T>> = Vec::with_capacity(n);
    for i in 0..n {
        handles.push(start(i));
        assert!(
            common::eventually(Duration::from_secs(5), || {
                let answered = handles.iter().filter(|h| h.is_finished()).count() as u64;
                at_gateway() + answered > i as u64
            }),
            "request {i} never reached the gateway"
        );
    }
    handles
}

/// `n` requests, each sent once the previous one holds its slot (or was answered); their
/// statuses in the order sent.
fn parallel(gw: &Gateway, path: &str, tenant: &str, n: usize) -> Vec<u16> {
    started(gw, path, tenant, n)
        .into_iter()
        .map(|h| h.join().unwrap_or(0))
        .collect()
}

fn started(gw: &Gateway, path: &str, tenant: &str, n: usize) -> Vec<std::thread::JoinHandle<u16>> {
    let addr = gw.addr;
    in_order(
        n,
        |_| {
            let (path, tenant) = (path.to_string(), tenant.to_string());
            std::thread::spawn(move || {
                request(addr, "GET", &path, &[("x-org-id", &tenant)]).map_or(0, |r| r.status)
            })
        },
        || in_flight(gw, tenant),
    )
}

#[test]
fn concurrency_limits_requests_in_flight_and_frees_the_slot_however_a_request_ends() {
    let up = Upstream::start("u");
    let dead = format!("127.0.0.1:{}", common::free_port());
    let cfg = one_route_config(up.addr, 2, "")
        .edit("    servers:", "    read_timeout: 1s\n    servers:")
        .edit(
            "routes:\n",
            &format!("  gone:\n    servers: [\"{dead}\"]\n    retries: 0\n  patient:\n    servers: [\"{}\"]\nroutes:\n  - id: broken\n    path: /broken/**\n    upstream: gone\n  - id: patient\n    path: /patient/**\n    upstream: patient\n", up.addr),
        );
    let limits = "limits:\n  - id: in-flight\n    pathPattern: /**\n    concurrency: 2\n";
    let gw = Gateway::start(&format!("{cfg}{TENANT}{limits}"));
    // two slow requests fill the tenant's slots; the third is refused at once; meanwhile the
    // operator sees them in the tenant lookup and the status
    let running = started(&gw, "/delay/800", "acme", 3);
    let t = request(gw.admin, "GET", "/api/tenants/acme", &[])
        .expect("lookup")
        .json();
    let s = request(gw.admin, "GET", "/api/status", &[])
        .expect("status")
        .json();
    let statuses: Vec<u16> = running.into_iter().map(|h| h.join().unwrap_or(0)).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    assert_eq!(t["in_flight"][0]["rule"], "in-flight", "{t}");
    assert_eq!(t["in_flight"][0]["now"], 2, "{t}");
    assert_eq!(t["in_flight"][0]["max"], 2, "{t}");
    let rule = &s["rules"].as_array().expect("rules")[0];
    assert_eq!(rule["concurrency"]["max"], 2, "{s}");
    assert_eq!(rule["concurrency"]["partitions_in_flight"], 1, "{s}");
    // another tenant has its own slots
    assert_eq!(parallel(&gw, "/delay/300", "globex", 2), vec![200, 200]);
    // a refusal says when to come back, under both names
    let addr = gw.addr;
    let slow: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                // (well inside the pool's read_timeout of 1 s, on a busy machine too)
                request(addr, "GET", "/delay/600", &[("x-org-id", "hooli")])
            })
        })
        .collect();
    assert!(common::eventually(Duration::from_secs(5), || in_flight(
        &gw, "hooli"
    ) == 2));
    let r = gw.get("/x", &[("x-org-id", "hooli")]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-ratelimit-retry-after"), Some("1"));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    for s in slow {
        assert_eq!(s.join().expect("thread").expect("answer").status, 200);
    }
    let m = gw.metrics();
    assert_eq!(
        metric_sum(&m, "tollgate_ratelimit_decisions_total{decision=\"denied\",rule=\"in-flight\",tier=\"concurrency\"}"),
        2.0,
        "{m}"
    );
    // both slots free: two requests in flight together are served (one leaked slot: a 429)
    let free = |why: &str| {
        assert!(
            common::eventually(Duration::from_secs(3), || parallel(
                &gw,
                "/delay/300",
                "acme",
                2
            ) == vec![200, 200]),
            "slots not freed after {why}"
        );
    };
    free("success");
    // the client goes away while the upstream is slow (10 s, no read timeout on that pool:
    // only the client's going frees the slots within the 3 s `free` waits)
    for _ in 0..2 {
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        use std::io::Write;
        s.write_all(b"GET /patient/delay/10000 HTTP/1.1\r\nhost: x\r\nx-org-id: acme\r\n\r\n")
            .unwrap();
        // gone once the request holds its slot
        assert!(common::eventually(Duration::from_secs(5), || in_flight(
            &gw, "acme"
        ) == 1));
        drop(s);
        assert!(common::eventually(Duration::from_secs(5), || in_flight(
            &gw, "acme"
        ) == 0));
    }
    free("client aborts");
    // the upstream fails, and the upstream times out (read_timeout 1s)
    assert_eq!(parallel(&gw, "/broken/x", "acme", 2), vec![502, 502]);
    free("upstream errors");
    assert_eq!(parallel(&gw, "/delay/1500", "acme", 2), vec![504, 504]);
    free("timeouts");
    // a request refused by the concurrency limit spends no slot either
    assert_eq!(parallel(&gw, "/delay/500", "acme", 3), vec![200, 200, 429]);
    free("a refusal");
}

/// Requests `(path, tenant)` to a shaped pool, each sent once the previous one is in the pool
/// (in flight or queued) or answered; their responses, when each ended and when it was sent.
fn staggered(gw: &Gateway, reqs: &[(&str, &str)]) -> Vec<(common::Response, Instant, Instant)> {
    let addr = gw.addr;
    in_order(
        reqs.len(),
        |i| {
            let (path, tenant) = (reqs[i].0.to_string(), reqs[i].1.to_string());
            std::thread::spawn(move || {
                let sent = Instant::now();
                let r = request(addr, "GET", &path, &[("x-org-id", &tenant)]).expect("answer");
                (r, Instant::now(), sent)
            })
        },
        || in_pool(gw),
    )
    .into_iter()
    .map(|h| h.join().expect("thread"))
    .collect()
}

#[test]
fn a_full_pool_serves_the_higher_plan_first_and_refuses_past_its_queue() {
    let up = Upstream::start("u");
    let shaped = |queue: &str| {
        one_route_config(up.addr, 2, "").edit(
            "    servers:",
            &format!("    max_in_flight: 1\n    queue: {queue}\n    servers:"),
        )
    };
    let plans = "plans:\n  premium: { tenants: [vip], priority: 10 }\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{plans}",
        shaped("{ max: 20, timeout: 10s }")
    ));
    // one request holds the pool; ten free ones queue behind it; then a premium one
    let mut reqs = vec![("/delay/600", "f0")];
    let free: Vec<String> = (1..=10).map(|i| format!("f{i}")).collect();
    for f in &free {
        reqs.push(("/delay/100", f));
    }
    reqs.push(("/delay/100", "vip"));
    let done = staggered(&gw, &reqs);
    assert!(done.iter().all(|(r, _, _)| r.status == 200));
    let vip = done[11].1;
    let before_vip: Vec<&str> = done[1..11]
        .iter()
        .zip(&free)
        .filter(|((_, t, _), _)| *t < vip)
        .map(|(_, f)| f.as_str())
        .collect();
    assert!(
        before_vip.is_empty(),
        "served before the premium request: {before_vip:?}"
    );
    let m = gw.metrics();
    for (series, want) in [
        (
            "tollgate_pool_queue_waits_total{plan=\"premium\",pool=\"app\"}",
            1.0,
        ),
        (
            "tollgate_pool_queue_waits_total{plan=\"none\",pool=\"app\"}",
            10.0,
        ),
    ] {
        assert_eq!(metric_sum(&m, series), want, "{series}\n{m}");
    }
    assert!(m.contains("tollgate_pool_queue_depth{pool=\"app\"}"), "{m}");
    drop(gw);

    // a queue of one, a 300 ms wait: the third is refused at once, the second after waiting
    let gw = Gateway::start(&format!(
        "{}{TENANT}{plans}",
        shaped("{ max: 1, timeout: 300ms }")
    ));
    let done = staggered(&gw, &[("/delay/1200", "a"), ("/x", "b"), ("/x", "c")]);
    assert_eq!(done[0].0.status, 200);
    for (r, _, _) in &done[1..] {
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    // each from when it was sent
    let (waited, full) = (done[1].1 - done[1].2, done[2].1 - done[2].2);
    assert!(
        full < waited,
        "the full queue answers at once ({full:?}), the wait at its timeout ({waited:?})"
    );
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    let m = gw.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_pool_queue_refused_total{pool=\"app\",reason=\"full\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_pool_queue_refused_total{pool=\"app\",reason=\"timeout\"}"
        ),
        1.0,
        "{m}"
    );
}

#[test]
fn a_reload_keeps_the_queue_and_a_raised_max_in_flight_lets_it_in() {
    let up = Upstream::start("u");
    let shaped = |max: usize| {
        format!(
            "{}{TENANT}",
            one_route_config(up.addr, 2, "").edit(
                "    servers:",
                &format!(
                    "    max_in_flight: {max}\n    queue: {{ max: 5, timeout: 10s }}\n    servers:"
                ),
            )
        )
    };
    let gw = Gateway::start(&shaped(1));
    let addr = gw.addr;
    let blocker = std::thread::spawn(move || {
        request(addr, "GET", "/delay/3000", &[("x-org-id", "a")])
            .map(|r| (r.status, Instant::now()))
    });
    assert!(common::eventually(Duration::from_secs(5), || in_pool(&gw) == 1));
    let queued = std::thread::spawn(move || {
        request(addr, "GET", "/x", &[("x-org-id", "b")]).map(|r| (r.status, Instant::now()))
    });
    assert!(common::eventually(Duration::from_secs(5), || in_pool(&gw) == 2));
    let status = request(gw.admin, "GET", "/api/status", &[])
        .expect("status")
        .json();
    let shaping = &status["pools"][0]["shaping"];
    assert_eq!(shaping["max_in_flight"], 1, "{status}");
    assert_eq!(shaping["in_flight"], 1, "{status}");
    assert_eq!(shaping["queue_depth"], 1, "{status}");
    assert!(gw.reload(&shaped(2)), "{}", gw.log());
    let (q_status, q_done) = queued.join().expect("thread").expect("answer");
    let (b_status, b_done) = blocker.join().expect("thread").expect("answer");
    assert_eq!((q_status, b_status), (200, 200));
    assert!(
        q_done < b_done,
        "the waiting request got in when the reload raised the limit"
    );
}

#[test]
fn the_strictest_answer_wins_and_over_limit_answers_spend_nothing() {
    let up = Upstream::start("u");
    let rule = |id: &str, path: &str, action: &str| {
        let extra = match action {
            "throttle" => "\n    throttle: { rate: 100MB/s }",
            _ => "",
        };
        format!("  - id: {id}\n    pathPattern: {path}\n    algorithm: token_bucket\n    tiers: [{{ period: 1h, threshold: 1 }}]\n    action: {action}{extra}\n")
    };
    let limits = format!(
        "limits:\n{}{}{}{}{}",
        rule("ban", "/a/**", "shadowban"),
        rule("slow", "/a/**", "throttle"),
        rule("hard", "/b/**", "reject"),
        rule("ban2", "/b/**", "shadowban"),
        rule("slow2", "/c/**", "throttle"),
    )
        + "  - id: cap\n    pathPattern: /c/**\n    algorithm: token_bucket\n    tiers: [{ period: 1h, threshold: 10 }]\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 1, "")
    ));
    let t = [("x-org-id", "t")];
    for path in ["/a/x", "/b/x", "/c/x"] {
        assert!(
            gw.get(path, &t).body.contains("\"server\""),
            "first request of {path} served"
        );
    }
    // shadowban over throttle: the made-up answer, not the upstream's
    let r = gw.get("/a/x", &t);
    assert_eq!((r.status, r.body.as_str()), (200, "{}"));
    // reject over shadowban
    assert_eq!(gw.get("/b/x", &t).status, 429);
    // throttled: proxied, not counted in the throttle rule's window, but counted in the
    // windows of the rules it is not over (it reached the upstream)
    for _ in 0..3 {
        assert!(gw.get("/c/x", &t).body.contains("\"server\""));
    }
    // which of them reached the upstream: the 3 first and the 3 throttled (what each rule
    // counted of them is asserted in-process: tests/admission.rs, same name)
    assert_eq!(up.hits(), 6);
    let m = gw.metrics();
    for (series, want) in [
        ("{decision=\"shadowbanned\",rule=\"ban\",tier=\"1h\"}", 1.0),
        ("{decision=\"denied\",rule=\"hard\",tier=\"1h\"}", 1.0),
        ("{decision=\"throttled\",rule=\"slow2\",tier=\"1h\"}", 3.0),
        ("{decision=\"allowed\",rule=\"cap\",tier=\"all\"}", 4.0),
    ] {
        let series = format!("tollgate_ratelimit_decisions_total{series}");
        assert_eq!(metric_sum(&m, &series), want, "{series}\n{m}");
    }
}

#[test]
fn check_shows_each_answer_and_limit() {
    let dir = common::TempDir::new();
    let cfg = one_route_config("127.0.0.1:9".parse().expect("addr"), 1, "")
        .replace("{LISTEN}", "127.0.0.1:1")
        .replace("{ADMIN}", "127.0.0.1:2")
        .edit(
            "    servers:",
            "    max_in_flight: 2\n    queue: { max: 10, timeout: 2s }\n    servers:",
        )
        + "plans:\n  premium: { tenants: [acme], priority: 10 }\n"
        + "limits:\n  - { id: scraping, pathPattern: /s/**, tiers: [{ period: 1m, threshold: 2 }], action: shadowban }\n  - { id: downloads, pathPattern: /f/**, tiers: [{ period: 1h, threshold: 1 }], action: throttle, throttle: { rate: 256KiB/s } }\n  - { id: exports, pathPattern: /e/**, concurrency: 1 }\n";
    let conf = dir.write("gateway.yaml", &cfg);
    let (code, out, err) = common::run_tollgate(&["-t", "-c", conf.to_str().expect("path")]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "max_in_flight 2 (queue 10, timeout 2s)",
        "premium (priority 10)",
        "shadowban (200 application/json)",
        "throttle to 262144 B/s",
        "concurrency 1",
    ] {
        assert!(out.contains(want), "{want:?} missing in:\n{out}");
    }
}

#[test]
fn requests_in_flight_survive_a_reload() {
    let up = Upstream::start("u");
    let cfg = |extra: &str| {
        format!(
            "{}{TENANT}limits:\n  - id: in-flight\n    pathPattern: /**\n    concurrency: 1\n{extra}",
            one_route_config(up.addr, 2, "")
        )
    };
    let gw = Gateway::start(&cfg(""));
    let addr = gw.addr;
    let slow = std::thread::spawn(move || {
        request(addr, "GET", "/delay/1500", &[("x-org-id", "acme")]).map(|r| r.status)
    });
    assert!(common::eventually(Duration::from_secs(5), || in_flight(
        &gw, "acme"
    ) == 1));
    // another rule comes; the concurrency rule stays: its request in flight still counts
    let other =
        "  - id: other\n    pathPattern: /o/**\n    tiers: [{ period: 1h, threshold: 9 }]\n";
    assert!(gw.reload(&cfg(other)), "{}", gw.log());
    assert_eq!(gw.get("/x", &[("x-org-id", "acme")]).status, 429);
    assert_eq!(slow.join().expect("thread").expect("answer"), 200);
    assert_eq!(
        gw.get("/x", &[("x-org-id", "acme")]).status,
        200,
        "freed after it ended"
    );
}

/// Decisions the gateway counted for `rule` (allowed or not).
fn decided(gw: &Gateway, rule: &str) -> f64 {
    let m = gw.metrics();
    ["allowed", "denied"]
        .iter()
        .map(|d| {
            metric_sum(
                &m,
                &format!("tollgate_ratelimit_decisions_total{{decision=\"{d}\",rule=\"{rule}\""),
            )
        })
        .sum()
}

/// Send a GET on a connection of its own once the gateway has decided every request before it
/// (so that the order of arrival is the order of sending); the stream is returned unread.
fn send_in_turn(gw: &Gateway, rule: &str, path: &str, tenant: &str) -> std::net::TcpStream {
    let before = decided(gw, rule);
    let mut s = std::net::TcpStream::connect(gw.addr).expect("connect");
    let raw = format!(
        "GET {path} HTTP/1.1\r\nhost: gw\r\nx-org-id: {tenant}\r\nconnection: close\r\n\r\n"
    );
    std::io::Write::write_all(&mut s, raw.as_bytes()).expect("send");
    assert!(
        common::eventually(Duration::from_secs(5), || decided(gw, rule) > before),
        "the gateway decided {path}"
    );
    s
}

fn read_answer(mut s: std::net::TcpStream) -> common::Response {
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut buf).expect("read");
    common::parse_response(&buf).expect("an HTTP answer")
}

/// docs/configuration.md "Leaky bucket": a burst of 20 leaves the gateway `period /
/// threshold` apart (50 ms; never sooner, on tokio's 1 ms timer), in the order it arrived,
/// through a real gateway to an upstream that notes when each request reaches it.
#[test]
fn a_leaky_bucket_lets_a_burst_leave_evenly_spaced_in_arrival_order() {
    let up = common::recording::RecordingUpstream::start();
    let limits = "limits:\n  - id: steady\n    pathPattern: /**\n    algorithm: leaky_bucket\n    tiers: [{ period: 1, threshold: 20 }]\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 2, "")
    ));
    // another tenant's request first: the gateway then holds a connection to the upstream, and
    // the burst's first request does not arrive a connect later than those after it (45 ms
    // after it instead of 50 once, on a busy machine)
    let warm = common::request(gw.addr, "GET", "/warm", &[("x-org-id", "warm")]);
    assert_eq!(warm.expect("warm-up").status, 200);
    let streams: Vec<_> = (0..20)
        .map(|i| send_in_turn(&gw, "steady", &format!("/seq/{i}"), "acme"))
        .collect();
    let answers: Vec<u16> = streams.into_iter().map(|s| read_answer(s).status).collect();
    assert!(answers.iter().all(|&s| s == 200), "{answers:?}");
    let arrivals: Vec<_> = up
        .arrivals()
        .into_iter()
        .filter(|(_, l)| l.contains("/seq/"))
        .collect();
    let order: Vec<String> = arrivals.iter().map(|(_, l)| l.clone()).collect();
    let expected: Vec<String> = (0..20).map(|i| format!("GET /seq/{i} HTTP/1.1")).collect();
    assert_eq!(order, expected, "in arrival order");
    let t0 = arrivals[0].0;
    let since: Vec<u128> = arrivals
        .iter()
        .map(|(t, _)| (*t - t0).as_millis())
        .collect();
    for (i, &ms) in since.iter().enumerate() {
        // each leaves at its turn, never sooner (a busy machine may make one late: the next
        // then leaves at its own turn, not 50 ms after the late one)
        assert!(
            ms + 2 >= 50 * i as u128,
            "request {i} after {ms} ms: {since:?}"
        );
    }
    let gaps: Vec<u128> = since.windows(2).map(|w| w[1] - w[0]).collect();
    let mut sorted = gaps.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    assert!(
        (45..=60).contains(&median),
        "median gap {median} ms: {gaps:?}"
    );
    assert!(
        since[19] <= 19 * 50 + 500,
        "the last left at {} ms: {since:?}",
        since[19]
    );
}

/// docs/configuration.md "Leaky bucket": a client that goes away while it waits for its turn
/// never reaches the upstream, and its turn goes back to the queue (it was the last one).
#[test]
fn a_client_that_leaves_the_queue_gives_its_turn_back() {
    let up = common::recording::RecordingUpstream::start();
    let limits = "limits:\n  - id: slow\n    pathPattern: /**\n    algorithm: leaky_bucket\n    queue: 5\n    tiers: [{ period: 2, threshold: 1 }]\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 2, "")
    ));
    let first = read_answer(send_in_turn(&gw, "slow", "/first", "acme"));
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-remaining"), Some("5"));
    // the second would wait 2 s: its client leaves
    let leaving = send_in_turn(&gw, "slow", "/leaving", "acme");
    drop(leaving);
    // the gateway notices (it watches the connection while the request waits): the next one
    // takes the same turn, with the same places left behind it
    assert!(common::eventually(Duration::from_secs(5), || metric_sum(
        &gw.metrics(),
        "tollgate_queue_left_total"
    ) == 1.0));
    let third = read_answer(send_in_turn(&gw, "slow", "/third", "acme"));
    assert_eq!(third.status, 200);
    assert_eq!(
        third.header("x-ratelimit-remaining"),
        Some("4"),
        "one waits (this one), not two"
    );
    let lines = up.request_lines();
    assert_eq!(
        lines,
        ["GET /first HTTP/1.1", "GET /third HTTP/1.1"],
        "{lines:?}"
    );
    assert_eq!(
        metric_sum(&gw.metrics(), "tollgate_queue_waited_total"),
        2.0
    );
}

/// The same over HTTP/2 (h2c): a client that gives up while its request waits for its turn
/// (curl's `--max-time`) resets its stream; the request leaves the queue and never reaches the
/// upstream.
#[test]
fn an_http2_client_that_gives_up_leaves_the_queue() {
    let up = common::recording::RecordingUpstream::start();
    let limits = "limits:\n  - id: slow\n    pathPattern: /**\n    algorithm: leaky_bucket\n    queue: 5\n    tiers: [{ period: 2, threshold: 1 }]\n";
    let gw = Gateway::start(&format!(
        "{}{TENANT}{limits}",
        one_route_config(up.addr, 2, "  h2c: true")
    ));
    let first = read_answer(send_in_turn(&gw, "slow", "/first", "acme"));
    assert_eq!(first.status, 200);
    let url = format!("http://{}/leaving", gw.addr);
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "--max-time",
            "0.5",
            "-H",
            "x-org-id: acme",
            &url,
        ])
        .output()
        .expect("curl");
    assert!(!out.status.success(), "curl gave up before the turn came");
    assert!(
        common::eventually(Duration::from_secs(5), || metric_sum(
            &gw.metrics(),
            "tollgate_queue_left_total"
        ) == 1.0),
        "the gateway saw the stream go"
    );
    let third = read_answer(send_in_turn(&gw, "slow", "/third", "acme"));
    assert_eq!(third.header("x-ratelimit-remaining"), Some("4"));
    assert_eq!(
        up.request_lines(),
        ["GET /first HTTP/1.1", "GET /third HTTP/1.1"]
    );
}
