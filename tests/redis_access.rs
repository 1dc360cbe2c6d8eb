//! Redis as operators run it: `rediss://` with a private CA and a client certificate, an ACL
//! user whose password comes from a file, and only the commands docs/operations.md lists. A real
//! redis-server with `--tls-port` and `--tls-auth-clients yes`; the gateway's counts must reach
//! it, and a server it cannot verify (no CA, or a name the certificate does not hold) must not
//! get them, with the reason in the log and `on_failure` applying.

mod common;
use common::*;
use std::time::Duration;

/// The ACL docs/operations.md "Running Redis" gives for the gateway's user (key prefix
/// `tollgate`), read from the page itself so that the page and the tests cannot drift, as
/// redis-server's `--user` arguments (it takes each word of a directive as its own argument):
/// the default user (the test's, with every right) first.
fn acl() -> Vec<String> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let line = page
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ACL SETUSER gateway "))
        .expect("docs/operations.md gives the gateway's ACL");
    let mut args: Vec<String> = [
        "--user",
        "default",
        "on",
        ">admin-secret",
        "~*",
        "&*",
        "+@all",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--user".to_string(), "gateway".to_string()]);
    args.extend(line.split_whitespace().skip(3).map(|w| match w {
        ">PASSWORD" => ">gw-secret".to_string(),
        w => w.to_string(),
    }));
    args
}

/// `acl()` without one of its commands (`+hincrby`).
fn acl_without(command: &str) -> Vec<String> {
    let acl = acl();
    assert!(acl.iter().any(|w| w == command), "{command} is in the ACL");
    acl.into_iter().filter(|w| w != command).collect()
}

struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
    certs: TempDir,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        Self::start_with_acl(&[])
    }

    /// With `more` rights for the gateway's user (`+role`) after the documented ones.
    fn start_with_acl(more: &[&str]) -> TlsRedis {
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
        let acl = acl();
        args.extend(acl.iter().map(String::as_str));
        args.extend(more);
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
    counts_reach(&gw, &r);
}

/// The gateway connects, its counts reach `r` under the user's key prefix with no command
/// refused by the ACL, and the limit (5 a minute) holds through Redis.
fn counts_reach(gw: &Gateway, r: &TlsRedis) {
    assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
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

/// Redis Sentinel over TLS: the sentinel and the primary take `rediss://` only from clients
/// with a certificate of the private CA (`tls-auth-clients yes` on the primary), the sentinel
/// names the primary by the name its certificate holds (`announce-hostnames`), and the
/// gateway logs in to the primary as the ACL user with the documented commands and `+role`.
#[test]
fn counts_reach_a_primary_found_through_a_tls_sentinel_as_an_acl_user() {
    let up = Upstream::start("app");
    let r = TlsRedis::start_with_acl(&["+role"]);
    let p = |n: &str| r.certs.0.join(n).display().to_string();
    let sentinel_tls = common::free_port();
    let conf = format!(
        "tls-port {sentinel_tls}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
         tls-auth-clients yes\ntls-replication yes\nsentinel resolve-hostnames yes\n\
         sentinel announce-hostnames yes\nsentinel monitor mymaster localhost {} 1\n\
         sentinel auth-user mymaster default\nsentinel auth-pass mymaster admin-secret\n",
        p("server.pem"),
        p("server.key"),
        p("ca.pem"),
        r.tls_port
    );
    let sentinel = common::sentinel::Sentinel::start(&conf);
    assert_eq!(
        sentinel.primary_addr(),
        Some(("localhost".to_string(), r.tls_port))
    );
    let files = files(&r);
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let cfg = config(up.addr, "-", TLS).edit(
        "  url: \"-\"\n",
        &format!(
            "  sentinel: {{ master: mymaster, nodes: [\"rediss://localhost:{sentinel_tls}\"] }}\n"
        ),
    );
    let gw = Gateway::start_with_files(&cfg, &files);
    counts_reach(&gw, &r);
    // and the check at start-up found nothing missing, `+role` included
    assert!(
        !gw.log().contains("may not run"),
        "a command was missing: {}",
        gw.log()
    );
    // without `+role` the Sentinel client cannot confirm the primary, and says so
    r.admin(&["ACL", "SETUSER", "gateway", "-role"]);
    let without = Gateway::start_with_files(&cfg, &files);
    assert!(
        eventually(Duration::from_secs(10), || without
            .log()
            .contains("no permissions to run the 'role' command")),
        "{}",
        without.log()
    );
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
    let acl = acl();
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
            args.extend(acl.iter().map(String::as_str));
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

/// A redis-server on a plain port whose users are `acl` (`--user` arguments): the test logs in
/// as `default` (`admin`), the gateways as `gateway`.
fn acl_redis(acl: &[String]) -> RedisServer {
    let args: Vec<&str> = acl.iter().map(String::as_str).collect();
    RedisServer::start_with(&args)
}

/// A command as the test's user (every right).
fn admin(r: &RedisServer, args: &[&str]) -> redis::Value {
    let url = format!("redis://:admin-secret@127.0.0.1:{}", r.port);
    let client = redis::Client::open(url).expect("client");
    let mut conn = client.get_connection().expect("admin connection");
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn admin_keys(r: &RedisServer) -> Vec<String> {
    common::strings(admin(r, &["KEYS", "tollgate:*"]))
}

fn admin_int(r: &RedisServer, args: &[&str]) -> i64 {
    match admin(r, args) {
        redis::Value::Int(i) => i,
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).parse().unwrap_or(0),
        _ => 0,
    }
}

/// The algorithms a rule may name (docs/configuration.md).
const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "token_bucket",
    "sliding_log",
    "leaky_bucket",
];

/// One rule per algorithm of `algorithms`, each on its own path (`/<algorithm>/...`), and the
/// gateway's Redis (the plain port of `r`, as the ACL user `gateway`).
fn acl_config(
    up: std::net::SocketAddr,
    r: &RedisServer,
    algorithms: &[&str],
    tier: &str,
    on_failure: &str,
) -> String {
    let mut c = one_route_config(up, 1, "");
    c.push_str("tenant:\n  from: [{ header: x-org-id, trusted: true }]\nlimits:\n");
    for a in algorithms {
        c.push_str(&format!(
            "  - id: {a}\n    algorithm: {a}\n    pathPattern: /{a}/**\n    tiers: [{tier}]\n"
        ));
        if *a == "leaky_bucket" {
            // no waiting for a turn: over the rate is refused at once
            c.push_str("    queue: 0\n");
        }
    }
    c.push_str(&format!(
        r#"redis:
  url: "redis://127.0.0.1:{}"
  username: gateway
  password_file: redis.pass
  sync_interval: 200ms
  timeout: 1s
  on_failure: {on_failure}
"#,
        r.port
    ));
    c
}

fn acl_gateway(cfg: &str) -> Gateway {
    Gateway::start_with_files(cfg, &[("redis.pass", "gw-secret\n")])
}

/// `n` requests of tenant `acme` to `path`, alternating between the gateways: the statuses.
fn alternate(gws: &[&Gateway], path: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| gws[i % gws.len()].get(path, &[("x-org-id", "acme")]).status)
        .collect()
}

/// The error replies a gateway counted (`tollgate_redis_errors_total`), of `kind` or all.
fn errors_counted(gw: &Gateway, kind: Option<&str>) -> f64 {
    errors_in(&gw.metrics(), kind)
}

/// The same of one reading of the metrics (two readings may fall on both sides of a round).
fn errors_in(metrics: &str, kind: Option<&str>) -> f64 {
    let prefix = match kind {
        Some(k) => format!("tollgate_redis_errors_total{{kind=\"{k}\"}}"),
        None => "tollgate_redis_errors_total".to_string(),
    };
    metric_sum(metrics, &prefix)
}

fn readyz(gw: &Gateway) -> serde_json::Value {
    request(gw.admin, "GET", "/readyz", &[])
        .expect("readyz")
        .json()
}

/// docs/operations.md's ACL, read from the page: two gateways on one Redis, as that user, share
/// the limit of every algorithm (each rule on its own path, 20 per period; 40 requests
/// alternating between them), and Redis refuses none of their commands.
#[test]
fn the_documented_acl_lets_two_gateways_share_the_limit_of_every_algorithm() {
    let up = Upstream::start("app");
    let r = acl_redis(&acl());
    let p = period_with_room(600, 90);
    let tier = format!("{{ period: {p}, threshold: 20 }}");
    let token = "0123456789abcdef0123";
    let cfg = acl_config(up.addr, &r, &ALGORITHMS, &tier, "local_share").replace(
        "  threads: 1\n",
        &format!("  threads: 1\n  admin_token: \"{token}\"\n"),
    );
    let (a, b) = (acl_gateway(&cfg), acl_gateway(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
        assert!(
            eventually(Duration::from_secs(10), || gw
                .log()
                .contains("may run every command the gateway sends")),
            "the access check at start-up: {}",
            gw.log()
        );
    }
    for alg in ALGORITHMS {
        let statuses = alternate(&[&a, &b], &format!("/{alg}/x"), 40);
        let admitted = statuses.iter().filter(|&&s| s == 200).count();
        assert!(
            statuses.iter().all(|&s| s == 200 || s == 429),
            "{alg}: {statuses:?}"
        );
        if alg == "leaky_bucket" {
            // `queue: 0`: one at a time, 1 turn per period / 20, shared: the first turn (plus
            // at most one per instance on credit), not one per instance and turn
            assert!((1..=3).contains(&admitted), "{alg}: {statuses:?}");
        } else {
            // the fleet's 20, not 20 per instance; nothing refused under 0.9 of it
            assert!((18..=22).contains(&admitted), "{alg}: {statuses:?}");
            assert!(
                statuses[..18].iter().all(|&s| s == 200),
                "{alg}: {statuses:?}"
            );
        }
    }
    // every rule's count is in Redis
    assert!(
        eventually(Duration::from_secs(10), || {
            let keys = admin_keys(&r);
            ALGORITHMS
                .iter()
                .all(|alg| keys.iter().any(|k| k.contains(&format!(":{alg}:"))))
        }),
        "{:?}",
        admin_keys(&r)
    );
    // an operator's reset of every rule goes through as that user too (its scripts, and the
    // mark the heartbeats read, under the key prefix); first, every count has reached Redis
    // (a count reported after a reset counts after it: the leaky bucket's one turn would go)
    for gw in [&a, &b] {
        assert!(eventually(Duration::from_secs(10), || metric_sum(
            &gw.metrics(),
            "tollgate_redis_pending_deltas"
        ) == 0.0));
    }
    let raw = format!(
        "POST /api/tenants/acme/reset HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let reset = request_raw(a.admin, raw.as_bytes()).expect("the admin answers");
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(reset.json()["told_at_once"], true, "{}", reset.body);
    for alg in ALGORITHMS {
        // both admit again (b hears of it within a round; a leaky bucket of `queue: 0` holds
        // one turn: b takes it, though its refused requests made it leases it kept unused; a
        // busy machine once let the sweeper drop b's counter holding one, and the turn stayed
        // leased to nobody until the next window's end)
        let path = format!("/{alg}/x");
        let gws = if alg == "leaky_bucket" {
            vec![&b]
        } else {
            vec![&b, &a]
        };
        for gw in gws {
            assert!(
                eventually(Duration::from_secs(5), || gw
                    .get(&path, &[("x-org-id", "acme")])
                    .status
                    == 200),
                "{alg} after the reset"
            );
        }
    }
    // and no command was refused: by Redis's ACL log, and by the gateways'
    let log = admin(&r, &["ACL", "LOG"]);
    assert!(
        matches!(&log, redis::Value::Array(v) if v.is_empty()),
        "ACL refusals: {log:?}"
    );
    for gw in [&a, &b] {
        assert_eq!(errors_counted(gw, None), 0.0, "{}", gw.metrics());
        assert_eq!(readyz(gw)["redis"], "connected");
        assert!(readyz(gw)["redis_error"].is_null());
    }
}

/// A user without `+hincrby` (what docs/operations.md once gave) and a `sliding_log` rule of 20
/// on two gateways with `on_failure: local_share`: Redis refuses every round of the rule
/// (NOPERM inside the script). That is logged once, with the command to add, counted, shown on
/// `/readyz` and `/api/status`, and the rule falls back to `local_share`: the two admit about
/// 20, not 40, and refuse nothing under it. Once the ACL is fixed (at run time) the error
/// clears, and the counts made meanwhile reach Redis.
#[test]
fn a_user_without_hincrby_is_logged_counted_shown_and_sliding_logs_fall_back_to_on_failure() {
    let up = Upstream::start("app");
    let r = acl_redis(&acl_without("+hincrby"));
    let p = period_with_room(600, 90);
    let tier = format!("{{ period: {p}, threshold: 20 }}");
    let cfg = acl_config(up.addr, &r, &["sliding_log"], &tier, "local_share");
    let (a, b) = (acl_gateway(&cfg), acl_gateway(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
        // the access check at start-up names the command, and the process runs on
        let said = "redis: user \"gateway\" may not run HINCRBY (NOPERM): add +hincrby to its ACL";
        assert!(
            eventually(Duration::from_secs(10), || gw.log().contains(said)),
            "{}",
            gw.log()
        );
        assert!(gw
            .log()
            .contains(&format!("ERROR tollgate::services::fleet_sync] {said}")));
    }
    assert!(eventually(Duration::from_secs(5), || metric_sum(
        &a.metrics(),
        "tollgate_redis_live_instances"
    ) == 2.0));
    // the first requests find the error: each instance's first round that reports units of
    // the rule is refused
    let first = alternate(&[&a, &b], "/sliding_log/x", 2);
    assert_eq!(first, [200, 200]);
    for gw in [&a, &b] {
        assert!(
            eventually(Duration::from_secs(10), || readyz(gw)["redis"] == "error"),
            "{}",
            gw.log()
        );
        let ready = readyz(gw);
        assert_eq!(ready["redis_error"]["kind"], "noperm", "{ready}");
        let message = ready["redis_error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("add +hincrby to its ACL"), "{message}");
        let status = request(gw.admin, "GET", "/api/status", &[])
            .expect("status")
            .json();
        assert_eq!(status["redis"]["state"], "error");
        assert_eq!(status["redis"]["error"]["kind"], "noperm");
    }
    // the link gauge says it too: Redis answers, but not as it should
    assert!(
        eventually(Duration::from_secs(5), || a
            .metrics()
            .contains("tollgate_redis_connected 0")),
        "{}",
        a.metrics()
    );
    // on_failure: local_share: each instance its share of the 20, so the two admit about 20
    // (not 40), and refuse nothing while under it
    let statuses = alternate(&[&a, &b], "/sliding_log/x", 38);
    let admitted = 2 + statuses.iter().filter(|&&s| s == 200).count();
    assert!((18..=22).contains(&admitted), "{admitted}: {statuses:?}");
    assert!(statuses[..16].iter().all(|&s| s == 200), "{statuses:?}");
    for gw in [&a, &b] {
        // counted: every refused round (the next comes within a sync interval), and only as
        // NOPERM
        assert!(
            eventually(Duration::from_secs(10), || errors_in(
                &gw.metrics(),
                Some("noperm")
            ) >= 2.0),
            "{}",
            gw.metrics()
        );
        let m = gw.metrics();
        assert_eq!(errors_in(&m, None), errors_in(&m, Some("noperm")), "{m}");
        assert!(metric_sum(&m, "tollgate_redis_sync_total{result=\"error\"}") >= 2.0);
    }
    // rounds go on, refused each time; the log says it once per instance, not once a round
    let rounds = |g: &Gateway| errors_counted(g, Some("noperm"));
    let before = rounds(&a);
    assert!(eventually(Duration::from_secs(10), || rounds(&a) >= before + 3.0));
    for gw in [&a, &b] {
        assert_eq!(
            gw.log().matches("redis: error replies (noperm)").count(),
            1,
            "{}",
            gw.log()
        );
    }
    // no count of the rule reached Redis meanwhile (the script stops at HINCRBY, before
    // writing; the very first round, which only asked for the waiting requests and reported
    // no unit, needed no HINCRBY and left its lease in the ledger hash)
    assert!(
        admin_keys(&r)
            .iter()
            .all(|k| !k.contains(":sliding_log:") || k.ends_with(":fleet")),
        "{:?}",
        admin_keys(&r)
    );
    // the ACL is fixed while the gateways run: the error clears, and the counts made meanwhile
    // reach Redis, each once
    admin(&r, &["ACL", "SETUSER", "gateway", "+hincrby"]);
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
        assert!(readyz(gw)["redis_error"].is_null());
        assert!(eventually(Duration::from_secs(5), || gw
            .metrics()
            .contains("tollgate_redis_connected 1")));
        assert!(
            eventually(Duration::from_secs(5), || gw
                .log()
                .contains("redis: no more error replies")),
            "{}",
            gw.log()
        );
    }
    let in_redis = || {
        admin_keys(&r)
            .iter()
            .filter(|k| k.contains(":sliding_log:") && !k.ends_with(":fleet"))
            .map(|k| admin_int(&r, &["GET", k]))
            .sum::<i64>()
    };
    assert!(
        eventually(Duration::from_secs(10), || in_redis() == admitted as i64),
        "Redis holds {} of {admitted}",
        in_redis()
    );
}

/// Error replies other than a permission: a key of the wrong type (WRONGTYPE, one tenant's
/// counter) and a full Redis (OOM, `maxmemory 1` with `noeviction`) are logged, counted and
/// shown as well, and clear when Redis accepts the commands again.
#[test]
fn wrongtype_and_oom_replies_are_logged_counted_and_shown_until_they_clear() {
    let up = Upstream::start("app");
    let r = acl_redis(&acl());
    let p = period_with_room(600, 90);
    let tier = format!("{{ period: {p}, threshold: 50 }}");
    let cfg = acl_config(up.addr, &r, &["fixed_window"], &tier, "local");
    let gw = acl_gateway(&cfg);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    assert_eq!(
        gw.get("/fixed_window/x", &[("x-org-id", "acme")]).status,
        200
    );
    let key = || {
        admin_keys(&r)
            .into_iter()
            .find(|k| k.contains("{acme}:fixed_window:") && !k.ends_with(":fleet"))
    };
    assert!(eventually(Duration::from_secs(10), || key().is_some()));
    let Some(k) = key() else { unreachable!() };
    // WRONGTYPE: the counter's key turned into a hash
    admin(&r, &["DEL", &k]);
    admin(&r, &["HSET", &k, "f", "1"]);
    let mut sent = 1;
    let wrongtype = || readyz(&gw)["redis_error"]["kind"] == "wrongtype";
    assert!(
        eventually(Duration::from_secs(10), || {
            // `local`: the tenant's requests go on under the instance's own count
            assert_eq!(
                gw.get("/fixed_window/x", &[("x-org-id", "acme")]).status,
                200
            );
            sent += 1;
            wrongtype()
        }),
        "{}",
        gw.log()
    );
    assert_eq!(readyz(&gw)["redis"], "error");
    assert!(errors_counted(&gw, Some("wrongtype")) >= 1.0);
    assert_eq!(
        gw.log().matches("redis: error replies (wrongtype)").count(),
        1
    );
    // the key is fixed: the error clears
    admin(&r, &["DEL", &k]);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    assert!(gw
        .log()
        .contains("redis: the wrongtype error replies stopped"));
    // OOM: Redis is full, and refuses writes
    admin(&r, &["CONFIG", "SET", "maxmemory", "1"]);
    assert!(
        eventually(Duration::from_secs(10), || {
            assert_eq!(
                gw.get("/fixed_window/x", &[("x-org-id", "acme")]).status,
                200
            );
            readyz(&gw)["redis_error"]["kind"] == "oom"
        }),
        "{}",
        gw.log()
    );
    assert!(errors_counted(&gw, Some("oom")) >= 1.0);
    assert!(gw
        .log()
        .contains("redis: error replies (oom): OOM command not allowed"));
    admin(&r, &["CONFIG", "SET", "maxmemory", "0"]);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    assert_eq!(gw.log().matches("redis: error replies (oom)").count(), 1);
}

/// `tollgate -t` asks Redis whether the ACL user may run the commands the config needs: it
/// fails (exit 1) naming the command and what to add when Redis refuses one; a command only
/// other algorithms need is a warning; a Redis that does not answer is a warning (exit 0);
/// `--offline` checks the files only.
#[test]
fn t_says_which_command_the_acl_user_may_not_run() {
    let up = Upstream::start("app");
    let r = acl_redis(&acl_without("+hincrby"));
    let p = period_with_room(600, 10);
    let tier = format!("{{ period: {p}, threshold: 20 }}");
    let dir = TempDir::new();
    dir.write("redis.pass", "gw-secret\n");
    let t = |algorithms: &[&str], redis: &RedisServer| {
        let cfg = acl_config(up.addr, redis, algorithms, &tier, "local_share")
            .replace("{LISTEN}", "127.0.0.1:1")
            .replace("{ADMIN}", "127.0.0.1:2");
        let path = dir.write("gateway.yaml", &cfg);
        let path = path.display().to_string();
        (
            run_tollgate(&["-t", "-c", &path]),
            run_tollgate(&["-t", "--offline", "-c", &path]),
        )
    };
    let said = "redis: user \"gateway\" may not run HINCRBY (NOPERM): add +hincrby to its ACL (sliding_log rules need it)";
    let ((code, out, err), (offline, _, offline_err)) = t(&["fixed_window", "sliding_log"], &r);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("error: {said}")), "{err}");
    assert!(out.contains("is valid"), "the files are: {out}");
    assert_eq!(offline, 0, "{offline_err}");
    assert!(!offline_err.contains("HINCRBY"), "{offline_err}");
    // no sliding_log rule: a warning (a reload that adds one would need it)
    let ((code, _, err), _) = t(&["fixed_window"], &r);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("warning: {said}")), "{err}");
    // the documented ACL: nothing to say
    let full = acl_redis(&acl());
    let ((code, out, err), _) = t(&ALGORITHMS, &full);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("may run every command the gateway sends"),
        "{out}"
    );
    assert!(!err.contains("redis:"), "{err}");
    // Redis down: not checked, a warning only
    let mut down = acl_redis(&acl());
    down.kill();
    let ((code, _, err), _) = t(&ALGORITHMS, &down);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: redis: the ACL of user \"gateway\" was not checked"),
        "{err}"
    );
}

/// A gateway whose ACL user lacks `command`, with a fixed window far from its limit (plain
/// increments), connected; its Redis, and its config.
fn fixed_window_without(up: &Upstream, command: &str) -> (RedisServer, Gateway, String) {
    let r = acl_redis(&acl_without(command));
    let p = period_with_room(3600, 90);
    let tier = format!("{{ period: {p}, threshold: 100000 }}");
    let cfg = acl_config(up.addr, &r, &["fixed_window"], &tier, "local_share");
    let gw = acl_gateway(&cfg);
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    (r, gw, cfg)
}

/// What Redis holds of the fixed windows' counts.
fn fixed_window_counts(r: &RedisServer) -> i64 {
    admin_keys(r)
        .iter()
        .filter(|k| k.contains(":fixed_window:") && !k.ends_with(":fleet"))
        .map(|k| admin_int(r, &["GET", k]))
        .sum::<i64>()
}

/// Five requests through `gw`, each admitted, and Redis holding the five.
fn five_reach_redis(r: &RedisServer, gw: &Gateway) {
    let statuses = alternate(&[gw], "/fixed_window/x", 5);
    assert_eq!(statuses, [200; 5]);
    let held = || fixed_window_counts(r);
    assert!(
        eventually(Duration::from_secs(10), || held() == 5),
        "Redis holds {}; keys {:?}; log:\n{}",
        held(),
        admin_keys(r),
        gw.log()
    );
}

/// `tollgate -t` on the config `cfg` (its password file beside it): exit status, stdout,
/// stderr.
fn t_of(cfg: &str) -> (i32, String, String) {
    let dir = TempDir::new();
    dir.write("redis.pass", "gw-secret\n");
    let cfg = cfg
        .replace("{LISTEN}", "127.0.0.1:1")
        .replace("{ADMIN}", "127.0.0.1:2");
    let path = dir.write("gateway.yaml", &cfg);
    run_tollgate(&["-t", "-c", &path.display().to_string()])
}

/// A user without `+multi` (an ACL written before plain increments were marked): `-t` and the
/// start-up check name it, and plain increments still reach Redis, unmarked (a warning says a
/// failover may lose some, and the refusal is counted once); no request is refused.
#[test]
fn a_user_without_multi_gets_plain_increments_unmarked() {
    let up = Upstream::start("app");
    let (r, gw, cfg) = fixed_window_without(&up, "+multi");
    let said = "redis: user \"gateway\" may not run MULTI (NOPERM): add +multi to its ACL (plain increments behind one endpoint need it)";
    assert!(
        eventually(Duration::from_secs(10), || gw.log().contains(said)),
        "{}",
        gw.log()
    );
    five_reach_redis(&r, &gw);
    // (Redis applies the increments a refused MULTI leaves untransacted at once: the warning
    // comes as the gateway reads the replies, a moment after)
    let warned = || {
        gw.log()
            .contains("plain increments could not be marked (NOPERM")
    };
    assert!(eventually(Duration::from_secs(10), warned), "{}", gw.log());
    // the refusal is counted as any error reply (after the round), once: the marks stop with
    // it
    let counted = || errors_counted(&gw, None) == 1.0;
    assert!(
        eventually(Duration::from_secs(10), counted),
        "{}",
        gw.metrics()
    );
    assert_eq!(errors_counted(&gw, Some("noperm")), 1.0);
    // and `-t` names the command
    let (code, out, err) = t_of(&cfg);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("error: {said}")), "{err}");
}

/// A user without `+zrangebyscore` (an ACL written before plain increments were marked and the
/// heartbeat read the fleet's waiting marks): both reads are refused once each, counted and
/// logged, and then no more (the marks go unmarked, the instance no longer hears of the
/// others' waits); every request goes through and Redis holds each.
#[test]
fn a_user_without_zrangebyscore_is_refused_the_marks_reads_once_each_and_counts_go_on() {
    let up = Upstream::start("app");
    let (r, gw, _) = fixed_window_without(&up, "+zrangebyscore");
    let statuses = alternate(&[&gw], "/fixed_window/x", 5);
    assert_eq!(statuses, [200; 5]);
    let held = || fixed_window_counts(&r);
    assert!(
        eventually(Duration::from_secs(10), || held() == 5),
        "Redis holds {}; log:\n{}",
        held(),
        gw.log()
    );
    assert!(
        eventually(Duration::from_secs(10), || errors_counted(
            &gw,
            Some("noperm")
        ) == 2.0),
        "{}",
        gw.metrics()
    );
    let log = gw.log();
    assert!(log.contains("waiting marks could not be read"), "{log}");
    assert!(
        log.contains("plain increments could not be marked (NOPERM"),
        "{log}"
    );
    // three more periodic rounds: no more refusals
    let rounds = || metric_sum(&gw.metrics(), "tollgate_redis_sync_total");
    let before = rounds();
    assert!(eventually(Duration::from_secs(10), || rounds() >= before + 3.0));
    assert_eq!(errors_counted(&gw, None), 2.0, "{}", gw.metrics());
    assert_eq!(alternate(&[&gw], "/fixed_window/x", 3), [200; 3]);
}

/// A user without the waits channel (an ACL written before it: `resetchannels` alone): the
/// listener's refused subscription is logged once and not retried, `-t` names both commands as
/// warnings (exit status 0: holders still hear of waits at their heartbeats), and every request
/// goes through with Redis holding each.
#[test]
fn a_user_without_the_waits_channel_is_warned_and_counts_go_on() {
    let up = Upstream::start("app");
    let (r, gw, cfg) = fixed_window_without(&up, "&tollgate:*");
    let refused = "cannot listen on the waits channel tollgate:waits";
    assert!(
        eventually(Duration::from_secs(10), || gw.log().contains(refused)),
        "{}",
        gw.log()
    );
    five_reach_redis(&r, &gw);
    // (not retried: once in the log, after three more periodic rounds)
    let rounds = || metric_sum(&gw.metrics(), "tollgate_redis_sync_total");
    let before = rounds();
    assert!(eventually(Duration::from_secs(10), || rounds() >= before + 3.0));
    assert_eq!(gw.log().matches(refused).count(), 1, "{}", gw.log());
    let (code, out, err) = t_of(&cfg);
    assert_eq!(code, 0, "{out}{err}");
    for c in [
        "PUBLISH (NOPERM): add +publish",
        "SUBSCRIBE (NOPERM): add +subscribe",
    ] {
        let said = format!(
            "warning: redis: user \"gateway\" may not run {c} to its ACL (with it, and the channel"
        );
        assert!(err.contains(&said), "{said} in {err}");
    }
}
