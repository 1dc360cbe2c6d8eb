//! What a round sends and gets back: the updates, their replies and errors, the heartbeat,
//! the [`SyncBackend`] trait that runs a round, and the reading of the replies.

use async_trait::async_trait;
use std::time::Duration;
use tollgate_limits::ledger::Answer;

/// Why a round has no answer. `unapplied`: certainly nothing of it reached Redis (the
/// connection was refused), so the ledger sends its plain increments again; otherwise (a
/// timeout, a connection lost on the way) they may have been applied and the ledger takes them
/// as counted, so that none is ever counted twice: the backend's marks (`journal`) then tell
/// whether Redis holds them, and send them again if not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundError {
    pub message: String,
    pub unapplied: bool,
}

impl From<String> for RoundError {
    fn from(message: String) -> Self {
        RoundError {
            message,
            unapplied: false,
        }
    }
}

impl From<&str> for RoundError {
    fn from(message: &str) -> Self {
        RoundError::from(message.to_string())
    }
}

impl From<redis::RedisError> for RoundError {
    fn from(e: redis::RedisError) -> Self {
        RoundError {
            unapplied: e.is_connection_refusal(),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for RoundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The kind of an error reply, a bounded set (the label of `tollgate_redis_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The ACL user may not run a command (or touch a key), the script's own calls included.
    NoPerm,
    /// A full Redis with `noeviction` refuses writes.
    Oom,
    /// A replica refuses writes.
    ReadOnly,
    /// A key holds another type than the command needs.
    WrongType,
    /// The server does not know the script (and loading it failed).
    NoScript,
    /// Any other error reply, an error raised in the script included.
    Other,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::NoPerm,
        ErrorKind::Oom,
        ErrorKind::ReadOnly,
        ErrorKind::WrongType,
        ErrorKind::NoScript,
        ErrorKind::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::NoPerm => "noperm",
            ErrorKind::Oom => "oom",
            ErrorKind::ReadOnly => "readonly",
            ErrorKind::WrongType => "wrongtype",
            ErrorKind::NoScript => "noscript",
            ErrorKind::Other => "other",
        }
    }

    /// The kind of an error reply from its code (`NOPERM`) and text. Inside a script, Redis
    /// 7.0 answers a command the user may not run with `ERR The user executing the script
    /// can't run this command`, 7.2 on with `NOPERM`; the other codes come through as they are.
    pub fn of(code: &str, detail: &str) -> ErrorKind {
        match code {
            "NOPERM" => ErrorKind::NoPerm,
            "OOM" => ErrorKind::Oom,
            "READONLY" => ErrorKind::ReadOnly,
            "WRONGTYPE" => ErrorKind::WrongType,
            "NOSCRIPT" => ErrorKind::NoScript,
            _ if detail.contains("can't run this command")
                || detail.contains("no permissions to")
                || detail.contains("No permissions to") =>
            {
                ErrorKind::NoPerm
            }
            _ if detail.starts_with("OOM ") || detail.contains(": OOM ") => ErrorKind::Oom,
            _ => ErrorKind::Other,
        }
    }
}

/// An error reply: its kind and Redis's text (`CODE detail`; no key of ours is in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyError {
    pub kind: ErrorKind,
    pub message: String,
}

/// The longest error text kept (a script's error names its hash and line).
const MAX_ERROR_TEXT: usize = 300;

impl ReplyError {
    pub fn new(code: &str, detail: &str) -> ReplyError {
        let mut message = format!("{code} {detail}").trim().to_string();
        if message.len() > MAX_ERROR_TEXT {
            let mut end = MAX_ERROR_TEXT;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("...");
        }
        ReplyError {
            kind: ErrorKind::of(code, detail),
            message,
        }
    }

    pub fn of_server(e: &redis::ServerError) -> ReplyError {
        ReplyError::new(e.code(), e.details().unwrap_or(""))
    }

    /// The error reply inside a client error, if it is one (not an I/O error, a timeout).
    pub fn of_redis(e: &redis::RedisError) -> Option<ReplyError> {
        match e.kind() {
            redis::ErrorKind::Server(_) | redis::ErrorKind::Extension => {
                let code = e.code()?;
                Some(ReplyError::new(code, e.detail().unwrap_or("")))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a round's update (or its heartbeat) got instead of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The update (its index in the round); `None`: the heartbeat.
    pub update: Option<usize>,
    pub error: ReplyError,
}

/// What one window record of one counter sends in a round: a lease ask (the script), or a
/// plain increment (a direct record far from its limit, see `limits::ledger`).
/// (A round's updates are built once and live in one `Vec` while it runs: a lease ask's size,
/// next to its own strings, costs nothing worth a box each.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Update {
    Lease(LedgerUpdate),
    Count(CountUpdate),
}

impl Update {
    /// The contract's key (which cluster slot the update goes to).
    pub fn key(&self) -> &str {
        match self {
            Update::Lease(u) => &u.key,
            Update::Count(c) => &c.key,
        }
    }
}

/// What Redis answered to an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Lease(Answer),
    /// The fleet's total after the increment.
    Count(u64),
}

/// A plain increment of the contract's key: `INCRBY`, and `PEXPIREAT` after it when the
/// increment created the key (its total is the increment: the first report of the window, a
/// restart, an expiry) or when `first` (the record's earlier report is not known to have set
/// the expiry: its round failed). An `INCRBY` and a `PEXPIREAT` for the key's creator only:
/// the others' reports cost one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountUpdate {
    pub key: String,
    pub delta: u64,
    pub first: bool,
    pub expire_at_ms: u64,
}

/// The steps of a plain increment: 1 `INCRBY`, 2 `PEXPIREAT`.
pub fn count_cmd(c: &CountUpdate, stage: u8) -> redis::Cmd {
    match stage {
        1 => {
            let mut cmd = redis::cmd("INCRBY");
            cmd.arg(&c.key).arg(c.delta);
            cmd
        }
        _ => {
            let mut cmd = redis::cmd("PEXPIREAT");
            cmd.arg(&c.key).arg(c.expire_at_ms);
            cmd
        }
    }
}

/// The first step of a plain increment.
pub fn count_start(_: &CountUpdate) -> u8 {
    1
}

/// After a step's reply: `Ok(Ok(total))` done, `Ok(Err((stage, total)))` the next step.
pub type CountStep = Result<Result<u64, (u8, u64)>, String>;

/// What a plain increment's step answered (`total`: what an earlier step found). An error
/// reply is not an answer here: the callers take it as a refusal first (`Refused`).
pub fn count_reply(c: &CountUpdate, stage: u8, total: u64, v: &redis::Value) -> CountStep {
    match (stage, v) {
        (1, redis::Value::Int(t)) => {
            let t = (*t).max(0) as u64;
            // the increment created the key: it has no expiry yet
            if t == c.delta || c.first {
                Ok(Err((2, t)))
            } else {
                Ok(Ok(t))
            }
        }
        (2, redis::Value::Int(_)) => Ok(Ok(total)),
        (_, redis::Value::ServerError(e)) => Err(format!("{e:?}")),
        _ => Err(format!("unexpected answer {v:?} to a count")),
    }
}

/// What one window record of one counter sends in a round (see `script`: its family's script).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerUpdate {
    /// The contract's key: the fleet's admitted count for the window.
    pub key: String,
    /// `<key>:fleet`, a hash: each member's cumulative count (`u:`), ceiling (`c:`) and lease
    /// end (`e:`).
    pub ledger_key: String,
    /// Sliding windows: the previous window's ledger; token buckets: the bucket
    /// (`<prefix>:{<partition>}:<rule id>:bucket`, the time it is full again, in µs); else
    /// `ledger_key` again.
    pub prev_ledger_key: String,
    /// This instance and the record's incarnation.
    pub member: String,
    pub used: u64,
    pub want: u64,
    /// The threshold.
    pub cap: u64,
    pub now_ms: u64,
    /// Until when the lease holds (the window's end).
    pub lease_until_ms: u64,
    /// Unix ms at which both keys expire.
    pub expire_at_ms: u64,
    /// Sliding windows: how much of the previous window still weighs (ms of `period_ms`) at
    /// the end of the lease's horizon; 0 for fixed windows.
    pub weight_ms: u64,
    pub period_ms: u64,
    /// Buckets: ns per token (`period / threshold`; the script takes µs to the ns,
    /// `bucket_arg`); 0 for windows.
    pub bucket_ns: u64,
    /// Buckets: how far ahead the bucket may be booked, in µs (`algorithm::tolerance_ns`).
    pub tolerance_us: u64,
    /// Sliding logs: what Redis hears of the record's units by instant (default: not a log).
    pub log: LogReport,
    /// Token buckets: the lease carried over from the previous window's record (which gives
    /// it back in the same round, just before): the member's ceiling if it has none yet.
    pub adopt: u64,
    /// Of `want - used`, the requests waiting now: granted first, from all that is free.
    pub need: u64,
    /// The spare budget: what all members together may hold unused beyond their needs.
    pub spare: u64,
    /// Token buckets: of `used`, what Redis confirmed before: what it has charged already if
    /// it has lost its record of the member (a restart), so that it is not charged twice.
    pub confirmed: u64,
    /// Sliding windows: the previous window's contract key (its count, plain increments
    /// included); token buckets: the previous window's ledger (its records' leases); else
    /// `key` again.
    pub prev_key: String,
    /// What direct records can admit in the window in all (`ledger::direct_cap`; 0: none
    /// can): kept out of leases, less what they reported, until the total passes it.
    pub direct_cap: u64,
    /// The fleet's instances as this one knows them, and what a direct record may hold
    /// admitted and unreported (`ledger::direct_allowance`; 0: none can be direct): past
    /// `direct_cap`, that much for each instance not yet among the ledger's members.
    pub instances: u64,
    pub direct_each: u64,
    /// Fixed windows: the member's steady demand until the window's end (`ledger::Ask::rest`,
    /// within `want`; 0: none): when the members' demands fill what is left, the script leases
    /// each its part of it at once.
    pub rest: u64,
    /// Token buckets: what this member admitted and Redis has not charged yet was admitted
    /// at or after this instant (ms; 0: now). Charged from then, so that tokens admitted
    /// while Redis was out of reach refill as they would have (see `script::BUCKETS`).
    pub since_ms: u64,
}

/// What a sliding log's ask tells Redis of its units by instant (`script::Family::Log`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogReport {
    /// The length of one of the window's buckets (ms; 0: not a log).
    pub bucket_ms: u64,
    /// Where units named without their instants go: the bucket of now, or the window's last.
    pub last: u64,
    /// The first bucket of the previous window still in the span at `now_ms`.
    pub from: u64,
    /// The units this ask reports past `confirmed`, by bucket, oldest first
    /// (`sliding_log::Log::by_bucket`).
    pub units: Vec<(u64, u64)>,
}

/// This instance's heartbeat, and the marks of the partitions its requests wait on.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub key: String,
    /// When an operator last reset or granted a window (`adjusted_key`), read with the
    /// heartbeat: a change makes the counters the count refuses ask at once, so that they
    /// hear of it (`fleet_sync::adjust`).
    pub adjusted_key: String,
    /// The fleet's waiting marks (`waiting_key`): a sorted set of `<instance> <count key>`
    /// by when that instance last asked for that window with requests waiting. A holder of an
    /// unused part of a window others wait on reports it at once (`ledger::Sizing::waited_on`)
    /// rather than at half of it, so that what it does not need goes to them.
    pub waiting_key: String,
    /// This round's marks: the count keys of its asks with requests waiting.
    pub waits: Vec<String>,
    /// The waits channel (`waits_channel`): the marks are also published there (`publish`,
    /// off once Redis refused it: an ACL without `+publish` or the channel), for the
    /// holders to hear of them within a round trip.
    pub channel: String,
    pub publish: bool,
    /// This instance hears the waits channel: its heartbeat reads only the marks that were
    /// not published (an earlier release's, or where Redis refused the `PUBLISH`).
    pub subscribed: bool,
    /// A whole heartbeat (periodic rounds, and every round while the instance is new): it
    /// counts the live instances, and reads the adjustment mark and (`hear`) the others'
    /// waiting marks younger than `WAIT_MARK_MS`. Otherwise the round only adds its marks.
    pub beat: bool,
    /// A whole heartbeat reads the others' waiting marks (off once Redis refused the read:
    /// an ACL without `+zrangebyscore`).
    pub hear: bool,
    pub instance: String,
    pub now_ms: u64,
    /// Instances not heard from for this long are no longer counted.
    pub liveness_ms: u64,
}

/// How long a waiting mark is heard (chosen by simulation: kept 1-2 s, holders report more
/// often for waits that have ended; the swaying seed scenario refuses nobody under 0.9 x at
/// 500 ms).
pub const WAIT_MARK_MS: u64 = 500;

/// How long the set of waiting marks outlives its last writer.
pub const WAITING_TTL_MS: u64 = 10_000;

impl Heartbeat {
    /// How many replies it adds to a pipeline: its marks' (`ZADD`, `PEXPIRE`, with `publish`
    /// a `PUBLISH`), then the beat's (`ZADD`, `ZREMRANGEBYSCORE`, `PEXPIRE`, `HGETALL`, with `hear` a
    /// `ZREMRANGEBYSCORE` and a `ZRANGEBYSCORE` of the marks, then `ZCARD`).
    pub fn replies(&self) -> usize {
        let marks = match (self.waits.is_empty(), self.publish) {
            (true, _) => 0,
            (false, false) => 2,
            (false, true) => 3,
        };
        marks + self.beat_replies()
    }

    fn beat_replies(&self) -> usize {
        match (self.beat, self.hear) {
            (false, _) => 0,
            (true, false) => 5,
            (true, true) => 7,
        }
    }

    /// The member of the waiting marks for a window's count key: `<instance> <key>`, or
    /// `<instance>+ <key>` where the mark is also published (`publish`).
    pub fn wait_member(&self, key: &str) -> String {
        let published = if self.publish { "+" } else { "" };
        format!("{}{published} {key}", self.instance)
    }

    /// What the marks publish: the instance, then each count key, a line each.
    pub fn wait_message(&self) -> String {
        let mut m = String::with_capacity(
            self.instance.len() + self.waits.iter().map(|k| k.len() + 1).sum::<usize>(),
        );
        m.push_str(&self.instance);
        for k in &self.waits {
            m.push('\n');
            m.push_str(k);
        }
        m
    }
}

/// The count keys a message of the waits channel names, unless this instance sent it.
pub fn waits_told(message: &[u8], instance: &str) -> Option<Vec<String>> {
    let text = std::str::from_utf8(message).ok()?;
    let mut lines = text.split('\n');
    if lines.next()? == instance {
        return None;
    }
    let keys: Vec<String> = lines
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect();
    (!keys.is_empty()).then_some(keys)
}

/// The channel the waiting marks are published on: `<key prefix>:waits` (an ACL names it
/// `&<key prefix>:*`). A Redis Cluster passes a `PUBLISH` to every node, so an instance may
/// listen on any.
pub fn waits_channel(key_prefix: &str) -> String {
    format!("{key_prefix}:waits")
}

/// What a heartbeat's replies told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Beat {
    /// The live instance count (`None`: no beat, or a reply refused).
    pub instances: Option<u64>,
    /// The last operator's adjustment mark (`Heartbeat::adjusted_key`; `None`: none lately).
    pub adjusted: Option<u64>,
    /// The count keys the other instances' requests waited on lately, sorted (`waiting_key`).
    pub waited: Vec<String>,
    /// Redis refused the read of the waiting marks (`Heartbeat::hear`).
    pub unheard: bool,
    /// Redis refused to publish the marks (`Heartbeat::publish`).
    pub unpublished: bool,
}

/// A heartbeat's replies (the last `hb.replies()` of a pipeline): what they told, and the
/// first error reply among them. The instances are counted unless one of their own commands
/// was refused; the adjustment mark and the others' waits are read even so (an ACL without
/// `+zrangebyscore` refuses the waits' read alone).
pub fn beat_reply(hb: &Heartbeat, values: &[redis::Value]) -> (Beat, Option<ReplyError>) {
    let refused = |v: &redis::Value| match v {
        redis::Value::ServerError(e) => Some(ReplyError::of_server(e)),
        _ => None,
    };
    let error = values.iter().find_map(refused);
    let marks = values.len().saturating_sub(hb.beat_replies());
    // (the marks' replies: ZADD, PEXPIRE, then PUBLISH's)
    let unpublished = hb.publish && marks == 3 && values.get(2).and_then(refused).is_some();
    let beat = match values.get(marks..) {
        Some(b) if hb.beat => b,
        _ => {
            let told = Beat {
                unpublished,
                ..Beat::default()
            };
            return (told, error);
        }
    };
    // (the instances' own: ZADD, ZREMRANGEBYSCORE, PEXPIRE, then ZCARD)
    let counted = [0, 1, 2, beat.len().saturating_sub(1)]
        .iter()
        .all(|&i| beat.get(i).and_then(refused).is_none());
    let reads = beat.get(4..6).filter(|_| hb.hear).unwrap_or_default();
    let mut waited: Vec<String> = match reads.get(1) {
        Some(redis::Value::Array(a)) => a
            .iter()
            .filter_map(text)
            .filter_map(|m| {
                let (who, key) = m.split_once(' ')?;
                let (who, published) = match who.strip_suffix('+') {
                    Some(w) => (w, true),
                    None => (who, false),
                };
                (who != hb.instance && !(published && hb.subscribed)).then(|| key.to_string())
            })
            .collect(),
        _ => Vec::new(),
    };
    waited.sort_unstable();
    waited.dedup();
    let told = Beat {
        instances: counted
            .then(|| beat.last().and_then(int).map(|i| i.max(1) as u64))
            .flatten(),
        adjusted: adjusted_reply(beat),
        waited,
        unheard: reads.iter().any(|v| refused(v).is_some()),
        unpublished,
    };
    (told, error)
}

/// What a round got back.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// Each update's answer; `None` where its node did not answer (a cluster node down or
    /// slow: the others' answers still count).
    pub answers: Vec<Option<Reply>>,
    /// The live instance count (`None`: the heartbeat's node did not answer).
    pub instances: Option<u64>,
    /// What the heartbeat read of the last operator's adjustment (`Heartbeat::adjusted_key`;
    /// `None`: none lately, or no heartbeat).
    pub adjusted: Option<u64>,
    /// What the heartbeat read of the others' waiting marks (`Beat::waited`), and whether
    /// Redis refused the read (`Beat::unheard`).
    pub waited: Vec<String>,
    pub unheard: bool,
    /// Redis refused to publish the marks (`Beat::unpublished`).
    pub unpublished: bool,
    /// Cluster: how many slots the round went to answered, and how many did not (their keys
    /// wait), and why.
    pub slots_answered: usize,
    pub slots_failed: usize,
    pub slot_error: Option<String>,
    /// Cluster: the slots whose last round did not answer, after this one.
    pub slots_down: usize,
    /// The error replies: updates (and the heartbeat) Redis refused. A refused update has no
    /// answer (a later round sends it again), and its counter falls back to `on_failure`.
    pub refused: Vec<Refusal>,
}

impl Exchange {
    /// Every update answered.
    pub fn whole(answers: Vec<Reply>, instances: Option<u64>) -> Exchange {
        Exchange {
            answers: answers.into_iter().map(Some).collect(),
            instances,
            ..Exchange::default()
        }
    }
}

/// One `SCAN` call's answer on one server: the keys it found and where to go on (0: that
/// server is done).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanPage {
    pub keys: Vec<String>,
    pub cursor: u64,
}

/// One `HSCAN` call's answer: where to go on (0: done) and the fields with their integer
/// values.
pub type HashPage = (u64, Vec<(String, u64)>);

#[async_trait]
pub trait SyncBackend: Send + Sync {
    /// Apply the updates; answer each, and count the live instances (periodic rounds carry
    /// the heartbeat). `Err` when nothing answered. Never called for an empty round.
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError>;

    /// How long a whole round may take (a cluster waits for each node up to the timeout, and
    /// may read the slot map first).
    fn deadline(&self, timeout: Duration) -> Duration {
        timeout
    }

    /// Run one script call outside the rounds (an operator's reset or grant, see
    /// `fleet_sync::adjust`) on the server holding its keys, loading the script there if it
    /// does not know it.
    async fn invoke(&self, call: &redis::ScriptInvocation<'_>) -> Result<redis::Value, RoundError> {
        let _ = call;
        Err("this backend runs no single calls".into())
    }

    /// How many servers hold keys (a cluster: its primaries; else one), for [`Self::scan`].
    async fn servers(&self) -> Result<usize, RoundError> {
        Ok(1)
    }

    /// One `SCAN` step on server `server` (`0..servers()`, in an order that holds while the
    /// cluster's primaries stay the same) for keys matching `pattern`.
    async fn scan(
        &self,
        server: usize,
        cursor: u64,
        pattern: &str,
        count: u64,
    ) -> Result<ScanPage, RoundError> {
        let _ = (server, cursor, pattern, count);
        Err("this backend reads no keys".into())
    }

    /// A page of a hash's fields and integer values (`HSCAN`), wherever the hash lives.
    async fn hscan(&self, key: &str, cursor: u64, count: u64) -> Result<HashPage, RoundError> {
        let _ = (key, cursor, count);
        Err("this backend reads no keys".into())
    }

    /// Some of a hash's integer values (`HMGET`; none: no such field), wherever it lives.
    async fn hash_counts(
        &self,
        key: &str,
        fields: &[&str],
    ) -> Result<Vec<Option<u64>>, RoundError> {
        let _ = (key, fields);
        Err("this backend reads no keys".into())
    }

    /// The integer values of count keys (none: no such key), wherever each lives.
    async fn counts_by_key(&self, keys: &[String]) -> Result<Vec<Option<u64>>, RoundError> {
        // (one server holds every key)
        self.counts(0, keys).await
    }

    /// The integer values of count keys (none: no such key) that live on server `server`.
    async fn counts(&self, server: usize, keys: &[String]) -> Result<Vec<Option<u64>>, RoundError> {
        let _ = (server, keys);
        Err("this backend reads no keys".into())
    }
}

/// How long the heartbeat set outlives its last writer.
pub const HEARTBEAT_TTL_MS: u64 = 60_000;

/// The key an operator's adjustment marks (`Heartbeat::adjusted_key`), see [`beside`].
pub fn adjusted_key(heartbeat_key: &str) -> String {
    beside(heartbeat_key, "adjusted")
}

/// The fleet's waiting marks (`Heartbeat::waiting_key`), see [`beside`].
pub fn waiting_key(heartbeat_key: &str) -> String {
    beside(heartbeat_key, "waiting")
}

/// A key the heartbeat reads: under the heartbeat's key (so under the key prefix an ACL
/// allows, `~prefix:*`) and in its Redis Cluster slot, so that the heartbeat reads it in the
/// same pipeline: `<heartbeat key>:<name>`, or, where that falls in another slot, the first
/// `<heartbeat key>:<name>:<n>` that does not (every instance finds the same; kept for the
/// last key prefix asked).
fn beside(heartbeat_key: &str, name: &str) -> String {
    use redis::cluster_routing::Slot;
    type Found = Vec<(String, String, String)>;
    static FOUND: parking_lot::Mutex<Found> = parking_lot::Mutex::new(Vec::new());
    let mut found = FOUND.lock();
    if let Some((_, _, key)) = found
        .iter()
        .find(|(hb, n, _)| hb == heartbeat_key && n == name)
    {
        return key.clone();
    }
    let slot = Slot::for_key(heartbeat_key);
    let plain = format!("{heartbeat_key}:{name}");
    let key = if Slot::for_key(&plain) == slot {
        plain
    } else {
        // (one in 16,384 lands in a given slot: a few thousand tries, once)
        (0u32..)
            .map(|n| format!("{heartbeat_key}:{name}:{n}"))
            .find(|k| Slot::for_key(k) == slot)
            .unwrap_or(plain)
    };
    // (a few key prefixes at most: the last one's keys)
    found.retain(|(hb, _, _)| hb == heartbeat_key);
    found.push((heartbeat_key.to_string(), name.to_string(), key.clone()));
    key
}

/// The mark of the last operator's adjustment among a whole heartbeat's replies (its fourth:
/// an `HGETALL` of `{v: mark}`), if there is one.
fn adjusted_reply(beat: &[redis::Value]) -> Option<u64> {
    let fields: Vec<&redis::Value> = match beat.get(3)? {
        redis::Value::Array(a) => a.iter().collect(),
        redis::Value::Map(m) => m.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return None,
    };
    fields
        .chunks(2)
        .find(|kv| kv.first().and_then(|k| text(k)).as_deref() == Some("v"))
        .and_then(|kv| kv.get(1).and_then(|v| text(v)))
        .and_then(|v| v.parse().ok())
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_string),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// One script answer: total, ceiling, fair, room, held, prev and grant, then a sliding log's
/// steps, packed as little-endian doubles in one string (whole numbers, each read as Redis
/// would read a number a script answers: negatives as 0).
pub fn answer(v: &redis::Value) -> Option<Answer> {
    let redis::Value::BulkString(b) = v else {
        return None;
    };
    if b.len() % 8 != 0 {
        return None;
    }
    let n = |i: usize| {
        let bytes = b.get(8 * i..8 * i + 8)?;
        let x = f64::from_le_bytes(bytes.try_into().ok()?);
        // (`as` saturates: NaN and negatives are 0)
        Some(x as u64)
    };
    Some(Answer {
        total: n(0)?,
        ceiling: n(1)?,
        fair: n(2)?,
        room: n(3)?,
        held: n(4)?,
        prev: n(5)?,
        grant: n(6)?,
        steps: std::array::from_fn(|k| (n(7 + 2 * k).unwrap_or(0), n(8 + 2 * k).unwrap_or(0))),
    })
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    }
}
