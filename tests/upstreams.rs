//! Upstream pools: balancing, health checks, and problem answers when upstreams fail.

mod common;
use common::{eventually, free_port, server_healthy, Gateway, Upstream};
use std::collections::HashMap;
use std::time::Duration;

fn config(servers: &[String], pool_extra: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"server:
  listen: ["{{LISTEN}}"]
  admin: "{{ADMIN}}"
  threads: 1
upstreams:
  pool:
    servers: [{}]
{pool_extra}
routes:
  - id: all
    path: /**
    upstream: pool
tenant:
  from:
    - header: x-org-id
      trusted: true
  required: false
"#,
        list.join(", ")
    )
}

fn hits(gw: &Gateway, n: usize, tenant: &str) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let r = gw.get("/x", &[("x-org-id", tenant)]);
        assert_eq!(r.status, 200, "{r:?}");
        *seen
            .entry(r.json()["server"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    seen
}

#[test]
fn round_robin_spreads_evenly() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&config(
        &[a.addr.to_string(), b.addr.to_string()],
        "    balance: round_robin",
    ));
    let seen = hits(&gw, 20, "t");
    assert_eq!(seen.get("a"), Some(&10), "{seen:?}");
    assert_eq!(seen.get("b"), Some(&10), "{seen:?}");
}

#[test]
fn random_uses_every_server() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&config(
        &[a.addr.to_string(), b.addr.to_string()],
        "    balance: random",
    ));
    let seen = hits(&gw, 60, "t");
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn consistent_hash_keeps_a_tenant_on_one_server() {
    let ups: Vec<Upstream> = ["a", "b", "c"].iter().map(|n| Upstream::start(n)).collect();
    let addrs: Vec<String> = ups.iter().map(|u| u.addr.to_string()).collect();
    let gw = Gateway::start(&config(&addrs, "    balance: consistent_hash"));
    let mut servers_used = std::collections::HashSet::new();
    for t in 0..12 {
        let seen = hits(&gw, 5, &format!("tenant-{t}"));
        assert_eq!(seen.len(), 1, "tenant-{t} moved between servers: {seen:?}");
        servers_used.extend(seen.into_keys());
    }
    assert!(
        servers_used.len() >= 2,
        "tenants are spread: {servers_used:?}"
    );
}

#[test]
fn dead_server_in_health_checked_pool_gets_no_traffic() {
    let (a, mut b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&config(
        &[a.addr.to_string(), b.addr.to_string()],
        "    health_check: { interval: 200ms, http: { path: /healthz } }",
    ));
    assert_eq!(hits(&gw, 10, "t").len(), 2);
    let b_addr = b.addr.to_string();
    b.kill();
    // after a health check (until the pool marks b unhealthy), every request goes to the live
    // server, none fails
    assert!(eventually(Duration::from_secs(5), || server_healthy(
        &gw, &b_addr
    ) == Some(false)));
    let seen = hits(&gw, 30, "t");
    assert_eq!(seen.get("a"), Some(&30), "{seen:?}");
}

#[test]
fn tcp_health_check_marks_dead_server() {
    let a = Upstream::start("a");
    let dead = format!("127.0.0.1:{}", free_port());
    let gw = Gateway::start(&config(
        &[a.addr.to_string(), dead.clone()],
        "    health_check: { interval: 100ms }",
    ));
    // until a health check has marked the dead server unhealthy (the pool and the log say so)
    let line = format!("upstream pool: {dead} becomes unhealthy");
    assert!(eventually(Duration::from_secs(5), || server_healthy(
        &gw, &dead
    ) == Some(false)
        && gw.log().contains(&line)));
    let seen = hits(&gw, 20, "t");
    assert_eq!(seen.get("a"), Some(&20), "{seen:?}");
    // the log line names the pool and the server, not a debug struct
    let log = gw.log();
    assert!(
        log.contains(&format!("upstream pool: {dead} becomes unhealthy")),
        "{log}"
    );
    assert!(!log.contains("Backend {"), "{log}");
}

#[test]
fn http_health_check_needs_a_2xx_answer() {
    let a = Upstream::start("a");
    // the server is up, but its health endpoint answers 503: no eligible server -> 502
    let gw = Gateway::start(&config(
        &[a.addr.to_string()],
        "    health_check: { interval: 100ms, http: { path: /status/503 } }",
    ));
    assert!(eventually(Duration::from_secs(3), || gw
        .get("/x", &[])
        .status
        == 502));
    let r = gw.get("/x", &[]);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
}

#[test]
fn upstream_down_is_502_problem_without_internal_detail() {
    let dead = format!("127.0.0.1:{}", free_port());
    let gw = Gateway::start(&config(std::slice::from_ref(&dead), ""));
    let r = gw.get("/x", &[]);
    assert_eq!(r.status, 502);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.json()["status"], 502);
    let port = dead.rsplit(':').next().unwrap();
    assert!(
        !r.body.contains(port),
        "leaks the upstream address: {}",
        r.body
    );
    assert!(
        !r.body.to_lowercase().contains("refused"),
        "leaks the error: {}",
        r.body
    );
    assert!(gw
        .metrics()
        .contains(r#"tollgate_requests_total{route="all",status="502"} 1"#));
}

#[test]
fn slow_upstream_is_504_after_read_timeout() {
    // a server that accepts and never answers
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _hold = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(4) {
            conns.push(c);
        }
        // the scenario: the connections stay open, unanswered, past the read timeout
        std::thread::sleep(Duration::from_secs(5));
    });
    let gw = Gateway::start(&config(&[addr], "    read_timeout: 300ms"));
    let r = gw.get("/x", &[]);
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.json()["status"], 504);
}

#[test]
fn a_dead_server_without_health_check_costs_no_request() {
    // docs/configuration.md "upstreams": a failed connection is retried on the next server, and the
    // failed server is skipped for a while even without a health check
    let a = Upstream::start("a");
    let dead = format!("127.0.0.1:{}", free_port()); // nothing listens there
    let gw = Gateway::start(&config(
        &[dead, a.addr.to_string()],
        "    balance: round_robin",
    ));
    let seen = hits(&gw, 20, "t");
    assert_eq!(seen.get("a"), Some(&20), "{seen:?}");
}

/// A gateway speaking h2c (`server.h2c`) in front of `up`: an HTTP/2 server for the pool under
/// test, whose listener counts the connections it is given.
fn h2c_server(up: &Upstream) -> Gateway {
    Gateway::start(&format!(
        "{}tenant:\n  required: false\n",
        common::one_route_config(up.addr, 2, "  h2c: true")
    ))
}

/// The most connections `server`'s `listener` held at once while `n` requests for `path` went
/// through `gw` together, after one request alone (which leaves a connection to reuse, as a
/// gateway in service has); every answer must be 200.
fn connections_on(gw: &Gateway, server: &Gateway, listener: &str, n: usize, path: &str) -> f64 {
    assert_eq!(gw.get("/warm", &[]).status, 200);
    let addr = gw.addr;
    let path = path.to_string();
    let clients: Vec<_> = (0..n)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || common::request(addr, "GET", &path, &[]).map(|r| r.status))
        })
        .collect();
    let mut most: f64 = 0.0;
    let series = format!("tollgate_connections{{listener=\"{listener}\"}}");
    while clients.iter().any(|c| !c.is_finished()) {
        most = most.max(common::metric_sum(&server.metrics(), &series));
        std::thread::sleep(Duration::from_millis(10));
    }
    for c in clients {
        assert_eq!(c.join().expect("client").expect("answer"), 200);
    }
    most
}

/// `connections_on` the server's plain listener.
fn connections_for(gw: &Gateway, server: &Gateway, n: usize, path: &str) -> f64 {
    connections_on(gw, server, &server.addr.to_string(), n, path)
}

#[test]
fn an_h2c_pool_multiplexes_requests_on_few_connections() {
    let up = Upstream::start("u");
    let server = h2c_server(&up);
    let target = vec![server.addr.to_string()];
    let h2c = Gateway::start(&config(&target, "    protocol: h2c"));
    let over_h2c = connections_for(&h2c, &server, 20, "/delay/800/h2c");
    drop(h2c);
    let http1 = Gateway::start(&config(&target, ""));
    let over_http1 = connections_for(&http1, &server, 20, "/delay/800/http1");
    drop(http1);
    eprintln!("20 requests at once: {over_h2c} connections over h2c, {over_http1} over HTTP/1.1");
    assert!(over_h2c <= 2.0, "h2c used {over_h2c} connections");
    assert!(over_http1 >= 15.0, "HTTP/1.1 used {over_http1} connections");
    // one stream per connection at most: as many connections as requests again
    let one = Gateway::start(&config(
        &target,
        "    protocol: h2c\n    max_streams_per_connection: 1",
    ));
    let over_one = connections_for(&one, &server, 10, "/delay/800/one");
    assert!(over_one >= 8.0, "one stream a connection used {over_one}");
}

#[test]
fn an_h2c_pool_whose_server_speaks_only_http1_answers_502_at_once() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(
        &[up.addr.to_string()],
        "    protocol: h2c\n    retries: 0",
    ));
    let t = std::time::Instant::now();
    let r = gw.get("/x", &[]);
    assert_eq!(r.status, 502, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn an_h2_pool_speaks_http2_over_tls_by_alpn() {
    let up = Upstream::start("u");
    let dir = common::TempDir::new();
    common::make_cert(&dir.0, "srv", "localhost");
    let tls_port = free_port();
    let server = Gateway::start(&format!(
        "server:\n  listen:\n    - \"{{LISTEN}}\"\n    - addr: \"127.0.0.1:{tls_port}\"\n      tls: {{ cert: {d}/srv.pem, key: {d}/srv.key }}\n  admin: \"{{ADMIN}}\"\n  threads: 2\nupstreams:\n  app:\n    servers: [\"{up}\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\ntenant:\n  required: false\n",
        d = dir.0.display(),
        up = up.addr
    ));
    let gw = Gateway::start(&config(
        &[format!("127.0.0.1:{tls_port}")],
        &format!(
            "    protocol: h2\n    tls: {{ sni: localhost, ca: {}/srv.pem }}",
            dir.0.display()
        ),
    ));
    let tls = format!("127.0.0.1:{tls_port}");
    let most = connections_on(&gw, &server, &tls, 20, "/delay/800/h2");
    assert!((1.0..=2.0).contains(&most), "h2 used {most} connections");
}
