//! Redis as operators run it: `rediss://` with a private CA and a client certificate, an ACL
//! user whose password comes from a file, and only the commands the README lists. A real
//! redis-server with `--tls-port` and `--tls-auth-clients yes`; the gateway's counts must reach
//! it, and a server it cannot verify (no CA, or a name the certificate does not hold) must not
//! get them, with the reason in the log and `on_failure` applying.

mod common;
use common::*;
use std::time::Duration;

/// The ACL the README gives for the gateway's user (key prefix `tollgate`).
/// (redis-server takes each word of a directive as its own argument.)
const ACL: &[&str] = &[
    "--user",
    "default",
    "on",
    ">admin-secret",
    "~*",
    "&*",
    "+@all",
    "--user",
    "gateway",
    "on",
    ">gw-secret",
    "~tollgate:*",
    "resetchannels",
    "-@all",
    "+evalsha",
    "+script|load",
    "+incrby",
    "+pexpireat",
    "+ping",
    "+get",
    "+set",
    "+hgetall",
    "+hset",
    "+pexpire",
    "+zadd",
    "+zcard",
    "+zremrangebyscore",
];

struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
    certs: TempDir,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        let certs = TempDir::new();
        make_cert(&certs.0, "server", "localhost");
        make_cert(&certs.0, "client", "tollgate");
        let tls_port = free_port();
        let p = |n: &str| certs.0.join(n).display().to_string();
        let (tp, cert, key, ca) = (
            tls_port.to_string(),
            p("server.pem"),
            p("server.key"),
            p("client.pem"),
        );
        let mut args = vec![
            "--tls-port",
            &tp,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "yes",
        ];
        args.extend_from_slice(ACL);
        // the plain port answers the test (as the default user), the TLS port the gateway
        let server = RedisServer::start_with(&args);
        TlsRedis {
            server,
            tls_port,
            certs,
        }
    }

    fn admin(&self, args: &[&str]) -> redis::Value {
        let client = redis::Client::open(format!(
            "redis://:admin-secret@127.0.0.1:{}",
            self.server.port
        ))
        .expect("client");
        let mut conn = client.get_connection().expect("admin connection");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).expect("admin command")
    }

    fn keys(&self) -> Vec<String> {
        match self.admin(&["KEYS", "tollgate:*"]) {
            redis::Value::Array(v) => v
                .iter()
                .filter_map(|k| match k {
                    redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn config(up: std::net::SocketAddr, url: &str, tls: &str) -> String {
    let mut c = one_route_config(up, 1, "");
    c.push_str(&format!(
        r#"tenant:
  from: [{{ header: x-org-id, trusted: true }}]
limits:
  - id: per-tenant
    pathPattern: /**
    tiers: [{{ period: 60, threshold: 5 }}]
redis:
  url: "{url}"
  username: gateway
  password_file: redis.pass
  sync_interval: 200ms
  timeout: 1s
  on_failure: local
  {tls}
"#
    ));
    c
}

fn files(r: &TlsRedis) -> Vec<(&'static str, String)> {
    let read = |n: &str| std::fs::read_to_string(r.certs.0.join(n)).expect("cert");
    vec![
        // as `echo gw-secret > redis.pass` writes it: the newline is not part of it
        ("redis.pass", "gw-secret\n".to_string()),
        ("ca.pem", read("server.pem")),
        ("client.pem", read("client.pem")),
        ("client.key", read("client.key")),
    ]
}

fn start(up: &Upstream, r: &TlsRedis, url: &str, tls: &str) -> Gateway {
    let files = files(r);
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    Gateway::start_with_files(&config(up.addr, url, tls), &files)
}

const TLS: &str = "tls: { ca: ca.pem, cert: client.pem, key: client.key }";

#[test]
fn counts_reach_a_tls_redis_as_an_acl_user_with_the_readme_commands_only() {
    let up = Upstream::start("app");
    let r = TlsRedis::start();
    let url = format!("rediss://localhost:{}", r.tls_port);
    let gw = start(&up, &r, &url, TLS);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    for _ in 0..3 {
        assert_eq!(gw.get("/x", &[("x-org-id", "acme")]).status, 200);
    }
    // the counts are in Redis, under the user's key prefix
    assert!(
        eventually(Duration::from_secs(10), || !r.keys().is_empty()),
        "no key in Redis; log:\n{}",
        gw.log()
    );
    // and no command of the gateway's was refused by the ACL
    let log = r.admin(&["ACL", "LOG"]);
    assert!(
        matches!(&log, redis::Value::Array(v) if v.is_empty()),
        "ACL refusals: {log:?}"
    );
    // the fleet limit holds through Redis: the 6th request of the window is refused
    let statuses: Vec<u16> = (0..3)
        .map(|_| gw.get("/x", &[("x-org-id", "acme")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "{}", gw.log());
}

#[test]
fn a_redis_the_gateway_cannot_verify_gets_nothing_and_on_failure_applies() {
    let up = Upstream::start("app");
    let r = TlsRedis::start();
    // no CA: the system's roots do not know the server's certificate
    let no_ca = start(
        &up,
        &r,
        &format!("rediss://localhost:{}", r.tls_port),
        "tls: { cert: client.pem, key: client.key }",
    );
    // a name the certificate does not hold (it names localhost, not 127.0.0.1)
    let wrong_name = start(&up, &r, &format!("rediss://127.0.0.1:{}", r.tls_port), TLS);
    for gw in [&no_ca, &wrong_name] {
        assert!(
            eventually(Duration::from_secs(10), || gw.log().contains("redis:")),
            "{}",
            gw.log()
        );
        assert!(wait_redis_state(gw, "disconnected"), "{}", gw.log());
        // on_failure: local: traffic flows, limited per instance
        let statuses: Vec<u16> = (0..6)
            .map(|_| gw.get("/x", &[("x-org-id", "acme")]).status)
            .collect();
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
        let log = gw.log().to_lowercase();
        assert!(log.contains("certificate"), "the reason is logged: {log}");
    }
    assert!(r.keys().is_empty(), "{:?}", r.keys());
}

#[test]
fn a_wrong_password_is_refused_by_redis_and_said_in_the_log() {
    let up = Upstream::start("app");
    let r = TlsRedis::start();
    let mut files = files(&r);
    files[0].1 = "not-the-password\n".into();
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let url = format!("rediss://localhost:{}", r.tls_port);
    let gw = Gateway::start_with_files(&config(up.addr, &url, TLS), &files);
    assert!(wait_redis_state(&gw, "disconnected"), "{}", gw.log());
    assert!(
        eventually(Duration::from_secs(10), || {
            let l = gw.log().to_lowercase();
            l.contains("password authentication failed")
        }),
        "{}",
        gw.log()
    );
    assert_eq!(gw.get("/x", &[("x-org-id", "acme")]).status, 200);
    // the password file is read again at reload: the right one connects
    std::fs::write(gw.dir.0.join("redis.pass"), "gw-secret\n").expect("write");
    assert!(gw.reload(&config(up.addr, &url, TLS)), "{}", gw.log());
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
}
