//! Live operations (contract sections 1 and 7): SIGHUP reload, graceful upgrade, shutdown,
//! access log. Real processes, real signals.

mod common;
use common::{
    connections_to, eventually, get_on, metric_sum, period_label, period_with_room, request, Edit,
    Gateway, KillOnDrop, Upstream,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(up: &Upstream, extra_server: &str, threshold: u64) -> String {
    let server = format!(
        "  grace_period: 2s\n  pid_file: {{DIR}}/tollgate.pid\n  upgrade_sock: {{DIR}}/upgrade.sock\n{extra_server}"
    );
    format!(
        r#"{head}tenant:
  from:
    - header: x-org-id
      trusted: true
  required: false
limits:
  - id: api
    pathPattern: /limited/**
    tiers: [{{ period: 1h, threshold: {threshold} }}]
"#,
        head = common::one_route_config(up.addr, 2, &server)
    )
}

fn signal(gw: &Gateway, sig: i32) {
    let pid = gw.child.id() as i32;
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Write a new config for `gw` (placeholders resolved as at start); SIGHUP is the caller's.
fn rewrite(gw: &Gateway, template: &str) {
    let text = template
        .replace("{LISTEN}", &gw.addr.to_string())
        .replace("{ADMIN}", &gw.admin.to_string())
        .replace("{DIR}", &gw.dir.0.display().to_string());
    std::fs::write(&gw.config, text).unwrap();
}

fn server_of(gw: &Gateway) -> String {
    let r = gw.get("/x", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["server"].as_str().unwrap_or_default().to_string()
}

#[test]
fn sighup_swaps_the_config_keeps_counts_when_only_thresholds_change_and_logs_what_changed() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&config(&a, "", 3));
    assert_eq!(
        gw.get("/limited/1", &[]).header("x-ratelimit-remaining"),
        Some("2")
    );
    assert_eq!(
        gw.get("/limited/1", &[]).header("x-ratelimit-remaining"),
        Some("1")
    );
    rewrite(&gw, &config(&b, "", 3));
    signal(&gw, libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(5), || server_of(&gw) == "b"),
        "new upstream pool in use"
    );
    // same rule id and tiers: the count went on
    assert_eq!(
        gw.get("/limited/1", &[]).header("x-ratelimit-remaining"),
        Some("0")
    );
    assert_eq!(gw.get("/limited/1", &[]).status, 429);
    // (waiting on the reload metric, not on limited requests, so that the first request after
    // the swap shows what the reload did to the count)
    let reload = |text: &str, n: f64| {
        rewrite(&gw, text);
        signal(&gw, libc::SIGHUP);
        assert!(eventually(Duration::from_secs(5), || metric_sum(
            &gw.metrics(),
            "tollgate_config_reloads_total{result=\"ok\"}"
        ) >= n));
    };
    // a raised threshold: no amnesty, the 3 used stay used
    reload(&config(&b, "", 5), 2.0);
    let r = gw.get("/limited/1", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    // a lowered threshold already used up denies at once
    reload(&config(&b, "", 2), 3.0);
    let r = gw.get("/limited/1", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert!(
        gw.log()
            .contains("reload: rule api changed: tiers 5/1h -> 2/1h; counts kept"),
        "{}",
        gw.log()
    );
    // a changed period starts fresh, and the log says so
    reload(&config(&b, "", 2).edit("period: 1h", "period: 2h"), 4.0);
    let r = gw.get("/limited/1", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    assert!(gw.log().contains(
        "reload: rule api changed: tiers 2/1h -> 2/2h; counts reset (tier periods or plan lists changed)"
    ), "{}", gw.log());
    // so do a changed algorithm and `per`; rules added and removed and pools changed are listed
    let next = config(&a, "", 2).edit("period: 1h", "period: 2h").edit(
        "  - id: api\n",
        "  - id: api\n    algorithm: sliding_window\n    per: ip\n",
    )
        + "  - id: extra\n    pathPattern: /x/**\n    tiers: [{ period: 1s, threshold: 9 }]\n";
    reload(&next, 5.0);
    assert!(
        eventually(Duration::from_secs(2), || {
            let log = gw.log();
            log.contains("reload: rules added: extra")
                && log.contains("counts reset (algorithm, per changed)")
                && log.contains("reload: pools changed: app")
        }),
        "{}",
        gw.log()
    );
    reload(&config(&a, "", 2).edit("period: 1h", "period: 2h"), 6.0);
    assert!(eventually(Duration::from_secs(2), || gw
        .log()
        .contains("reload: rules removed: extra")));
}

#[test]
fn an_invalid_file_keeps_the_running_config_and_is_logged_with_its_position() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&config(&a, "", 3));
    rewrite(
        &gw,
        &config(&b, "", 3).edit("    upstream: app", "    upstream: nope"),
    );
    signal(&gw, libc::SIGHUP);
    assert!(eventually(Duration::from_secs(5), || metric_sum(
        &gw.metrics(),
        "tollgate_config_reloads_total{result=\"error\"}"
    ) == 1.0));
    assert_eq!(server_of(&gw), "a");
    let log = gw.log();
    let want = format!(
        "{}:14:15: routes[0].upstream: unknown upstream \"nope\"",
        gw.config.display()
    );
    assert!(log.contains(&want), "log lacks {want:?}:\n{log}");
    // a listener change is applied only by a restart or upgrade, and the log says so
    rewrite(&gw, &config(&a, "", 3).edit("  threads: 2", "  threads: 1"));
    signal(&gw, libc::SIGHUP);
    assert!(eventually(Duration::from_secs(5), || gw
        .log()
        .contains("need a restart or a graceful upgrade")));
}

/// Send requests back to back until `stop`; count failures (non-200 or connection errors).
fn traffic(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            match request(addr, "GET", "/x", &[]) {
                Ok(r) if r.status == 200 => ok += 1,
                _ => failed += 1,
            }
        }
        (ok, failed)
    })
}

/// Write the new config beside the old one and rename it over (what an operator's tools do):
/// a reload never sees a half-written file.
fn replace_by_rename(gw: &Gateway, template: &str) {
    let text = template
        .replace("{LISTEN}", &gw.addr.to_string())
        .replace("{ADMIN}", &gw.admin.to_string())
        .replace("{DIR}", &gw.dir.0.display().to_string());
    let tmp = gw.config.with_extension("yaml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &gw.config).unwrap();
}

#[test]
fn twenty_reloads_under_load_fail_no_request() {
    reloads_under_load(rewrite, false);
}

#[test]
fn twenty_reloads_under_load_by_rename_fail_no_request() {
    reloads_under_load(replace_by_rename, true);
}

/// 20 SIGHUPs under traffic, every other file invalid, written with `write`: no request fails,
/// each SIGHUP is one reload, and with `exact` every valid file is taken.
fn reloads_under_load(write: fn(&Gateway, &str), exact: bool) {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let valid = [config(&a, "", 3), config(&b, "", 3)];
    let gw = Gateway::start(&valid[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr, stop.clone());
    let reloads = || {
        let m = gw.metrics();
        metric_sum(&m, "tollgate_config_reloads_total{result=\"ok\"}")
            + metric_sum(&m, "tollgate_config_reloads_total{result=\"error\"}")
    };
    for i in 0..20 {
        if i % 2 == 0 {
            write(&gw, &valid[(i / 2) % 2]);
        } else {
            write(&gw, "server: [this is not valid");
        }
        let before = reloads();
        signal(&gw, libc::SIGHUP);
        // until this SIGHUP's reload is counted (ok or error), before the next file
        assert!(
            eventually(Duration::from_secs(5), || reloads() > before),
            "SIGHUP {i} made no reload"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(ok > 50, "traffic flowed: {ok}");
    assert_eq!(failed, 0, "{failed} requests failed during reloads");
    let m = gw.metrics();
    let ok = metric_sum(&m, "tollgate_config_reloads_total{result=\"ok\"}");
    let errors = metric_sum(&m, "tollgate_config_reloads_total{result=\"error\"}");
    assert_eq!(ok + errors, 20.0, "one reload per SIGHUP: {m}");
    if exact {
        assert_eq!((ok, errors), (10.0, 10.0), "{m}");
    } else {
        // a file rewritten in place may be read half-written: an error, and the old one stays
        assert!(ok >= 5.0, "{m}");
    }
}

#[test]
fn a_storm_of_sighups_leaves_the_last_valid_config_running() {
    let ups: Vec<Upstream> = (0..3).map(|i| Upstream::start(&format!("u{i}"))).collect();
    let mut gw = Gateway::start(&config(&ups[0], "", 3));
    for i in 0..50 {
        // the last file written (i = 49) is valid and points at u1
        if i % 5 == 3 {
            rewrite(&gw, "routes: [oops");
        } else {
            rewrite(&gw, &config(&ups[1 + (i % 2)], "", 3));
        }
        signal(&gw, libc::SIGHUP);
        // the storm: signals 18 ms apart, faster than reloads are made
        std::thread::sleep(Duration::from_millis(18));
    }
    assert!(eventually(Duration::from_secs(5), || server_of(&gw) == "u2"));
    // and it stays: once a last SIGHUP, of a file that changes nothing (it is invalid), has
    // been handled, no reload of the storm is left to come
    let errors = || {
        metric_sum(
            &gw.metrics(),
            "tollgate_config_reloads_total{result=\"error\"}",
        )
    };
    let before = errors();
    rewrite(&gw, "routes: [oops");
    signal(&gw, libc::SIGHUP);
    assert!(eventually(Duration::from_secs(5), || errors() > before));
    assert_eq!(server_of(&gw), "u2");
    assert!(
        gw.child.try_wait().unwrap().is_none(),
        "the process survived the storm"
    );
    let m = gw.metrics();
    assert!(
        metric_sum(&m, "tollgate_config_reloads_total{result=\"ok\"}") >= 1.0,
        "{m}"
    );
}

#[test]
fn sigterm_drains_in_flight_requests_then_exits() {
    let up = Upstream::start("a");
    let mut gw = Gateway::start(&config(&up, "", 3));
    let addr = gw.addr;
    let slow = std::thread::spawn(move || request(addr, "GET", "/delay/1000", &[]));
    // until the request is in flight: the gateway has forwarded it to the upstream
    assert!(eventually(Duration::from_secs(5), || connections_to(
        up.addr
    ) > 0));
    let t = Instant::now();
    // a probe on a kept-alive connection (new connections are refused once draining starts)
    let mut probe = std::net::TcpStream::connect(gw.admin).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(get_on(&mut probe, "/readyz", &[]).0, 200);
    signal(&gw, libc::SIGTERM);
    // from the first moment of draining, load balancers are told to go elsewhere
    let mut answer = (0, String::new());
    assert!(
        eventually(Duration::from_secs(2), || {
            answer = get_on(&mut probe, "/readyz", &[]);
            answer.0 == 503
        }),
        "{answer:?}"
    );
    let (status, body) = answer;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"draining\":true"), "{body}");
    let r = slow.join().unwrap().expect("in-flight request answered");
    assert_eq!(r.status, 200, "the request in flight completed");
    assert!(
        eventually(Duration::from_secs(10), || gw
            .child
            .try_wait()
            .ok()
            .flatten()
            .is_some()),
        "exited once the request in flight was answered"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(8),
        "{took:?}"
    );
}

#[test]
fn sigint_exits_at_once() {
    let up = Upstream::start("a");
    let mut gw = Gateway::start(&config(&up, "", 3));
    let t = Instant::now();
    signal(&gw, libc::SIGINT);
    assert!(eventually(Duration::from_secs(3), || gw
        .child
        .try_wait()
        .ok()
        .flatten()
        .is_some()));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

/// A graceful upgrade of `gw`: start the new process with `-u`, wait until it listens on the
/// upgrade socket, then SIGQUIT the old one; returns the new process.
fn hand_over(gw: &Gateway) -> std::process::Child {
    let log = std::fs::File::create(gw.dir.0.join("new.log")).unwrap();
    let new = std::process::Command::new(common::tollgate_bin())
        .args(["-u", "-c", &gw.config.display().to_string()])
        .stderr(log)
        .spawn()
        .unwrap();
    let sock = gw.dir.0.join("upgrade.sock");
    assert!(
        eventually(Duration::from_secs(10), || sock.exists()),
        "the new process waits on the upgrade socket"
    );
    signal(gw, libc::SIGQUIT);
    new
}

#[test]
fn graceful_upgrade_hands_over_listeners_without_refusing_a_connection() {
    let up = Upstream::start("a");
    let mut gw = Gateway::start(&config(&up, "", 3));
    let stop = Arc::new(AtomicBool::new(false));
    // every request of the traffic counts: a refused connection is a failed request
    let load = traffic(gw.addr, stop.clone());
    // until the traffic is answered by the old process
    assert!(eventually(Duration::from_secs(5), || metric_sum(
        &gw.metrics(),
        "tollgate_requests_total"
    ) >= 20.0));
    // a new process with a bad config exits 1; the old one keeps serving
    let bad = gw.dir.write("bad.yaml", "server: [");
    let st = std::process::Command::new(common::tollgate_bin())
        .args(["-u", "-c", &bad.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(1));
    // the new process waits for the listeners; SIGQUIT makes the old one hand them over
    let mut new = hand_over(&gw);
    // the old process exits once its grace period (2 s) is over
    assert!(
        eventually(Duration::from_secs(8), || gw
            .child
            .try_wait()
            .unwrap()
            .is_some()),
        "the old process exited"
    );
    // keep the traffic going past the old process's exit: the new one answers it all (until
    // the new process, on the same admin address, has answered 50 more)
    let answered = || {
        request(gw.admin, "GET", "/metrics", &[])
            .map_or(0.0, |r| metric_sum(&r.body, "tollgate_requests_total"))
    };
    let at_exit = answered();
    assert!(
        eventually(Duration::from_secs(5), || answered() >= at_exit + 50.0),
        "the new process answers the traffic"
    );
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(new.try_wait().unwrap().is_none(), "the new process runs");
    let after = request(gw.addr, "GET", "/x", &[]).expect("the new process answers");
    assert_eq!(after.status, 200);
    let ready = request(gw.admin, "GET", "/readyz", &[]).expect("its admin listener too");
    assert_eq!(ready.status, 200);
    let _ = new.kill();
    let _ = new.wait();
    assert!(ok > 50, "traffic flowed: {ok}");
    assert_eq!(failed, 0, "{failed} requests failed or were refused");
}

/// Clients that keep their connections alive, as browsers, SDKs and wrk do: each sends a
/// request, reads its whole answer, and sends the next on the same connection; it opens a new
/// connection only when the server said `Connection: close` or closed the connection before
/// the request was sent (as HTTP clients check before reusing one). A request sent and never
/// answered is a failure. Returns (answered 200, failed).
fn kept_alive_traffic(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, 0);
        let mut conn: Option<std::net::TcpStream> = None;
        while !stop.load(Ordering::Relaxed) {
            let mut s = match conn.take() {
                Some(s) => s,
                None => match std::net::TcpStream::connect(addr) {
                    Ok(s) => s,
                    Err(_) => {
                        failed += 1;
                        continue;
                    }
                },
            };
            // closed by the server while idle? (a FIN waiting to be read): reconnect
            s.set_nonblocking(true).unwrap();
            let mut probe = [0u8; 1];
            let closed = matches!(s.peek(&mut probe), Ok(0));
            s.set_nonblocking(false).unwrap();
            if closed {
                continue;
            }
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            if s.write_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n").is_err() {
                failed += 1;
                continue;
            }
            let mut buf = Vec::new();
            let mut tmp = [0u8; 4096];
            let complete = loop {
                if let Some(len) = common::response_len(&buf).filter(|&n| buf.len() >= n) {
                    let r = common::parse_response(&buf[..len]).ok();
                    break r.map(|r| (r.status == 200, r.header("connection") == Some("close")));
                }
                match s.read(&mut tmp) {
                    Ok(0) | Err(_) => break None,
                    Ok(n) => buf.extend_from_slice(&tmp[..n]),
                }
            };
            match complete {
                Some((true, close)) => {
                    ok += 1;
                    if !close {
                        conn = Some(s);
                    }
                }
                _ => failed += 1,
            }
        }
        (ok, failed)
    })
}

/// A graceful upgrade under clients that keep their connections alive (8 threads of the
/// above, and wrk with 32 connections): no request is lost. The old process answers what
/// arrives on its kept-alive connections with `Connection: close` until it closes the idle
/// ones, so every client moves to the new process between two requests.
#[test]
fn graceful_upgrade_loses_no_request_of_kept_alive_clients() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, "", 3));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| kept_alive_traffic(gw.addr, stop.clone()))
        .collect();
    let wrk = std::process::Command::new("wrk")
        .args(["-t1", "-c32", "-d5s", "--latency"])
        .arg(format!("http://{}/x", gw.addr))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wrk (Debian package wrk; make test installs it)");
    // traffic on the old process first
    assert!(eventually(Duration::from_secs(5), || metric_sum(
        &gw.metrics(),
        "tollgate_requests_total"
    ) > 500.0));
    let mut new = hand_over(&gw);
    let mut old = gw;
    assert!(
        eventually(Duration::from_secs(10), || old
            .child
            .try_wait()
            .unwrap()
            .is_some()),
        "the old process exited"
    );
    let out = wrk.wait_with_output().unwrap();
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, 0);
    for c in clients {
        let (o, f) = c.join().unwrap();
        ok += o;
        failed += f;
    }
    let wrk_out = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = new.kill();
    let _ = new.wait();
    assert!(ok > 100, "kept-alive clients were served: {ok}");
    assert_eq!(failed, 0, "kept-alive requests lost");
    assert!(
        !wrk_out.contains("Socket errors") && !wrk_out.contains("Non-2xx"),
        "wrk lost requests: {wrk_out}"
    );
    assert!(wrk_out.contains("requests in"), "{wrk_out}");
}

/// Is `pid` a running process (not gone, not a zombie waiting for its parent)?
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The file `pid` runs (`/proc/<pid>/exe`; " (deleted)" once the file was replaced).
fn exe_of(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// The processes whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .is_ok_and(|s| s.contains(&format!("\nPPid:\t{pid}\n")))
        })
        .collect()
}

/// A gateway's own binary file (a copy: one link, so that renamed over, the running file is
/// deleted, as after dpkg) with its config (error log `error.log`, pid file `tollgate.pid`).
struct OwnBinary {
    dir: common::TempDir,
    exe: std::path::PathBuf,
    conf: std::path::PathBuf,
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
}

impl OwnBinary {
    fn new(up: &Upstream) -> Self {
        let dir = common::TempDir::new();
        let bin = dir.0.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("tollgate");
        std::fs::copy(common::tollgate_bin(), &exe).unwrap();
        let port = || {
            format!("127.0.0.1:{}", common::free_port())
                .parse()
                .unwrap()
        };
        let (addr, admin): (std::net::SocketAddr, std::net::SocketAddr) = (port(), port());
        let text = config(up, "  error_log: {DIR}/error.log\n", 3)
            .replace("{LISTEN}", &addr.to_string())
            .replace("{ADMIN}", &admin.to_string())
            .replace("{DIR}", &dir.0.display().to_string());
        let conf = dir.write("gateway.yaml", &text);
        OwnBinary {
            dir,
            exe,
            conf,
            addr,
            admin,
        }
    }

    fn wait_ready(&self) {
        assert!(
            eventually(Duration::from_secs(20), || request(
                self.admin,
                "GET",
                "/readyz",
                &[]
            )
            .is_ok_and(|r| r.status == 200)),
            "not ready; log:\n{}",
            self.log()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("error.log")).unwrap_or_default()
    }

    /// Put a new file in place of the binary, as dpkg does: written beside it, renamed over.
    fn replace(&self, write: impl FnOnce(&std::path::Path) -> std::io::Result<()>) {
        let staged = self.exe.with_extension("dpkg-new");
        write(&staged).unwrap();
        std::fs::rename(&staged, &self.exe).unwrap();
    }
}

/// Run `start` (a spawn of a file just written) again while it fails with ETXTBSY: a process
/// forked meanwhile by another test's thread holds the file open for writing until it execs.
fn fresh_file<T>(mut start: impl FnMut() -> std::io::Result<T>) -> T {
    let mut result = start();
    let mut tries = 0;
    while let Err(e) = &result {
        if e.raw_os_error() != Some(libc::ETXTBSY) || tries == 100 {
            break;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(20));
        result = start();
    }
    result.expect("start the gateway's own binary")
}

/// As the package's unit runs it: `tollgate -d` from a binary file that a package upgrade then
/// replaces (renamed over, as dpkg does). SIGUSR2 starts the new file with `-u -d`: it takes
/// the listeners, writes the pid file while the old process still runs (what systemd needs to
/// follow it as the unit's main process), the old one exits, and no request of the traffic
/// (a connection per request, and kept-alive clients) is refused or lost.
#[test]
fn sigusr2_upgrades_in_place_to_the_replaced_binary_without_losing_a_request() {
    let up = Upstream::start("a");
    let own = OwnBinary::new(&up);
    let (addr, admin, exe) = (own.addr, own.admin, own.exe.clone());
    let pid_file = own.dir.0.join("tollgate.pid");
    let read_pid = || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    };
    let mut status = std::process::Command::new(&exe);
    status
        .args(["-d", "-c", &own.conf.display().to_string()])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let status = fresh_file(|| status.status());
    assert!(status.success());
    own.wait_ready();
    let old = read_pid().expect("the pid file");
    let mut pids = KillOnDrop(vec![old]);
    let log = || own.log();

    let stop = Arc::new(AtomicBool::new(false));
    let mut load: Vec<_> = (0..4)
        .map(|_| kept_alive_traffic(addr, stop.clone()))
        .collect();
    load.push(traffic(addr, stop.clone()));
    let answered = || {
        request(admin, "GET", "/metrics", &[])
            .map_or(0.0, |r| metric_sum(&r.body, "tollgate_requests_total"))
    };
    assert!(eventually(Duration::from_secs(5), || answered() >= 50.0));

    // the package upgrade: a new file renamed over the old one
    own.replace(|staged| {
        std::fs::hard_link(common::tollgate_bin(), staged)
            .or_else(|_| std::fs::copy(common::tollgate_bin(), staged).map(|_| ()))
    });
    assert!(exe_of(old).ends_with(" (deleted)"), "{}", exe_of(old));

    // SAFETY: kill(2) on the daemon this test started.
    unsafe {
        libc::kill(old, libc::SIGUSR2);
    }
    let mut new = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            new = read_pid().filter(|&p| p != old && running(p));
            new.is_some() && running(old)
        }),
        "the new process wrote the pid file while the old one ran; log:\n{}",
        log()
    );
    let new = new.unwrap();
    pids.0.push(new);
    assert_eq!(
        exe_of(new),
        exe.display().to_string(),
        "it runs the new file"
    );
    assert!(
        eventually(Duration::from_secs(15), || !running(old)),
        "the old process exited; log:\n{}",
        log()
    );
    // the new process answers the traffic (its own count, from zero)
    assert!(
        eventually(Duration::from_secs(5), || answered() >= 50.0),
        "the new process answers; log:\n{}",
        log()
    );
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, 0);
    for l in load {
        let (o, f) = l.join().unwrap();
        ok += o;
        failed += f;
    }
    assert!(ok > 100, "traffic flowed: {ok}");
    assert_eq!(failed, 0, "requests refused or lost; log:\n{}", log());
    assert!(running(new), "the new process runs");
    assert_eq!(read_pid(), Some(new));
    let log = log();
    assert!(
        log.contains("waits for the listeners; handing them over"),
        "{log}"
    );
}

/// SIGUSR2 when the binary rejects the config, or the new process cannot take the listeners:
/// the reason is logged and the running process keeps serving, untouched. Then, with the file
/// fixed, a SIGUSR2 to a process in the foreground (no -d) hands over to a foreground child.
#[test]
fn sigusr2_that_cannot_hand_over_keeps_the_running_process() {
    let up = Upstream::start("a");
    let mut gw = Gateway::start(&config(&up, "", 3));
    let good = std::fs::read_to_string(&gw.config).unwrap();
    std::fs::write(&gw.config, good.replace("routes:", "routes: [")).unwrap();
    signal(&gw, libc::SIGUSR2);
    assert!(
        eventually(Duration::from_secs(10), || gw
            .log()
            .contains("this process keeps serving")),
        "{}",
        gw.log()
    );
    let log = gw.log();
    let line = log
        .lines()
        .find(|l| l.contains("keeps serving"))
        .unwrap_or_default();
    assert!(line.contains("-t rejects"), "{line}");
    assert!(
        line.contains("gateway.yaml:"),
        "the error names the file: {line}"
    );
    assert!(gw.child.try_wait().unwrap().is_none(), "still running");
    assert_eq!(gw.get("/x", &[]).status, 200);
    assert_eq!(
        request(gw.admin, "GET", "/readyz", &[])
            .map(|r| r.status)
            .ok(),
        Some(200),
        "still ready: nothing was handed over"
    );

    // counted by the old process (3 an hour)
    for left in ["2", "1"] {
        let r = gw.get("/limited/1", &[]);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(left));
    }

    // fixed: the foreground process hands over to its child and exits
    std::fs::write(&gw.config, &good).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr, stop.clone());
    let new_process = gw.upgrade_in_place();
    let new = new_process.0[0];
    assert!(running(new));
    assert_eq!(gw.get("/x", &[]).status, 200);
    // without Redis, the new process counts afresh
    let r = gw.get("/limited/1", &[]);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"), "{r:?}");
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(ok > 10, "{ok}");
    assert_eq!(failed, 0, "requests refused or lost");
}

/// SIGUSR2 when the new binary passes `-t` but then exits, or never waits on the upgrade
/// socket (here within `TOLLGATE_UPGRADE_WAIT_MS`, 30 s by default): the reason is logged, the
/// new process is stopped, and the running one keeps serving, ready.
#[test]
fn sigusr2_with_a_new_binary_that_exits_or_never_waits_keeps_the_running_process() {
    use std::os::unix::fs::PermissionsExt;
    let up = Upstream::start("a");
    let own = OwnBinary::new(&up);
    let log = std::fs::File::create(own.dir.0.join("error.log")).unwrap();
    let mut child = std::process::Command::new(&own.exe);
    child
        .args(["-c", &own.conf.display().to_string()])
        .env("RUST_LOG", "info")
        .env("TOLLGATE_UPGRADE_WAIT_MS", "1000")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    let mut child = fresh_file(|| child.spawn());
    let _pids = KillOnDrop(vec![child.id() as i32]);
    // the new binaries, written well before they run (see `fresh_file`)
    let script = |name: &str, body: &str| {
        let path = own.dir.0.join(name);
        let text = format!("#!/bin/sh\ncase \"$1\" in -t) exit 0;; esac\n{body}\n");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let exits = script("exits", "exit 3");
    let never = script("never", "exec sleep 30");
    own.wait_ready();
    for (file, why) in [
        (
            exits,
            "the new process exited (exit status: 3) before taking the listeners",
        ),
        (never, "the new process did not wait on"),
    ] {
        own.replace(|staged| std::fs::rename(&file, staged));
        let before = own.log().matches("keeps serving").count();
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGUSR2);
        }
        assert!(
            eventually(Duration::from_secs(10), || own
                .log()
                .matches("keeps serving")
                .count()
                > before),
            "{}",
            own.log()
        );
        let log = own.log();
        let line = log
            .lines()
            .rfind(|l| l.contains("keeps serving"))
            .unwrap_or_default();
        assert!(line.contains(why), "{why}: {line}");
        assert!(child.try_wait().unwrap().is_none(), "still running");
        assert_eq!(request(own.addr, "GET", "/x", &[]).unwrap().status, 200);
        assert_eq!(
            request(own.admin, "GET", "/readyz", &[]).unwrap().status,
            200,
            "still ready: nothing was handed over"
        );
    }
    // the new process that never waited was stopped (and reaped)
    assert_eq!(children_of(child.id() as i32), Vec::<i32>::new());
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn access_log_has_one_line_per_request() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, "  access_log: true", 1));
    gw.get("/limited/1", &[("x-org-id", "acme\"\n")]);
    gw.get("/limited/1", &[("x-org-id", "acme\"\n")]);
    assert!(eventually(Duration::from_secs(2), || gw
        .log()
        .matches("tollgate::access")
        .count()
        == 2));
    let log = gw.log();
    let line = log
        .lines()
        .find(|l| l.contains("tollgate::access") && l.contains("status=200"))
        .unwrap();
    for part in [
        "route=all",
        "method=GET",
        "decision=allowed",
        "latency_ms=",
        &format!("upstream={}", up.addr),
    ] {
        assert!(line.contains(part), "{part} missing in {line}");
    }
    assert!(
        line.contains("tenant=\"acme\\\"\""),
        "tenant escaped: {line}"
    );
    assert!(log.lines().any(|l| l.contains("tollgate::access")
        && l.contains("status=429 decision=denied")
        && l.ends_with(" rule=api")));

    // a bare CR, an obs-fold and a vertical tab inside the tenant header: whatever the parser
    // makes of them, each request is one line
    let before = gw.log().matches("tollgate::access").count();
    let attacks: [&[u8]; 3] = [
        b"GET /limited/2 HTTP/1.1\r\nHost: x\r\nx-org-id: a\rINFO tollgate::access forged\r\nConnection: close\r\n\r\n",
        b"GET /limited/2 HTTP/1.1\r\nHost: x\r\nx-org-id: a\r\n forged tollgate::access\r\nConnection: close\r\n\r\n",
        b"GET /limited/2 HTTP/1.1\r\nHost: x\r\nx-org-id: a\x0bb\r\nConnection: close\r\n\r\n",
    ];
    let mut statuses = Vec::new();
    for raw in attacks {
        statuses.push(common::request_raw(gw.addr, raw).map(|r| r.status).ok());
    }
    // (pingora refuses some with 400 before any phase runs: those are not logged)
    assert!(statuses.iter().flatten().all(|s| *s < 500), "{statuses:?}");
    // until a request sent after them is logged (theirs, if any, were written before: each
    // is logged before its connection closes, and the client read to the close)
    gw.get("/limited/marker", &[]);
    assert!(eventually(Duration::from_secs(2), || gw
        .log()
        .contains("path=\"/limited/marker\"")));
    let log = gw.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tollgate::access") && !l.contains("/limited/marker"))
        .collect();
    assert!(lines.len() <= before + 3, "{lines:#?}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("INFO  tollgate::access] route=")),
        "every access line is whole: {lines:#?}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with(" forged") || l.starts_with("INFO tollgate::access forged")),
        "{log}"
    );
}

/// `log_format: json` (issue 42): every line the gateway writes is one JSON object with
/// `ts`, `level` and `target`; its own lines say `msg`, an access line has its fields (a
/// hostile tenant a JSON string, the status and latency numbers); under `tracing.tenant: hash`
/// the access log names the tenant by its hash, as the spans do.
#[test]
fn json_logs_parse_line_by_line() {
    let up = Upstream::start("a");
    let hostile = "acme\"},\"status\":1";
    let json = config(&up, "  access_log: true\n  log_format: json", 1);
    let gw = Gateway::start(&json);
    assert_eq!(gw.get("/limited/1", &[("x-org-id", hostile)]).status, 200);
    assert_eq!(gw.get("/limited/1", &[("x-org-id", hostile)]).status, 429);
    let access = |gw: &Gateway| -> Vec<serde_json::Value> {
        let log = gw.log();
        let all: Vec<serde_json::Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        for v in &all {
            assert!(v["ts"].is_string() && v["level"].is_string(), "{v}");
            let target = v["target"].as_str().unwrap_or_default();
            assert!(target == "tollgate::access" || v["msg"].is_string(), "{v}");
        }
        all.into_iter()
            .filter(|v| v["target"] == "tollgate::access")
            .collect()
    };
    assert!(eventually(Duration::from_secs(2), || access(&gw).len() == 2));
    let lines = access(&gw);
    let (ok, denied) = (&lines[0], &lines[1]);
    assert_eq!(ok["tenant"], hostile, "{ok}");
    assert_eq!(
        (ok["status"].as_u64(), denied["status"].as_u64()),
        (Some(200), Some(429))
    );
    assert!(
        ok["latency_ms"].is_f64() && ok["request_id"].is_string(),
        "{ok}"
    );
    assert_eq!(ok["upstream"], up.addr.to_string());
    assert_eq!(
        (&ok["route"], &ok["method"], &ok["path"]),
        (&"all".into(), &"GET".into(), &"/limited/1".into())
    );
    assert_eq!(
        (&denied["decision"], &denied["rule"]),
        (&"denied".into(), &"api".into())
    );
    // the tenant by its hash
    let hashed = json + "tracing:\n  otlp: http://127.0.0.1:9\n  sample: 0\n  tenant: hash\n";
    let gw = Gateway::start(&hashed);
    gw.get("/limited/1", &[("x-org-id", "acme")]);
    assert!(eventually(Duration::from_secs(2), || access(&gw).len() == 1));
    let tenant = access(&gw)[0]["tenant"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(tenant != "acme" && tenant.len() == 16, "{tenant}");
    assert!(!gw.log().contains("acme"), "{}", gw.log());
}

#[test]
fn a_reload_that_adds_redis_starts_syncing() {
    let up = Upstream::start("a");
    let redis = common::RedisServer::start();
    let gw = Gateway::start(&config(&up, "", 100));
    assert_eq!(
        request(gw.admin, "GET", "/readyz", &[]).unwrap().json()["redis"],
        "not_configured"
    );
    let with_redis = format!(
        "{}redis:\n  url: {}\n  key_prefix: op\n",
        config(&up, "", 100),
        redis.url()
    );
    rewrite(&gw, &with_redis);
    signal(&gw, libc::SIGHUP);
    assert!(common::wait_redis_state(&gw, "connected"));
    gw.get("/limited/1", &[("x-org-id", "t")]);
    assert!(eventually(Duration::from_secs(5), || redis
        .counter_keys("op:{t}:api:*")
        .len()
        == 1));
}

#[test]
fn a_request_whose_client_left_is_counted_as_499() {
    use std::io::Write;
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, "", 3));
    let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
    s.write_all(b"GET /delay/1500 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // until the request is in flight: the gateway has forwarded it to the upstream
    assert!(eventually(Duration::from_secs(5), || connections_to(
        up.addr
    ) > 0));
    drop(s);
    assert!(
        eventually(Duration::from_secs(5), || gw
            .metrics()
            .contains("status=\"499\"} 1")),
        "{}",
        gw.metrics()
    );
    assert!(!gw.metrics().contains("status=\"500\""), "{}", gw.metrics());
}

#[test]
fn a_listener_that_cannot_be_bound_ends_start_up_with_exit_1() {
    let up = Upstream::start("a");
    let first = Gateway::start(&config(&up, "", 3));
    // the same data plane port, its own admin port
    let text = std::fs::read_to_string(&first.config).unwrap().edit(
        &first.admin.to_string(),
        &format!("127.0.0.1:{}", common::free_port()),
    );
    let dir = common::TempDir::new();
    let conf = dir.write("second.yaml", &text);
    let t = Instant::now();
    let (code, _, err) = common::run_tollgate(&["-c", conf.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(
        err.contains(&format!("cannot listen on {}", first.addr)) && err.contains("in use"),
        "{err}"
    );
    // (besides the config's warnings, printed at every start)
    let lines = err
        .trim()
        .lines()
        .filter(|l| !l.contains(": warning: "))
        .count();
    assert_eq!(lines, 1, "one line: {err}");
    // the first one is untouched
    assert_eq!(first.get("/x", &[("x-org-id", "t")]).status, 200);
}

#[test]
fn the_access_log_names_a_shadow_rule_and_a_reload_drops_the_series_of_removed_rules() {
    let up = Upstream::start("a");
    let shadow = "  - id: trial\n    pathPattern: /limited/**\n    action: shadow\n    tiers: [{ period: 1h, threshold: 1 }]\n";
    let with_shadow = format!("{}{shadow}", config(&up, "  access_log: true", 100));
    let gw = Gateway::start(&with_shadow);
    for _ in 0..2 {
        assert_eq!(gw.get("/limited/1", &[("x-org-id", "globex")]).status, 200);
    }
    assert!(eventually(Duration::from_secs(2), || gw.log().lines().any(
        |l| l.contains("tenant=\"globex\"") && l.ends_with(" shadow_denied_by=trial")
    )));
    assert!(gw.metrics().contains("rule=\"trial\""));
    // the rule goes; its series go with it
    rewrite(&gw, &config(&up, "  access_log: true", 100));
    signal(&gw, libc::SIGHUP);
    assert!(eventually(Duration::from_secs(5), || !gw
        .metrics()
        .contains("rule=\"trial\"")));
    assert!(gw.metrics().contains("rule=\"api\""));
}

#[test]
fn metrics_name_the_tier_that_denies_and_time_each_route() {
    let up = Upstream::start("a");
    let base = common::one_route_config(up.addr, 2, "");
    // a second route, to be removed by a reload
    let two_routes = base.edit(
        "routes:\n",
        "routes:\n  - id: reports\n    path: /reports/**\n    upstream: app\n",
    );
    // an hourly tier and a 10-second one, each of a period from there up whose window has
    // room for the test: the requests of each rule fall in one window of each
    let (hour, ten) = (period_with_room(3600, 20), period_with_room(10, 5));
    let limits = format!("tenant:\n  from:\n    - header: x-org-id\n      trusted: true\nlimits:\n  - id: api\n    pathPattern: /limited/**\n    tiers: [{{ period: 1s, threshold: 1000 }}, {{ period: {hour}, threshold: 2 }}]\n  - id: burst\n    pathPattern: /burst/**\n    tiers: [{{ period: {ten}, threshold: 1 }}, {{ period: {hour}, threshold: 1000 }}]\n");
    let gw = Gateway::start(&format!("{two_routes}{limits}"));
    for _ in 0..2 {
        assert_eq!(gw.get("/limited/1", &[("x-org-id", "t")]).status, 200);
    }
    assert_eq!(gw.get("/limited/1", &[("x-org-id", "t")]).status, 429);
    assert_eq!(gw.get("/burst/1", &[("x-org-id", "t")]).status, 200);
    assert_eq!(gw.get("/burst/1", &[("x-org-id", "t")]).status, 429);
    assert_eq!(gw.get("/reports/1", &[("x-org-id", "t")]).status, 200);
    let m = gw.metrics();
    // which tier denies: the hourly one of `api`, the 10-second one of `burst`
    let (hour, ten) = (period_label(hour), period_label(ten));
    for series in [
        format!(
            r#"tollgate_ratelimit_decisions_total{{decision="denied",rule="api",tier="{hour}"}} 1"#
        ),
        r#"tollgate_ratelimit_decisions_total{decision="denied",rule="api",tier="1s"} 0"#.into(),
        format!(
            r#"tollgate_ratelimit_decisions_total{{decision="denied",rule="burst",tier="{ten}"}} 1"#
        ),
        r#"tollgate_ratelimit_decisions_total{decision="allowed",rule="api",tier="all"} 2"#.into(),
        // a latency histogram per route: every request answered is in it
        r#"tollgate_request_duration_seconds_count{route="all"} 5"#.into(),
        r#"tollgate_request_duration_seconds_count{route="reports"} 1"#.into(),
        // the limiter's own time: one observation per request decided
        r#"tollgate_ratelimit_decision_duration_seconds_count 6"#.into(),
    ] {
        assert!(m.contains(&series), "{series} missing in\n{m}");
    }
    // the route goes; its series go with it
    rewrite(&gw, &format!("{base}{limits}"));
    signal(&gw, libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(5), || !gw
            .metrics()
            .contains("route=\"reports\"")),
        "{}",
        gw.metrics()
    );
    assert!(gw
        .metrics()
        .contains(r#"tollgate_request_duration_seconds_count{route="all"}"#));
}

#[test]
fn server_health_series_follow_the_running_config() {
    let (a, mut b) = (Upstream::start("a"), Upstream::start("b"));
    let config = |up: &Upstream| common::one_route_config(up.addr, 1, "");
    let gw = Gateway::start(&config(&a));
    let series = |up: &Upstream| {
        format!(
            "tollgate_upstream_server_healthy{{pool=\"app\",server=\"{}\"}} 1",
            up.addr
        )
    };
    assert!(eventually(Duration::from_secs(3), || gw
        .metrics()
        .contains(&series(&a))));
    // a reload to another server: its series comes, the old one goes
    assert!(gw.reload(&config(&b)));
    assert!(eventually(Duration::from_secs(3), || {
        let m = gw.metrics();
        m.contains(&series(&b)) && !m.contains(&a.addr.to_string())
    }));
    // a server whose connection failed is skipped, and shows 0
    let addr = b.addr;
    b.kill();
    assert_eq!(gw.get("/x", &[]).status, 502);
    let down = format!("tollgate_upstream_server_healthy{{pool=\"app\",server=\"{addr}\"}} 0");
    assert!(
        eventually(Duration::from_secs(3), || gw.metrics().contains(&down)),
        "{}",
        gw.metrics()
    );
}
