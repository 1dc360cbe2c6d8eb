//! The fleet as the gateway runs it: the limits core's `FleetState` (what the decisions know
//! of Redis and the other instances, atomics only) with the runtime's side of it: waking the
//! sync service when a counter wants a round, waking the requests that wait for one, and the
//! error replies the admin listener shows.

use super::wall_clock::SystemClock;
use std::ops::Deref;
use std::sync::Arc;
use tokio::sync::Notify;
use tollgate_limits::clock::{Clock, NANOS_PER_MS};
pub use tollgate_limits::fleet::{FleetMode, FleetState, Link};

pub struct Fleet {
    /// Shared with the limiter of every snapshot.
    pub state: Arc<FleetState>,
    /// Woken by the limiter when a counter wants a round now (lease used up or nearly so).
    pub wake: Notify,
    /// Told when a sync round ends (requests held for the fleet or by `action: delay` wait
    /// for it).
    rounds: Notify,
    /// Redis answers with error replies (NOPERM, OOM, ...): their kind and text, until a
    /// periodic round has none. Written by the sync service, read by the admin listener only
    /// (the counters concerned know it each by itself, see `record::Ledger::unreachable`).
    reply_error: parking_lot::Mutex<Option<ReplyErrorState>>,
}

/// What `/readyz` and `/api/status` show of Redis's error replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyErrorState {
    /// `noperm`, `oom`, `readonly`, `wrongtype`, `noscript` or `other`.
    pub kind: &'static str,
    /// Redis's text, and what to do about it when known.
    pub message: String,
}

/// How long a request whose lease is used may wait for an answer: a round in flight may have
/// to end first (at most `timeout`), then the round that asks for it starts within an early
/// round's gap and ends within `timeout`.
pub fn hold_limit(timeout: std::time::Duration) -> u64 {
    2 * timeout.as_millis() as u64 + 2 * MIN_ROUND_GAP_MS
}

/// Rounds asked for early come at least this far apart (so at most 20 extra per second).
pub const MIN_ROUND_GAP_MS: u64 = 50;

impl Default for Fleet {
    fn default() -> Self {
        let hold = hold_limit(crate::config::defaults::DEFAULT_REDIS_TIMEOUT);
        Fleet {
            state: Arc::new(FleetState::new(hold)),
            wake: Notify::new(),
            rounds: Notify::new(),
            reply_error: parking_lot::Mutex::new(None),
        }
    }
}

impl Deref for Fleet {
    type Target = FleetState;
    fn deref(&self) -> &FleetState {
        &self.state
    }
}

impl Fleet {
    /// Forget the link state (the sync was switched off or its endpoint changed).
    pub fn reset_link(&self) {
        self.state.reset_link();
        *self.reply_error.lock() = None;
    }

    /// Redis answers with error replies (`Some`), or no longer does (`None`).
    pub fn set_reply_error(&self, e: Option<ReplyErrorState>) {
        *self.reply_error.lock() = e;
    }

    /// The error replies Redis answers with now, if any.
    pub fn reply_error(&self) -> Option<ReplyErrorState> {
        self.reply_error.lock().clone()
    }

    /// A sync round has ended after `took`: wake the requests waiting for one.
    pub fn round_ended(&self, took: std::time::Duration) {
        let now_ms = SystemClock.now_ns() / NANOS_PER_MS;
        self.state.note_round(now_ms, took.as_micros() as u64);
        self.rounds.notify_waiters();
    }

    /// Wait for the end of the next sync round.
    pub async fn next_round(&self) {
        self.rounds.notified().await
    }

    /// Ask for a round now (the sync service is woken once per ask).
    pub fn want_round(&self) {
        if self.state.ask_round() {
            self.wake.notify_one();
        }
    }
}
