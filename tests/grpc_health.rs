//! The gRPC health check of a pool (`health_check.grpc`) against real grpcio servers
//! (tests/grpc/peer.py, whose health status `test.Control/SetHealth` changes): SERVING keeps a
//! server in, NOT_SERVING, an unknown service, SERVICE_UNKNOWN, a server that is not gRPC, one
//! that never answers and one that refuses take it out; over h2c and over TLS (ALPN h2).

mod common;
use common::{eventually, free_port, run_tollgate, Gateway, TempDir, Upstream};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a health check may take to notice a change (checks every 200 ms here).
const NOTICE: Duration = Duration::from_secs(10);

use common::grpc::{repo, Peer};

/// The health tests' ways with a server.
trait HealthPeer: Sized {
    fn start() -> Self;
    fn start_tls(dir: &TempDir, name: &str) -> Self;
    fn name(&self) -> String;
    fn set_health(&self, setting: &str, ca: Option<&PathBuf>);
}

impl HealthPeer for Peer {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// Over TLS with `dir/name.pem` and `dir/name.key`.
    fn start_tls(dir: &TempDir, name: &str) -> Self {
        let cert = dir.0.join(format!("{name}.pem")).display().to_string();
        let key = dir.0.join(format!("{name}.key")).display().to_string();
        Self::start_with(&["--tls", &cert, &key])
    }

    fn name(&self) -> String {
        self.addr.to_string()
    }

    /// `test.Control/SetHealth` with `SERVICE=STATUS`, straight to the server.
    fn set_health(&self, setting: &str, ca: Option<&PathBuf>) {
        let mut spec = json!({
            "target": self.name(),
            "calls": [{"method": "/test.Control/SetHealth", "messages": [setting]}],
        });
        if let Some(ca) = ca {
            spec["ca"] = json!(ca.display().to_string());
        }
        let out = grpc(&spec);
        assert_eq!(out[0]["code"], "OK", "SetHealth {setting}: {out:?}");
    }
}

/// Run tests/grpc/client.py on `spec`; its results.
fn grpc(spec: &Value) -> Vec<Value> {
    common::grpc::run(spec)
}

/// `n` `/test.Echo/Unary` calls through the gateway: each must answer OK with its message
/// back; the server (`x-peer`) of each.
fn echo_through(gw: &Gateway, n: usize) -> Vec<String> {
    let out = grpc(&json!({
        "target": gw.addr.to_string(),
        "calls": [{"method": "/test.Echo/Unary", "messages": ["ping"], "repeat": n, "timeout": 5}],
    }));
    assert_eq!(out.len(), n);
    out.iter()
        .map(|r| {
            assert_eq!(r["code"], "OK", "{r}");
            assert_eq!(r["responses"], json!(["ping"]), "{r}");
            assert_eq!(r["initial"]["x-seen-method"], "yes", "{r}");
            r["initial"]["x-peer"].as_str().unwrap_or("").to_string()
        })
        .collect()
}

/// A gateway speaking h2c to its clients, with the pools `pools` (YAML under `upstreams:`)
/// and a route to the first, `app`.
fn gateway(pools: &str) -> Gateway {
    Gateway::start(&format!(
        "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: 2\n  h2c: true\nupstreams:\n{pools}routes:\n  - id: all\n    path: /**\n    upstream: app\ntenant:\n  required: false\n"
    ))
}

/// A pool `name` of `servers` with `extra` lines (indented by four).
fn pool(name: &str, servers: &[String], extra: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!("  {name}:\n    servers: [{}]\n{extra}\n", list.join(", "))
}

/// The health of `addr` in the pool `pool` (the admin API's view).
fn healthy(gw: &Gateway, pool: &str, addr: &str) -> Option<bool> {
    let status = common::request(gw.admin, "GET", "/api/status", &[])
        .ok()?
        .json();
    status["pools"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == pool)?["servers"]
        .as_array()?
        .iter()
        .find(|s| s["addr"] == addr)?["healthy"]
        .as_bool()
}

/// Until `addr` of `pool` is `want` and the log has said so (with `reason` for unhealthy).
fn wait_health(gw: &Gateway, pool: &str, addr: &str, want: bool, reason: &str) {
    let line = format!(
        "upstream {pool}: {addr} becomes {}",
        if want { "healthy" } else { "unhealthy" }
    );
    let logged = |log: &str| {
        log.lines()
            .any(|l| l.contains(&line) && (want || l.contains(reason)))
    };
    assert!(
        eventually(NOTICE, || healthy(gw, pool, addr) == Some(want)
            && logged(&gw.log())),
        "{addr} of {pool} is not {} ({reason}); log:\n{}",
        if want { "healthy" } else { "unhealthy" },
        gw.log()
    );
    let log = gw.log();
    assert!(!log.contains("panicked"), "{log}");
}

const CHECK: &str = "    protocol: h2c\n    health_check: { interval: 200ms, timeout: 1s, grpc: { service: \"\" } }";

#[test]
fn a_not_serving_server_is_taken_out_and_back_in_when_serving() {
    let (a, b) = (Peer::start(), Peer::start());
    let gw = gateway(&pool("app", &[a.name(), b.name()], CHECK));
    // both serve: calls through the gateway reach both
    let mut seen = echo_through(&gw, 10);
    seen.sort();
    seen.dedup();
    let mut both = vec![a.name(), b.name()];
    both.sort();
    assert_eq!(seen, both);

    a.set_health("=NOT_SERVING", None);
    wait_health(&gw, "app", &a.name(), false, "status NOT_SERVING");
    assert_eq!(healthy(&gw, "app", &b.name()), Some(true));
    let seen = echo_through(&gw, 20);
    assert!(seen.iter().all(|p| *p == b.name()), "{seen:?}");

    a.set_health("=SERVING", None);
    wait_health(&gw, "app", &a.name(), true, "");
    let seen = echo_through(&gw, 10);
    assert!(seen.contains(&a.name()), "{seen:?}");
    assert!(seen.contains(&b.name()), "{seen:?}");
}

#[test]
fn a_named_service_must_be_known_and_serving() {
    let p = Peer::start();
    let gw = gateway(&pool(
        "app",
        &[p.name()],
        "    protocol: h2c\n    health_check: { interval: 200ms, grpc: { service: billing } }",
    ));
    // grpcio answers a Check of a service it does not know with grpc-status NOT_FOUND
    wait_health(&gw, "app", &p.name(), false, "grpc-status 5 (NOT_FOUND)");
    p.set_health("billing=SERVING", None);
    wait_health(&gw, "app", &p.name(), true, "");
    // the service is asked about, not the server: the server's own status does not count
    p.set_health("=NOT_SERVING", None);
    p.set_health("billing=SERVICE_UNKNOWN", None);
    wait_health(&gw, "app", &p.name(), false, "status SERVICE_UNKNOWN");
    p.set_health("billing=SERVING", None);
    wait_health(&gw, "app", &p.name(), true, "");
    assert_eq!(echo_through(&gw, 3), vec![p.name(); 3]);
}

#[test]
fn a_server_that_does_not_speak_grpc_is_unhealthy_at_once() {
    // an HTTP/1.1-only server, and an HTTP/2 one that is not a gRPC health server (a gateway
    // speaking h2c in front of that server: its answer to the check is not SERVING, whether
    // the server's JSON without a grpc-status or a gRPC error of its own): both fail their
    // check at once, long before the check's 30 s timeout
    let up = Upstream::start("u");
    let h2 = Gateway::start(&format!(
        "{}tenant:\n  required: false\n",
        common::one_route_config(up.addr, 1, "  h2c: true")
    ));
    let t = Instant::now();
    let gw = gateway(&pool(
        "app",
        &[up.addr.to_string(), h2.addr.to_string()],
        "    protocol: h2c\n    health_check: { interval: 200ms, timeout: 30s, grpc: {} }",
    ));
    wait_health(&gw, "app", &up.addr.to_string(), false, "HTTP/2");
    wait_health(&gw, "app", &h2.addr.to_string(), false, "gRPC health check");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(!gw.log().contains("no answer within"), "{}", gw.log());
}

#[test]
fn a_server_that_never_answers_or_refuses_is_unhealthy() {
    let good = Peer::start();
    // connections complete (the kernel's backlog) but nothing is ever read or answered
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_addr = silent.local_addr().expect("addr").to_string();
    let refused = format!("127.0.0.1:{}", free_port());
    let gw = gateway(&pool(
        "app",
        &[good.name(), silent_addr.clone(), refused.clone()],
        "    protocol: h2c\n    health_check: { interval: 200ms, timeout: 300ms, grpc: {} }",
    ));
    wait_health(&gw, "app", &silent_addr, false, "no answer within 300ms");
    wait_health(&gw, "app", &refused, false, "cannot connect");
    // checked in the same rounds, the serving one stays in, and takes every call
    assert_eq!(healthy(&gw, "app", &good.name()), Some(true));
    assert_eq!(echo_through(&gw, 6), vec![good.name(); 6]);
    drop(silent);
}

#[test]
fn an_h2_pool_is_checked_over_tls_with_its_settings() {
    let dir = TempDir::new();
    common::make_cert(&dir.0, "srv", "localhost");
    common::make_cert(&dir.0, "other", "localhost");
    let p = Peer::start_tls(&dir, "srv");
    let ca = dir.0.join("srv.pem");
    let d = dir.0.display();
    let check = "    protocol: h2\n    health_check: { interval: 200ms, grpc: {} }";
    let gw = gateway(&format!(
        "{}{}{}",
        pool(
            "app",
            &[p.name()],
            &format!("{check}\n    tls: {{ sni: localhost, ca: {d}/srv.pem }}")
        ),
        // a CA that did not sign the server's certificate: the handshake fails
        pool(
            "wrongca",
            &[p.name()],
            &format!("{check}\n    tls: {{ sni: localhost, ca: {d}/other.pem }}")
        ),
        // unless verification is off
        pool(
            "noverify",
            &[p.name()],
            &format!("{check}\n    tls: {{ sni: localhost, ca: {d}/other.pem, verify: false }}")
        ),
    ));
    wait_health(&gw, "wrongca", &p.name(), false, "cannot connect");
    p.set_health("=NOT_SERVING", Some(&ca));
    wait_health(&gw, "app", &p.name(), false, "status NOT_SERVING");
    wait_health(&gw, "noverify", &p.name(), false, "status NOT_SERVING");
    p.set_health("=SERVING", Some(&ca));
    wait_health(&gw, "app", &p.name(), true, "");
    wait_health(&gw, "noverify", &p.name(), true, "");
    assert_eq!(healthy(&gw, "wrongca", &p.name()), Some(false));
}

#[test]
fn the_summary_prints_a_grpc_check_and_the_pool_protocol() {
    let dir = TempDir::new();
    let path = dir.write(
        "gateway.yaml",
        &format!(
            "server:\n  listen: [\"127.0.0.1:8080\"]\nupstreams:\n{}{}routes:\n  - id: all\n    path: /**\n    upstream: app\ntenant:\n  required: false\n",
            pool("app", &["127.0.0.1:9001".into()], "    protocol: h2c\n    health_check: { interval: 2s, grpc: {} }"),
            // the contract's own form: the interval is 1s unless given
            pool("billing", &["127.0.0.1:9002".into()], "    protocol: h2c\n    health_check: { grpc: { service: billing.v1 } }"),
        ),
    );
    let (code, out, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "round_robin h2c [127.0.0.1:9001] grpc every 2s",
        "round_robin h2c [127.0.0.1:9002] grpc \"billing.v1\" every 1s",
    ] {
        assert!(out.contains(want), "{want:?} missing in:\n{out}");
    }
}

/// An HTTP check on an HTTP/2 pool speaks HTTP/2: a server that speaks nothing else (the
/// benchmarks' gRPC server, which answers any path) is healthy by it. The server is down
/// first (unhealthy), then starts on its address and must become healthy.
#[test]
fn an_http_check_of_an_http2_pool_speaks_http2() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let gw = gateway(&pool(
        "app",
        std::slice::from_ref(&addr),
        "    protocol: h2c\n    health_check: { interval: 200ms, http: { path: /healthz } }",
    ));
    wait_health(&gw, "app", &addr, false, "");
    let mut up = std::process::Command::new(repo().join("target/debug/examples/grpc_upstream"));
    up.arg(&addr);
    let (child, _) = common::spawn_listening(up);
    let _up = common::KillOnDrop(vec![child.id() as i32]);
    wait_health(&gw, "app", &addr, true, "");
}
