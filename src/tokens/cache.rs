//! Verified tokens, kept until they expire so that a client reusing its token costs a hash
//! look-up instead of a signature check. Bounded: at most `MAX_ENTRIES` tokens (a shard that
//! fills up drops its expired tokens, then all of them). Keyed by a 64-bit hash of the whole
//! token, and the token itself compared in full: two tokens never share an entry.

use super::verified::Verified;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The most tokens kept (about 1 KiB each).
pub const MAX_ENTRIES: usize = 16 * 1024;
const SHARDS: usize = 16;

struct Entry {
    token: Box<str>,
    verified: Arc<Verified>,
}

pub struct TokenCache {
    hasher: ahash::RandomState,
    shards: [Mutex<HashMap<u64, Entry>>; SHARDS],
}

impl Default for TokenCache {
    fn default() -> Self {
        TokenCache {
            hasher: ahash::RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }
}

impl TokenCache {
    fn shard(&self, hash: u64) -> &Mutex<HashMap<u64, Entry>> {
        &self.shards[(hash >> 60) as usize % SHARDS]
    }

    /// The verified claims of this token, if it was verified and has not expired.
    pub fn get(&self, token: &str, now_s: u64) -> Option<Arc<Verified>> {
        let hash = self.hasher.hash_one(token);
        let shard = self.shard(hash).lock();
        let e = shard.get(&hash)?;
        (*e.token == *token && e.verified.until_s > now_s).then(|| e.verified.clone())
    }

    pub fn insert(&self, token: &str, verified: Arc<Verified>, now_s: u64) {
        let hash = self.hasher.hash_one(token);
        let mut shard = self.shard(hash).lock();
        if shard.len() >= MAX_ENTRIES / SHARDS && !shard.contains_key(&hash) {
            shard.retain(|_, e| e.verified.until_s > now_s);
            if shard.len() >= MAX_ENTRIES / SHARDS {
                shard.clear();
            }
        }
        shard.insert(
            hash,
            Entry {
                token: token.into(),
                verified,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(until_s: u64) -> Arc<Verified> {
        Arc::new(Verified {
            tenant: b"acme"[..].into(),
            plan: None,
            forward: Vec::new(),
            until_s,
        })
    }

    #[test]
    fn kept_until_expiry_and_bounded() {
        let c = TokenCache::default();
        c.insert("a.b.c", verified(100), 10);
        assert!(c.get("a.b.c", 99).is_some());
        assert!(c.get("a.b.c", 100).is_none(), "expired");
        assert!(c.get("a.b.d", 50).is_none());
        for i in 0..(3 * MAX_ENTRIES) {
            c.insert(&format!("t{i}"), verified(1000), 10);
        }
        assert!(c.len() <= MAX_ENTRIES, "{}", c.len());
    }
}
