//! Upgrade in place on SIGUSR2 (nginx's signal for a new binary): the running process starts
//! its own successor from the path it was started from (which a package upgrade has replaced)
//! with `-u`, and once the successor waits on `server.upgrade_sock`, hands it the listeners as
//! on SIGQUIT (the graceful upgrade: nothing refused, requests in flight finished). Started by
//! this process, the successor runs in the same systemd unit (the same control group), and
//! started with `-d` it writes the pid file before this process exits, so systemd follows it
//! as the unit's main process (`Type=forking` with `PIDFile=`). The package's `postinst` sends
//! the signal after an upgrade.
//!
//! Nothing changes if the successor cannot take over: its binary rejects the config (`-t`),
//! it exits, or it does not wait on the upgrade socket within [`WAIT_FOR_SUCCESSOR`] (the
//! environment variable `TOLLGATE_UPGRADE_WAIT_MS` gives another limit, for tests); the reason
//! is logged, a successor still running is stopped, and this process keeps serving.

use crate::ticker::Ticker;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set (to anything) for `-t`: as `--offline`, the files only. The upgrade in place sets it
/// for the new binary's check, since a binary from before `--offline` would refuse the flag.
pub const OFFLINE_CHECK_ENV: &str = "TOLLGATE_OFFLINE_CHECK";

/// How long the successor may take to load its config and wait on the upgrade socket.
pub const WAIT_FOR_SUCCESSOR: Duration = Duration::from_secs(30);

/// [`WAIT_FOR_SUCCESSOR`], or `TOLLGATE_UPGRADE_WAIT_MS` (milliseconds) when set and valid.
pub fn wait_for_successor(env: Option<&str>) -> Duration {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(WAIT_FOR_SUCCESSOR, Duration::from_millis)
}

/// Raise the returned flag on SIGUSR2 (whose default action would end the process).
pub fn install_sigusr2() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let raised = Arc::clone(&flag);
    // SAFETY: the action only stores to an atomic, which is async-signal-safe.
    unsafe {
        signal_hook_registry::register(libc::SIGUSR2, move || {
            raised.store(true, Ordering::SeqCst)
        })?;
    }
    Ok(flag)
}

/// How to start the successor: the same binary path, config and daemon flag as this process.
#[derive(Debug, Clone)]
pub struct Successor {
    /// The path this process was started from (absolute), not `/proc/self/exe`, which names
    /// the replaced file once a package upgrade has put a new one in its place.
    pub exe: PathBuf,
    /// The config file (absolute).
    pub conf: PathBuf,
    pub daemon: bool,
    /// Where this process sends its listeners (its `server.upgrade_sock`).
    pub upgrade_sock: PathBuf,
    /// How long the successor may take to wait on the socket.
    pub wait: Duration,
}

impl Successor {
    /// The binary this process runs as, as a path that a package upgrade replaces: argv[0]
    /// when it names a path (made absolute), otherwise the executable's own path.
    pub fn this_binary() -> PathBuf {
        let argv0 = std::env::args_os().next().map(PathBuf::from);
        match argv0 {
            Some(p) if p.components().count() > 1 => std::path::absolute(&p).unwrap_or(p),
            _ => std::env::current_exe().unwrap_or_else(|_| PathBuf::from("tollgate")),
        }
    }

    /// Check the config with the new binary, start it with `-u` and wait until it waits on the
    /// upgrade socket; returns its pid. On error nothing is left running.
    pub fn start(&self) -> Result<u32, String> {
        let exe = self.exe.display();
        let check = Command::new(&self.exe)
            .arg("-t")
            .arg("-c")
            .arg(&self.conf)
            // the files only: a Redis ACL to fix must not stop an upgrade (as `-t --offline`,
            // which a binary older than that flag would refuse; the variable it ignores)
            .env(OFFLINE_CHECK_ENV, "1")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {exe}: {e}"))?;
        if !check.status.success() {
            let errors = String::from_utf8_lossy(&check.stderr);
            return Err(format!(
                "{exe} -t rejects {}: {}",
                self.conf.display(),
                errors.trim()
            ));
        }
        // the socket file of an earlier upgrade would look like a waiting successor
        match std::fs::remove_file(&self.upgrade_sock) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "cannot remove {}: {e}",
                    self.upgrade_sock.display()
                ))
            }
            _ => {}
        }
        let mut cmd = Command::new(&self.exe);
        cmd.arg("-u");
        if self.daemon {
            cmd.arg("-d");
        }
        let mut child = cmd
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {exe}: {e}"))?;
        let pid = child.id();
        let waiting = wait_for(&self.upgrade_sock, &mut child, self.wait);
        if let Err(why) = waiting {
            let _ = child.kill();
            let _ = child.wait();
            return Err(why);
        }
        // reaped when it exits (with -d, at once: its own child goes on as the daemon)
        let _ = std::thread::Builder::new()
            .name("successor".into())
            .spawn(move || child.wait());
        Ok(pid)
    }
}

/// Until `sock` exists (the successor bound it and waits for the listeners), the successor
/// exits, or `limit` passes.
fn wait_for(sock: &Path, child: &mut std::process::Child, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if sock.exists() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the new process exited ({status}) before taking the listeners"
            ));
        }
        if start.elapsed() > limit {
            return Err(format!(
                "the new process did not wait on {} within {limit:?}",
                sock.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub struct Upgrader {
    pub successor: Successor,
    pub flag: Arc<AtomicBool>,
}

#[async_trait]
impl BackgroundService for Upgrader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = Ticker::every(Duration::from_millis(50));
        while ticker.tick(&mut shutdown).await {
            if !self.flag.swap(false, Ordering::SeqCst) {
                continue;
            }
            let successor = self.successor.clone();
            log::info!(
                "upgrade: SIGUSR2: starting {} -u -c {}",
                successor.exe.display(),
                successor.conf.display()
            );
            match tokio::task::spawn_blocking(move || successor.start()).await {
                Ok(Ok(pid)) => {
                    log::info!("upgrade: pid {pid} waits for the listeners; handing them over");
                    // Pingora's own graceful upgrade: send the listeners, stop accepting,
                    // finish what is in flight, exit
                    // SAFETY: kill(2) on this process's own pid with a signal it handles.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGQUIT);
                    }
                    return;
                }
                Ok(Err(why)) => {
                    log::error!("upgrade: {why}; this process keeps serving");
                }
                Err(e) => log::error!("upgrade: {e}; this process keeps serving"),
            }
        }
    }
}
