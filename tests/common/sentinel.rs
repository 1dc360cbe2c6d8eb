//! A real redis-sentinel process (Debian's `redis-sentinel`) watching `mymaster`.

use super::{eventually, free_port, redis_cmd, strings, TempDir};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Sentinel {
    child: Child,
    /// Its plain port, which the tests ask.
    pub port: u16,
    pub dir: TempDir,
}

impl Sentinel {
    /// A sentinel on a port of its own with `conf` (the `sentinel monitor mymaster ...` lines
    /// and any other); up once it names a primary.
    pub fn start(conf: &str) -> Self {
        let port = free_port();
        let dir = TempDir::new();
        let path = dir.write(
            "sentinel.conf",
            &format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n{conf}",
                dir.0.display()
            ),
        );
        let child = Command::new("redis-sentinel")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel (install redis-sentinel)");
        let s = Sentinel { child, port, dir };
        assert!(
            eventually(Duration::from_secs(10), || s.primary().is_some()),
            "redis-sentinel did not start on {port}"
        );
        s
    }

    /// The (host, port) of the primary it names now.
    pub fn primary_addr(&self) -> Option<(String, u16)> {
        let reply = redis_cmd(
            self.port,
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        )
        .ok()?;
        let addr = strings(reply);
        Some((addr.first()?.clone(), addr.get(1)?.parse().ok()?))
    }

    /// The port of the primary it names now.
    pub fn primary(&self) -> Option<u16> {
        self.primary_addr().map(|(_, port)| port)
    }

    /// How many replicas and other sentinels it knows of.
    pub fn knows(&self) -> (usize, usize) {
        let count = |what: &str| {
            redis_cmd(self.port, &["SENTINEL", what, "mymaster"])
                .map(|v| match v {
                    redis::Value::Array(a) => a.len(),
                    _ => 0,
                })
                .unwrap_or(0)
        };
        (count("replicas"), count("sentinels"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
