//! Priority shaping (a pool's `max_in_flight` and `queue`): at most N requests in flight to the
//! pool; the others wait in a queue ordered by their tenant's plan `priority` (higher first,
//! first come first served within one), up to `queue.max` of them and `queue.timeout` each. A
//! full queue or a timeout is the caller's 503.
//!
//! A request that gets in holds a `GateSlot`; dropping it (the request is done, however it
//! ended) hands the slot straight to the first waiter, or frees it. Gates live outside config
//! snapshots, by pool name, so a reload keeps the requests in flight and the queue; it only
//! changes the limits.

use crate::config::model::Shaping;
use parking_lot::Mutex;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Why a request was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue was full.
    Full,
    /// It waited `queue.timeout`.
    Timeout,
}

struct Waiter {
    priority: i64,
    /// Arrival order: earlier first within a priority.
    seq: u64,
    tx: oneshot::Sender<()>,
}

impl PartialEq for Waiter {
    fn eq(&self, o: &Self) -> bool {
        (self.priority, self.seq) == (o.priority, o.seq)
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Waiter {
    /// The heap's greatest is served first: the highest priority, then the earliest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.priority
            .cmp(&o.priority)
            .then_with(|| o.seq.cmp(&self.seq))
    }
}

struct State {
    limits: Shaping,
    active: usize,
    seq: u64,
    waiters: BinaryHeap<Waiter>,
}

/// One pool's gate.
pub struct Gate {
    state: Mutex<State>,
}

impl Gate {
    pub fn new(limits: Shaping) -> Gate {
        Gate {
            state: Mutex::new(State {
                limits,
                active: 0,
                seq: 0,
                waiters: BinaryHeap::new(),
            }),
        }
    }

    /// New limits (a reload); a raised `max_in_flight` lets waiters in at once.
    pub fn set_limits(&self, limits: Shaping) {
        let mut st = self.state.lock();
        st.limits = limits;
        while st.active < st.limits.max_in_flight {
            match st.waiters.pop() {
                Some(w) => {
                    if w.tx.send(()).is_ok() {
                        st.active += 1;
                    }
                }
                None => break,
            }
        }
    }

    /// Requests waiting now (those that gave up not counted).
    pub fn depth(&self) -> usize {
        let mut st = self.state.lock();
        st.waiters.retain(|w| !w.tx.is_closed());
        st.waiters.len()
    }

    /// Requests in flight now.
    pub fn active(&self) -> usize {
        self.state.lock().active
    }

    /// Get in, waiting in the queue at `priority` if the pool is full. Returns the slot and
    /// whether the request waited.
    pub async fn enter(self: &Arc<Self>, priority: i64) -> Result<(GateSlot, bool), Refused> {
        let (rx, timeout) = {
            let mut st = self.state.lock();
            if st.active < st.limits.max_in_flight {
                st.active += 1;
                return Ok((self.slot(), false));
            }
            // waiters that gave up (their request went away) hold no place
            st.waiters.retain(|w| !w.tx.is_closed());
            if st.waiters.len() >= st.limits.queue_max {
                return Err(Refused::Full);
            }
            let (tx, rx) = oneshot::channel();
            st.seq += 1;
            let seq = st.seq;
            st.waiters.push(Waiter { priority, seq, tx });
            (rx, st.limits.queue_timeout)
        };
        // a request that goes away while it waits (its client left) gives back a slot handed
        // to it meanwhile
        let mut waiting = Waiting {
            rx: Some(rx),
            gate: self,
        };
        let Some(rx) = waiting.rx.as_mut() else {
            return Err(Refused::Timeout);
        };
        let got = match tokio::time::timeout(timeout, &mut *rx).await {
            Ok(Ok(())) => Ok((self.slot(), true)),
            Ok(Err(_)) => Err(Refused::Timeout),
            Err(_) => {
                // a slot handed over just as the time ran out is taken, not lost
                rx.close();
                match rx.try_recv() {
                    Ok(()) => Ok((self.slot(), true)),
                    Err(_) => Err(Refused::Timeout),
                }
            }
        };
        waiting.rx = None;
        got
    }

    fn slot(self: &Arc<Self>) -> GateSlot {
        GateSlot {
            gate: Arc::clone(self),
        }
    }

    /// A request is done: its slot goes to the first waiter still there, or is freed.
    fn leave(&self) {
        let mut st = self.state.lock();
        if st.active <= st.limits.max_in_flight {
            while let Some(w) = st.waiters.pop() {
                if w.tx.send(()).is_ok() {
                    return;
                }
            }
        }
        st.active = st.active.saturating_sub(1);
    }
}

/// A request in flight to a shaped pool.
pub struct GateSlot {
    gate: Arc<Gate>,
}

/// A place in the queue, while its request waits.
struct Waiting<'a> {
    rx: Option<oneshot::Receiver<()>>,
    gate: &'a Arc<Gate>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.gate.leave();
            }
        }
    }
}

impl Drop for GateSlot {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

/// The gates by pool name, outliving snapshots.
#[derive(Default)]
pub struct Gates {
    by_pool: Mutex<std::collections::HashMap<String, Arc<Gate>>>,
}

impl Gates {
    /// The gate of pool `name` with these limits (the existing one, its limits updated).
    pub fn get(&self, name: &str, limits: Shaping) -> Arc<Gate> {
        let mut m = self.by_pool.lock();
        m.retain(|_, g| Arc::strong_count(g) > 1 || g.active() > 0);
        match m.get(name) {
            Some(g) => {
                g.set_limits(limits);
                Arc::clone(g)
            }
            None => {
                let g = Arc::new(Gate::new(limits));
                m.insert(name.to_string(), Arc::clone(&g));
                g
            }
        }
    }
}

/// How long a refused request is told to wait (`Retry-After`).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, queue: usize, timeout_ms: u64) -> Shaping {
        Shaping {
            max_in_flight: max,
            queue_max: queue,
            queue_timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn higher_priority_first_then_first_come() {
        let gate = Arc::new(Gate::new(limits(1, 10, 10_000)));
        let (first, waited) = gate.enter(0).await.expect("free");
        assert!(!waited);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, prio) in [("a", 0), ("b", 0), ("vip", 10), ("c", 0)] {
            let (g, o) = (Arc::clone(&gate), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let (slot, waited) = g.enter(prio).await.expect("queued");
                assert!(waited);
                o.lock().push(name);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(slot);
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.depth(), 4);
        drop(first);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(*order.lock(), vec!["vip", "a", "b", "c"]);
        assert_eq!(gate.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_and_a_timeout_refuse() {
        let gate = Arc::new(Gate::new(limits(1, 1, 500)));
        let (_held, _) = gate.enter(0).await.expect("free");
        let g = Arc::clone(&gate);
        let waiting = tokio::spawn(async move { g.enter(0).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(gate.enter(5).await.err(), Some(Refused::Full));
        assert_eq!(waiting.await.expect("task"), Err(Refused::Timeout));
        assert_eq!(gate.depth(), 0, "the one that gave up holds no place");
    }
}
