//! The concurrency limits of a snapshot (`concurrency: N` on a rule): a request takes a slot
//! in every one that applies to it, or none (the in-flight tables are the limits core's,
//! `tollgate_limits::in_flight`).

use crate::config::model::Rule;
use prometheus::IntCounter;
use smallvec::SmallVec;
use std::sync::Arc;
use tollgate_limits::in_flight::{InFlight, Slot};
use tollgate_limits::partition::PartitionValue;

/// One rule's concurrency limit in a snapshot.
pub struct ConcurrencyRule {
    pub rule: Arc<Rule>,
    pub max: u32,
    pub table: Arc<InFlight>,
    /// `tollgate_ratelimit_decisions_total{rule,decision="denied",tier="concurrency"}`
    pub denied: IntCounter,
}

/// What a request refused for its requests in flight is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Index into the snapshot's concurrency rules.
    pub rule: usize,
    pub status: u16,
    pub max: u32,
}

/// Take a slot in every concurrency limit that applies to the request, or none of them: the
/// first full one refuses. `partition` gives the request's partition for a rule (`None`: the
/// rule does not count it).
pub fn acquire<'a>(
    rules: &[ConcurrencyRule],
    applies: impl Fn(&Rule) -> Option<PartitionValue<'a>>,
) -> Result<SmallVec<[Slot; 1]>, Refusal> {
    let mut slots = SmallVec::new();
    for (i, c) in rules.iter().enumerate() {
        let Some(part) = applies(&c.rule) else {
            continue;
        };
        match c.table.try_acquire(&part.key_buf(), c.max) {
            Some(s) => slots.push(s),
            None => {
                c.denied.inc();
                // the slots taken so far go back as `slots` drops
                return Err(Refusal {
                    rule: i,
                    status: c.rule.status,
                    max: c.max,
                });
            }
        }
    }
    Ok(slots)
}
