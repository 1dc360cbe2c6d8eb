//! Hostile clients against the real gateway (issue 38): HTTP/2 streams reset after their
//! HEADERS reached the upstream, more streams a second than allowed, slow readers over HTTP/1.1
//! and HTTP/2, idle and silent connections (h2c and TLS), and more connections than a listener
//! or one address may hold. Each with its bound, and an honest request served beside it.
//! `make conformance` runs the same attacks from outside (Python's `h2`) against the release
//! build, with honest clients' latency measured.

mod common;
use common::{
    eventually, make_cert, metric_sum, one_route_config, request, Gateway, TempDir, Upstream,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const OPEN: &str = "tenant:\n  required: false\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn metric(gw: &Gateway, series: &str) -> f64 {
    metric_sum(&gw.metrics(), series)
}

/// An HTTP/2 connection with prior knowledge to `addr`; the connection's own task returns its
/// end (the GOAWAY reason the gateway gave, if any).
async fn h2_connect(
    addr: SocketAddr,
    window: Option<u32>,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut b = h2::client::Builder::new();
    if let Some(w) = window {
        b.initial_window_size(w);
    }
    let (client, conn) = b.handshake(tcp).await.expect("h2 handshake");
    (client, tokio::spawn(conn))
}

fn get(path: &str) -> http::Request<()> {
    http::Request::get(format!("http://localhost{path}"))
        .body(())
        .expect("request")
}

/// Until `upstream` holds `n` connections from the gateway (its side ESTABLISHED: a request
/// in progress), or 2 s passed; returns whether it did.
async fn upstream_holds(upstream: SocketAddr, n: usize) -> bool {
    let waited = Instant::now();
    while common::connections_to(upstream) != n {
        if waited.elapsed() > Duration::from_secs(2) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

/// Rapid Reset, the delayed form: batches of `batch` streams, each reset once its request
/// reached `upstream`, until the gateway closes the connection or `streams` were sent. Before
/// each batch, the upstream requests of the one before must have been cancelled. Returns the
/// streams sent, the connection's end, and whether every reset stream's upstream request was
/// cancelled.
async fn delayed_resets(
    addr: SocketAddr,
    path: &str,
    streams: usize,
    batch: usize,
    upstream: SocketAddr,
) -> (usize, Option<h2::Reason>, bool) {
    let (client, conn) = h2_connect(addr, None).await;
    let mut client = Some(client);
    let mut sent = 0;
    let mut cancelled = true;
    'attack: while sent < streams {
        cancelled &= upstream_holds(upstream, 0).await;
        let mut open = Vec::with_capacity(batch);
        for _ in 0..batch {
            let Some(c) = client.take() else {
                break 'attack;
            };
            let Ok(c) = c.ready().await else {
                break 'attack;
            };
            let client = client.insert(c);
            match client.send_request(get(path), true) {
                Ok((response, stream)) => open.push((response, stream)),
                Err(_) => break 'attack,
            }
            sent += 1;
        }
        upstream_holds(upstream, open.len()).await;
        for (_, mut stream) in open {
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    drop(client);
    let end = tokio::time::timeout(Duration::from_secs(10), conn).await;
    let reason = match end {
        Ok(Ok(Err(e))) => e.reason(),
        _ => None,
    };
    (sent, reason, cancelled && upstream_holds(upstream, 0).await)
}

#[test]
fn delayed_resets_end_in_goaway_with_a_bounded_number_of_upstream_requests_and_few_log_lines() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&(one_route_config(up.addr, 2, "  h2c: true") + OPEN));
    let log_before = gw.log().lines().count();
    let rt = runtime();
    // an upstream that takes 3 s: every reset comes while its request is upstream
    let (sent, reason, cancelled) = rt.block_on(delayed_resets(
        gw.addr,
        "/delay/3000/attack",
        5_000,
        20,
        up.addr,
    ));
    assert_eq!(
        reason,
        Some(h2::Reason::ENHANCE_YOUR_CALM),
        "after {sent} streams; log:\n{}",
        gw.log()
    );
    assert!(
        sent < 1_000,
        "the connection was closed after {sent} streams"
    );
    assert!(
        cancelled,
        "a reset stream's upstream request went on (the upstream still held its connection)"
    );
    // an honest request, sent after the attack and answered after the same delay: every
    // request of the attack that reached the upstream has been counted by then
    let honest = request(gw.addr, "GET", "/delay/3000/honest", &[]).expect("honest request");
    assert_eq!(honest.status, 200);
    let reached = up.hits() - 1;
    eprintln!("[delayed resets] {sent} streams sent, {reached} reached the upstream");
    assert!(
        reached <= 300,
        "{reached} of {sent} reset streams reached the upstream"
    );
    assert_eq!(
        metric(&gw, "tollgate_client_errors_total{kind=\"goaway\"}"),
        1.0
    );
    assert!(metric(&gw, "tollgate_client_errors_total{kind=\"reset\"}") > 100.0);
    let log = gw.log();
    let new_lines: Vec<&str> = log.lines().skip(log_before).collect();
    assert!(
        new_lines.len() <= 5,
        "the attack wrote {} log lines:\n{}",
        new_lines.len(),
        new_lines.join("\n")
    );
    assert!(!log.contains("Fail to proxy"), "{log}");
}

#[test]
fn a_client_that_cancels_now_and_then_keeps_its_connection() {
    let up = Upstream::start("u");
    let gw = Gateway::start(
        &(one_route_config(
            up.addr,
            2,
            "  h2c: true\n  http2: { max_premature_resets: 10 }",
        ) + OPEN),
    );
    let rt = runtime();
    rt.block_on(async {
        let (mut client, conn) = h2_connect(gw.addr, None).await;
        // 30 cancelled streams among 90 answered ones: more than the budget, but a third
        for i in 0..120 {
            client = client.ready().await.expect("the connection is kept");
            if i % 4 == 0 {
                let (_, mut stream) = client
                    .send_request(get("/delay/200/cancelled"), true)
                    .expect("sent");
                tokio::time::sleep(Duration::from_millis(5)).await;
                stream.send_reset(h2::Reason::CANCEL);
            } else {
                let (response, _) = client.send_request(get("/ok"), true).expect("sent");
                let response = response.await.expect("answered");
                assert_eq!(response.status(), 200);
            }
        }
        assert!(!conn.is_finished(), "the connection is still open");
    });
    assert_eq!(
        metric(&gw, "tollgate_client_errors_total{kind=\"goaway\"}"),
        0.0
    );
}

#[test]
fn streams_past_the_rate_are_refused_and_the_rest_answered() {
    let up = Upstream::start("u");
    let gw = Gateway::start(
        &(one_route_config(
            up.addr,
            2,
            "  h2c: true\n  http2: { max_streams_per_second: 20 }",
        ) + OPEN),
    );
    let rt = runtime();
    let (ok, refused) = rt.block_on(async {
        let (mut client, _conn) = h2_connect(gw.addr, None).await;
        let mut pending = Vec::new();
        for _ in 0..80 {
            client = client.ready().await.expect("ready");
            let (response, _) = client.send_request(get("/burst"), true).expect("sent");
            pending.push(response);
        }
        let (mut ok, mut refused) = (0, 0);
        for p in pending {
            match p.await {
                Ok(r) if r.status() == 200 => ok += 1,
                Err(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => refused += 1,
                other => panic!("unexpected: {other:?}"),
            }
        }
        (ok, refused)
    });
    eprintln!("[stream rate] {ok} answered, {refused} refused");
    // a second's worth at once, and what time gave while the burst arrived
    assert!((20..=30).contains(&ok), "{ok} answered");
    assert_eq!(ok + refused, 80);
    assert_eq!(
        metric(&gw, "tollgate_client_errors_total{kind=\"refused\"}"),
        f64::from(refused)
    );
}

/// Whether the peer of `s` closes it within `within` without anything being sent.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {
                if Instant::now() >= deadline {
                    return false;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn silent_and_idle_connections_are_closed_in_time_on_every_listener() {
    let up = Upstream::start("u");
    let dir = TempDir::new();
    make_cert(&dir.0, "gw", "localhost");
    let tls_port = common::free_port();
    let cfg = format!(
        "server:\n  listen:\n    - \"{{LISTEN}}\"\n    - addr: \"127.0.0.1:{tls_port}\"\n      tls: {{ cert: {d}/gw.pem, key: {d}/gw.key }}\n  admin: \"{{ADMIN}}\"\n  threads: 2\n  h2c: true\n  client_header_timeout: 1s\n  keepalive_timeout: 1s\nupstreams:\n  app:\n    servers: [\"{up}\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n{OPEN}",
        d = dir.0.display(),
        up = up.addr
    );
    let gw = Gateway::start(&cfg);
    let tls: SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    let t = Instant::now();
    // nothing sent: on the h2c listener (the preface never comes) and on the TLS one
    let mut silent_plain = TcpStream::connect(gw.addr).unwrap();
    let mut silent_tls = TcpStream::connect(tls).unwrap();
    // the preface and nothing else (no SETTINGS, no stream)
    let mut preface_only = TcpStream::connect(gw.addr).unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    // a slowloris on the h2c listener: an HTTP/1.1 header a byte now and then
    let mut slowloris = TcpStream::connect(gw.addr).unwrap();
    slowloris.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    for (name, s) in [
        ("silent h2c", &mut silent_plain),
        ("silent TLS", &mut silent_tls),
        ("preface only", &mut preface_only),
        ("slowloris", &mut slowloris),
    ] {
        assert!(closed_within(s, Duration::from_secs(5)), "{name} held");
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed too soon: {took:?}"
    );
    // an HTTP/2 connection idle after its request is closed after keepalive_timeout, one
    // whose request takes longer is not
    let rt = runtime();
    rt.block_on(async {
        let (mut client, conn) = h2_connect(gw.addr, None).await;
        client = client.ready().await.unwrap();
        let (slow, _) = client.send_request(get("/delay/2500/slow"), true).unwrap();
        let slow = tokio::time::timeout(Duration::from_secs(10), slow).await;
        assert_eq!(slow.expect("in time").expect("answered").status(), 200);
        let idle_from = Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(6), conn).await;
        assert!(end.is_ok(), "an idle HTTP/2 connection was kept");
        assert!(idle_from.elapsed() >= Duration::from_millis(900));
    });
    assert!(metric(&gw, "tollgate_client_errors_total{kind=\"timeout\"}") >= 3.0);
}

#[test]
fn a_client_that_stops_reading_is_let_go_after_send_timeout() {
    let up = Upstream::start("u");
    let gw = Gateway::start(
        &(one_route_config(
            up.addr,
            2,
            "  h2c: true\n  send_timeout: 1s\n  max_connections: 50",
        ) + OPEN),
    );
    let open = |gw: &Gateway| metric(gw, "tollgate_connections{");
    // HTTP/1.1: 50 MB asked for, nothing read
    let mut h1 = TcpStream::connect(gw.addr).unwrap();
    h1.write_all(b"GET /bytes/50000000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    assert!(eventually(Duration::from_secs(2), || open(&gw) >= 1.0));
    assert!(
        eventually(Duration::from_secs(10), || open(&gw) == 0.0),
        "the HTTP/1.1 slow reader is held"
    );
    // HTTP/2: a window of 0, so nothing of the answer can be sent
    let rt = runtime();
    rt.block_on(async {
        let (mut client, _conn) = h2_connect(gw.addr, Some(0)).await;
        client = client.ready().await.unwrap();
        let (response, _) = client.send_request(get("/bytes/50000000"), true).unwrap();
        let response = response.await.expect("the header is sent");
        let mut body = response.into_body();
        let t = Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(10), body.data()).await;
        match end {
            Ok(Some(Err(e))) => assert!(e.is_reset(), "{e}"),
            other => panic!("the stream was not reset: {other:?}"),
        }
        assert!(t.elapsed() >= Duration::from_millis(900));
    });
    assert!(metric(&gw, "tollgate_client_errors_total{kind=\"timeout\"}") >= 2.0);
    // the gateway still answers
    assert_eq!(request(gw.addr, "GET", "/ok", &[]).unwrap().status, 200);
    drop(h1);
}

/// Wait until the gateway holds no client connection. Its readiness probe connects to each
/// listener before `/readyz` says ready, and waits until the listener closed that connection;
/// the count lets go of it just after the close.
fn no_connection_held(gw: &Gateway) {
    let idle = eventually(Duration::from_secs(20), || {
        metric(gw, "tollgate_connections{") == 0.0
    });
    assert!(idle, "{}", gw.metrics());
}

fn ready(gw: &Gateway) -> (u16, serde_json::Value) {
    let r = request(gw.admin, "GET", "/readyz", &[]).expect("readyz");
    (r.status, r.json())
}

#[test]
fn a_full_listener_refuses_new_connections_and_is_not_ready_until_one_closes() {
    let up = Upstream::start("u");
    let gw = Gateway::start(
        &(one_route_config(
            up.addr,
            2,
            "  max_connections: 3\n  client_header_timeout: 30s",
        ) + OPEN),
    );
    no_connection_held(&gw);
    let held: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(gw.addr).unwrap())
        .collect();
    // a connection is counted when the gateway's accept loop takes it from the backlog, which
    // a busy machine may delay: wait for the count itself, as long as for the start
    let counted = eventually(Duration::from_secs(20), || {
        metric(&gw, "tollgate_connections{") == 3.0
    });
    assert!(counted, "{}\n{}", gw.metrics(), gw.log());
    // up to the limit, every connection is held, none refused; counted means full at once
    let refused = metric(&gw, "tollgate_connections_refused_total{");
    assert_eq!(refused, 0.0, "{}", gw.metrics());
    let (status, body) = ready(&gw);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["listeners_full"][0], gw.addr.to_string());
    let mut refused = TcpStream::connect(gw.addr).unwrap();
    assert!(closed_within(&mut refused, Duration::from_secs(20)));
    assert!(
        gw.metrics().contains(&format!(
            "tollgate_connections_refused_total{{listener=\"{}\",reason=\"listener_full\"}} 1",
            gw.addr
        )),
        "{}",
        gw.metrics()
    );
    // the limit is the process's: a reload that changes it says so and keeps it
    let raised = one_route_config(
        up.addr,
        2,
        "  max_connections: 5\n  client_header_timeout: 30s",
    ) + OPEN;
    assert!(gw.reload(&raised));
    assert!(gw
        .log()
        .contains("server.max_connections_per_ip or server.log_format need a restart"));
    let mut still_refused = TcpStream::connect(gw.addr).unwrap();
    assert!(closed_within(&mut still_refused, Duration::from_secs(20)));
    drop(held);
    assert!(eventually(Duration::from_secs(5), || ready(&gw).0 == 200));
    assert_eq!(request(gw.addr, "GET", "/ok", &[]).unwrap().status, 200);
}

#[test]
fn one_address_holds_at_most_max_connections_per_ip() {
    let up = Upstream::start("u");
    let gw = Gateway::start(
        &(one_route_config(
            up.addr,
            2,
            "  max_connections_per_ip: 2\n  client_header_timeout: 30s",
        ) + OPEN),
    );
    no_connection_held(&gw);
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(gw.addr).unwrap())
        .collect();
    // counted when accepted, which a busy machine may delay (see the test above)
    let counted = eventually(Duration::from_secs(20), || {
        metric(&gw, "tollgate_connections{") == 2.0
    });
    assert!(counted, "{}\n{}", gw.metrics(), gw.log());
    let mut third = TcpStream::connect(gw.addr).unwrap();
    assert!(closed_within(&mut third, Duration::from_secs(20)));
    assert!(
        gw.metrics().contains("reason=\"per_ip\"} 1"),
        "{}",
        gw.metrics()
    );
    // a listener whose clients are refused by address is not full: still ready
    assert_eq!(ready(&gw).0, 200);
    drop(held);
    assert!(eventually(Duration::from_secs(5), || request(
        gw.addr,
        "GET",
        "/ok",
        &[]
    )
    .is_ok_and(|r| r.status == 200)));
}

/// Requests in a shaped pool: in flight to it and waiting in its queue.
fn in_pool(admin: SocketAddr) -> u64 {
    request(admin, "GET", "/api/status", &[]).map_or(0, |r| {
        let s = &r.json()["pools"][0]["shaping"];
        s["in_flight"].as_u64().unwrap_or(0) + s["queue_depth"].as_u64().unwrap_or(0)
    })
}

/// Until the shaped pool holds `n` requests (5 s at most), without blocking the runtime.
async fn pool_holds(admin: SocketAddr, n: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if tokio::task::spawn_blocking(move || in_pool(admin))
            .await
            .ok()
            == Some(n)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

#[test]
fn a_stream_reset_while_it_waits_for_a_shaped_pool_never_reaches_the_upstream() {
    let up = Upstream::start("u");
    let cfg = one_route_config(up.addr, 2, "  h2c: true").replace(
        "    servers:",
        "    max_in_flight: 1\n    queue: { max: 10, timeout: 10s }\n    servers:",
    ) + OPEN;
    let gw = Gateway::start(&cfg);
    let rt = runtime();
    rt.block_on(async {
        let (client, _conn) = h2_connect(gw.addr, None).await;
        let mut client = client.ready().await.unwrap();
        let (first, _) = client.send_request(get("/delay/4000/first"), true).unwrap();
        assert!(pool_holds(gw.admin, 1).await, "the first holds the pool");
        let mut waiting = Vec::new();
        for _ in 0..5 {
            client = client.ready().await.unwrap();
            waiting.push(client.send_request(get("/queued"), true).unwrap());
        }
        assert!(
            pool_holds(gw.admin, 6).await,
            "the five wait behind the first"
        );
        for (_, mut stream) in waiting {
            stream.send_reset(h2::Reason::CANCEL);
        }
        assert!(
            pool_holds(gw.admin, 1).await,
            "the reset streams left the queue"
        );
        assert_eq!(first.await.expect("answered").status(), 200);
    });
    assert_eq!(request(gw.addr, "GET", "/after", &[]).unwrap().status, 200);
    assert_eq!(
        up.hits(),
        2,
        "only the first request and the one after reached it"
    );
}
