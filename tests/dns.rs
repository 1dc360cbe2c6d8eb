//! Upstream servers given by name (docs/configuration.md, "`dns`"), against a real `dnsmasq`
//! that the test starts on a port of its own, answering from a hosts file the test rewrites:
//! every address of a name is a server of the pool, a new answer is followed without a reload,
//! a failed lookup keeps the last addresses and is counted, health checks apply per address,
//! a reload looks names up at once, and `-t` refuses a name that resolves to nothing.

mod common;
use common::{
    eventually, free_port, metric_sum, request, run_tollgate, server_healthy, Gateway, TempDir,
    Upstream, FAST_SAMPLER,
};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `dnsmasq` answering for `*.test` from a hosts file only (TTL 1 s), on a free port of
/// 127.0.0.1 (or at another address); a name it does not have is NXDOMAIN. Killed on drop.
struct Dnsmasq {
    child: Option<Child>,
    /// The TTL of its answers, in seconds.
    ttl: u32,
    ip: &'static str,
    port: u16,
    hosts: PathBuf,
    dir: TempDir,
}

impl Dnsmasq {
    fn start(hosts: &str) -> Dnsmasq {
        Self::start_at("127.0.0.1", free_port(), hosts)
    }

    fn start_at(ip: &'static str, port: u16, hosts: &str) -> Dnsmasq {
        let dir = TempDir::new();
        let hosts = dir.write("hosts", hosts);
        let mut d = Dnsmasq {
            child: None,
            ttl: 1,
            ip,
            port,
            hosts,
            dir,
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let bin = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("dnsmasq");
        let child = Command::new(bin)
            .args([
                "--keep-in-foreground",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--local=/test/",
                "--log-queries",
                "--log-facility=-",
            ])
            .arg(format!("--local-ttl={}", self.ttl))
            .arg(format!("--listen-address={}", self.ip))
            .arg(format!("--port={}", self.port))
            .arg(format!(
                "--pid-file={}",
                self.dir.0.join("dnsmasq.pid").display()
            ))
            .arg(format!("--addn-hosts={}", self.hosts.display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log()).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn dnsmasq (apt-get install dnsmasq): {e}"));
        self.child = Some(child);
        // it listens on TCP too, once its UDP socket is bound
        let addr = SocketAddr::new(self.ip.parse().expect("an IP"), self.port);
        assert!(
            eventually(Duration::from_secs(10), || TcpStream::connect(addr).is_ok()),
            "dnsmasq listens on {addr}: {}",
            std::fs::read_to_string(self.log()).unwrap_or_default()
        );
    }

    fn log(&self) -> PathBuf {
        self.dir.0.join("dnsmasq.log")
    }

    /// Answer from `hosts` from now on (dnsmasq rereads its hosts files on SIGHUP).
    fn set_hosts(&self, hosts: &str) {
        std::fs::write(&self.hosts, hosts).expect("write hosts");
        let pid = self.child.as_ref().expect("running").id() as i32;
        // SAFETY: a signal to our own child.
        unsafe {
            libc::kill(pid, libc::SIGHUP);
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Upstreams named `names` on 127.0.0.1, 127.0.0.2, ... all on one port (A records carry no
/// port), and the port.
fn upstreams(names: &[&str]) -> (Vec<Upstream>, u16) {
    let port = free_port();
    let ups = names
        .iter()
        .enumerate()
        .map(|(i, n)| Upstream::start_on(&format!("127.0.0.{}:{port}", i + 1), n))
        .collect();
    (ups, port)
}

/// One pool `pool` of the server `backend.test:{port}`, asking `dns` at `dns_port`, with
/// `extra` lines in the pool and `dns_extra` lines in `dns`.
fn config(port: u16, dns_port: u16, extra: &str, dns_extra: &str) -> String {
    format!(
        r#"server:
  listen: ["{{LISTEN}}"]
  admin: "{{ADMIN}}"
  threads: 1
dns:
  servers: ["127.0.0.1:{dns_port}"]
  timeout: 500ms
{dns_extra}
upstreams:
  pool:
    servers: ["backend.test:{port}"]
{extra}
routes:
  - id: all
    path: /**
    upstream: pool
"#
    )
}

/// Which upstream answered each of `n` requests.
fn hits(gw: &Gateway, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let r = gw.get("/x", &[]);
        assert_eq!(r.status, 200, "{r:?}\n{}", gw.log());
        let server = r.json()["server"].as_str().unwrap_or("?").to_string();
        *seen.entry(server).or_insert(0) += 1;
    }
    seen
}

/// The addresses `/api/status` lists for the pool.
fn listed(gw: &Gateway) -> Vec<String> {
    let status = request(gw.admin, "GET", "/api/status", &[])
        .expect("status")
        .json();
    let mut out: Vec<String> = status["pools"][0]["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["addr"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

fn lookups(gw: &Gateway, result: &str) -> f64 {
    metric_sum(
        &gw.metrics(),
        &format!("tollgate_upstream_dns_lookups_total{{pool=\"pool\",result=\"{result}\"}}"),
    )
}

#[test]
fn a_name_whose_address_changes_is_followed_without_a_reload() {
    let (_ups, port) = upstreams(&["a", "b"]);
    let dns = Dnsmasq::start("127.0.0.1 backend.test\n");
    let gw = Gateway::start(&config(port, dns.port, "", ""));
    assert_eq!(hits(&gw, 5).get("a"), Some(&5));
    assert_eq!(listed(&gw), vec![format!("127.0.0.1:{port}")]);

    dns.set_hosts("127.0.0.2 backend.test\n");
    assert!(
        eventually(Duration::from_secs(10), || listed(&gw)
            == vec![format!("127.0.0.2:{port}")]),
        "the pool follows the name: {:?}\n{}",
        listed(&gw),
        gw.log()
    );
    assert_eq!(hits(&gw, 5).get("b"), Some(&5));
    let m = gw.metrics();
    assert_eq!(
        metric_sum(&m, "tollgate_config_reloads_total{result=\"ok\"}"),
        0.0,
        "no reload"
    );
    assert!(lookups(&gw, "ok") >= 1.0, "{m}");
    assert!(
        gw.log()
            .contains("upstream pool: backend.test resolves to 127.0.0.2 (was 127.0.0.1)"),
        "{}",
        gw.log()
    );
}

#[test]
fn a_name_with_two_addresses_spreads_over_both() {
    let (_ups, port) = upstreams(&["a", "b"]);
    let dns = Dnsmasq::start("127.0.0.1 backend.test\n127.0.0.2 backend.test\n");
    let gw = Gateway::start(&config(port, dns.port, "    balance: round_robin", ""));
    let seen = hits(&gw, 20);
    assert_eq!(seen.get("a"), Some(&10), "{seen:?}");
    assert_eq!(seen.get("b"), Some(&10), "{seen:?}");
    let mut want = vec![format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")];
    want.sort();
    assert_eq!(listed(&gw), want);
    // asked for both families of the name
    let log = std::fs::read_to_string(dns.log()).unwrap_or_default();
    assert!(log.contains("query[A] backend.test"), "{log}");
    assert!(log.contains("query[AAAA] backend.test"), "{log}");
}

#[test]
fn a_failed_lookup_keeps_the_last_addresses_and_is_counted() {
    let (_ups, port) = upstreams(&["a", "b"]);
    let mut dns = Dnsmasq::start("127.0.0.1 backend.test\n");
    let gw = Gateway::start(&config(port, dns.port, "", ""));
    assert_eq!(
        lookups(&gw, "error"),
        0.0,
        "the series exists from the start"
    );
    assert!(gw
        .metrics()
        .contains("tollgate_upstream_dns_lookups_total{pool=\"pool\",result=\"error\"} 0"));
    dns.stop();
    // a lookup is tried again every min_ttl (1 s) while none answers
    assert!(
        eventually(Duration::from_secs(15), || lookups(&gw, "error") >= 2.0),
        "failures counted: {}\n{}",
        gw.metrics(),
        gw.log()
    );
    assert_eq!(hits(&gw, 5).get("a"), Some(&5), "the last address stays");
    assert_eq!(listed(&gw), vec![format!("127.0.0.1:{port}")]);
    let log = gw.log();
    assert!(
        log.contains("upstream pool: cannot resolve backend.test"),
        "{log}"
    );
    assert!(log.contains("its last addresses stay (127.0.0.1)"), "{log}");
    // logged once, not once a lookup
    assert_eq!(
        log.matches("cannot resolve backend.test").count(),
        1,
        "{log}"
    );

    // the nameserver back, with another answer: followed, and the log says so
    std::fs::write(&dns.hosts, "127.0.0.2 backend.test\n").expect("hosts");
    dns.spawn();
    assert!(
        eventually(Duration::from_secs(10), || listed(&gw)
            == vec![format!("127.0.0.2:{port}")]),
        "{}",
        gw.log()
    );
    assert_eq!(hits(&gw, 3).get("b"), Some(&3));
    assert!(
        gw.log().contains("backend.test resolves again"),
        "{}",
        gw.log()
    );

    // a name that no longer exists fails too: the last address stays
    let errors = lookups(&gw, "error");
    dns.set_hosts("");
    assert!(
        eventually(Duration::from_secs(10), || lookups(&gw, "error") > errors),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("no such name (NXDOMAIN)"), "{}", gw.log());
    assert_eq!(listed(&gw), vec![format!("127.0.0.2:{port}")]);
    assert_eq!(hits(&gw, 3).get("b"), Some(&3));
}

#[test]
fn health_checks_apply_per_address_and_survive_a_new_answer() {
    let (mut ups, port) = upstreams(&["a", "b", "c"]);
    let dns = Dnsmasq::start("127.0.0.1 backend.test\n127.0.0.2 backend.test\n");
    let gw = Gateway::start_with_env(
        &config(
            port,
            dns.port,
            "    health_check: { interval: 2s, http: { path: /healthz } }",
            "",
        ),
        &[FAST_SAMPLER],
    );
    assert_eq!(hits(&gw, 10).len(), 2);
    let b = format!("127.0.0.2:{port}");
    ups[1].kill();
    assert!(
        eventually(Duration::from_secs(10), || server_healthy(&gw, &b)
            == Some(false)),
        "{}",
        gw.log()
    );
    assert!(gw
        .log()
        .contains(&format!("upstream pool: {b} becomes unhealthy")));
    let gauge = format!("tollgate_upstream_server_healthy{{pool=\"pool\",server=\"{b}\"}} 0");
    assert!(eventually(Duration::from_secs(5), || gw
        .metrics()
        .contains(&gauge)));
    assert_eq!(hits(&gw, 10).get("a"), Some(&10));

    // a third address: added healthy, while b, which stays, stays unhealthy (a fresh state
    // would take it back until the next check)
    dns.set_hosts("127.0.0.1 backend.test\n127.0.0.2 backend.test\n127.0.0.3 backend.test\n");
    let c = format!("127.0.0.3:{port}");
    assert!(
        eventually(Duration::from_secs(10), || server_healthy(&gw, &c)
            == Some(true)),
        "{}",
        gw.log()
    );
    assert_eq!(server_healthy(&gw, &b), Some(false));
    let seen = hits(&gw, 20);
    assert_eq!(seen.get("b"), None, "{seen:?}");
    assert_eq!(seen.len(), 2, "{seen:?}");
    let gauge_c = format!("tollgate_upstream_server_healthy{{pool=\"pool\",server=\"{c}\"}} 1");
    assert!(eventually(Duration::from_secs(5), || gw
        .metrics()
        .contains(&gauge_c)));
}

#[test]
fn a_reload_looks_names_up_at_once() {
    let (_ups, port) = upstreams(&["a", "b"]);
    let dns = Dnsmasq::start("127.0.0.1 backend.test\n");
    // answers kept an hour: only the reload asks again
    let template = config(port, dns.port, "", "  min_ttl: 1h\n  max_ttl: 1h");
    let gw = Gateway::start(&template);
    assert_eq!(hits(&gw, 3).get("a"), Some(&3));
    dns.set_hosts("127.0.0.2 backend.test\n");
    assert!(gw.reload(&template), "{}", gw.log());
    assert_eq!(hits(&gw, 3).get("b"), Some(&3));
    assert_eq!(lookups(&gw, "ok") + lookups(&gw, "error"), 0.0);

    // another nameserver, by a reload too
    let other = Dnsmasq::start("127.0.0.1 backend.test\n");
    let template = config(port, other.port, "", "  min_ttl: 1h\n  max_ttl: 1h");
    assert!(gw.reload(&template), "{}", gw.log());
    assert_eq!(hits(&gw, 3).get("a"), Some(&3));
    assert!(
        gw.log().contains(
            "reload: dns changed: servers given by name are looked up with the new settings"
        ),
        "{}",
        gw.log()
    );
}

#[test]
fn a_name_of_etc_hosts_is_answered_from_it_alone() {
    let a = Upstream::start("a");
    // a nameserver that would answer otherwise, if it were asked
    let dns = Dnsmasq::start("127.0.0.9 localhost\n");
    let port = a.addr.port();
    let gw = Gateway::start(&config(port, dns.port, "", "").replace("backend.test", "localhost"));
    assert_eq!(hits(&gw, 3).get("a"), Some(&3));
    let listed = listed(&gw);
    assert!(listed.contains(&format!("127.0.0.1:{port}")), "{listed:?}");
    assert!(
        !listed.iter().any(|s| s.starts_with("127.0.0.9")),
        "{listed:?}"
    );
    let log = std::fs::read_to_string(dns.log()).unwrap_or_default();
    assert!(!log.contains("query["), "dnsmasq was asked: {log}");
}

#[test]
fn check_refuses_a_name_without_an_address_and_prints_the_addresses() {
    let dns = Dnsmasq::start("127.0.0.1 backend.test\n127.0.0.2 backend.test\n");
    let dir = TempDir::new();
    let text = config(9001, dns.port, "", "")
        .replace("{LISTEN}", "127.0.0.1:8080")
        .replace("{ADMIN}", "127.0.0.1:9090");
    let good = dir.write("good.yaml", &text);
    let (code, out, err) = run_tollgate(&["-t", "-c", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("dns: nameservers 127.0.0.1:{}", dns.port)),
        "{out}"
    );
    assert!(
        out.contains("[backend.test:9001 = 127.0.0.1 127.0.0.2]"),
        "{out}"
    );

    let bad = dir.write(
        "bad.yaml",
        &text.replace(
            "[\"backend.test:9001\"]",
            "[\"127.0.0.1:9002\", \"gone.test:9001\"]",
        ),
    );
    let p = bad.display().to_string();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 1, "{err}");
    // the entry's own position: line 11, column 33
    let line = err
        .lines()
        .find(|l| l.starts_with(&format!("{p}:11:33: ")))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains(
            "upstreams.pool.servers[1]: server \"gone.test:9001\" resolves to no address: no such name (NXDOMAIN)"
        ),
        "{line}"
    );
}

#[test]
fn without_the_section_the_nameservers_and_search_domains_of_resolv_conf_are_asked() {
    // a nameserver on port 53 (resolv.conf names no port), of an address of its own
    let dns = Dnsmasq::start_at(
        "127.0.0.53",
        53,
        "127.0.0.1 backend.test\n127.0.0.2 backend.test\n",
    );
    let dir = TempDir::new();
    let resolv = dir.write("resolv.conf", "nameserver 127.0.0.53\nsearch test\n");
    let text = "server:\n  listen: [\"127.0.0.1:8080\"]\nupstreams:\n  pool:\n    servers: [\"backend:9001\"]\nroutes:\n  - { id: all, path: /**, upstream: pool }\n";
    let config = dir.write("gateway.yaml", text);
    // the gateway sees the test's resolv.conf in a mount namespace of its own (root's)
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c"])
        .arg("mount --bind \"$1\" /etc/resolv.conf && shift && exec \"$@\"")
        .arg("sh")
        .arg(&resolv)
        .args([common::tollgate_bin(), "-t", "-c"])
        .arg(&config)
        .output()
        .expect("run unshare");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "tollgate -t under unshare --mount (as root): {stdout}{stderr}"
    );
    assert!(
        stdout.contains("dns: nameservers of /etc/resolv.conf, answers kept 1s to 5m"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[backend:9001 = 127.0.0.1 127.0.0.2]"),
        "{stdout}"
    );
    let log = std::fs::read_to_string(dns.log()).unwrap_or_default();
    assert!(log.contains("query[A] backend.test"), "{log}");
}

#[test]
fn an_answer_is_kept_no_longer_than_max_ttl() {
    let (_ups, port) = upstreams(&["a", "b"]);
    let mut dns = Dnsmasq::start("127.0.0.1 backend.test\n");
    // answers of an hour, restarted so that the TTL applies
    dns.stop();
    dns.ttl = 3600;
    dns.spawn();
    let gw = Gateway::start(&config(port, dns.port, "", "  max_ttl: 1s"));
    assert_eq!(hits(&gw, 3).get("a"), Some(&3));
    dns.set_hosts("127.0.0.2 backend.test\n");
    assert!(
        eventually(Duration::from_secs(10), || listed(&gw)
            == vec![format!("127.0.0.2:{port}")]),
        "{}",
        gw.log()
    );
}

#[test]
fn a_lookup_without_an_answer_in_time_fails() {
    // a nameserver that never answers
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let port = silent.local_addr().expect("addr").port();
    let dir = TempDir::new();
    let text = config(9001, port, "", "")
        .replace("500ms", "300ms")
        .replace("{LISTEN}", "127.0.0.1:8080")
        .replace("{ADMIN}", "127.0.0.1:9090");
    let path = dir.write("gateway.yaml", &text);
    let (code, _, err) = run_tollgate(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("server \"backend.test:9001\" resolves to no address: no answer within 300ms"),
        "{err}"
    );
}

#[test]
fn a_pool_of_addresses_asks_no_resolver() {
    let a = Upstream::start("a");
    let dns = Dnsmasq::start("127.0.0.1 backend.test\n");
    let text = config(1, dns.port, "", "").replace("backend.test:1", &a.addr.to_string());
    let gw = Gateway::start(&text);
    assert_eq!(hits(&gw, 3).get("a"), Some(&3));
    assert!(!gw.metrics().contains("tollgate_upstream_dns_lookups_total"));
    let log = std::fs::read_to_string(dns.log()).unwrap_or_default();
    assert!(!log.contains("query["), "{log}");
}
