//! Plain increments behind one endpoint, neither lost nor counted twice. An `INCRBY` is not
//! idempotent: a round that timed out may or may not have been applied, and a primary that
//! answered a round and died before its replica had it took the round with it. So a round's
//! plain increments go in one transaction (`MULTI` ... `EXEC`: applied, and passed on to
//! replicas, whole or not at all) with the round's mark: its number in this instance's sorted
//! set `<prefix>:rounds:<instance>` (scored by the time it was sent, trimmed to
//! [`MARK_KEEP_MS`]). Each round's increments are kept here (without I/O: the backend in
//! `single` sends and reads) until Redis answered it and [`RESYNC_SPAN_MS`] passed. After an
//! exchange that did not end with an answer (a timeout, a connection lost or refused: the
//! server may have been replaced or restarted), the next one first reads the marks: a kept
//! round whose mark Redis does not hold was not applied there, or was lost with a failed
//! primary, and its increments go again, with a new mark, in a transaction of their own
//! ([`Journal::repair`]); the others are counted. A server that holds none of the marks has lost
//! every count (a restart without persistence): the ledger's own check of totals brings
//! records back (`ledger::apply_count`), and nothing is sent again from here. A round is kept before anything is sent, so
//! that an exchange dropped anywhere on its way (a timeout) leaves it to the next check.

use super::round::CountUpdate;
use std::collections::{HashMap, VecDeque};

/// How long after Redis answered it a round may still be lost with a failed server: a replica
/// lags its primary by far less, even on a busy server. Plain increments' rounds are kept this
/// long, and after a failure the records Redis answered within it report their whole counts
/// again (`fleet_sync::Accounts::note_trouble`).
pub const RESYNC_SPAN_MS: u64 = 10_000;

/// How long Redis keeps a round's mark (and the set, after this instance's last round).
pub const MARK_KEEP_MS: u64 = 60_000;

/// The most increments kept for a check (about 100 bytes each): past it, the oldest rounds
/// are taken as applied without a check, as every round was before marks.
pub const MAX_KEPT: usize = 100_000;

/// A round's increments, kept until known applied.
#[derive(Debug, Clone)]
struct Kept {
    seq: u64,
    /// When it was sent (unix ms: its mark's score).
    sent_ms: u64,
    /// When Redis answered the round (unix ms); `None`: no answer yet.
    answered_ms: Option<u64>,
    counts: Vec<CountUpdate>,
}

/// What the backend does with a mark after the round that carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// The transaction ran: the increments and the mark are in Redis.
    Applied,
    /// Redis refused the transaction (a command refused when queued: OOM, READONLY, NOPERM):
    /// nothing of it was applied, and the updates are refused (the ledger sends them again).
    Refused,
    /// Redis ran the commands one by one (it refused `MULTI`, e.g. an ACL without `+multi`):
    /// the increments may be applied without their mark, so marks stop.
    Unmarked,
}

/// What a check found (`Journal::repair`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Redis holds every kept round.
    Nothing,
    /// These increments go again, in a round of this number.
    Again(u64, Vec<CountUpdate>),
    /// Redis holds none of the marks of rounds it answered: it lost its data; these kept
    /// rounds are dropped.
    Emptied { rounds: usize },
}

/// This instance's rounds of plain increments and their marks (one backend's; see the module).
#[derive(Debug)]
pub struct Journal {
    key: String,
    next_seq: u64,
    rounds: VecDeque<Kept>,
    /// The last exchange started and did not end with an answer: check before the next.
    unsettled: bool,
    increments: usize,
    /// Marks stopped (Redis refused `MULTI`, or the read of the marks).
    off: bool,
}

impl Journal {
    /// `key`: the set of this instance's marks.
    pub fn new(key: String) -> Journal {
        Self::numbered_from(key, 1)
    }

    /// Rounds numbered from `first`: a backend made again for the same instance (a reload
    /// that changed the `redis` section) starts past every number the one before it used
    /// (`single` starts at the time in µs), so that an old mark in the set never stands for a
    /// new round.
    pub fn numbered_from(key: String, first: u64) -> Journal {
        Journal {
            key,
            next_seq: first,
            rounds: VecDeque::new(),
            unsettled: false,
            increments: 0,
            off: false,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether marks stopped.
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// Marks stop (Redis refused them): nothing is kept or checked any more.
    pub fn turn_off(&mut self) {
        self.off = true;
        self.rounds.clear();
        self.increments = 0;
        self.unsettled = false;
    }

    /// Whether the next exchange reads the marks first: the last did not end with an answer
    /// and rounds are kept.
    pub fn wants_check(&self) -> bool {
        self.unsettled && !self.rounds.is_empty()
    }

    /// An exchange begins with these plain increments; their round's number, if they are
    /// marked (none when there are none, or marks stopped). Until [`Self::settled`], the
    /// exchange is unsettled: if it never ends (a timeout drops it anywhere on its way), the
    /// next one checks, this round included.
    pub fn begin(&mut self, counts: Vec<CountUpdate>, now_ms: u64) -> Option<u64> {
        self.unsettled = true;
        self.trim(now_ms);
        if counts.is_empty() || self.off {
            return None;
        }
        Some(self.keep(counts, now_ms))
    }

    fn keep(&mut self, counts: Vec<CountUpdate>, now_ms: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.increments += counts.len();
        self.rounds.push_back(Kept {
            seq,
            sent_ms: now_ms,
            answered_ms: None,
            counts,
        });
        seq
    }

    /// The last kept round Redis answered (its number and when it was sent), for a round to
    /// read back: a server that no longer holds it lost it (a failover under a connection
    /// that came back by itself, with no round failing), see [`Self::lost_sight`].
    pub fn probe(&self) -> Option<(u64, u64)> {
        self.rounds
            .iter()
            .rev()
            .find(|k| k.answered_ms.is_some())
            .map(|k| (k.seq, k.sent_ms))
    }

    /// Increments of a repair that Redis refused one by one (the ledger took them as sent
    /// long ago): kept again without a mark, so that the next check sends them again.
    pub fn requeue(&mut self, counts: Vec<CountUpdate>, now_ms: u64) {
        if counts.is_empty() || self.off {
            return;
        }
        self.keep(counts, now_ms);
        self.unsettled = true;
    }

    /// Redis did not hold the probed round (or refused a repair): the next exchange checks.
    pub fn lost_sight(&mut self) {
        self.unsettled = true;
    }

    /// Redis answered the round `seq` (a round of the exchange, or a repair), with what became
    /// of its mark, and the keys of its increments that Redis refused one by one (the ledger
    /// sends them again, so they are kept no more).
    pub fn answered(&mut self, seq: Option<u64>, marked: Marked, refused: &[&str], now_ms: u64) {
        let Some(seq) = seq else { return };
        match marked {
            Marked::Applied => {
                if let Some(k) = self.rounds.iter_mut().find(|k| k.seq == seq) {
                    let before = k.counts.len();
                    k.counts.retain(|c| !refused.contains(&c.key.as_str()));
                    self.increments -= before - k.counts.len();
                    k.answered_ms = Some(now_ms);
                }
            }
            Marked::Refused => self.forget(seq),
            Marked::Unmarked => self.turn_off(),
        }
    }

    /// The whole exchange was answered: no check before the next.
    pub fn settled(&mut self) {
        self.unsettled = false;
    }

    /// The round `seq` certainly did not reach Redis (the connection was refused): the ledger
    /// sends its increments again. The exchange stays unsettled (the server may have restarted).
    pub fn unapplied(&mut self, seq: Option<u64>) {
        if let Some(seq) = seq {
            self.forget(seq);
        }
    }

    fn forget(&mut self, seq: u64) {
        if let Some(i) = self.rounds.iter().position(|k| k.seq == seq) {
            if let Some(k) = self.rounds.remove(i) {
                self.increments -= k.counts.len();
            }
        }
    }

    /// The kept rounds' marks that Redis holds are `marks`: the others were not applied there
    /// (or were lost with a failed primary), except the round `current` (the exchange's own,
    /// not sent yet). Their increments whose keys have not expired (each instance computes a
    /// key's expiry alike) make one round, kept and numbered here, for the backend to send
    /// with its own mark. The rounds Redis holds count as answered now.
    ///
    /// A server that holds none of the marks of rounds it answered has lost its data (a
    /// restart without persistence): then nothing is sent again ([`Repair::Emptied`]). Such a
    /// server lost every count, not only the last rounds', and a record far from its limit
    /// sends its whole count again once its next increment shows a total below what it alone
    /// had reported (`ledger::apply_count`): the last rounds' increments sent here too would
    /// count twice.
    pub fn repair(&mut self, marks: &[u64], now_ms: u64, current: Option<u64>) -> Repair {
        let emptied = marks.is_empty()
            && self
                .rounds
                .iter()
                .any(|k| k.answered_ms.is_some() && Some(k.seq) != current);
        if emptied {
            let before = self.rounds.len();
            self.rounds.retain(|k| Some(k.seq) == current);
            self.increments = self.rounds.iter().map(|k| k.counts.len()).sum();
            return Repair::Emptied {
                rounds: before - self.rounds.len(),
            };
        }
        let mut again: Vec<CountUpdate> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut kept = VecDeque::with_capacity(self.rounds.len());
        for mut k in std::mem::take(&mut self.rounds) {
            if Some(k.seq) == current {
                kept.push_back(k);
                continue;
            }
            if marks.contains(&k.seq) {
                k.answered_ms.get_or_insert(now_ms);
                kept.push_back(k);
                continue;
            }
            self.increments -= k.counts.len();
            for c in k.counts.into_iter().filter(|c| c.expire_at_ms > now_ms) {
                match at.get(&c.key) {
                    Some(&i) => again[i].delta += c.delta,
                    None => {
                        at.insert(c.key.clone(), again.len());
                        // the key may be gone with the increment (a restart): its expiry again
                        again.push(CountUpdate { first: true, ..c });
                    }
                }
            }
        }
        self.rounds = kept;
        if again.is_empty() {
            return Repair::Nothing;
        }
        let seq = self.keep(again.clone(), now_ms);
        Repair::Again(seq, again)
    }

    /// Drop what needs no check any more: rounds answered more than the resync span ago, then
    /// the oldest past [`MAX_KEPT`] increments.
    fn trim(&mut self, now_ms: u64) {
        let span = RESYNC_SPAN_MS;
        while let Some(k) = self.rounds.front() {
            let old = k.answered_ms.is_some_and(|t| t + span < now_ms);
            if !old && self.increments <= MAX_KEPT {
                break;
            }
            if let Some(k) = self.rounds.pop_front() {
                self.increments -= k.counts.len();
            }
        }
    }

    /// The rounds kept and their increments (for tests and the log).
    pub fn kept(&self) -> (usize, usize) {
        (self.rounds.len(), self.increments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inc(key: &str, delta: u64, expire_at_ms: u64) -> CountUpdate {
        CountUpdate {
            key: key.into(),
            delta,
            first: false,
            expire_at_ms,
        }
    }

    #[test]
    fn an_answered_round_is_kept_for_the_resync_span_then_dropped() {
        let mut j = Journal::new("p:rounds:i".into());
        assert_eq!(j.begin(vec![], 0), None, "no increments, no mark");
        assert!(!j.wants_check(), "nothing kept");
        j.settled();
        let s = j.begin(vec![inc("a", 2, 99_000)], 1_000);
        assert_eq!(s, Some(1));
        assert!(j.wants_check(), "sent, no answer yet");
        j.answered(s, Marked::Applied, &[], 1_010);
        j.settled();
        assert!(!j.wants_check());
        assert_eq!(j.kept(), (1, 1));
        // within the span it stays; past it the next round drops it
        j.begin(vec![inc("a", 1, 99_000)], 11_000);
        assert_eq!(j.kept(), (2, 2));
        j.answered(Some(2), Marked::Applied, &[], 11_001);
        j.begin(vec![inc("b", 1, 99_000)], 11_011);
        assert_eq!(
            j.kept(),
            (2, 2),
            "round 1 answered at 1,010: dropped at 11,011"
        );
    }

    #[test]
    fn after_an_exchange_without_an_answer_the_rounds_redis_lacks_go_again_merged() {
        let mut j = Journal::new("k".into());
        let one = j.begin(vec![inc("a", 2, 50_000), inc("b", 1, 50_000)], 0);
        j.answered(one, Marked::Applied, &[], 5);
        j.settled();
        let two = j.begin(vec![inc("a", 3, 50_000), inc("old", 4, 100)], 10);
        // no answer (a timeout): unsettled
        assert!(j.wants_check());
        let three = j.begin(vec![inc("a", 5, 50_000)], 20);
        let four = j.begin(vec![inc("a", 7, 50_000)], 30);
        assert_eq!(
            (one, two, three, four),
            (Some(1), Some(2), Some(3), Some(4))
        );
        // Redis (a promoted replica) holds round 1 only: 2 and 3 go again, "old" has expired;
        // 4 is the exchange's own, not sent yet
        let Repair::Again(seq, again) = j.repair(&[1], 200, four) else {
            panic!("rounds to send again")
        };
        assert_eq!(seq, 5);
        assert_eq!(
            again,
            vec![CountUpdate {
                first: true,
                ..inc("a", 8, 50_000)
            }]
        );
        j.answered(Some(5), Marked::Applied, &[], 210);
        assert!(j.wants_check(), "until the exchange is answered");
        // dropped before its answer: the next check finds its round missing
        assert_eq!(
            j.repair(&[1, 5], 300, None),
            Repair::Again(
                6,
                vec![CountUpdate {
                    first: true,
                    ..inc("a", 7, 50_000)
                }]
            )
        );
        j.settled();
        assert!(!j.wants_check());
        assert_eq!(
            j.kept(),
            (3, 4),
            "round 1 (2), the repair, the second repair"
        );
        // a check that finds every round: nothing again
        let s = j.begin(vec![inc("c", 1, 50_000)], 300);
        assert_eq!(j.repair(&[1, 5, 6], 400, s), Repair::Nothing);
        // a server that holds none of the marks of answered rounds lost its data: nothing
        // again (the ledger's totals bring the counts back), the exchange's own round kept
        assert_eq!(j.repair(&[], 500, s), Repair::Emptied { rounds: 3 });
        assert_eq!(j.kept(), (1, 1));
    }

    #[test]
    fn refused_and_unapplied_increments_are_the_ledgers_to_send_again() {
        let mut j = Journal::new("k".into());
        let s = j.begin(vec![inc("a", 1, 9_000), inc("b", 1, 9_000)], 0);
        j.answered(s, Marked::Applied, &["b"], 1);
        assert_eq!(j.kept(), (1, 1), "b was refused alone");
        let s = j.begin(vec![inc("a", 1, 9_000)], 2);
        j.answered(s, Marked::Refused, &["a"], 3);
        assert_eq!(j.kept(), (1, 1), "the transaction was refused whole");
        let s = j.begin(vec![inc("a", 1, 9_000)], 4);
        j.unapplied(s);
        assert_eq!(j.kept(), (1, 1));
        assert!(
            j.wants_check(),
            "a refused connection: the server may have restarted"
        );
        // only round 1 is kept (2 and 3 are the ledger's), and Redis holds it
        assert_eq!(j.repair(&[1], 5, None), Repair::Nothing);
        // Redis refused MULTI: marks stop, nothing is kept
        let s = j.begin(vec![inc("a", 1, 9_000)], 6);
        j.answered(s, Marked::Unmarked, &[], 7);
        assert!(j.is_off());
        assert_eq!(j.begin(vec![inc("a", 1, 9_000)], 8), None);
        assert_eq!(j.kept(), (0, 0));
    }

    #[test]
    fn a_round_reads_back_the_last_answered_mark() {
        let mut j = Journal::new("k".into());
        assert_eq!(j.probe(), None);
        let a = j.begin(vec![inc("a", 1, 9_000)], 10);
        j.answered(a, Marked::Applied, &[], 11);
        let b = j.begin(vec![inc("a", 1, 9_000)], 20);
        assert_eq!(j.probe(), Some((1, 10)), "round 2 has no answer yet");
        j.answered(b, Marked::Applied, &[], 21);
        j.settled();
        assert_eq!(j.probe(), Some((2, 20)));
        j.lost_sight();
        assert!(j.wants_check());
        // a repair's increments Redis refused one by one: kept again, unmarked, for the next
        // check
        j.settled();
        j.requeue(vec![inc("b", 2, 9_000)], 30);
        assert!(j.wants_check());
        assert_eq!(
            j.repair(&[1, 2], 40, None),
            Repair::Again(
                4,
                vec![CountUpdate {
                    first: true,
                    ..inc("b", 2, 9_000)
                }]
            )
        );
    }

    #[test]
    fn past_the_most_kept_the_oldest_rounds_go_unchecked() {
        let mut j = Journal::new("k".into());
        let big: Vec<CountUpdate> = (0..MAX_KEPT / 2 + 1)
            .map(|i| inc(&i.to_string(), 1, 9_000))
            .collect();
        j.begin(big.clone(), 0);
        j.begin(big.clone(), 1);
        assert_eq!(j.kept().0, 2);
        j.begin(vec![inc("x", 1, 9_000)], 2);
        assert_eq!(j.kept(), (2, MAX_KEPT / 2 + 2));
    }
}
