//! The fleet record of one tier of one counter: what this instance admitted in the current
//! window and the previous one, what Redis confirmed and leased (`Ledger`), and the counts a
//! record leaves behind when it must make room (`Orphan`). Plain data: the accounting on it is
//! `ledger`'s, the windows `algorithm`'s.

use std::sync::atomic::{AtomicU32, Ordering};

static NEXT_GEN: AtomicU32 = AtomicU32::new(1);

/// A fresh incarnation number for a window record (unique within the process).
pub fn next_gen() -> u32 {
    NEXT_GEN.fetch_add(1, Ordering::Relaxed)
}

/// What this instance admitted in one window, and what of it Redis confirmed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Record {
    /// Incarnation of the window's record; part of this instance's name in Redis.
    pub gen: u32,
    /// Requests admitted here in the window.
    pub used: u64,
    /// Of `used`, what Redis has confirmed.
    pub sent: u64,
    /// Of `used`, what was reported as plain increments (the script hears of the rest).
    pub direct: u64,
    /// The record asks for leases (it left the direct zone, or never could be direct).
    pub leased: bool,
}

impl Record {
    /// Counts not yet confirmed by Redis.
    pub fn unsent(&self) -> u64 {
        self.used - self.sent.min(self.used)
    }

    /// The record as an orphan of the window starting at `window_start_ms`, if Redis has not
    /// confirmed all of it.
    fn orphan(&self, window_start_ms: u64) -> Option<Orphan> {
        (self.used > self.sent).then_some(Orphan {
            window_start_ms,
            gen: self.gen,
            used: self.used,
            sent: self.sent,
            direct: self.direct,
            leased: self.leased,
        })
    }
}

/// The fleet accounting of one tier: the current window's record and the previous one's, and
/// what the fleet said of them at the last answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ledger {
    /// The current window's record (the window is the tier state's).
    pub current: Record,
    /// The previous window's record (starting at `previous_start_ms`), until Redis has
    /// confirmed all of it.
    pub previous: Record,
    pub previous_start_ms: u64,
    /// The lease: `used` may grow to this in the window.
    pub ceiling: u64,
    /// `used` when the lease was granted (to see when half of it is gone).
    pub lease_from: u64,
    /// The fleet's total for the window at the last answer (`sent` included).
    pub base: u64,
    /// Requests that wanted this tier (admitted or not) since the last drain.
    pub demand: u64,
    /// Units held since the last drain because the lease was used (they wait for the next
    /// round's answer), in thousandths: the first part of the next ask (`Ledger::need`). A rule
    /// charging late counts the share of its units its last answers were charged.
    pub need_milli: u64,
    /// This record wants to be in the next round, early or not (a request waits, a shadow rule
    /// counted past the lease, half of the lease is used).
    pub asking: bool,
    /// When this record was last drained (ms; 0: never): demand over the time since is the
    /// rate that sizes the next ask.
    pub drained_ms: u64,
    /// The most Redis would let this instance hold unused, at the last answer (0: no answer
    /// yet in this window).
    pub fair: u64,
    /// What no instance held at the last answer.
    pub room: u64,
    /// At the last answer: what the others had admitted or held (sliding windows use it to
    /// keep the cap of each moment).
    pub others: u64,
    /// Sliding windows: the previous window's count as Redis bounds it (leases included).
    pub prev_bound: u64,
    /// The previous window's record still holds a lease (to give back).
    pub prev_held: bool,
    /// Token buckets: the lease carried over from the previous window's record, which Redis
    /// moves to this record at its first answer (0 once moved).
    pub adopt: u64,
    /// How many answers in a row granted less than the requests that waited here (0: the
    /// last did). After one, the requests wait once more (the others report what they
    /// admitted of what they hold, and the next answer is the fleet's truth); after two, the
    /// fleet is full as far as Redis knows, and requests past the lease are refused.
    pub short: u8,
    /// Its Redis Cluster node did not answer the last round while others did: the counter
    /// falls back to `on_failure` alone until its node answers (kept across windows).
    pub unreachable: bool,
    /// Late charges: of the last answers (halved past 1024), how many were charged anything:
    /// a request held for a lease asks for that share of its units (`note_hold`), not all of
    /// them (a rule counting one answer in ten would otherwise hold ten times the quota it
    /// uses). Kept across windows.
    pub answers: u16,
    pub charged_answers: u16,
    /// A plain increment was confirmed: the key exists and has its expiry.
    pub keyed: bool,
    /// When the round that Redis last answered for this record was drained (ms; 0: none):
    /// what it has not confirmed was admitted after that.
    pub settled_ms: u64,
    /// Units granted to the window (`POST /api/tenants/{id}/grant`, or a reset: a grant of
    /// what was counted): windows and logs admit that much past the threshold; a bucket's
    /// grant is tokens, given back once (its time moved). With Redis: the fleet's grant as
    /// the last answer (or the admin's own call) said; grants only grow within a window.
    pub grant: u64,
    /// The count refused a request since the last answer (the window is full as far as
    /// Redis said), or a part refused as full skipped a periodic round (`filled`): when an
    /// operator resets or grants a window somewhere in the fleet, the record asks at the next
    /// round if it has not asked since, so that it hears of it.
    pub count_full: bool,
    /// The last answer granted requests that waited here (`Ask::need`) and none has been
    /// drained since: the next drain keeps that lease whole, whatever it asks, so that the
    /// requests it was granted for (woken by the answer, maybe decided after the next round
    /// has begun) find it still there.
    pub granted_waiting: bool,
    /// The window is new and Redis has not answered for it yet: requests held in the old
    /// window (whose asks were of that window) ask again when they are held again.
    pub rehold: bool,
    /// A fixed window's: requests wanted this tier since the last periodic round, so its
    /// lease is in use and a quiet moment after an early round does not give it back (set by
    /// `ledger::note_demand` for fixed windows only).
    pub busy: bool,
    /// The last answer was to an ask for a part of a filling fixed window (`Ask::rest`): the
    /// lease asks again once used up, not at half.
    pub split: bool,
    /// The last answer lowered this record's part of a filling window (Redis re-split it to
    /// its share): Redis keeps what it held before for it until its next call, so even used
    /// up it is told when others wait on the window (`Sizing::waited_on`), and calls.
    pub resplit: bool,
    /// When this record last called because others waited on its window (ms; 0: never):
    /// unless that call's answer re-split its part, it does not call again for the others'
    /// waits within `ledger::HEARD_GAP_MS` (each of a waiter's asks, 100 to 200 ms apart, made
    /// every holder call, with nothing to give: its part no more than its share).
    pub heard_ms: u64,
    /// How many answers in a row left this record's part of a filling window used up, waiting
    /// on the others (`short` 1) with the fleet past half its cap: it asks again after
    /// `ledger::WAIT_GAPS_MS` of that many, not at every early round.
    pub waits: u8,
    /// The last answer counted the window's whole cap (threshold and grant) admitted
    /// (`ledger::apply`): nothing can come back but an operator's grant or reset, so a part of
    /// a filling window refused as full asks again only then (`count_full`) or when its window
    /// ends, not at every periodic round.
    pub filled: bool,
    /// The last answer left nobody any room (the window's whole cap, threshold and grant,
    /// counted or leased) and counted at least 0.9 x of it admitted, or leased this record the
    /// rest of it: once the lease is used, a fixed window is full as two answers that could
    /// not grant would say (a refusal there is not one under 0.9 x threshold; past the
    /// count and this lease, only the others' leases they give back, or an operator's grant,
    /// make room), so a request past it is refused at once (`ledger::note_full`), without the
    /// asks that would learn it.
    pub capped: bool,
    /// Units that wanted this tier since the last periodic round, and in the interval before
    /// it (saturating); `steady`: the lesser of the last two complete intervals, the demand an
    /// interval that sizes a fixed window's forecast until its end (`ledger::Sizing`). Kept
    /// across windows.
    pub interval_demand: u32,
    pub last_interval: u32,
    pub steady: u32,
}

/// Counts of a window record that could not stay in its counter (the counter was evicted,
/// moved to another plan, or rolled twice before Redis answered): kept aside until sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Orphan {
    pub window_start_ms: u64,
    pub gen: u32,
    pub used: u64,
    /// What Redis confirmed, and of it what went as plain increments.
    pub sent: u64,
    pub direct: u64,
    /// The record leased (its counts go through the script), or was direct.
    pub leased: bool,
}

impl Ledger {
    /// The units held for the next ask (`need_milli`, rounded up).
    pub fn need(&self) -> u64 {
        self.need_milli.div_ceil(1000)
    }

    /// Counts not yet confirmed by Redis (both windows).
    pub fn unsent(&self) -> u64 {
        self.current.unsent() + self.previous.unsent()
    }

    /// Move to a new window starting at `start_ms`; the old current window becomes the
    /// previous record. Returns the record that had to be dropped with counts still unsent.
    /// `bucket`: a token bucket, whose state outlives windows (what Redis last said of it
    /// still holds).
    /// `adjacent`: the old window is the one just before the new (otherwise nothing this
    /// record knows bounds the previous window: the first answer will).
    pub fn roll(&mut self, old_start_ms: u64, bucket: bool, adjacent: bool) -> Option<Orphan> {
        let orphan = self.previous.orphan(self.previous_start_ms);
        let cur = self.current;
        // a bucket's tokens outlive the window: what is left of the lease goes on (Redis moves
        // it at the next round, the old record giving it back and the new one adopting it)
        let carried = if bucket {
            self.ceiling.saturating_sub(cur.used)
        } else {
            0
        };
        *self = Ledger {
            current: Record {
                gen: next_gen(),
                leased: bucket,
                ..Record::default()
            },
            previous: cur,
            previous_start_ms: old_start_ms,
            prev_held: cur.leased && self.ceiling > cur.used,
            // what the fleet can have admitted in the window that ends: what the others had
            // admitted or held at the last answer, and all this instance admitted
            // (less what was granted to it: a grant weighs on the next window no more than on
            // its own)
            prev_bound: if adjacent {
                self.others
                    .saturating_add(cur.used)
                    .max(self.base.saturating_add(cur.unsent()))
                    .saturating_sub(self.grant)
            } else {
                0
            },
            fair: if bucket { self.fair } else { 0 },
            room: if bucket { self.room } else { 0 },
            ceiling: carried,
            adopt: carried,
            // (a bucket's tokens admitted in the new window while Redis is out of reach count
            // from the window's start, as the old record's would have)
            settled_ms: if bucket { self.settled_ms } else { 0 },
            unreachable: self.unreachable,
            answers: self.answers,
            charged_answers: self.charged_answers,
            // requests held in the old window wait on in this one: what they did not ask for
            // yet is asked for here, and those an answer could not grant ask again
            need_milli: self.need_milli,
            asking: self.need_milli > 0,
            interval_demand: self.interval_demand,
            last_interval: self.last_interval,
            steady: self.steady,
            ..Ledger::default()
        };
        orphan
    }

    /// Take the previous record and the current one out as orphans (the counter is being
    /// replaced), leaving nothing unsent behind.
    pub fn orphans(&self, window_start_ms: u64) -> [Option<Orphan>; 2] {
        [
            self.previous.orphan(self.previous_start_ms),
            self.current.orphan(window_start_ms),
        ]
    }
}
