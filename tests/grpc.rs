//! gRPC through the gateway (issue 39), with a real grpcio server and client from PyPI
//! (`tests/grpc/peer.py`, `tests/grpc/client.py`, in `target/test-venv`: `make deps-test`):
//! the four RPC kinds, metadata both ways, trailers, deadlines, the answers the gateway makes
//! as gRPC statuses, limits on methods, `count_when.grpc_status`, a cost from the trailers,
//! a stream under reload and under the limits meant for plain requests.

mod common;

use common::Gateway;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::grpc::{repo as root, Peer};

/// Run the grpcio client on `spec`: one result per call.
fn run(spec: Value) -> Vec<Value> {
    common::grpc::run(&spec)
}

/// The calls in `calls`, over h2c to `target`.
fn calls(target: SocketAddr, calls: Value) -> Vec<Value> {
    run(json!({ "target": target.to_string(), "calls": calls }))
}

/// One call.
fn call(target: SocketAddr, c: Value) -> Value {
    calls(target, json!([c])).remove(0)
}

/// A gateway speaking h2c, its one pool `grpc` (h2c) on `peer`, routes and the rest in `tail`
/// (`routes` default to one catch-all), tenants from `x-api-key` metadata or `x-org-id`.
fn config(peer: SocketAddr, server_extra: &str, pool_extra: &str, tail: &str) -> String {
    let routes = if tail.contains("routes:") {
        ""
    } else {
        "routes:\n  - id: all\n    path: /**\n    upstream: grpc\n"
    };
    // an hour's window with room for the test: none of its counts crosses an edge
    let tail = tail.replace(
        "period: 1h",
        &format!("period: {}", common::period_with_room(3600, 60)),
    );
    format!(
        "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: 2\n  h2c: true\n{server_extra}upstreams:\n  grpc:\n    servers: [\"{peer}\"]\n    protocol: h2c\n{pool_extra}{routes}tenant:\n  from:\n    - api_key: {{ header: x-api-key, keys: {{ \"k-acme\": acme }} }}\n    - header: x-org-id\n      trusted: true\n  required: false\n{tail}"
    )
}

fn metrics_line(gw: &Gateway, series: &str) -> f64 {
    common::metric_sum(&gw.metrics(), series)
}

#[test]
fn the_four_kinds_of_call_pass_with_metadata_and_trailers_over_h2c_and_tls() {
    let peer = Peer::start_with(&[]);
    let tls_port = common::free_port();
    let demo = root().join("target/demo-tls");
    let listen = format!(
        "  listen:\n    - \"{{LISTEN}}\"\n    - addr: \"127.0.0.1:{tls_port}\"\n      tls: {{ cert: {}, key: {} }}\n",
        demo.join("localhost.pem").display(),
        demo.join("localhost.key").display()
    );
    let cfg = config(peer.addr, "", "", "")
        .replace("  listen: [\"{LISTEN}\"]\n", &listen)
        .replace("  h2c: true\n", "  h2c: true\n  access_log: true\n");
    let gw = Gateway::start(&cfg);
    let kinds = json!([
        {"method": "/test.Echo/Unary", "messages": ["hello"],
         "metadata": [["x-echo-one", "1"], ["x-usage", "7"]], "timeout": 10},
        {"method": "/test.Echo/ServerStream", "kind": "server_stream",
         "metadata": [["x-count", "4"]]},
        {"method": "/test.Echo/ClientStream", "kind": "client_stream",
         "messages": ["a", "b", "c"]},
        {"method": "/test.Echo/Bidi", "kind": "bidi", "messages": ["x", "y"]},
        {"method": "/test.Echo/Unary", "metadata": [["x-status", "9"], ["x-message", "not now"]]},
    ]);
    let over_tls = run(json!({
        "target": format!("localhost:{tls_port}"),
        "ca": demo.join("localhost.pem"),
        "calls": kinds,
    }));
    for results in [calls(gw.addr, kinds.clone()), over_tls] {
        let [unary, server, client, bidi, failed] = &results[..] else {
            panic!("{results:?}")
        };
        assert_eq!(unary["code"], "OK", "{unary}");
        assert_eq!(unary["responses"], json!(["hello"]));
        // metadata both ways, custom trailers back, the deadline passed on
        assert_eq!(unary["initial"]["x-echo-one"], "1", "{unary}");
        assert_eq!(unary["trailing"]["x-trailer"], "yes", "{unary}");
        assert_eq!(unary["trailing"]["x-usage-tokens"], "7", "{unary}");
        let left: u64 = unary["initial"]["x-seen-timeout-ms"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("the server saw a deadline");
        assert!((5_000..=10_000).contains(&left), "{unary}");
        assert_eq!(server["code"], "OK", "{server}");
        assert_eq!(server["responses"], json!(["0", "1", "2", "3"]));
        assert_eq!(server["trailing"]["x-trailer"], "yes");
        assert_eq!(client["responses"], json!(["3"]), "{client}");
        assert_eq!(bidi["responses"], json!(["x", "y"]), "{bidi}");
        assert_eq!(bidi["code"], "OK");
        // the upstream's own status and message reach the client
        assert_eq!(failed["code"], "FAILED_PRECONDITION", "{failed}");
        assert_eq!(failed["details"], "not now");
    }
    assert_eq!(
        metrics_line(
            &gw,
            "tollgate_grpc_requests_total{grpc_status=\"OK\",route=\"all\"}"
        ),
        8.0
    );
    assert!(common::eventually(Duration::from_secs(5), || gw
        .log()
        .contains("grpc_status=FAILED_PRECONDITION")));
}

/// One unary call with curl over h2c (curl keeps no deadline of its own), its message `hi`
/// and `headers`; the answer's head and trailers, in lower case.
fn curl_call(addr: SocketAddr, path: &str, headers: &[&str]) -> String {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-D",
        "-",
    ])
    .args(["-H", "content-type: application/grpc", "-H", "te: trailers"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .args(["--data-binary", "@-"])
        .arg(format!("http://{addr}{path}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("stdin")
                .write_all(b"\0\0\0\0\x02hi")?;
            c.wait_with_output()
        })
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).to_lowercase()
}

#[test]
fn a_deadline_that_passes_at_the_gateway_is_deadline_exceeded() {
    let peer = Peer::start_with(&[]);
    // one call a second per tenant, in a leaky bucket: the second waits its turn
    let tail = "limits:\n  - id: steady\n    pathPattern: /test.Echo/*\n    algorithm: leaky_bucket\n    tiers: [{ period: 10, threshold: 1 }]\n";
    let gw = Gateway::start(&config(peer.addr, "", "", tail));
    // the upstream takes longer than the deadline
    let t0 = Instant::now();
    let slow = call(
        gw.addr,
        json!({"method": "/test.Echo/Slow", "metadata": [["x-sleep-ms", "5000"], ["x-org-id", "a"]], "timeout": 0.5}),
    );
    assert_eq!(slow["code"], "DEADLINE_EXCEEDED", "{slow}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{slow}");
    // the next call's turn comes after its deadline: refused at once by the gateway, never
    // forwarded (the upstream would have said so in its initial metadata)
    let t0 = Instant::now();
    let queued = call(
        gw.addr,
        json!({"method": "/test.Echo/Unary", "metadata": [["x-org-id", "a"]], "timeout": 2}),
    );
    assert_eq!(queued["code"], "DEADLINE_EXCEEDED", "{queued}");
    assert!(
        queued["details"]
            .as_str()
            .is_some_and(|d| d.contains("grpc-timeout")),
        "{queued}"
    );
    assert!(queued["initial"].get("x-seen-method").is_none(), "{queued}");
    assert!(t0.elapsed() < Duration::from_millis(1500), "{queued}");
    // a deadline the gateway keeps itself (curl sets no deadline of its own): the server
    // has begun its answer (its initial metadata), so the status comes in trailers
    let t0 = Instant::now();
    let head = curl_call(
        gw.addr,
        "/test.Echo/Slow",
        &["grpc-timeout: 300m", "x-sleep-ms: 5000", "x-org-id: c"],
    );
    assert!(head.contains("x-seen-method: yes"), "{head}");
    assert!(head.contains("grpc-status: 4"), "{head}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{head}");
    // the longest deadline a client can write is no deadline to worry about
    let head = curl_call(
        gw.addr,
        "/test.Echo/Unary",
        &["grpc-timeout: 99999999H", "x-org-id: d"],
    );
    assert!(head.contains("grpc-status: 0"), "{head}");
    // without a deadline, the same call waits its turn and passes
    let patient = call(
        gw.addr,
        json!({"method": "/test.Echo/Unary", "metadata": [["x-org-id", "b"]]}),
    );
    assert_eq!(patient["code"], "OK", "{patient}");
}

#[test]
fn answers_made_by_the_gateway_are_grpc_statuses() {
    let peer = Peer::start_with(&[]);
    let dead = format!("127.0.0.1:{}", common::free_port());
    let pools = format!(
        "  gone:\n    servers: [\"{dead}\"]\n    protocol: h2c\n    retries: 0\n  plain:\n    servers: [\"{}\"]\n",
        peer.addr
    );
    let tail = "routes:\n  - id: echo\n    path: /test.Echo/*\n    upstream: grpc\n  - id: down\n    path: /down.Service/*\n    upstream: gone\n  - id: plain\n    path: /plain.Service/*\n    upstream: plain\n  - id: closed\n    path: /closed.Service/*\n    upstream: grpc\n    deny: [127.0.0.1/32]\n  - id: keyed\n    path: /keyed.Service/*\n    upstream: grpc\n    tenant: required\nlimits:\n  - id: unary\n    pathPattern: /test.Echo/Unary\n    tiers: [{ period: 1h, threshold: 2 }]\n";
    let gw = Gateway::start(&config(peer.addr, "  max_body_bytes: 2000\n", &pools, tail));
    let me = json!([["x-api-key", "k-acme"]]);
    let r = calls(
        gw.addr,
        json!([
            {"method": "/test.Echo/Unary", "metadata": me, "repeat": 3},
            {"method": "/test.Echo/ServerStream", "kind": "server_stream", "metadata": me},
            {"method": "/nowhere.Service/Call"},
            {"method": "/down.Service/Call"},
            {"method": "/plain.Service/Call"},
            {"method": "/closed.Service/Call"},
            {"method": "/keyed.Service/Call"},
            {"method": "/test.Echo/Unary", "messages": ["x".repeat(3000)], "metadata": [["x-org-id", "other"]]},
            // a stream whose answer has begun: its status in trailers, at once
            {"method": "/test.Echo/Bidi", "kind": "bidi", "messages": ["x".repeat(3000)], "timeout": 5},
        ]),
    );
    // a method's limit: the third call is refused, another method is not limited
    assert_eq!(r[0]["code"], "OK");
    assert_eq!(r[1]["code"], "OK");
    let refused = &r[2];
    assert_eq!(refused["code"], "RESOURCE_EXHAUSTED", "{refused}");
    assert!(
        refused["details"].as_str().is_some_and(|d| !d.is_empty()),
        "{refused}"
    );
    // the quota as metadata (trailers-only: grpcio reads the head as the trailers)
    let md = &refused["trailing"];
    assert_eq!(md["x-ratelimit-limit"], "2", "{refused}");
    assert_eq!(md["x-ratelimit-remaining"], "0", "{refused}");
    let retry: u64 = md["retry-after"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!(retry > 0, "{refused}");
    assert_eq!(
        md["grpc-retry-pushback-ms"].as_str(),
        Some((retry * 1000).to_string().as_str()),
        "{refused}"
    );
    assert!(md.get("ratelimit-policy").is_some(), "{refused}");
    assert_eq!(r[3]["code"], "OK", "{}", r[3]);
    for (i, code) in [
        (4, "UNIMPLEMENTED"),
        (5, "UNAVAILABLE"),
        (6, "INTERNAL"),
        (7, "PERMISSION_DENIED"),
        (8, "UNAUTHENTICATED"),
    ] {
        assert_eq!(r[i]["code"], code, "{}", r[i]);
        assert!(
            r[i]["details"].as_str().is_some_and(|d| !d.is_empty()),
            "{}",
            r[i]
        );
    }
    // a client limit: a body past server.max_body_bytes
    assert_eq!(r[9]["code"], "RESOURCE_EXHAUSTED", "{}", r[9]);
    assert_eq!(r[10]["code"], "RESOURCE_EXHAUSTED", "{}", r[10]);
    assert!(
        r[10]["ms"].as_f64().unwrap_or(f64::MAX) < 2000.0,
        "{}",
        r[10]
    );
    assert!(r[6]["details"]
        .as_str()
        .is_some_and(|d| d.contains("h2 or h2c")));
    let m = gw.metrics();
    for (route, code, n) in [
        // the limit's refusal and the bodies too large
        ("echo", "RESOURCE_EXHAUSTED", 3.0),
        ("none", "UNIMPLEMENTED", 1.0),
        ("down", "UNAVAILABLE", 1.0),
        ("plain", "INTERNAL", 1.0),
    ] {
        let series =
            format!("tollgate_grpc_requests_total{{grpc_status=\"{code}\",route=\"{route}\"}}");
        assert_eq!(common::metric_sum(&m, &series), n, "{series}\n{m}");
    }
    // said at -t: the route names gRPC methods, its pool speaks HTTP/1.1
    let (code, out, err) = common::run_tollgate(&["-t", "-c", gw.config.to_str().expect("path")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        (out.clone() + &err).contains("routes[2].path: /plain.Service/* names gRPC methods, but pool \"plain\" speaks HTTP/1.1"),
        "{out}{err}"
    );
}

#[test]
fn a_refused_call_waits_the_pushback_its_retry_policy_obeys() {
    let peer = Peer::start_with(&[]);
    // both calls in one window (its end at most a few seconds away)
    let period = common::period_with_room(2, 1);
    let tail = format!("limits:\n  - id: unary\n    pathPattern: /test.Echo/Unary\n    tiers: [{{ period: {period}, threshold: 1 }}]\n");
    let gw = Gateway::start(&config(peer.addr, "", "", &tail));
    let retry = json!({"methodConfig": [{
        "name": [{"service": "test.Echo"}],
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                         "backoffMultiplier": 1, "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}
    }]});
    let r = run(json!({
        "target": gw.addr.to_string(),
        "service_config": retry.to_string(),
        "calls": [{"method": "/test.Echo/Unary", "metadata": [["x-org-id", "a"]], "repeat": 2}],
    }));
    // the second call is refused, waits the pushback (the window's end), is retried and passes
    assert_eq!(r[0]["code"], "OK", "{r:?}");
    assert_eq!(r[1]["code"], "OK", "{r:?}");
    let refused = metrics_line(
        &gw,
        "tollgate_grpc_requests_total{grpc_status=\"RESOURCE_EXHAUSTED\"",
    );
    assert!(refused >= 1.0, "the retry was not refused first");
    let waited = r[1]["ms"].as_f64().unwrap_or(0.0);
    assert!(
        waited >= 500.0,
        "retried after {waited} ms, before the pushback"
    );
}

#[test]
fn count_when_grpc_status_and_a_cost_from_the_trailers() {
    let peer = Peer::start_with(&[]);
    let tail = "limits:\n  - id: failures\n    pathPattern: /test.Echo/Unary\n    tiers: [{ period: 1h, threshold: 2 }]\n    count_when: { grpc_status: [UNAUTHENTICATED, 14] }\n  - id: tokens\n    pathPattern: /test.Echo/ServerStream\n    tiers: [{ period: 1h, threshold: 10 }]\n    cost: { response_trailer: x-usage-tokens }\n    unit: tokens\n";
    let gw = Gateway::start(&config(peer.addr, "", "", tail));
    let a = json!(["x-org-id", "a"]);
    let r = calls(
        gw.addr,
        json!([
            // successes are not counted; two failures are; then the method is refused
            {"method": "/test.Echo/Unary", "metadata": [a], "repeat": 4},
            {"method": "/test.Echo/Unary", "metadata": [a, ["x-status", "16"]]},
            {"method": "/test.Echo/Unary", "metadata": [a, ["x-status", "14"]]},
            {"method": "/test.Echo/Unary", "metadata": [a]},
            // tokens from the trailers: 4 each
            {"method": "/test.Echo/ServerStream", "kind": "server_stream", "metadata": [a, ["x-usage", "4"]], "repeat": 4},
        ]),
    );
    let codes: Vec<&str> = r.iter().map(|c| c["code"].as_str().unwrap_or("")).collect();
    assert_eq!(
        codes,
        [
            "OK",
            "OK",
            "OK",
            "OK",
            "UNAUTHENTICATED",
            "UNAVAILABLE",
            "RESOURCE_EXHAUSTED",
            "OK",
            "OK",
            "OK",
            "RESOURCE_EXHAUSTED"
        ],
        "{r:?}"
    );
    // each stream's quota: admission's one unit on what the trailers charged before it
    let remaining = |c: &Value| c["initial"]["x-ratelimit-remaining"].clone();
    assert_eq!(remaining(&r[7]), "9", "{}", r[7]);
    assert_eq!(remaining(&r[8]), "5", "{}", r[8]);
    assert_eq!(remaining(&r[9]), "1", "{}", r[9]);
}

#[test]
fn a_stream_outlives_the_limits_meant_for_requests_and_a_reload() {
    let peer = Peer::start_with(&[]);
    // every limit of a plain request at 1 s; the stream lasts 4 s, a message each 400 ms
    let server = "  send_timeout: 1s\n  keepalive_timeout: 1s\n  client_header_timeout: 1s\n";
    let pool = "    read_timeout: 1s\n";
    let tail = "limits:\n  - id: one-stream\n    pathPattern: /test.Echo/ServerStream\n    concurrency: 1\n";
    let gw = Gateway::start(&config(peer.addr, server, pool, tail));
    let addr = gw.addr;
    let stream = std::thread::spawn(move || {
        call(
            addr,
            json!({"method": "/test.Echo/ServerStream", "kind": "server_stream",
                   "metadata": [["x-org-id", "a"], ["x-count", "10"], ["x-interval-ms", "400"]]}),
        )
    });
    // the open stream holds the tenant's one place: a second is refused meanwhile
    let probe = json!({"method": "/test.Echo/ServerStream", "kind": "server_stream",
                       "metadata": [["x-org-id", "a"]]});
    let in_flight = || {
        common::request(gw.admin, "GET", "/api/tenants/a", &[])
            .map(|r| r.json()["in_flight"][0]["now"].as_u64().unwrap_or(0))
            .unwrap_or(0)
    };
    let open = common::eventually(Duration::from_secs(10), || {
        stream.is_finished() || in_flight() == 1
    });
    assert!(
        open && !stream.is_finished(),
        "the stream never held its place: {:?}",
        stream.join()
    );
    assert_eq!(call(addr, probe.clone())["code"], "RESOURCE_EXHAUSTED");
    let text = std::fs::read_to_string(&gw.config).expect("config");
    assert!(gw.reload(&text.replace("concurrency: 1", "concurrency: 1\n    enabled: true")));
    let done = stream.join().expect("stream");
    assert_eq!(done["code"], "OK", "{done}");
    assert_eq!(
        done["responses"].as_array().map(Vec::len),
        Some(10),
        "{done}"
    );
    assert!(done["ms"].as_f64().unwrap_or(0.0) >= 3500.0, "{done}");
    // closed, the stream gave its place back
    assert_eq!(call(addr, probe)["code"], "OK");
}

/// What the actions mean for a call (docs/configuration.md, "gRPC"): each decides once, when
/// the call starts. `shadow` counts and never refuses; `delay` holds the call's start;
/// `throttle` paces the answer's messages; `leaky_bucket` (above, with deadlines) spaces the
/// calls' starts; `concurrency` (above) counts a stream while it is open.
#[test]
fn actions_on_calls_and_streams() {
    let peer = Peer::start_with(&[]);
    let tail = "limits:\n  - id: watch\n    pathPattern: /test.Echo/Unary\n    tiers: [{ period: 1h, threshold: 1 }]\n    action: shadow\n  - id: hold\n    pathPattern: /test.Echo/ClientStream\n    algorithm: token_bucket\n    tiers: [{ period: 1, threshold: 1 }]\n    action: delay\n    max_delay: 5s\n  - id: slow\n    pathPattern: /test.Echo/ServerStream\n    tiers: [{ period: 1h, threshold: 1 }]\n    action: throttle\n    throttle: { rate: 40B/s }\n  - id: hold-long\n    pathPattern: /test.Echo/Bidi\n    algorithm: token_bucket\n    tiers: [{ period: 10, threshold: 1 }]\n    action: delay\n    max_delay: 15s\n";
    let gw = Gateway::start(&config(peer.addr, "", "", tail));
    let a = json!(["x-org-id", "a"]);
    let stream = json!({"method": "/test.Echo/ServerStream", "kind": "server_stream",
                        "metadata": [a, ["x-count", "10"]]});
    let r = calls(
        gw.addr,
        json!([
            {"method": "/test.Echo/Unary", "metadata": [a], "repeat": 3},
            {"method": "/test.Echo/ClientStream", "kind": "client_stream", "messages": ["m"], "metadata": [a], "repeat": 2},
            stream,
            stream,
        ]),
    );
    let codes: Vec<&str> = r.iter().map(|c| c["code"].as_str().unwrap_or("")).collect();
    assert_eq!(codes, ["OK"; 7], "{r:?}");
    let m = gw.metrics();
    assert!(
        common::metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total{decision=\"shadow_denied\""
        ) >= 2.0,
        "{m}"
    );
    // the second client stream waited for the bucket's next token (1 a second)
    let ms = |c: &Value| c["ms"].as_f64().unwrap_or(0.0);
    assert!(ms(&r[4]) >= 500.0, "{}", r[4]);
    // a delay longer than the call's deadline: DEADLINE_EXCEEDED when the deadline passes,
    // not once the delay is over (curl keeps no deadline of its own)
    let first = curl_call(gw.addr, "/test.Echo/Bidi", &["x-org-id: a"]);
    assert!(first.contains("grpc-status: 0"), "{first}");
    let t0 = Instant::now();
    let held = curl_call(
        gw.addr,
        "/test.Echo/Bidi",
        &["x-org-id: a", "grpc-timeout: 300m"],
    );
    assert!(held.contains("grpc-status: 4"), "{held}");
    assert!(!held.contains("x-seen-method"), "never forwarded: {held}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // the second server stream: 10 messages of 6 bytes at 40 bytes a second
    assert!(ms(&r[5]) < 1000.0, "{}", r[5]);
    assert_eq!(r[6]["responses"].as_array().map(Vec::len), Some(10));
    assert!(ms(&r[6]) >= 1000.0, "{}", r[6]);
}

/// A cost from the trailers across a fleet: two gateways sharing Redis, each charging what
/// its calls' trailers say; Redis holds the sum, and both refuse once it is full.
#[test]
fn a_fleet_takes_the_trailers_cost() {
    let redis = common::RedisServer::start();
    let peer = Peer::start_with(&[]);
    let period = common::period_with_room(3600, 30);
    let tail = format!(
        "limits:\n  - id: tokens\n    pathPattern: /test.Echo/*\n    cost: {{ response_trailer: x-usage-tokens }}\n    tiers: [{{ period: {period}, threshold: 40 }}]\nredis:\n  url: {}\n  key_prefix: tg\n  sync_interval: 50ms\n",
        redis.url()
    );
    let cfg = config(peer.addr, "", "", &tail);
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(common::wait_redis_state(gw, "connected"));
    }
    let unary = json!({"method": "/test.Echo/Unary", "metadata": [["x-org-id", "acme"], ["x-usage", "10"]]});
    for gw in [&a, &b] {
        assert_eq!(call(gw.addr, unary.clone())["code"], "OK");
    }
    let stored = || {
        redis
            .counter_keys("tg:{acme}:tokens:*")
            .first()
            .map(|k| redis.int(&["GET", k]))
    };
    assert!(
        common::eventually(Duration::from_secs(5), || stored() == Some(20)),
        "Redis holds {:?} of the 20 charged",
        stored()
    );
    // each instance then knows the other's charge: two more calls fill the 40
    for gw in [&a, &b] {
        assert_eq!(call(gw.addr, unary.clone())["code"], "OK");
    }
    assert!(common::eventually(Duration::from_secs(5), || {
        stored() == Some(40)
    }));
    for gw in [&a, &b] {
        assert!(
            common::eventually(Duration::from_secs(5), || call(gw.addr, unary.clone())
                ["code"]
                == "RESOURCE_EXHAUSTED"),
            "the fleet's 40 tokens are spent"
        );
    }
}

/// README "A curl session through the demo": the demo config (ports moved to free ones) with
/// the gRPC upstream `make run` starts, and the README's grpcio command, run as written: five
/// calls pass, the sixth is RESOURCE_EXHAUSTED with its pushback.
#[test]
fn the_readmes_grpc_demo_holds() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let line = readme
        .lines()
        .find(|l| {
            l.starts_with(
                "$ scripts/test-venv && target/test-venv/bin/python tests/grpc/client.py '",
            )
        })
        .expect("the README's gRPC command");
    let spec: Value = line
        .split('\'')
        .nth(1)
        .and_then(|s| serde_json::from_str(s).ok())
        .expect("its JSON spec");
    let mut up = Command::new(root().join("target/debug/examples/grpc_upstream"));
    up.arg("127.0.0.1:0");
    let (child, grpc_addr) = common::spawn_listening(up);
    let _up = common::KillOnDrop(vec![child.id() as i32]);
    // the demo, its ports moved: the gateway's, the admin's, the gRPC upstream's
    let gw = common::DemoGateway::start(&[("127.0.0.1:9004", grpc_addr)]);
    let (ready, listen) = (gw.ready, gw.listen);
    let mut spec = spec;
    spec["target"] = json!(listen.to_string());
    // the six calls in one of the rule's 10 s windows (aligned to the clock)
    assert!(common::eventually(Duration::from_secs(5), || {
        common::now_ms() % 10_000 < 8_000
    }));
    let results = if ready { run(spec) } else { Vec::new() };
    drop(gw);
    assert!(ready, "the demo gateway did not start");
    let codes: Vec<&str> = results
        .iter()
        .map(|c| c["code"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        codes,
        ["OK", "OK", "OK", "OK", "OK", "RESOURCE_EXHAUSTED"],
        "{results:?}"
    );
    assert_eq!(results[0]["responses"], json!(["hi"]));
    assert!(
        results[5]["trailing"]["grpc-retry-pushback-ms"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|ms| ms > 0 && ms <= 10_000),
        "{}",
        results[5]
    );
}

/// Redis out of reach under `on_failure: deny` refuses the call for want of the fleet's
/// counts, not by a limit: UNAVAILABLE (docs/configuration.md "gRPC": the table), while a call
/// on a route no rule limits passes.
#[test]
fn redis_out_of_reach_under_deny_is_unavailable() {
    let peer = Peer::start_with(&[]);
    let nobody = common::free_port();
    let tail = format!(
        "limits:\n  - id: unary\n    pathPattern: /test.Echo/Unary\n    tiers: [{{ period: 1h, threshold: 100 }}]\nredis:\n  url: redis://127.0.0.1:{nobody}\n  timeout: 100ms\n  on_failure: deny\n"
    );
    let gw = Gateway::start(&config(peer.addr, "", "", &tail));
    let r = calls(
        gw.addr,
        json!([
            {"method": "/test.Echo/Unary", "metadata": [["x-org-id", "a"]]},
            {"method": "/test.Echo/ServerStream", "kind": "server_stream", "metadata": [["x-org-id", "a"]]},
        ]),
    );
    assert_eq!(r[0]["code"], "UNAVAILABLE", "{}", r[0]);
    assert!(
        r[0]["trailing"].get("grpc-retry-pushback-ms").is_some(),
        "{}",
        r[0]
    );
    assert_eq!(r[1]["code"], "OK", "{}", r[1]);
}
