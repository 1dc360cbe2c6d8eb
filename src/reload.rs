//! SIGHUP reload (contract section 7). The handler is installed before the server starts (the
//! default action of SIGHUP would kill the process, and pingora handles only SIGQUIT, SIGTERM
//! and SIGINT); it only raises a flag, which survives pingora's fork in daemon mode. A
//! background service sees the flag, reads and validates the file and its includes in full, off
//! the request path, and swaps the snapshot: requests in flight finish under the old one. A
//! storm of signals coalesces into one reload at a time.

use crate::config;
use crate::metrics::Metrics;
use crate::snapshot::{Runtime, SharedSnapshot, Snapshot};
use crate::ticker::Ticker;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Install the SIGHUP handler; the returned flag is raised by every SIGHUP.
pub fn install_sighup() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let raised = Arc::clone(&flag);
    // SAFETY: the action only stores to an atomic, which is async-signal-safe.
    unsafe {
        signal_hook_registry::register(libc::SIGHUP, move || raised.store(true, Ordering::SeqCst))?;
    }
    Ok(flag)
}

pub struct Reloader {
    pub path: PathBuf,
    pub shared: SharedSnapshot,
    pub runtime: Runtime,
    pub metrics: Arc<Metrics>,
    pub flag: Arc<AtomicBool>,
}

impl Reloader {
    /// Reload now; returns whether the new config is running.
    pub fn reload(&self) -> bool {
        let old = self.shared.load_full();
        let fail = |why: &str| {
            self.metrics.reloads.with_label_values(&["error"]).inc();
            log::error!("reload: {why}; the running configuration stays");
            false
        };
        let cfg = match config::load(&self.path) {
            Ok(c) => c,
            Err(errors) => {
                for e in &errors.0 {
                    log::error!("reload: {e}");
                }
                return fail("invalid configuration");
            }
        };
        for w in &cfg.warnings {
            log::warn!("reload: {w}");
        }
        let (a, b) = (&old.config.server, &cfg.server);
        if a.listen != b.listen
            || a.listen_tls != b.listen_tls
            || a.h2c != b.h2c
            || a.admin != b.admin
            || a.threads != b.threads
        {
            log::warn!(
                "reload: changes to server.listen (addresses or tls on/off), server.h2c, server.admin or server.threads need a restart or a graceful upgrade (tollgate -u); the running listeners and threads stay (certificates are reloaded)"
            );
        }
        let snapshot = match Snapshot::build(cfg, &self.runtime) {
            Ok(s) => s,
            Err(e) => return fail(&format!("cannot build upstream pools: {e}")),
        };
        self.shared.store(Arc::new(snapshot));
        self.metrics.reloads.with_label_values(&["ok"]).inc();
        log::info!("reload: configuration {} reloaded", self.path.display());
        true
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = Ticker::every(Duration::from_millis(50));
        while ticker.tick(&mut shutdown).await {
            if self.flag.swap(false, Ordering::SeqCst) {
                self.reload();
            }
        }
    }
}
