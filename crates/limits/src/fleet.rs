//! What the decisions know about the fleet: whether a sync is configured, whether Redis
//! answered the last round (or has not been asked yet), how many instances share the limits,
//! and which `on_failure` applies. Read with atomics only; written by the sync service.
//!
//! Waking the sync service and the requests waiting for a round is the runtime's business:
//! here a round is only asked for (`ask_round` says whether the ask is new) and noted when it
//! ended (`note_round`); the gateway's `Fleet` pairs this state with its notifications.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// What the shared limits do while Redis does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Each instance may use its share of what was left at the last answer.
    #[default]
    LocalShare,
    /// Each instance alone decides, with the whole threshold.
    Local,
    /// Count, but enforce nothing.
    Allow,
    /// Answer 503 where a rule applies.
    Deny,
}

impl std::fmt::Display for OnFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnFailure::LocalShare => "local_share",
            OnFailure::Local => "local",
            OnFailure::Allow => "allow",
            OnFailure::Deny => "deny",
        })
    }
}

/// How the limiter treats shared limits right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetMode {
    /// No sync (or `on_failure: local` while Redis is down): this instance alone decides.
    Alone,
    /// Redis answers: an instance admits what Redis leased to it (or, far from the limit, what
    /// its direct records may),
    /// `instances` sharing.
    Leased { instances: u64 },
    /// Redis is down and `on_failure: local_share`: each instance may use its share of what
    /// was left at the last answer, `instances` sharing.
    Shared { instances: u64 },
    /// Redis is down and `on_failure: allow`: count, but enforce nothing.
    AllowAll,
    /// Redis is down and `on_failure: deny`: answer 503 where a rule applies.
    DenyAll,
}

impl FleetMode {
    /// The mode as the ledger takes it: (leased by instances, shared by instances).
    pub fn ledger_modes(self) -> (Option<u64>, Option<u64>) {
        match self {
            FleetMode::Leased { instances } => (Some(instances), None),
            FleetMode::Shared { instances } => (None, Some(instances)),
            _ => (None, None),
        }
    }
}

/// Whether Redis has answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// No round has ended yet (start-up).
    Unknown,
    Up,
    Down,
}

pub struct FleetState {
    configured: AtomicBool,
    /// 0 unknown, 1 up, 2 down
    link: AtomicU8,
    instances: AtomicU64,
    /// How many times the heartbeats counted the instances (at most 2: see `instances_assumed`).
    counted: AtomicU8,
    on_failure: AtomicU8,
    /// A counter wants a round now (lease used up or nearly so), and none has begun since.
    wanted: AtomicBool,
    /// Of those, a request waits on a record that has no answer in its window yet (its first
    /// ask): the round starts at once, not an early round's gap after the last (`at_once`), and
    /// whether the sync service has been told since (`ask_round`).
    at_once: AtomicBool,
    at_once_told: AtomicBool,
    /// When the last round ended (ms since the epoch, 0: none yet), and how long it took (us).
    last_round_end_ms: AtomicU64,
    last_round_us: AtomicU64,
    /// How long a request may wait for the fleet (`Verdict::Hold`), in ms.
    hold_ms: AtomicU64,
    /// The fleet's `sync_interval`, in ms.
    interval_ms: AtomicU64,
    /// Records far from the limit may report plain increments (one Redis server; a Redis
    /// Cluster leases everything: a node that does not answer may still apply what it got,
    /// which only idempotent reports survive).
    plain: AtomicBool,
}

impl FleetState {
    /// No sync configured yet; a held request waits at most `hold_ms`.
    pub fn new(hold_ms: u64) -> FleetState {
        FleetState {
            configured: AtomicBool::new(false),
            link: AtomicU8::new(0),
            instances: AtomicU64::new(1),
            counted: AtomicU8::new(0),
            on_failure: AtomicU8::new(0),
            wanted: AtomicBool::new(false),
            at_once: AtomicBool::new(false),
            at_once_told: AtomicBool::new(true),
            last_round_end_ms: AtomicU64::new(0),
            last_round_us: AtomicU64::new(0),
            hold_ms: AtomicU64::new(hold_ms),
            interval_ms: AtomicU64::new(1000),
            plain: AtomicBool::new(true),
        }
    }

    pub fn configure(&self, on: bool, on_failure: OnFailure) {
        self.on_failure.store(code(on_failure), Ordering::Relaxed);
        self.configured.store(on, Ordering::Relaxed);
    }

    /// How long a held request may wait.
    pub fn set_hold(&self, ms: u64) {
        self.hold_ms.store(ms, Ordering::Relaxed);
    }

    pub fn hold_ms(&self) -> u64 {
        self.hold_ms.load(Ordering::Relaxed)
    }

    /// The fleet's `sync_interval`: what a record's demand an interval is counted over.
    pub fn set_interval(&self, ms: u64) {
        self.interval_ms.store(ms.max(1), Ordering::Relaxed);
    }

    pub fn interval_ms(&self) -> u64 {
        self.interval_ms.load(Ordering::Relaxed)
    }

    /// Whether records far from the limit may report plain increments (see `plain`).
    pub fn set_plain_increments(&self, on: bool) {
        self.plain.store(on, Ordering::Relaxed);
    }

    pub fn plain_increments(&self) -> bool {
        self.plain.load(Ordering::Relaxed)
    }

    pub fn is_configured(&self) -> bool {
        self.configured.load(Ordering::Relaxed)
    }

    pub fn link(&self) -> Link {
        decode_link(self.link.load(Ordering::Relaxed))
    }

    pub fn is_connected(&self) -> bool {
        self.link() == Link::Up
    }

    /// Record the outcome of a sync round; returns the previous link state when it changed.
    pub fn set_connected(&self, up: bool) -> Option<Link> {
        let new = if up { 1 } else { 2 };
        let old = self.link.swap(new, Ordering::Relaxed);
        (old != new).then_some(decode_link(old))
    }

    /// Forget the link state (the sync was switched off or its endpoint changed).
    pub fn reset_link(&self) {
        self.link.store(0, Ordering::Relaxed);
    }

    pub fn set_instances(&self, n: u64) {
        self.instances.store(n.max(1), Ordering::Relaxed);
        let _ = self
            .counted
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < 2).then_some(c + 1)
            });
    }

    /// The instances what is kept for the others' direct records must assume: those the
    /// heartbeats counted once they have counted twice, and at least
    /// [`COLD_FLEET`](crate::ledger::COLD_FLEET) before (instances that start together each
    /// see only themselves at first; by the second count each has written its heartbeat).
    pub fn instances_assumed(&self) -> u64 {
        let n = self.instances();
        if self.counted.load(Ordering::Relaxed) >= 2 {
            n
        } else {
            n.max(crate::ledger::COLD_FLEET)
        }
    }

    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed)
    }

    /// A sync round ended at `now_ms` (ms since the epoch) after `took_us`.
    pub fn note_round(&self, now_ms: u64, took_us: u64) {
        self.last_round_end_ms.store(now_ms, Ordering::Relaxed);
        self.last_round_us.store(took_us, Ordering::Relaxed);
    }

    /// When the last round ended (ms since the epoch) and how long it took (us), if one did.
    pub fn last_round(&self) -> Option<(u64, u64)> {
        let end = self.last_round_end_ms.load(Ordering::Relaxed);
        (end > 0).then(|| (end, self.last_round_us.load(Ordering::Relaxed)))
    }

    /// Ask for a round now. Returns whether the ask is new, or newly one to start at once
    /// (`ask_at_once`): the sync service is to be woken.
    pub fn ask_round(&self) -> bool {
        let new = !self.wanted.swap(true, Ordering::Relaxed);
        !self.at_once_told.swap(true, Ordering::Relaxed) || new
    }

    /// The round asked for next is to start at once: a request waits on a record's first ask
    /// in its window, which waits on nothing but Redis (a round trip), where other asks wait
    /// on the others' rounds too and come an early round's gap apart. Followed by
    /// `ask_round`.
    pub fn ask_at_once(&self) {
        if !self.at_once.swap(true, Ordering::Relaxed) {
            self.at_once_told.store(false, Ordering::Relaxed);
        }
    }

    /// Whether a round was asked for (and not yet begun).
    pub fn round_requested(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Whether the round asked for is to start at once (`ask_at_once`).
    pub fn round_at_once(&self) -> bool {
        self.at_once.load(Ordering::Relaxed)
    }

    /// Whether a round was asked for since the last call (clears the request, and its being
    /// at once).
    pub fn take_round_request(&self) -> bool {
        self.at_once.store(false, Ordering::Relaxed);
        self.wanted.swap(false, Ordering::Relaxed)
    }

    pub fn mode(&self) -> FleetMode {
        if !self.is_configured() {
            return FleetMode::Alone;
        }
        let instances = self.instances();
        match self.link() {
            // the first round has not ended (at most `timeout` after start-up): what is
            // leased (nothing yet), as when a lease has run out
            Link::Up | Link::Unknown => return FleetMode::Leased { instances },
            Link::Down => {}
        }
        // Redis did not answer the last round (or the first): on_failure applies
        self.failure_mode(instances)
    }

    /// What `on_failure` makes of the shared limits.
    fn failure_mode(&self, instances: u64) -> FleetMode {
        match self.on_failure() {
            OnFailure::LocalShare => FleetMode::Shared { instances },
            OnFailure::Local => FleetMode::Alone,
            OnFailure::Allow => FleetMode::AllowAll,
            OnFailure::Deny => FleetMode::DenyAll,
        }
    }

    /// The mode for a request held as long as it may: when the last round did not answer
    /// (or has not ended: the first), `on_failure` applies; when it did, the leased mode (the
    /// limiter then refuses what no lease covers).
    pub fn mode_without_answer(&self) -> FleetMode {
        match self.mode() {
            FleetMode::Leased { .. } if self.link() == Link::Up => self.mode(),
            FleetMode::Leased { instances } => self.failure_mode(instances),
            other => other,
        }
    }

    pub fn on_failure(&self) -> OnFailure {
        decode(self.on_failure.load(Ordering::Relaxed))
    }

    /// The mode of a counter whose Redis Cluster node did not answer while the rest of Redis
    /// did: `local_share` divides what was left among the instances, `local` gives each the
    /// whole threshold. `allow` acts as `local` and `deny` as `local_share` here: answering
    /// every request (or none) for the tenants of one shard is left to a whole outage.
    pub fn unreachable_mode(&self) -> FleetMode {
        let instances = self.instances();
        match self.on_failure() {
            OnFailure::Local | OnFailure::Allow => FleetMode::Alone,
            OnFailure::LocalShare | OnFailure::Deny => FleetMode::Shared { instances },
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

fn decode(c: u8) -> OnFailure {
    match c {
        0 => OnFailure::LocalShare,
        1 => OnFailure::Local,
        2 => OnFailure::Allow,
        _ => OnFailure::Deny,
    }
}

fn decode_link(c: u8) -> Link {
    match c {
        0 => Link::Unknown,
        1 => Link::Up,
        _ => Link::Down,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/fleet.md "Far from the limit": what is kept for other instances' direct records
    /// assumes at least 10 instances until the heartbeats have counted twice.
    #[test]
    fn the_instances_assumed_are_at_least_ten_until_counted_twice() {
        let f = FleetState::new(1000);
        assert_eq!(f.instances_assumed(), crate::ledger::COLD_FLEET);
        f.set_instances(3);
        assert_eq!((f.instances(), f.instances_assumed()), (3, 10));
        f.set_instances(3);
        assert_eq!(f.instances_assumed(), 3);
        f.set_instances(12);
        f.set_instances(2);
        assert_eq!(f.instances_assumed(), 2, "counted twice stays counted");
    }

    #[test]
    fn a_counter_whose_cluster_node_is_down_falls_back_by_on_failure() {
        let f = FleetState::new(1000);
        f.set_instances(3);
        for (on_failure, mode) in [
            (OnFailure::LocalShare, FleetMode::Shared { instances: 3 }),
            (OnFailure::Local, FleetMode::Alone),
            // a partial outage: allow acts as local, deny as local_share
            (OnFailure::Allow, FleetMode::Alone),
            (OnFailure::Deny, FleetMode::Shared { instances: 3 }),
        ] {
            f.configure(true, on_failure);
            assert_eq!(f.unreachable_mode(), mode, "{on_failure}");
        }
    }

    #[test]
    fn a_round_asked_for_twice_wakes_once() {
        let f = FleetState::new(1000);
        assert!(f.ask_round());
        assert!(!f.ask_round());
        assert!(f.take_round_request());
        assert!(f.ask_round());
    }

    #[test]
    fn a_round_asked_for_at_once_wakes_again_once() {
        let f = FleetState::new(1000);
        assert!(f.ask_round());
        assert!(!f.round_at_once());
        // a first ask waits while the round is in its gap: the sync service is woken again
        f.ask_at_once();
        assert!(f.ask_round(), "woken again, to start at once");
        assert!(f.round_at_once());
        f.ask_at_once();
        assert!(!f.ask_round(), "told already");
        assert!(f.take_round_request());
        assert!(
            !f.round_at_once(),
            "the round began: the next waits its gap"
        );
        assert!(f.ask_round());
    }
}
