//! Redis as operators run it: `rediss://` with a private CA and a client certificate, an ACL
//! user whose password comes from a file, and only the commands docs/operations.md lists. A real
//! redis-server with `--tls-port` and `--tls-auth-clients yes`; the gateway's counts must reach
//! it, and a server it cannot verify (no CA, or a name the certificate does not hold) must not
//! get them, with the reason in the log and `on_failure` applying.

mod common;
use common::*;
use std::time::Duration;

/// The ACL docs/operations.md "Running Redis" gives for the gateway's user (key prefix `tollgate`).
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
        make_cert(&certs.0, "ca", "test-ca");
        make_signed_cert(&certs.0, "ca", "server", "localhost");
        make_signed_cert(&certs.0, "ca", "client", "tollgate");
        let tls_port = free_port();
        let p = |n: &str| certs.0.join(n).display().to_string();
        let (tp, cert, key, ca) = (
            tls_port.to_string(),
            p("server.pem"),
            p("server.key"),
            p("ca.pem"),
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
        ("ca.pem", read("ca.pem")),
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
    for (gw, reason) in [
        (&no_ca, "UnknownIssuer"),
        (&wrong_name, "certificate not valid for name"),
    ] {
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
        // the reason is logged, as docs/operations.md "Running Redis" shows it
        let log = gw.log();
        assert!(
            log.contains(&format!("invalid peer certificate: {reason}")),
            "the reason is logged: {log}"
        );
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

/// A Redis Cluster over TLS (`tls-cluster yes`), its nodes' certificates signed by a private
/// CA and announcing the name their certificates hold (`cluster-announce-hostname`): the
/// cluster client verifies every node it finds against `tls.ca`, and logs in as the ACL user
/// with docs/operations.md's commands and `+cluster|slots`. (The redis crate takes a CA for a cluster
/// only with rustls, hence rustls for Redis: redis-rs/redis-rs#1534.)
#[test]
fn counts_reach_a_tls_redis_cluster_as_an_acl_user_verified_against_the_ca() {
    let up = Upstream::start("app");
    let certs = TempDir::new();
    make_cert(&certs.0, "ca", "test-ca");
    make_signed_cert(&certs.0, "ca", "server", "localhost");
    let p = |n: &str| certs.0.join(n).display().to_string();
    let (cert, key, ca) = (p("server.pem"), p("server.key"), p("ca.pem"));
    // below the cluster buses' ports (each node's port + 10000), as the nodes' own ports are
    let tls_ports: Vec<String> = (0..3).map(|_| free_port_with_bus().to_string()).collect();
    let nodes: Vec<RedisServer> = tls_ports
        .iter()
        .map(|tp| {
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                "--cluster-announce-hostname",
                "localhost",
                "--cluster-preferred-endpoint-type",
                "hostname",
                "--tls-cluster",
                "yes",
                "--tls-port",
                tp,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "no",
                // the cluster bus logs in as the default user
                "--masteruser",
                "default",
                "--masterauth",
                "admin-secret",
            ];
            args.extend_from_slice(ACL);
            args.push("+cluster|slots");
            RedisServer::start_with(&args)
        })
        .collect();
    let mut create = std::process::Command::new("redis-cli");
    create.args([
        "-a",
        "admin-secret",
        "--no-auth-warning",
        "--cluster",
        "create",
    ]);
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port));
    }
    let out = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli (install redis-tools)");
    assert!(
        out.status.success(),
        "cluster create: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let admin = |n: &RedisServer, args: &[&str]| -> redis::Value {
        let url = format!("redis://:admin-secret@127.0.0.1:{}", n.port);
        let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
            return redis::Value::Nil;
        };
        let mut cmd = redis::cmd(args[0]);
        args[1..].iter().for_each(|a| {
            cmd.arg(*a);
        });
        cmd.query(&mut conn).unwrap_or(redis::Value::Nil)
    };
    let text = |v: redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        _ => String::new(),
    };
    assert!(
        eventually(Duration::from_secs(20), || nodes
            .iter()
            .all(
                |n| text(admin(n, &["CLUSTER", "INFO"])).contains("cluster_state:ok")
            )),
        "the cluster did not become ok"
    );
    let url = format!("rediss://localhost:{}", tls_ports[0]);
    let cfg = config(up.addr, "", "tls: { ca: ca.pem }")
        .edit("  url: \"\"\n", &format!("  cluster: [\"{url}\"]\n"));
    assert!(cfg.contains("cluster: ["), "{cfg}");
    let ca_pem = std::fs::read_to_string(&ca).expect("ca");
    let gw = Gateway::start_with_files(&cfg, &[("redis.pass", "gw-secret\n"), ("ca.pem", &ca_pem)]);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    // tenants on each master: their counts arrive there
    let tenants: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    for t in &tenants {
        assert_eq!(gw.get("/x", &[("x-org-id", t)]).status, 200);
    }
    let keys = |n: &RedisServer| match admin(n, &["KEYS", "tollgate:*"]) {
        redis::Value::Array(v) => v.len(),
        _ => 0,
    };
    assert!(
        eventually(Duration::from_secs(10), || nodes
            .iter()
            .all(|n| keys(n) > 0)),
        "counts on every master: {:?}; log:\n{}",
        nodes.iter().map(keys).collect::<Vec<_>>(),
        gw.log()
    );
    for n in &nodes {
        let log = admin(n, &["ACL", "LOG"]);
        assert!(
            matches!(&log, redis::Value::Array(v) if v.is_empty()),
            "ACL refusals: {log:?}"
        );
    }
}
