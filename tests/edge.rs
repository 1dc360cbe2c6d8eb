//! The edge (issue 10, contract section 9) with real clients: TLS termination with SNI and
//! certificate reload (a Rust TLS client and curl), HTTP/2 over TLS and h2c (curl), upstream
//! TLS (the example upstream speaking HTTPS), WebSocket through the gateway (a Rust client and
//! the `ws_echo` example), the tenant header, and the pool's `retries`.

mod common;

use common::*;
use pingora::tls::nid::Nid;
use pingora::tls::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

/// A TLS connection that does not verify, asking for `sni`.
fn tls_connect(addr: SocketAddr, sni: &str) -> SslStream<TcpStream> {
    tls_handshake(addr, sni, |b| b.set_alpn_protos(b"\x08http/1.1").unwrap())
        .expect("TLS handshake")
}

/// A TLS handshake that does not verify, asking for `sni`, the connector set up by `setup`.
fn tls_handshake(
    addr: SocketAddr,
    sni: &str,
    setup: impl FnOnce(&mut pingora::tls::ssl::SslConnectorBuilder),
) -> Option<SslStream<TcpStream>> {
    let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    setup(&mut b);
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    b.build()
        .configure()
        .unwrap()
        .verify_hostname(false)
        .connect(sni, tcp)
        .ok()
}

fn peer_cn(s: &SslStream<TcpStream>) -> String {
    let cert = s.ssl().peer_certificate().expect("a certificate");
    let cn = cert
        .subject_name()
        .entries_by_nid(Nid::COMMONNAME)
        .next()
        .expect("a CN")
        .data()
        .as_slice()
        .to_vec();
    String::from_utf8(cn).unwrap_or_default()
}

fn peer_digest(s: &SslStream<TcpStream>) -> Vec<u8> {
    let cert = s.ssl().peer_certificate().expect("a certificate");
    cert.digest(pingora::tls::hash::MessageDigest::sha256())
        .unwrap()
        .to_vec()
}

struct Curl {
    code: u16,
    version: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Curl {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn curl(dir: &Path, args: &[&str]) -> Curl {
    let hdr = dir.join("curl-headers");
    let body = dir.join("curl-body");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-D"])
        .arg(&hdr)
        .arg("-o")
        .arg(&body)
        .args(["-w", "%{http_code} %{http_version}"])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (code, version) = text.split_once(' ').unwrap_or(("0", ""));
    let headers = std::fs::read_to_string(&hdr)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Curl {
        code: code.parse().unwrap_or(0),
        version: version.to_string(),
        headers,
        body: std::fs::read_to_string(&body).unwrap_or_default(),
    }
}

fn tls_config(up: SocketAddr, tls_port: u16, server_extra: &str, tail: &str) -> String {
    format!(
        "server:\n  listen:\n    - \"{{LISTEN}}\"\n    - addr: \"127.0.0.1:{tls_port}\"\n      tls: {{ cert: gw.pem, key: gw.key }}\n  admin: \"{{ADMIN}}\"\n  threads: 1\n{server_extra}upstreams:\n  app:\n    servers: [\"{up}\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n{tail}"
    )
}

const LIMITS: &str = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\nlimits:\n  - id: per-org\n    pathPattern: /**\n    tiers: [{ period: 10, threshold: 2 }]\n";

/// `LIMITS` with a period of 10 s or a little more whose window has 8 s left now: a test's few
/// requests fall in one window (with 10 s exactly, a window's end between them let the third
/// request through once in `make test`).
fn limits() -> String {
    LIMITS.replace(
        "period: 10",
        &format!("period: {}", period_with_room(10, 8)),
    )
}

/// Start a gateway whose directory already holds the certificates `certs` (name, host).
fn start_tls(template: &str, certs: &[(&str, &str)]) -> Gateway {
    let dir = TempDir::new();
    for (name, host) in certs {
        make_cert(&dir.0, name, host);
    }
    let files: Vec<(String, String)> = certs
        .iter()
        .flat_map(|(name, _)| {
            ["pem", "key"].map(|ext| {
                let f = format!("{name}.{ext}");
                let text = std::fs::read_to_string(dir.0.join(&f)).unwrap();
                (f, text)
            })
        })
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    Gateway::start_with_files(template, &files)
}

/// A gateway with a plain and a TLS listener (certificate `gw` for localhost) before `up`;
/// the TLS listener's address.
fn one_tls_listener(up: &Upstream) -> (Gateway, SocketAddr) {
    let tls_port = free_port();
    let gw = start_tls(
        &tls_config(up.addr, tls_port, "", ""),
        &[("gw", "localhost")],
    );
    (gw, format!("127.0.0.1:{tls_port}").parse().unwrap())
}

/// A TLS listener offers Mozilla intermediate's key exchange groups only (X25519, P-256,
/// P-384; OpenSSL 3 alone would add X448 and P-521), and starting one logs no failed handshake
/// (the readiness probe's connection completes its own).
#[test]
fn tls_offers_intermediate_groups_and_starts_without_a_handshake_error() {
    let up = Upstream::start("app");
    let (gw, tls_addr) = one_tls_listener(&up);
    let with_group = |group: &str| {
        tls_handshake(tls_addr, "localhost", |b| b.set_groups_list(group).unwrap()).is_some()
    };
    for ok in ["X25519", "P-256", "P-384"] {
        assert!(with_group(ok), "{ok} is offered");
    }
    // by now the probe's connection (accepted before these three) has been handled
    let log = gw.log();
    assert!(log.contains("ready: listening"), "{log}");
    assert!(
        !log.contains("handshake error"),
        "the readiness probe's connection failed a handshake: {log}"
    );
    for refused in ["X448", "P-521"] {
        assert!(!with_group(refused), "{refused} is not offered");
    }
}

#[test]
fn tls_picks_the_certificate_by_sni_and_serves_http2() {
    let up = Upstream::start("app");
    let tls_port = free_port();
    let extra = "  certificates:\n    - hosts: [\"api.example.com\"]\n      cert: api.pem\n      key: api.key\n    - hosts: [\"*.example.com\"]\n      cert: wild.pem\n      key: wild.key\n";
    let gw = start_tls(
        &tls_config(up.addr, tls_port, extra, &limits()),
        &[
            ("gw", "localhost"),
            ("api", "api.example.com"),
            ("wild", "*.example.com"),
        ],
    );
    let tls_addr: SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    // exact host, then wildcard (one label), then the listener's own
    assert_eq!(
        peer_cn(&tls_connect(tls_addr, "api.example.com")),
        "api.example.com"
    );
    assert_eq!(
        peer_cn(&tls_connect(tls_addr, "eu.example.com")),
        "*.example.com"
    );
    assert_eq!(
        peer_cn(&tls_connect(tls_addr, "API.Example.COM")),
        "api.example.com"
    );
    assert_eq!(
        peer_cn(&tls_connect(tls_addr, "a.b.example.com")),
        "localhost"
    );
    assert_eq!(peer_cn(&tls_connect(tls_addr, "other.test")), "localhost");

    // HTTP/2 over TLS (ALPN), verified against the certificate curl is given
    let dir = &gw.dir.0;
    let url = format!("https://api.example.com:{tls_port}/v1/things");
    let resolve = format!("api.example.com:{tls_port}:127.0.0.1");
    let cacert = dir.join("api.pem").display().to_string();
    let h2 = |org: &str| {
        curl(
            dir,
            &[
                "--http2",
                "--cacert",
                &cacert,
                "--resolve",
                &resolve,
                "-H",
                &format!("x-org-id: {org}"),
                &url,
            ],
        )
    };
    let first = h2("acme");
    assert_eq!(
        (first.code, first.version.as_str()),
        (200, "2"),
        "{}",
        first.body
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert!(first.header("ratelimit").is_some_and(|v| v.contains("r=1")));
    assert!(first.header("ratelimit-policy").is_some());
    let seen: serde_json::Value = serde_json::from_str(&first.body).unwrap();
    assert!(
        seen["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "x-tenant-id" && h[1] == "acme"),
        "the tenant reaches the upstream: {}",
        first.body
    );
    assert_eq!(h2("acme").code, 200);
    let denied = h2("acme");
    assert_eq!((denied.code, denied.version.as_str()), (429, "2"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert!(denied.header("retry-after").is_some());
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert!(denied.body.contains("\"status\":429"), "{}", denied.body);
    // a route that does not match gets its problem+json over HTTP/2 too
    // (no tenant: 401 when required is off? the header source is optional here, so 200)
    let one_one = curl(
        dir,
        &[
            "--http1.1",
            "--cacert",
            &cacert,
            "--resolve",
            &resolve,
            "-H",
            "x-org-id: globex",
            &url,
        ],
    );
    assert_eq!((one_one.code, one_one.version.as_str()), (200, "1.1"));
    let m = gw.metrics();
    assert!(
        metric_sum(&m, "tollgate_ratelimit_decisions_total{decision=\"denied\"") >= 1.0,
        "{m}"
    );
    assert!(
        metric_sum(&m, "tollgate_requests_total{route=\"all\",status=\"429\"") >= 1.0,
        "{m}"
    );
    assert!(
        metric_sum(&m, "tollgate_requests_total{route=\"all\",status=\"200\"") >= 3.0,
        "{m}"
    );
}

#[test]
fn plain_listeners_take_http2_prior_knowledge_with_h2c() {
    let up = Upstream::start("app");
    let cfg = one_route_config(up.addr, 1, "  h2c: true") + &limits();
    let gw = Gateway::start(&cfg);
    let url = format!("http://{}/v1/x", gw.addr);
    let r = curl(
        &gw.dir.0,
        &["--http2-prior-knowledge", "-H", "x-org-id: acme", &url],
    );
    assert_eq!((r.code, r.version.as_str()), (200, "2"), "{}", r.body);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    // HTTP/1.1 on the same listener still works
    let r = curl(&gw.dir.0, &["--http1.1", "-H", "x-org-id: acme", &url]);
    assert_eq!((r.code, r.version.as_str()), (200, "1.1"));
    let r = curl(
        &gw.dir.0,
        &["--http2-prior-knowledge", "-H", "x-org-id: acme", &url],
    );
    assert_eq!(r.code, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
}

/// Over HTTP/2 the values unique to one answer (`x-ratelimit-remaining`, `RateLimit`, the
/// request id) go as never-indexed literals (RFC 7541 6.2.3): they neither fill the
/// connection's HPACK table nor push its constant fields out; the constant quota fields
/// (`x-ratelimit-limit`, `RateLimit-Policy`) are indexed. Read by python-hyper's `hpack`.
#[test]
fn over_http2_the_values_unique_to_an_answer_are_never_indexed() {
    let up = Upstream::start("app");
    let cfg = one_route_config(up.addr, 1, "  h2c: true")
        + "limits:\n  - id: hourly\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1000 }]\n";
    let gw = Gateway::start(&cfg);
    let out = Command::new(test_python())
        .arg(repo().join("tests/h2/hpack_probe.py"))
        .args([
            &gw.addr.to_string(),
            "/v1/x",
            "3",
            r#"[["x-org-id", "acme"]]"#,
        ])
        .output()
        .expect("run tests/h2/hpack_probe.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Vec<(String, String, bool)>> =
        serde_json::from_slice(&out.stdout).expect("the probe prints JSON");
    assert_eq!(answers.len(), 3);
    for (i, fields) in answers.iter().enumerate() {
        let never = |name: &str| fields.iter().find(|f| f.0 == name).map(|f| f.2);
        assert_eq!(
            fields
                .iter()
                .find(|f| f.0 == "x-ratelimit-remaining")
                .map(|f| f.1.as_str()),
            Some(["999", "998", "997"][i]),
            "{fields:?}"
        );
        for unique in ["x-ratelimit-remaining", "ratelimit", "x-request-id"] {
            assert_eq!(never(unique), Some(true), "{unique} in {fields:?}");
        }
        for constant in ["x-ratelimit-limit", "ratelimit-policy"] {
            assert_eq!(never(constant), Some(false), "{constant} in {fields:?}");
        }
    }
}

#[test]
fn without_h2c_a_plain_listener_does_not_speak_http2() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&one_route_config(up.addr, 1, ""));
    let url = format!("http://{}/v1/x", gw.addr);
    let r = curl(&gw.dir.0, &["--http2-prior-knowledge", &url]);
    assert_ne!(r.version, "2", "h2c is off by default");
}

#[test]
fn sighup_reloads_certificates_for_new_handshakes_only() {
    let up = Upstream::start("app");
    let (gw, tls_addr) = one_tls_listener(&up);
    let mut open = tls_connect(tls_addr, "localhost");
    let before = peer_digest(&open);
    assert_eq!(get_on(&mut open, "/a", &[]).0, 200);

    // a new certificate in the same files
    make_cert(&gw.dir.0, "gw", "localhost");
    let reloads = gw.log().matches("reloaded").count();
    let pid = gw.child.id().to_string();
    Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || gw
            .log()
            .matches("reloaded")
            .count()
            > reloads),
        "reload logged: {}",
        gw.log()
    );
    let fresh = tls_connect(tls_addr, "localhost");
    assert_ne!(
        peer_digest(&fresh),
        before,
        "new handshakes use the new certificate"
    );
    // the connection opened before the reload goes on
    assert_eq!(get_on(&mut open, "/b", &[]).0, 200);
    assert_eq!(peer_digest(&open), before);

    // a broken certificate is a reload error: the running one stays
    let now = peer_digest(&fresh);
    std::fs::write(gw.dir.0.join("gw.pem"), "not a certificate\n").unwrap();
    let failures = gw.log().matches("gw.pem").count();
    Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || gw
            .log()
            .matches("gw.pem")
            .count()
            > failures),
        "the reload error names the file: {}",
        gw.log()
    );
    assert_eq!(peer_digest(&tls_connect(tls_addr, "localhost")), now);
}

#[test]
fn bad_certificate_files_are_config_errors_with_their_path() {
    let dir = TempDir::new();
    make_cert(&dir.0, "gw", "localhost");
    make_cert(&dir.0, "other", "localhost");
    let cfg = |cert: &str, key: &str| {
        format!(
            "server:\n  listen:\n    - addr: \"127.0.0.1:1\"\n      tls: {{ cert: {cert}, key: {key} }}\nupstreams:\n  app:\n    servers: [\"127.0.0.1:2\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n"
        )
    };
    let check = |text: String| {
        let f = dir.write("gateway.yaml", &text);
        run_tollgate(&["-t", "-c", f.to_str().unwrap()])
    };
    let (code, _, err) = check(cfg("gw.pem", "gw.key"));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = check(cfg("missing.pem", "gw.key"));
    assert_eq!(code, 1);
    assert!(
        err.contains("gateway.yaml:4:20: server.listen[0].tls.cert: cannot read"),
        "{err}"
    );
    assert!(err.contains("missing.pem"), "{err}");
    let (code, _, err) = check(cfg("gw.pem", "other.key"));
    assert_eq!(code, 1);
    assert!(
        err.contains("server.listen[0].tls.key: the key in"),
        "{err}"
    );
    assert!(err.contains("does not belong to the certificate"), "{err}");
    let (code, _, err) = check(cfg("gw.key", "gw.key"));
    assert_eq!(code, 1);
    assert!(err.contains("holds no PEM certificate"), "{err}");
    // certificates by SNI need a TLS listener, and valid host names
    let text = "server:\n  listen: [\"127.0.0.1:1\"]\n  certificates:\n    - hosts: [\"bad host\"]\n      cert: gw.pem\n      key: gw.key\nupstreams:\n  app:\n    servers: [\"127.0.0.1:2\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n";
    let (code, _, err) = check(text.to_string());
    assert_eq!(code, 1);
    assert!(err.contains("invalid host \"bad host\""), "{err}");
    assert!(err.contains("no listener has tls"), "{err}");
}

fn tls_upstream(dir: &Path) -> (Child, SocketAddr) {
    make_cert(dir, "up", "upstream.test");
    let cert = dir.join("up.pem").display().to_string();
    let key = dir.join("up.key").display().to_string();
    let mut cmd = Command::new(upstream_bin());
    cmd.args(["127.0.0.1:0", "secure"])
        .env("UPSTREAM_TLS", format!("{cert}:{key}"));
    spawn_listening(cmd)
}

#[test]
fn upstream_tls_verifies_the_server_against_the_ca() {
    let dir = TempDir::new();
    let (mut child, up) = tls_upstream(&dir.0);
    make_cert(&dir.0, "stranger", "upstream.test");
    let ca = |extra: &str| {
        format!(
            "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: 1\nupstreams:\n  app:\n    servers: [\"{up}\"]\n    tls: {{ sni: upstream.test, {extra} }}\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n"
        )
    };
    let pem = |n: &str| std::fs::read_to_string(dir.0.join(n)).unwrap();
    let files = [
        ("up.pem", pem("up.pem")),
        ("stranger.pem", pem("stranger.pem")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(a, b)| (*a, b.as_str())).collect();

    let gw = Gateway::start_with_files(&ca("ca: up.pem"), &files);
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["server"], "secure");
    drop(gw);

    let gw = Gateway::start_with_files(&ca("ca: stranger.pem"), &files);
    assert_eq!(
        gw.get("/hello", &[]).status,
        502,
        "an unverified server is refused"
    );
    drop(gw);

    let gw = Gateway::start_with_files(&ca("ca: stranger.pem, verify: false"), &files);
    assert_eq!(gw.get("/hello", &[]).status, 200);
    let (code, _, err) = run_tollgate(&["-t", "-c", gw.config.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        err.contains("gateway.yaml:8:") && err.contains("warning: upstreams.app.tls.verify: false"),
        "-t prints the warning with its position: {err}"
    );
    assert!(
        gw.log()
            .contains("warning: upstreams.app.tls.verify: false"),
        "{}",
        gw.log()
    );
    drop(gw);

    // without `ca`, the system's roots: a self-signed server is refused
    let gw = Gateway::start_with_files(&ca("verify: true"), &files);
    assert_eq!(gw.get("/hello", &[]).status, 502);
    drop(gw);

    // the wrong name is refused as well
    let wrong_name = ca("ca: up.pem").edit("sni: upstream.test", "sni: other.test");
    let gw = Gateway::start_with_files(&wrong_name, &files);
    assert_eq!(gw.get("/hello", &[]).status, 502);
    let _ = child.kill();
    let _ = child.wait();
}

struct WsEcho {
    child: Child,
    addr: SocketAddr,
}

impl WsEcho {
    fn start() -> Self {
        let mut cmd = Command::new(upstream_bin().with_file_name("ws_echo"));
        cmd.arg("127.0.0.1:0");
        let (child, addr) = spawn_listening(cmd);
        WsEcho { child, addr }
    }
}

impl Drop for WsEcho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn websocket_is_tunnelled_and_counted_once() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let ws = WsEcho::start();
    let limits = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\nlimits:\n  - id: per-org\n    pathPattern: /ws/**\n    tiers: [{ period: 10, threshold: 1 }]\n";
    let gw = Gateway::start(&(one_route_config(ws.addr, 1, "") + limits));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("ws://{}/ws/chat", gw.addr);
    let connect = |org: &'static str| {
        let mut req = url.clone().into_client_request().unwrap();
        req.headers_mut().insert("x-org-id", org.parse().unwrap());
        req.headers_mut()
            .insert("x-tenant-id", "forged".parse().unwrap());
        tokio_tungstenite::connect_async(req)
    };
    rt.block_on(async {
        let (mut s, resp) = connect("acme")
            .await
            .unwrap_or_else(|e| panic!("handshake through the gateway: {e}\n{}", gw.log()));
        assert_eq!(resp.status(), 101);
        assert_eq!(resp.headers().get("x-ratelimit-remaining").unwrap(), "0");
        let first = s.next().await.unwrap().unwrap();
        assert_eq!(
            first,
            Message::text("tenant: acme"),
            "the gateway's tenant, not the client's copy"
        );
        for i in 0..5 {
            s.send(Message::text(format!("hi {i}"))).await.unwrap();
            let back = s.next().await.unwrap().unwrap();
            assert_eq!(back, Message::text(format!("echo: hi {i}")));
        }
        s.close(None).await.unwrap();
        // the handshake was the one request counted: the next one is over the limit
        match connect("acme").await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 429),
            other => panic!("expected 429, got {:?}", other.map(|(_, r)| r.status())),
        }
        // another tenant has its own quota
        let (mut s, _) = connect("globex").await.expect("another tenant");
        assert_eq!(
            s.next().await.unwrap().unwrap(),
            Message::text("tenant: globex")
        );
    });
    let m = gw.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total{decision=\"allowed\""
        ),
        2.0,
        "{m}"
    );
}

/// `max_body_bytes` is for request bodies: the messages of a tunnel after its `101` are not
/// counted, however many bytes they carry (it wrote a 413 into the stream and closed it).
#[test]
fn a_websocket_tunnel_carries_more_than_max_body_bytes() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let ws = WsEcho::start();
    let gw = Gateway::start(&one_route_config(ws.addr, 1, "  max_body_bytes: 1000"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("ws://{}/ws/big", gw.addr);
        let (mut s, resp) = tokio_tungstenite::connect_async(url)
            .await
            .unwrap_or_else(|e| panic!("handshake: {e}\n{}", gw.log()));
        assert_eq!(resp.status(), 101);
        let _tenant_line = s.next().await.unwrap().unwrap();
        // 20 messages of 600 bytes (12 KB), then one of 64 KiB, against a 1000-byte limit
        for i in 0..20 {
            let text = format!("{i:03}{}", "m".repeat(597));
            s.send(Message::text(text.clone())).await.unwrap();
            let back = s.next().await.unwrap().unwrap();
            assert_eq!(back, Message::text(format!("echo: {text}")), "message {i}");
        }
        let big = vec![7u8; 65536];
        s.send(Message::binary(big.clone())).await.unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), Message::binary(big));
        s.close(None).await.unwrap();
    });
    // request bodies are still limited on the same listener
    let body = "b".repeat(2000);
    let raw = format!(
        "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    assert_eq!(request_raw(gw.addr, raw.as_bytes()).unwrap().status, 413);
}

#[test]
fn the_tenant_header_is_the_gateways_own() {
    let up = Upstream::start("app");
    let tenant = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n";
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + tenant));
    let r = gw.get("/a", &[("x-org-id", "acme"), ("x-tenant-id", "evil")]);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["acme".to_string()]);
    drop(gw);

    let off =
        "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n  forward_header: false\n";
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + off));
    let r = gw.get("/a", &[("x-org-id", "acme"), ("x-tenant-id", "evil")]);
    assert!(r.upstream_headers("x-tenant-id").is_empty(), "{}", r.body);
    drop(gw);

    let named = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n  forward_header: x-customer\n";
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + named));
    let r = gw.get(
        "/a",
        &[
            ("x-org-id", "acme"),
            ("x-customer", "evil"),
            ("x-tenant-id", "kept"),
        ],
    );
    assert_eq!(r.upstream_headers("x-customer"), vec!["acme".to_string()]);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["kept".to_string()]);
}

#[test]
fn retries_stop_at_the_pools_setting() {
    let up = Upstream::start("live");
    let dead = |n: usize| -> Vec<String> {
        (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect()
    };
    let config = |retries: usize, servers: &[String]| {
        let list = servers
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: 1\nupstreams:\n  app:\n    servers: [{list}]\n    retries: {retries}\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n"
        )
    };
    // two dead servers before the live one: 2 retries reach it every time
    let mut servers = dead(2);
    servers.push(up.addr.to_string());
    let gw = Gateway::start(&config(2, &servers));
    let ok = (0..20).filter(|_| gw.get("/", &[]).status == 200).count();
    assert_eq!(ok, 20);
    drop(gw);
    // no retries: a request sent to a dead server fails
    let gw = Gateway::start(&config(0, &servers));
    let codes: Vec<u16> = (0..6).map(|_| gw.get("/", &[]).status).collect();
    assert!(codes.contains(&502), "{codes:?}");
}

#[test]
fn client_input_limits_answer_431_and_413() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&one_route_config(up.addr, 1, "  max_body_bytes: 1000"));
    // the default header limit is 64 KiB
    let big = "x".repeat(70_000);
    let r = gw.get("/a", &[("x-big", &big)]);
    assert_eq!(r.status, 431, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let fine = "x".repeat(60_000);
    assert_eq!(gw.get("/a", &[("x-big", &fine)]).status, 200);

    let post = |body: &str, chunked: bool| {
        let head = if chunked {
            format!(
                "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            )
        } else {
            format!(
                "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        };
        request_raw(gw.addr, head.as_bytes()).expect("an answer")
    };
    assert_eq!(post(&"b".repeat(500), false).status, 200);
    let r = post(&"b".repeat(2000), false);
    assert_eq!(r.status, 413, "declared length: {}", r.body);
    assert!(r.body.contains("\"status\":413"), "{}", r.body);
    assert_eq!(post(&"b".repeat(500), true).status, 200);
    assert_eq!(post(&"b".repeat(3000), true).status, 413, "while streaming");
    // counted under the route they matched (a 413 by Content-Length was route="none")
    assert_eq!(
        metric_sum(
            &gw.metrics(),
            "tollgate_requests_total{route=\"all\",status=\"413\"}"
        ),
        2.0
    );
    assert_eq!(
        metric_sum(
            &gw.metrics(),
            "tollgate_requests_total{route=\"all\",status=\"431\"}"
        ),
        1.0
    );
    drop(gw);

    let gw = Gateway::start(&one_route_config(
        up.addr,
        1,
        "  max_request_header_bytes: 2048",
    ));
    assert_eq!(gw.get("/a", &[("x-big", &"x".repeat(3000))]).status, 431);
    assert_eq!(gw.get("/a", &[("x-big", &"x".repeat(1000))]).status, 200);
}

#[test]
fn slow_clients_are_disconnected_after_client_header_timeout() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&one_route_config(up.addr, 2, "  client_header_timeout: 1s"));
    let started = std::time::Instant::now();
    // a header sent one byte every 200 ms never completes in time
    let mut slow = TcpStream::connect(gw.addr).unwrap();
    slow.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut closed_after = None;
    for _ in 0..40 {
        // the slow client itself: one byte every 200 ms
        std::thread::sleep(Duration::from_millis(200));
        if slow.write_all(b"x").is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        slow.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        let gone = matches!(slow.read(&mut b), Ok(0));
        slow.set_nonblocking(false).unwrap();
        if gone {
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("the slow client is disconnected");
    assert!(
        closed_after >= Duration::from_millis(900) && closed_after < Duration::from_secs(4),
        "{closed_after:?}"
    );
    // a connection that sends nothing is closed too
    let mut idle = TcpStream::connect(gw.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = std::time::Instant::now();
    let mut b = [0u8; 16];
    assert!(matches!(idle.read(&mut b), Ok(0) | Err(_)));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // an idle kept-alive connection is closed after the same time
    let mut kept = TcpStream::connect(gw.addr).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (status, _) = get_on(&mut kept, "/a", &[]);
    assert_eq!(status, 200);
    let t = std::time::Instant::now();
    assert!(matches!(kept.read(&mut b), Ok(0) | Err(_)));
    let idle = t.elapsed();
    assert!(
        idle >= Duration::from_millis(900) && idle < Duration::from_secs(3),
        "{idle:?}"
    );
    // a request whose header came in time may take longer than the timeout
    let r = gw.get("/delay/1500", &[]);
    assert_eq!(r.status, 200);
    // and ordinary clients are served
    assert_eq!(gw.get("/a", &[]).status, 200);
}

#[test]
fn a_tls_pools_health_check_speaks_tls() {
    let dir = TempDir::new();
    let (mut child, secure) = tls_upstream(&dir.0);
    let plain = Upstream::start("plain");
    let cfg = format!(
        "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: 1\nupstreams:\n  app:\n    servers: [\"{secure}\", \"{}\"]\n    tls: {{ sni: upstream.test, ca: up.pem }}\n    health_check: {{ interval: 200ms, timeout: 200ms }}\n    retries: 0\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n",
        plain.addr
    );
    let pem = std::fs::read_to_string(dir.0.join("up.pem")).unwrap();
    let gw = Gateway::start_with_files(&cfg, &[("up.pem", &pem)]);
    // the plain server accepts TCP connections but no TLS handshake: its check fails (no
    // retries, so a request sent to it would fail); until the pool says so
    let plain_addr = plain.addr.to_string();
    assert!(
        eventually(Duration::from_secs(5), || server_healthy(&gw, &plain_addr)
            == Some(false)),
        "{}",
        gw.log()
    );
    assert_eq!(server_healthy(&gw, &secure.to_string()), Some(true));
    let codes: Vec<u16> = (0..10).map(|_| gw.get("/x", &[]).status).collect();
    assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_request_a_server_received_is_not_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    // a server that reads each request and closes without answering
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closer = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let seen = received.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut b = [0u8; 4096];
            if matches!(s.read(&mut b), Ok(n) if n > 0) {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let live = Upstream::start("live");
    let cfg = format!(
        "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: 1\nupstreams:\n  app:\n    servers: [\"{closer}\", \"{}\"]\n    retries: 2\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n",
        live.addr
    );
    let gw = Gateway::start(&cfg);
    let mut failed = 0;
    for i in 0..6 {
        let r = if i % 2 == 0 {
            gw.get("/a", &[])
        } else {
            let raw = "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
            request_raw(gw.addr, raw.as_bytes()).unwrap()
        };
        match r.status {
            200 => {}
            502 => failed += 1,
            s => panic!("unexpected {s}"),
        }
    }
    assert!(
        failed > 0,
        "round robin sent some requests to the closing server"
    );
    assert_eq!(
        received.load(Ordering::SeqCst),
        failed,
        "each of those reached it once and was answered 502, not retried elsewhere"
    );
}
