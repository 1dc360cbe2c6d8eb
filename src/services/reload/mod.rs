//! SIGHUP reload (contract section 7). The handler is installed before the server starts (the
//! default action of SIGHUP would kill the process, and pingora handles only SIGQUIT, SIGTERM
//! and SIGINT); it only raises a flag, which survives pingora's fork in daemon mode. A
//! background service sees the flag, reads and validates the file and its includes in full, off
//! the request path, and swaps the snapshot: requests in flight finish under the old one. A
//! storm of signals coalesces into one reload at a time. What changed is logged (`diff`).

pub mod diff;
pub mod watch;

use crate::config;
use crate::config::Config;
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

/// The outcome of the last reload, for `/api/status` and `/readyz`.
#[derive(Default)]
pub struct ReloadStatus(parking_lot::Mutex<Option<LastReload>>);

#[derive(Debug, Clone, serde::Serialize)]
pub struct LastReload {
    /// Seconds since the epoch.
    pub at: u64,
    pub ok: bool,
    /// The errors, one `FILE:LINE:COL: message` per line, when the reload failed.
    pub error: Option<String>,
}

impl ReloadStatus {
    pub fn record(&self, error: Option<String>) {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        *self.0.lock() = Some(LastReload {
            at,
            ok: error.is_none(),
            error,
        });
    }

    pub fn last(&self) -> Option<LastReload> {
        self.0.lock().clone()
    }
}

pub struct Reloader {
    pub status: Arc<ReloadStatus>,
    pub path: PathBuf,
    pub shared: SharedSnapshot,
    pub runtime: Runtime,
    pub metrics: Arc<Metrics>,
    pub flag: Arc<AtomicBool>,
    /// `server.watch_config`: the files watched, and what they held when last loaded.
    pub watch: parking_lot::Mutex<watch::ConfigWatch>,
}

impl Reloader {
    /// The running config's files: its own and its includes.
    fn files(&self) -> (bool, Vec<PathBuf>) {
        let snap = self.shared.load();
        let cfg = &snap.config;
        let files = std::iter::once(self.path.clone())
            .chain(cfg.includes.iter().cloned())
            .collect();
        (cfg.server.watch_config, files)
    }

    /// Watch the running config's files if it says `watch_config` (it may have turned it on
    /// or off), as they are now: after every reload.
    fn follow_files(&self) {
        let (on, files) = self.files();
        self.watch.lock().follow(on, &files);
    }

    /// At start-up, before any service runs: what the files hold, as the config was loaded
    /// from them (the reloader's task, which may first run after the first requests, compares
    /// them then: an edit in between is seen).
    pub fn remember_files(&self) {
        let (_, files) = self.files();
        self.watch.lock().remember(&files);
    }

    /// Reload now; returns whether the new config is running.
    pub fn reload(&self) -> bool {
        let old = self.shared.load_full();
        let fail = |why: &str, detail: String| {
            self.metrics.reloads.with_label_values(&["error"]).inc();
            log::error!("reload: {why}; the running configuration stays");
            self.status.record(Some(detail));
            false
        };
        let cfg = match config::load(&self.path) {
            Ok(c) => c,
            Err(errors) => {
                for e in &errors.0 {
                    log::error!("reload: {e}");
                }
                return fail("invalid configuration", errors.to_string());
            }
        };
        for w in &cfg.warnings {
            log::warn!("reload: {w}");
        }
        warn_restart_needed(&old.config, &cfg);
        let snapshot = match Snapshot::build(cfg, &self.runtime) {
            Ok(s) => s,
            Err(e) => {
                let why = format!("cannot build upstream pools: {e}");
                return fail(&why, format!("{}:1:1: {why}", self.path.display()));
            }
        };
        self.shared.store(Arc::new(snapshot));
        let new = self.shared.load();
        self.forget_series(&old.config, &new.config);
        self.status.record(None);
        self.metrics.reloads.with_label_values(&["ok"]).inc();
        let changes = crate::services::reload::diff::changes(&old.config, &new.config);
        log::info!(
            "reload: configuration {} reloaded{}",
            self.path.display(),
            if changes.is_empty() {
                " (no rule or pool changed)"
            } else {
                ""
            }
        );
        for line in changes {
            log::info!("reload: {line}");
        }
        true
    }

    /// The metric series of the rules, routes and routes' pools the new config no longer has go
    /// with them.
    fn forget_series(&self, old: &Config, new: &Config) {
        let kept: std::collections::HashSet<String> =
            new.rules.iter().map(|r| r.id.clone()).collect();
        let routes_kept: std::collections::HashSet<String> =
            new.routes.iter().map(|r| r.id.clone()).collect();
        // the series of rules the new config no longer has go with them
        for gone in old.rules.iter().filter(|r| !kept.contains(&r.id)) {
            for d in crate::limits::decision_metrics::DECISIONS {
                for t in crate::limits::decision_metrics::tier_labels(gone) {
                    let _ = self.metrics.decisions.remove_label_values(&[
                        gone.id.as_str(),
                        d,
                        t.as_str(),
                    ]);
                }
            }
        }
        // and so do those of removed routes
        for gone in old.routes.iter().filter(|r| !routes_kept.contains(&r.id)) {
            let id = gone.id.as_str();
            let _ = self.metrics.request_duration.remove_label_values(&[id]);
            for code in 100..600u16 {
                if let Ok(status) = http::StatusCode::from_u16(code) {
                    let _ = self
                        .metrics
                        .requests
                        .remove_label_values(&[id, status.as_str()]);
                }
            }
        }
        // and the pools a route no longer sends to
        let kept = pool_pairs(new);
        for (route, pool) in pool_pairs(old).difference(&kept) {
            let _ = self
                .metrics
                .pool_requests
                .remove_label_values(&[route.as_str(), pool.as_str()]);
        }
    }
}

/// Each (route, pool) of `tollgate_upstream_requests_total` a config has.
fn pool_pairs(cfg: &Config) -> std::collections::HashSet<(String, String)> {
    let name = |p: usize| cfg.upstreams.get(p).map_or("", |u| u.name.as_str());
    let mut pairs = std::collections::HashSet::new();
    for r in &cfg.routes {
        pairs.insert((r.id.clone(), name(r.upstream).to_string()));
        for e in r.split.iter().flat_map(|s| &s.entries) {
            pairs.insert((r.id.clone(), name(e.pool).to_string()));
        }
    }
    pairs
}

/// Changes a reload cannot apply (the listeners, their limits, threads; tracing): warned of,
/// the running ones stay.
fn warn_restart_needed(old: &Config, new: &Config) {
    let (a, b) = (&old.server, &new.server);
    if a.listen != b.listen
        || a.listen_tls != b.listen_tls
        || a.h2c != b.h2c
        || a.admin != b.admin
        || a.threads != b.threads
        || a.max_connections != b.max_connections
        || a.max_connections_per_ip != b.max_connections_per_ip
        || a.log_json != b.log_json
    {
        log::warn!(
            "reload: changes to server.listen (addresses or tls on/off), server.h2c, server.admin, server.threads, server.max_connections, server.max_connections_per_ip or server.log_format need a restart or a graceful upgrade (tollgate -u); the running listeners, their limits and threads stay (certificates are reloaded)"
        );
    }
    if old.tracing != new.tracing {
        log::warn!(
            "reload: a changed tracing section needs a restart or a graceful upgrade (tollgate -u); spans go on as the running process started"
        );
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (on, files) = self.files();
        self.watch.lock().follow_from_start(on, &files);
        let mut ticker = Ticker::every(Duration::from_millis(50));
        while ticker.tick(&mut shutdown).await {
            let signalled = self.flag.swap(false, Ordering::SeqCst);
            let changed = if signalled {
                None
            } else {
                self.watch.lock().changed()
            };
            if let Some(file) = &changed {
                log::info!("reload: {} changed (watch_config)", file.display());
            }
            if signalled || changed.is_some() {
                let (_, files) = self.files();
                self.watch.lock().before_reload(&files);
                self.reload();
                self.follow_files();
            }
        }
    }
}
