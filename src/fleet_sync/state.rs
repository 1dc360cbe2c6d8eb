//! What the request path knows about the fleet: whether a sync is configured, whether Redis
//! answered the last round, and how many instances share the limits. Read with atomics only;
//! written by the sync service.

use crate::config::model::OnFailure;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use tokio::sync::Notify;

/// How the limiter treats shared limits right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetMode {
    /// No sync (or `on_failure: local` while Redis is down): this instance alone decides.
    Alone,
    /// Each instance may use its share of what is left, `instances` sharing.
    Shared { instances: u64 },
    /// Redis is down and `on_failure: allow`: count, but enforce nothing.
    AllowAll,
    /// Redis is down and `on_failure: deny`: answer 503 where a rule applies.
    DenyAll,
}

pub struct FleetState {
    configured: AtomicBool,
    connected: AtomicBool,
    instances: AtomicU64,
    on_failure: AtomicU8,
    /// Woken by the limiter when an instance has used its share and wants a sync now.
    pub wake: Notify,
}

impl Default for FleetState {
    fn default() -> Self {
        FleetState {
            configured: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            instances: AtomicU64::new(1),
            on_failure: AtomicU8::new(0),
            wake: Notify::new(),
        }
    }
}

fn code(f: OnFailure) -> u8 {
    match f {
        OnFailure::LocalShare => 0,
        OnFailure::Local => 1,
        OnFailure::Allow => 2,
        OnFailure::Deny => 3,
    }
}

impl FleetState {
    pub fn configure(&self, on: bool, on_failure: OnFailure) {
        self.on_failure.store(code(on_failure), Ordering::Relaxed);
        self.configured.store(on, Ordering::Relaxed);
    }

    pub fn is_configured(&self) -> bool {
        self.configured.load(Ordering::Relaxed)
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Record the outcome of a sync round; returns true when the state changed.
    pub fn set_connected(&self, up: bool) -> bool {
        self.connected.swap(up, Ordering::Relaxed) != up
    }

    pub fn set_instances(&self, n: u64) {
        self.instances.store(n.max(1), Ordering::Relaxed);
    }

    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed)
    }

    pub fn mode(&self) -> FleetMode {
        if !self.is_configured() {
            return FleetMode::Alone;
        }
        let shared = FleetMode::Shared {
            instances: self.instances(),
        };
        if self.is_connected() {
            return shared;
        }
        match self.on_failure.load(Ordering::Relaxed) {
            0 => shared,
            1 => FleetMode::Alone,
            2 => FleetMode::AllowAll,
            _ => FleetMode::DenyAll,
        }
    }
}
