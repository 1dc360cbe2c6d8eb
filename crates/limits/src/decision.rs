//! What the limiter decided for one request, as headers, metrics, inspection and the request
//! path read it (the gateway's limiter writes it): the verdict, every applying tier's report, and what is owed later (charges
//! of the answer, turns in leaky buckets). Plain data: it knows nothing of the limiter.

use crate::algorithm::TierVerdict;
use crate::calendar::CalendarUnit;
use http::HeaderMap;
use smallvec::SmallVec;

/// One tier's answer, for headers and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierReport {
    /// Index into `Limiter::rules`.
    pub rule: u16,
    /// Which tier list of the rule (0: `tiers`, else a plan's), and which tier in it.
    pub list: u16,
    pub tier: u8,
    pub threshold: u64,
    pub period_ms: u64,
    /// A calendar tier (`1d`, `1w`, `1mo`).
    pub calendar: Option<CalendarUnit>,
    pub verdict: TierVerdict,
    pub shadow: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Over the limit: answer `status` now.
    Reject {
        status: u16,
    },
    /// Over the limit of `delay` rules only: try again after `wait_ms` (at most `max_delay_ms`
    /// after the first attempt).
    Delay {
        wait_ms: u64,
        max_delay_ms: u64,
        status: u16,
    },
    /// Over the limit of a `shadowban` rule (index into `Limiter::rules`): answer its reply,
    /// without the upstream and without quota headers.
    Shadowban {
        rule: u16,
    },
    /// Over the limit of `throttle` rules only: proxy, and pace the response body at this many
    /// bytes per second.
    Throttle {
        bytes_per_sec: u64,
    },
    /// Under every limit, but this instance's lease of the fleet's quota is used: wait for the
    /// next sync round's answer (which asks for this request), then decide again
    /// (`Limiter::decide_after_hold` once the wait is over).
    Hold,
}

impl Verdict {
    /// The request goes to the upstream (allowed, or throttled): it counts in the windows of
    /// every applying rule it is not over.
    pub fn admits(&self) -> bool {
        matches!(self, Verdict::Allow | Verdict::Throttle { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// Every tier of every applying rule (shadow rules flagged).
    pub tiers: SmallVec<[TierReport; 6]>,
    /// (rule index, violated) for every applying rule.
    pub applied: SmallVec<[(u16, bool); 4]>,
    /// Some enforcing tier waits for the fleet (its lease is used).
    pub held: bool,
    /// Rules that charge this request only once its answer is known (`count_when`, a cost
    /// the answer carries): `Limiter::charge_late` charges it there.
    pub late: Vec<Late>,
    /// Leaky buckets: how long the request waits for its turn before it goes on (ns; the
    /// longest of its enforcing leaky tiers).
    pub wait_ns: u64,
    /// The leaky buckets it took a turn in: a request that leaves while it waits gives its
    /// turn back when nobody came after it (`Limiter::leave_queue`).
    pub queued: Vec<Queued>,
}

/// A turn taken in a leaky bucket (one rule, every tier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub rule: u16,
    pub list: u16,
    pub hash: u64,
    pub key: Box<[u8]>,
    pub units: u64,
    /// Each tier's next free slot just after this request took its turn.
    pub tats: SmallVec<[u64; 2]>,
}

/// What is known of an answer when late charges are taken from it.
#[derive(Debug)]
pub struct Answered<'a> {
    /// Its HTTP status.
    pub status: u16,
    /// Its gRPC status (from `grpc-status`), for a gRPC answer that has it.
    pub grpc: Option<u8>,
    /// The fields the costs are read from: its headers, or its trailers.
    pub fields: &'a HeaderMap,
    /// The answer has ended (its trailers, or its end, are known).
    pub ended: bool,
}

/// A charge owed by a forwarded request to a rule that charges late.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Late {
    pub rule: u16,
    pub list: u16,
    pub hash: u64,
    pub key: Box<[u8]>,
    /// The units admission checked room for (and its quota reports assumed).
    pub units: u64,
    /// Admitted while Redis answered: its answer is counted (`ledger::note_answer`).
    pub reserved: bool,
}

impl Default for Decision {
    fn default() -> Self {
        Decision::none()
    }
}

impl Decision {
    pub fn none() -> Self {
        Decision {
            verdict: Verdict::Allow,
            tiers: SmallVec::new(),
            applied: SmallVec::new(),
            held: false,
            late: Vec::new(),
            wait_ns: 0,
            queued: Vec::new(),
        }
    }

    /// Back to [`Decision::none`], keeping what it holds on the heap (a decision written in
    /// place: `Limiter::decide_into`).
    pub fn clear(&mut self) {
        self.verdict = Verdict::Allow;
        self.tiers.clear();
        self.applied.clear();
        self.held = false;
        self.late.clear();
        self.wait_ns = 0;
        self.queued.clear();
    }

    /// The longest wait among violated enforcing tiers.
    pub fn retry_after_ms(&self) -> u64 {
        self.tiers
            .iter()
            .filter(|t| !t.shadow && !t.verdict.allowed)
            .map(|t| t.verdict.retry_after_ms)
            .max()
            .unwrap_or(0)
    }
}
