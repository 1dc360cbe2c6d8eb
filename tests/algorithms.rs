//! The README's table of the five algorithms, measured: the pure algorithm functions (and the
//! sliding log's `Log`) under a fake clock, for a limit of 100 per 10 s.
//! - the edge: a client quiet until the last 0.1 s of a window, then sending a request every
//!   millisecond for two periods; the most admitted in any span of one period, and the most
//!   that leave (a leaky bucket's requests leave at their turns);
//! - a burst: 200 requests in the same millisecond on a fresh partition: admitted at once,
//!   queued (admitted, waiting their turns), refused;
//! - memory: the bytes one tier of one partition takes, at most.
//!
//! `the_readmes_algorithm_table_is_measured` prints the table and holds the README to it.

use std::collections::VecDeque;
use tollgate::config::model::Algorithm;
use tollgate::limits::algorithm::{self, Quota, TierState};
use tollgate::limits::clock::NANOS_PER_MS;
use tollgate::limits::sliding_log::Log;

const T: u64 = 100;
const P_MS: u64 = 10_000;
/// A whole window from the epoch.
const T0_MS: u64 = 180_000 * P_MS;

const ALL: [(&str, Algorithm); 5] = [
    ("fixed_window", Algorithm::FixedWindow),
    ("sliding_window", Algorithm::SlidingWindow),
    ("token_bucket", Algorithm::TokenBucket),
    ("leaky_bucket", Algorithm::LeakyBucket),
    ("sliding_log", Algorithm::SlidingLog),
];

fn quota(a: Algorithm) -> Quota {
    Quota {
        threshold: T,
        period_ms: P_MS,
        // a leaky bucket's queue: the default, its threshold
        queue: (a == Algorithm::LeakyBucket).then_some(T),
        ..Quota::default()
    }
}

/// One partition's tier: its state, and a log for the sliding log.
struct Partition {
    a: Algorithm,
    q: Quota,
    state: TierState,
    log: Option<Log>,
}

impl Partition {
    fn new(a: Algorithm) -> Partition {
        Partition {
            a,
            q: quota(a),
            state: TierState::default(),
            log: (a == Algorithm::SlidingLog).then(Log::default),
        }
    }

    /// A request at `ms`: None if refused, else when it leaves (its turn, for a leaky bucket).
    fn send(&mut self, ms: u64) -> Option<u64> {
        let now = ms * NANOS_PER_MS;
        algorithm::roll(&mut self.state, &self.q, self.a, now);
        let allowed = match &mut self.log {
            Some(log) => {
                log.prune(&self.q, now);
                log.evaluate(&self.q, now, 1).allowed
            }
            None => algorithm::evaluate(&self.state, &self.q, self.a, now, 1).allowed,
        };
        if !allowed {
            return None;
        }
        let wait = if self.a == Algorithm::LeakyBucket {
            algorithm::queue_wait_ns(&self.state, now) / NANOS_PER_MS
        } else {
            0
        };
        algorithm::commit(&mut self.state, &self.q, self.a, now, 1);
        if let Some(log) = &mut self.log {
            log.commit(&self.q, now, 1);
        }
        Some(ms + wait)
    }
}

/// The most instants of `at` (sorted) in any span of one period.
fn most_in_a_period(at: &[u64]) -> usize {
    let mut span: VecDeque<u64> = VecDeque::new();
    let mut most = 0;
    for &t in at {
        span.push_back(t);
        while span.front().is_some_and(|&f| t - f >= P_MS) {
            span.pop_front();
        }
        most = most.max(span.len());
    }
    most
}

struct Row {
    name: &'static str,
    /// The edge: most admitted in one period, most leaving in one period.
    admitted: usize,
    leaving: usize,
    /// A burst of 200 at once: admitted at once, queued, refused.
    at_once: usize,
    queued: usize,
    refused: usize,
    /// Bytes of one tier of one partition, at most.
    bytes: usize,
}

fn measure(name: &'static str, a: Algorithm) -> Row {
    // the edge
    let mut p = Partition::new(a);
    let mut admitted = Vec::new();
    let mut leaving = Vec::new();
    for ms in (T0_MS + P_MS - 100)..(T0_MS + 3 * P_MS - 100) {
        if let Some(leaves) = p.send(ms) {
            admitted.push(ms);
            leaving.push(leaves);
        }
    }
    leaving.sort_unstable();
    // a burst
    let mut p = Partition::new(a);
    let (mut at_once, mut queued, mut refused) = (0, 0, 0);
    for _ in 0..2 * T {
        match p.send(T0_MS + 5) {
            Some(leaves) if leaves == T0_MS + 5 => at_once += 1,
            Some(_) => queued += 1,
            None => refused += 1,
        }
    }
    let state = std::mem::size_of::<TierState>();
    let bytes = match a {
        // the instants of a full log, and its deque
        Algorithm::SlidingLog => state + std::mem::size_of::<Log>() + 8 * T as usize,
        _ => state,
    };
    Row {
        name,
        admitted: most_in_a_period(&admitted),
        leaving: most_in_a_period(&leaving),
        at_once,
        queued,
        refused,
        bytes,
    }
}

fn table() -> String {
    let mut out = String::from(
        "| `algorithm` | most admitted in one period at a window edge | most leaving in one period | a burst of 200: at once / queued / refused | bytes per partition and tier |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for (name, a) in ALL {
        let r = measure(name, a);
        let bytes = if a == Algorithm::SlidingLog {
            format!(
                "{} + 8 per unit in the span ({} at a threshold of {T})",
                r.bytes - 8 * T as usize,
                r.bytes
            )
        } else {
            r.bytes.to_string()
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} / {} / {} | {bytes} |\n",
            r.name, r.admitted, r.leaving, r.at_once, r.queued, r.refused
        ));
    }
    out
}

#[test]
fn the_readmes_algorithm_table_is_measured() {
    let t = table();
    println!("{t}");
    // what the README says of each algorithm, row by row
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    for row in t.lines() {
        assert!(
            readme.contains(row),
            "README.md lacks the measured row:\n{row}\n(the table, measured:\n{t})"
        );
    }
    // and the bounds the table shows: only the sliding log never admits more than the
    // threshold in a period; a leaky bucket's requests leave at its rate
    let rows: Vec<Row> = ALL.iter().map(|&(n, a)| measure(n, a)).collect();
    assert_eq!(rows[4].admitted, T as usize, "sliding_log: exact");
    assert!(
        rows[0].admitted >= 2 * T as usize - 1,
        "fixed_window: twice at the edge"
    );
    assert!(
        rows[3].leaving <= T as usize + 1,
        "leaky_bucket: its outflow"
    );
}
