//! Who is being limited now: per rule, the partitions (tenants, addresses) with the most
//! denials and the highest use of their limit in the current window, for `/api/top`. A fixed
//! number of entries per rule whatever the number of partitions: when it is full, a new
//! partition replaces the smallest entry and starts from its count (the Space-Saving
//! algorithm), so a heavy hitter is never missed and memory stays bounded. The request path
//! touches it only on a denial, or when a partition has used half of its limit or more.

use parking_lot::Mutex;

/// Entries kept per rule.
pub const CAPACITY: usize = 64;

/// Use of the limit (per mille) from which a partition is recorded.
pub const USAGE_FLOOR: u32 = 500;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The partition's store key (as the rule's counters hold it).
    pub key: Box<[u8]>,
    /// The window the counts belong to (its start, ms since the epoch).
    pub window_start_ms: u64,
    pub denied: u64,
    /// Of `denied`, what the entry inherited when it replaced another (Space-Saving): the
    /// partition was denied at least `denied - inherited` times.
    pub inherited: u64,
    /// The highest use of the limit seen in the window, per mille of the threshold.
    pub usage_permille: u32,
}

#[derive(Default)]
pub struct TopPartitions {
    entries: Mutex<Vec<Entry>>,
}

impl TopPartitions {
    /// A request of partition `key` was denied in the window starting at `window_start_ms`.
    pub fn denied(&self, key: &[u8], window_start_ms: u64, usage_permille: u32) {
        self.record(key, window_start_ms, 1, usage_permille);
    }

    /// Partition `key` has used `usage_permille` of its limit (>= `USAGE_FLOOR`).
    pub fn usage(&self, key: &[u8], window_start_ms: u64, usage_permille: u32) {
        self.record(key, window_start_ms, 0, usage_permille);
    }

    fn record(&self, key: &[u8], window_start_ms: u64, denied: u64, usage_permille: u32) {
        let mut entries = self.entries.lock();
        // entries of an older window go first
        entries.retain(|e| e.window_start_ms >= window_start_ms);
        if let Some(e) = entries.iter_mut().find(|e| &*e.key == key) {
            e.window_start_ms = window_start_ms;
            e.denied += denied;
            e.usage_permille = e.usage_permille.max(usage_permille);
            return;
        }
        if entries.len() < CAPACITY {
            entries.push(Entry {
                key: key.into(),
                window_start_ms,
                denied,
                inherited: 0,
                usage_permille,
            });
            return;
        }
        // full: replace the smallest, which the newcomer inherits (Space-Saving)
        if let Some(min) = entries
            .iter_mut()
            .min_by_key(|e| (e.denied, e.usage_permille))
        {
            if denied == 0 && usage_permille <= min.usage_permille && min.denied > 0 {
                return;
            }
            *min = Entry {
                key: key.into(),
                window_start_ms,
                denied: min.denied + denied,
                inherited: min.denied,
                usage_permille: usage_permille.max(min.usage_permille),
            };
        }
    }

    /// The `n` entries with the most denials (`by_denied`) or the highest use, in windows that
    /// started at `since_ms` or later.
    pub fn top(&self, n: usize, by_denied: bool, since_ms: u64) -> Vec<Entry> {
        let mut list: Vec<Entry> = self
            .entries
            .lock()
            .iter()
            .filter(|e| e.window_start_ms >= since_ms)
            .cloned()
            .collect();
        if by_denied {
            list.retain(|e| e.denied > 0);
            list.sort_by(|a, b| {
                b.denied
                    .cmp(&a.denied)
                    .then(b.usage_permille.cmp(&a.usage_permille))
            });
        } else {
            list.sort_by(|a, b| {
                b.usage_permille
                    .cmp(&a.usage_permille)
                    .then(b.denied.cmp(&a.denied))
            });
        }
        list.truncate(n);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_heavy_hitters_in_bounded_memory() {
        let top = TopPartitions::default();
        // a million distinct partitions denied once each, and two heavy hitters denied more
        // often than 1/CAPACITY of all denials (what Space-Saving guarantees to keep)
        for i in 0..1_000_000u32 {
            top.denied(&i.to_be_bytes(), 0, 1000);
            if i % 10 == 0 {
                top.denied(b"heavy", 0, 1000);
            }
            if i % 20 == 0 {
                top.denied(b"second", 0, 1000);
            }
        }
        assert!(top.entries.lock().len() <= CAPACITY);
        let t = top.top(2, true, 0);
        assert_eq!(&*t[0].key, b"heavy");
        assert_eq!(&*t[1].key, b"second");
        assert!(
            t[0].denied >= 100_000,
            "never undercounted: {}",
            t[0].denied
        );
        assert!(
            t[0].denied - t[0].inherited <= 100_000,
            "the sure part is exact or lower"
        );
    }

    #[test]
    fn a_new_window_starts_over() {
        let top = TopPartitions::default();
        top.denied(b"a", 0, 1000);
        top.usage(b"b", 0, 900);
        top.usage(b"c", 10_000, 600);
        assert_eq!(top.top(10, true, 10_000), vec![]);
        let usage = top.top(10, false, 10_000);
        assert_eq!(usage.len(), 1);
        assert_eq!(&*usage[0].key, b"c");
    }
}
