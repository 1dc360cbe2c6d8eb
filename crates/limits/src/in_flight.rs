//! Requests in flight per partition (`concurrency: N` on a rule, as nginx `limit_conn`), on this
//! instance. A request that fits takes a `Slot`; dropping the slot gives it back, so a slot is
//! freed however the request ends: answered, client gone, upstream failure or timeout (the
//! proxy keeps the slots in the request's context, dropped when the request is done).
//!
//! Memory: a partition has an entry only while it has requests in flight, so the tables hold at
//! most as many entries as there are requests in flight. The tables live outside the config
//! snapshot, by rule id and `per`, so a reload does not forget the requests in flight.

use crate::partition::PartitionBy;
use ahash::RandomState;
use hashbrown::HashMap;
use parking_lot::Mutex;
use std::sync::Arc;

const SHARDS: usize = 16;

/// Partition key -> requests in flight.
type Counts = HashMap<Box<[u8]>, u32, RandomState>;

/// The in-flight counts of one rule's partitions.
pub struct InFlight {
    hasher: RandomState,
    shards: Box<[Mutex<Counts>]>,
}

impl Default for InFlight {
    fn default() -> Self {
        let hasher = RandomState::new();
        InFlight {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(hasher.clone())))
                .collect(),
            hasher,
        }
    }
}

impl InFlight {
    fn shard(&self, key: &[u8]) -> &Mutex<Counts> {
        let h = self.hasher.hash_one(key);
        &self.shards[(h as usize) % SHARDS]
    }

    /// Take a slot for `key` if fewer than `max` are taken.
    pub fn try_acquire(self: &Arc<Self>, key: &[u8], max: u32) -> Option<Slot> {
        let mut m = self.shard(key).lock();
        match m.get_mut(key) {
            Some(n) if *n >= max => return None,
            Some(n) => *n += 1,
            None => {
                m.insert(key.into(), 1);
            }
        }
        Some(Slot {
            table: Arc::clone(self),
            key: key.into(),
        })
    }

    /// Requests of `key` in flight now.
    pub fn count(&self, key: &[u8]) -> u32 {
        self.shard(key).lock().get(key).copied().unwrap_or(0)
    }

    /// Partitions with requests in flight.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request in flight; dropping it frees the slot.
pub struct Slot {
    table: Arc<InFlight>,
    key: Box<[u8]>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.table.shard(&self.key).lock();
        if let Some(n) = m.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// The tables by rule identity (id and `per`), outliving snapshots.
#[derive(Default)]
pub struct InFlightRegistry {
    tables: Mutex<std::collections::HashMap<(String, PartitionBy), Arc<InFlight>>>,
}

impl InFlightRegistry {
    /// The table of the rule `id` counting `per`.
    pub fn get_or_create(&self, id: &str, per: &PartitionBy) -> Arc<InFlight> {
        let mut t = self.tables.lock();
        // forget the tables of rules gone, once their last request has ended
        t.retain(|_, table| Arc::strong_count(table) > 1 || !table.is_empty());
        Arc::clone(t.entry((id.to_string(), per.clone())).or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_freed_on_drop() {
        let t = Arc::new(InFlight::default());
        let a = t.try_acquire(b"acme", 2).expect("first");
        let b = t.try_acquire(b"acme", 2).expect("second");
        assert!(t.try_acquire(b"acme", 2).is_none(), "third of two");
        assert!(t.try_acquire(b"globex", 2).is_some(), "another partition");
        drop(a);
        let c = t.try_acquire(b"acme", 2).expect("freed");
        drop((b, c));
        assert_eq!(t.count(b"acme"), 0);
        assert!(t.is_empty(), "no entry without requests in flight");
    }
}
