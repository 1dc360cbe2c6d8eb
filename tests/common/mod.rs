//! Test harness: real processes on ephemeral ports. `Upstream` runs the example upstream
//! server, `Gateway` runs the real `tollgate` binary on a config written to a temp dir, and
//! `request` is a small HTTP/1.1 client over a plain TCP socket.
#![allow(dead_code)]

pub mod browser;
pub mod failover;
pub mod grpc;
pub mod recording;
pub mod sentinel;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn tollgate_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tollgate")
}

/// `target/<profile>/examples/upstream`, built by `cargo test` along with the tests.
pub fn upstream_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile_dir.join("examples").join("upstream");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test` (which builds examples)",
        bin.display()
    );
    bin
}

/// A fresh temp directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port for a server a test starts. Ports come from 20000-31999, below the kernel's
/// ephemeral range (where processes binding port 0 land), handed out once per process from a
/// counter seeded by the pid: parallel tests never get the same port, and a port cannot be
/// taken by someone's port-0 bind between this check and the server's own bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let seed = (std::process::id() % 60) * 200;
    loop {
        let p = LOW + (seed + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        if TcpListener::bind(("127.0.0.1", p as u16)).is_ok() {
            return p as u16;
        }
    }
}

/// A free port for a Redis Cluster node, whose cluster bus listens on the port + 10000: both
/// free, and the bus port below Linux's ephemeral range (32768 and up), where an outgoing
/// connection could take it between this check and the node's bind.
pub fn free_port_with_bus() -> u16 {
    loop {
        let p = free_port();
        let bus = u32::from(p) + 10_000;
        if bus < 32_768 && TcpListener::bind(("127.0.0.1", bus as u16)).is_ok() {
            return p;
        }
    }
}

/// Start a helper server that prints `listening on ADDR` once bound; returns it and ADDR.
pub fn spawn_listening(mut cmd: Command) -> (Child, SocketAddr) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?} (cargo build --examples): {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the server prints its address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {line:?}"));
    (child, addr)
}

pub struct Upstream {
    child: Child,
    pub addr: SocketAddr,
    pub name: String,
}

impl Upstream {
    /// Requests this upstream has served (its `/hits` counter).
    pub fn hits(&self) -> u64 {
        request(self.addr, "GET", "/hits", &[])
            .expect("upstream answers")
            .json()["hits"]
            .as_u64()
            .unwrap_or(0)
    }

    pub fn start(name: &str) -> Self {
        Self::start_on("127.0.0.1:0", name)
    }

    pub fn start_on(addr: &str, name: &str) -> Self {
        let mut cmd = Command::new(upstream_bin());
        cmd.args([addr, name]);
        let (child, addr) = spawn_listening(cmd);
        Upstream {
            child,
            addr,
            name: name.to_string(),
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Processes a test started that are not its children (daemons, a gateway's successor),
/// killed when the value drops, whether the test passed or not.
pub struct KillOnDrop(pub Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill(2) on processes this test started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

pub struct Gateway {
    pub child: Child,
    pub dir: TempDir,
    pub config: PathBuf,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

impl Gateway {
    /// Start the gateway on `config_template`, where `{LISTEN}` and `{ADMIN}` are replaced by
    /// free addresses. Waits until `/readyz` answers 200.
    pub fn start(config_template: &str) -> Self {
        Self::start_with_files(config_template, &[])
    }

    /// Like `start`, writing `files` (name, text) beside the config first.
    pub fn start_with_files(config_template: &str, files: &[(&str, &str)]) -> Self {
        Self::start_with(config_template, files, &[])
    }

    /// Like `start`, with `env` (name, value) set for the process, e.g. the sampler's
    /// `TOLLGATE_SAMPLE_INTERVAL_MS` (see `FAST_SAMPLER`).
    pub fn start_with_env(config_template: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with(config_template, &[], env)
    }

    fn start_with(config_template: &str, files: &[(&str, &str)], env: &[(&str, &str)]) -> Self {
        Self::start_laid_out(config_template, env, |dir, text| {
            for (name, text) in files {
                dir.write(name, text);
            }
            dir.write("gateway.yaml", text)
        })
    }

    /// Like `start`, with the files laid out by `lay_out` (given the directory and the config's
    /// text, it writes them and returns the path to start the gateway with).
    pub fn start_laid_out(
        config_template: &str,
        env: &[(&str, &str)],
        lay_out: impl FnOnce(&TempDir, &str) -> PathBuf,
    ) -> Self {
        let dir = TempDir::new();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let text = config_template
            .replace("{LISTEN}", &addr.to_string())
            .replace("{ADMIN}", &admin.to_string())
            .replace("{DIR}", &dir.0.display().to_string());
        let config = lay_out(&dir, &text);
        let log = std::fs::File::create(dir.0.join("gateway.log")).expect("log file");
        let child = Command::new(tollgate_bin())
            .arg("-c")
            .arg(&config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn tollgate");
        let mut gw = Gateway {
            child,
            dir,
            config,
            addr,
            admin,
        };
        gw.wait_ready();
        gw
    }

    fn wait_ready(&mut self) {
        let (admin, log) = (self.admin, self.dir.0.join("gateway.log"));
        let child = &mut self.child;
        let ready = eventually(Duration::from_secs(20), || {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("gateway exited early ({status}); log:\n{log}");
            }
            request(admin, "GET", "/readyz", &[]).is_ok_and(|r| r.status == 200)
        });
        assert!(ready, "gateway not ready in time; log:\n{}", self.log());
    }

    /// Write `template` as the new config (placeholders resolved as at start), send SIGHUP and
    /// wait until the reload is counted (ok or error); returns whether it was ok.
    #[allow(dead_code)]
    pub fn reload(&self, template: &str) -> bool {
        let count = |result: &str| {
            metric_sum(
                &self.metrics(),
                &format!("tollgate_config_reloads_total{{result=\"{result}\"}}"),
            )
        };
        let before = (count("ok"), count("error"));
        let text = template
            .replace("{LISTEN}", &self.addr.to_string())
            .replace("{ADMIN}", &self.admin.to_string())
            .replace("{DIR}", &self.dir.0.display().to_string());
        std::fs::write(&self.config, text).expect("write config");
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGHUP);
        }
        assert!(
            eventually(Duration::from_secs(5), || (count("ok"), count("error"))
                != before),
            "no reload counted"
        );
        count("ok") > before.0
    }

    /// Upgrade in place: SIGUSR2, then until this process has handed over and exited; the new
    /// process (its pid from the log, `upgrade: pid N ...`), killed when the value drops.
    pub fn upgrade_in_place(&mut self) -> KillOnDrop {
        // SAFETY: a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGUSR2);
        }
        let child = &mut self.child;
        assert!(
            eventually(Duration::from_secs(15), || child
                .try_wait()
                .ok()
                .flatten()
                .is_some()),
            "the old process exited; log:\n{}",
            self.log()
        );
        let log = self.log();
        let new = log
            .split("upgrade: pid ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the new pid is logged: {log}"));
        KillOnDrop(vec![new])
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("gateway.log")).unwrap_or_default()
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        request(self.addr, "GET", path, headers)
            .unwrap_or_else(|e| panic!("request to gateway: {e}; log:\n{}", self.log()))
    }

    pub fn metrics(&self) -> String {
        request(self.admin, "GET", "/metrics", &[])
            .expect("metrics")
            .body
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    /// For echo responses of the example upstream: the headers the upstream received.
    pub fn upstream_headers(&self, name: &str) -> Vec<String> {
        self.json()["headers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|h| h[0].as_str() == Some(name))
                    .filter_map(|h| h[1].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn decode_chunked(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&body[..i])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || body.len() < i + 2 + size {
            return out;
        }
        out.extend_from_slice(&body[i + 2..i + 2 + size]);
        body = &body[(i + 4 + size).min(body.len())..];
    }
}

/// One HTTP/1.1 request with `Connection: close`; `path` is sent as written.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    let mut raw = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        raw.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    raw.push_str("Connection: close\r\n\r\n");
    request_raw(addr, raw.as_bytes())
}

/// Send raw bytes and read the whole answer (the server closes the connection).
pub fn request_raw(addr: SocketAddr, raw: &[u8]) -> std::io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(raw)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<Response> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let raw_body = &buf[head_end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        decode_chunked(raw_body)
    } else {
        raw_body.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Send `raw` on a fresh connection and read until it closes (or is quiet for 1 s): every
/// answer's status and body, in order (answers framed by Content-Length).
pub fn exchange(addr: SocketAddr, raw: &[u8]) -> Vec<(u16, String)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let mut tmp = [0u8; 8192];
    while let Ok(n) = s.read(&mut tmp) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&tmp[..n]);
    }
    let mut answers = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let len = response_len(rest).unwrap_or(rest.len()).min(rest.len());
        let Ok(r) = parse_response(&rest[..len]) else {
            break;
        };
        answers.push((r.status, r.body));
        rest = &rest[len..];
    }
    answers
}

/// The length of the first response in `buf` (head plus Content-Length body).
pub fn response_len(buf: &[u8]) -> Option<usize> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(head_end + len)
}

/// Run `tollgate` with arguments; returns (exit code, stdout, stderr).
pub fn run_tollgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(tollgate_bin())
        .args(args)
        .output()
        .expect("run tollgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Poll `f` until it returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        // the poll interval
        std::thread::sleep(Duration::from_millis(25));
    }
    f()
}

/// A real `redis-server` on an ephemeral port (no persistence), killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let cluster = extra.contains(&"--cluster-enabled");
        let mut r = RedisServer {
            child: None,
            port: if cluster {
                free_port_with_bus()
            } else {
                free_port()
            },
            dir: TempDir::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// (Re)start on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir.0)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (install redis-server)");
        self.child = Some(child);
        let port = self.port;
        // up when it answers, if only to say that the default user needs a password
        let up = || match redis_cmd(port, &["PING"]) {
            Ok(_) => true,
            Err(e) => e.to_string().contains("NOAUTH"),
        };
        assert!(
            eventually(Duration::from_secs(10), up),
            "redis-server did not start on {port}"
        );
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        redis_cmd(self.port, args).expect("redis command")
    }

    pub fn keys(&self, pattern: &str) -> Vec<String> {
        strings(self.cmd(&["KEYS", pattern]))
    }

    /// Stop (`STOP`) or resume (`CONT`) the server process: it keeps its connections, and what
    /// clients send meanwhile is read when it resumes.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill -{sig} redis-server");
        }
    }

    /// The contract's counter keys matching `pattern` (not the `:fleet` ledgers beside them).
    pub fn counter_keys(&self, pattern: &str) -> Vec<String> {
        let mut keys = self.keys(pattern);
        keys.retain(|k| !k.ends_with(":fleet"));
        keys
    }

    /// What the counter keys `pattern` matches hold, summed (the ledgers left out).
    #[allow(dead_code)]
    pub fn held(&self, pattern: &str) -> i64 {
        self.counter_keys(pattern)
            .iter()
            .map(|k| self.int(&["GET", k]))
            .sum()
    }

    pub fn int(&self, args: &[&str]) -> i64 {
        match self.cmd(args) {
            redis::Value::Int(i) => i,
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).parse().unwrap_or(0),
            _ => 0,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The strings of an array reply (a `KEYS` answer, say); nothing for any other reply.
pub fn strings(reply: redis::Value) -> Vec<String> {
    match reply {
        redis::Value::Array(v) => v
            .into_iter()
            .filter_map(|k| match k {
                redis::Value::BulkString(b) => String::from_utf8(b).ok(),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub fn redis_cmd(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut conn)
}

/// Sum of a metric's samples whose line starts with `prefix` (name and label start).
pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The operator-view sampler ticking every 20 ms instead of every second (for
/// `Gateway::start_with_env`): a test waits for the sample it needs, not for whole seconds.
pub const FAST_SAMPLER: (&str, &str) = ("TOLLGATE_SAMPLE_INTERVAL_MS", "20");

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fixed-window period for a test, in whole seconds, whose current window has at least
/// `room_s` seconds left: the smallest P >= `min_period_s` with that room. Fixed windows are
/// aligned to the epoch (start = floor(now_ms / period_ms) * period_ms), so a test that writes
/// `period: {P}` into its config knows that everything it does within `room_s` seconds from
/// now falls in one window, without waiting for an edge to pass. Count the gateways' start-up
/// in `room_s` when the period is chosen before they start.
pub fn period_with_room(min_period_s: u64, room_s: u64) -> u64 {
    assert!(min_period_s > 0, "a period of at least 1 s");
    let now = now_ms();
    (min_period_s..)
        .find(|p| p * 1000 - now % (p * 1000) >= room_s * 1000)
        .expect("a period with room")
}

/// A period of `secs` seconds as the gateway writes it (tier labels, RateLimit-Policy names,
/// `/api/status`): in the largest unit that divides it exactly, `1h`, `61m`, `3601s`.
pub fn period_label(secs: u64) -> String {
    if secs != 0 && secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs != 0 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// TCP connections in state ESTABLISHED to `addr` (an IPv4 address), from any process of this
/// machine (`/proc/net/tcp`): e.g. whether the gateway has forwarded a request to an upstream.
pub fn connections_to(addr: SocketAddr) -> usize {
    let SocketAddr::V4(v4) = addr else {
        panic!("connections_to: IPv4 only, not {addr}")
    };
    // the kernel writes the address as the hex of its in-memory (network order) u32, read as
    // a native (little-endian) integer, and the port in hex
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    std::fs::read_to_string("/proc/net/tcp")
        .expect("/proc/net/tcp")
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&want.as_str()) && f.get(3) == Some(&"01")
        })
        .count()
}

/// Whether `/api/status` shows the pool server `addr` healthy now (`None`: no pool lists it).
pub fn server_healthy(gw: &Gateway, addr: &str) -> Option<bool> {
    let status = request(gw.admin, "GET", "/api/status", &[]).ok()?.json();
    status["pools"]
        .as_array()?
        .iter()
        .flat_map(|p| p["servers"].as_array().into_iter().flatten())
        .find(|s| s["addr"] == addr)?["healthy"]
        .as_bool()
}

/// Wait until the gateway's `/readyz` reports `redis` as `state`.
pub fn wait_redis_state(gw: &Gateway, state: &str) -> bool {
    eventually(Duration::from_secs(10), || {
        request(gw.admin, "GET", "/readyz", &[]).is_ok_and(|r| r.json()["redis"] == state)
    })
}

/// The head every single-pool test config shares: listeners on `{LISTEN}` and `{ADMIN}`,
/// `threads`, any further `server` lines (indented by two), one pool `app` on `up`, and one
/// catch-all route `all`. Tests append their `tenant`, `limits` and other sections.
pub fn one_route_config(up: SocketAddr, threads: usize, server_extra: &str) -> String {
    let mut s = format!(
        "server:\n  listen: [\"{{LISTEN}}\"]\n  admin: \"{{ADMIN}}\"\n  threads: {threads}\n"
    );
    for line in server_extra.lines().filter(|l| !l.trim().is_empty()) {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!(
        "upstreams:\n  app:\n    servers: [\"{up}\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: app\n"
    ));
    s
}

/// One keep-alive HTTP/1.1 GET on an open stream; returns (status, body).
pub fn get_on<S: Read + Write>(s: &mut S, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A local Redis Cluster: `masters` masters with `replicas` replicas each, a short node
/// timeout (1 s) so that a failover takes about a second.
#[allow(dead_code)]
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

#[allow(dead_code)]
impl Cluster {
    pub fn start(masters: usize, replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    // a master down leaves its own slots without service, not the others'
                    "--cluster-require-full-coverage",
                    "no",
                ])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli (install redis-tools)");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Cluster { nodes };
        assert!(
            eventually(Duration::from_secs(20), || c.is_ok()
                && c.masters().len() == masters
                && (replicas == 0 || c.replicas_in_sync() == masters * replicas)),
            "cluster did not become ok"
        );
        c
    }

    fn info(n: &RedisServer, section: &[&str]) -> String {
        match redis_cmd(n.port, section) {
            Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(redis::Value::VerbatimString { text, .. }) => text,
            _ => String::new(),
        }
    }

    /// Every live node says the cluster is ok.
    pub fn is_ok(&self) -> bool {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .all(|n| Self::info(n, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
    }

    /// Live nodes that are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .filter(|n| Self::info(n, &["INFO", "replication"]).contains("role:master"))
            .collect()
    }

    fn replicas_in_sync(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .filter(|n| {
                let i = Self::info(n, &["INFO", "replication"]);
                i.contains("role:slave") && i.contains("master_link_status:up")
            })
            .count()
    }

    /// The node serving `key`'s slot now (asked of the live masters).
    pub fn master_of(&self, key: &str) -> Option<usize> {
        let slot = match redis_cmd(self.masters().first()?.port, &["CLUSTER", "KEYSLOT", key]) {
            Ok(redis::Value::Int(s)) => s,
            _ => return None,
        };
        self.nodes.iter().position(|n| {
            n.child.is_some()
                && Self::info(n, &["INFO", "replication"]).contains("role:master")
                && self.owns(n, slot)
        })
    }

    fn owns(&self, n: &RedisServer, slot: i64) -> bool {
        // CLUSTER SLOTS: [[start, end, [host, port, id], replicas...], ...]
        let Ok(redis::Value::Array(ranges)) = redis_cmd(n.port, &["CLUSTER", "SLOTS"]) else {
            return false;
        };
        ranges.iter().any(|r| match r {
            redis::Value::Array(p) => {
                let int = |v: Option<&redis::Value>| match v {
                    Some(redis::Value::Int(i)) => *i,
                    _ => -1,
                };
                let port = match p.get(2) {
                    Some(redis::Value::Array(m)) => int(m.get(1)),
                    _ => -1,
                };
                int(p.first()) <= slot && slot <= int(p.get(1)) && port == i64::from(n.port)
            }
            _ => false,
        })
    }

    /// The seeds, as the config lists them.
    pub fn seeds(&self) -> String {
        let s: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"{}\"", n.url()))
            .collect();
        format!("[{}]", s.join(", "))
    }

    /// (port, key, value) of every counter key matching `pattern`, on the masters.
    pub fn keys(&self, pattern: &str) -> Vec<(u16, String, i64)> {
        let mut out = Vec::new();
        for n in self.masters() {
            for k in n.counter_keys(pattern) {
                let v = n.int(&["GET", &k]);
                out.push((n.port, k, v));
            }
        }
        out
    }
}

/// A self-signed EC certificate for `host` (also its subjectAltName) as `NAME.pem` and
/// `NAME.key` in `dir`.
#[allow(dead_code)]
pub fn make_cert(dir: &std::path::Path, name: &str, host: &str) {
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={host}"))
        .arg("-addext")
        .arg(format!("subjectAltName=DNS:{host}"))
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.pem")))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl (Debian package openssl) makes test certificates");
    assert!(status.success(), "openssl req failed");
}

/// `<name>.pem` and `<name>.key` for `host`, signed by the CA `<ca>.pem` / `<ca>.key` (made
/// with `make_cert`): a leaf (`CA:FALSE`), as rustls requires of the certificate it verifies.
pub fn make_signed_cert(dir: &std::path::Path, ca: &str, name: &str, host: &str) {
    let run = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl (Debian package openssl) makes test certificates");
        assert!(status.success(), "openssl {args:?} failed");
    };
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!("basicConstraints=critical,CA:FALSE\nsubjectAltName=DNS:{host}\n"),
    )
    .expect("extension file");
    let subj = format!("/CN={host}");
    run(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        &subj,
        "-keyout",
        &key,
        "-out",
        &csr,
    ]);
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    run(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_pem,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &ext,
        "-out",
        &pem,
    ]);
}

/// Edits of a test's config text that fail loudly when the text to replace is not there (a
/// silent `str::replace` would run the test on an unchanged config).
pub trait Edit {
    /// `self` with every `from` replaced by `to`; panics if `from` does not occur.
    fn edit(&self, from: &str, to: &str) -> String;
}

impl Edit for str {
    #[track_caller]
    fn edit(&self, from: &str, to: &str) -> String {
        assert!(
            self.contains(from),
            "the config has no {from:?} to replace:\n{self}"
        );
        self.replace(from, to)
    }
}

/// Tenant ids that a naive key or partition encoding would confuse: separators, their
/// percent-encodings, braces (Redis Cluster hash tags), spaces, and two 10 KB ids that differ
/// in their last byte.
pub fn hostile_tenant_ids() -> Vec<String> {
    let mut ids: Vec<String> = ["a:b", "a%3Ab", "a{b}", "a%7Bb%7D", "%", "%25", "a b"]
        .map(String::from)
        .to_vec();
    ids.push("x".repeat(10_000));
    ids.push(format!("{}y", "x".repeat(9_999)));
    ids
}

/// The tenancy of the rate-limiting tests (`tests/admission.rs`, `tests/limits.rs`): an API key
/// (`k-7f3a` is acme), a trusted path, a trusted `x-org-id` header; plan premium is globex.
#[allow(dead_code)]
pub const TENANCY: &str = r#"tenant:
  from:
    - api_key: { header: x-api-key, keys: { "k-7f3a": acme } }
    - path: /v1/organizations/{tenant}/**
      trusted: true
    - header: x-org-id
      trusted: true
  required: false
plans:
  premium: [globex]
"#;

/// The repository's root.
pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python of `target/test-venv` (grpcio, PyJWT, cryptography), which `scripts/test-venv`
/// makes and `make deps-test` runs.
pub fn test_python() -> std::path::PathBuf {
    let p = repo().join("target/test-venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test-venv (make deps-test does)",
        p.display()
    );
    p
}

/// The demo's gateway (`conf/gateway.yaml` and the files it includes, as `make run` starts it)
/// with its addresses moved: its listeners and admin to free ports, and each demo upstream
/// address of `upstreams` (`127.0.0.1:9001` ...) to the one given. Killed on drop.
#[allow(dead_code)]
pub struct DemoGateway {
    pub child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The HTTPS listener (`127.0.0.1:8443` in the demo).
    pub tls: SocketAddr,
    pub dir: TempDir,
    pub ready: bool,
}

#[allow(dead_code)]
impl DemoGateway {
    pub fn start(upstreams: &[(&str, SocketAddr)]) -> DemoGateway {
        let root = repo();
        let dir = TempDir::new();
        for f in ["keys.yaml", "plans.yaml", "limits.yaml"] {
            let text = std::fs::read_to_string(root.join("conf").join(f)).expect("conf file");
            dir.write(f, &text);
        }
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let tls = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut conf = std::fs::read_to_string(root.join("conf/gateway.yaml"))
            .expect("conf/gateway.yaml")
            .replace("127.0.0.1:8080", &listen.to_string())
            .replace("127.0.0.1:8443", &tls.to_string())
            .replace("127.0.0.1:9090", &admin.to_string())
            .replace("../target/", &format!("{}/", root.join("target").display()));
        for (from, to) in upstreams {
            conf = conf.replace(from, &to.to_string());
        }
        let path = dir.write("gateway.yaml", &conf);
        let child = Command::new(tollgate_bin())
            .arg("-c")
            .arg(&path)
            .stderr(Stdio::null())
            .spawn()
            .expect("tollgate");
        let ready = eventually(Duration::from_secs(20), || {
            request(admin, "GET", "/readyz", &[]).is_ok_and(|r| r.status == 200)
        });
        DemoGateway {
            child,
            listen,
            admin,
            tls,
            dir,
            ready,
        }
    }
}

impl Drop for DemoGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
