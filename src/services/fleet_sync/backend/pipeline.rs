//! One round's pipeline for one server: the updates (a lease ask runs the ledger script, a
//! plain increment its first step), the heartbeat, and the reading of the first replies and
//! of the later steps.

use super::journal::{Marked, MARK_KEEP_MS};
use super::round::{
    answer, count_cmd, count_reply, count_start, Heartbeat, Refusal, Reply, ReplyError, RoundError,
    Update, HEARTBEAT_TTL_MS, WAITING_TTL_MS, WAIT_MARK_MS,
};
use super::script::ledger_cmd;

fn add_update(p: &mut redis::Pipeline, u: &Update) {
    p.add_command(match u {
        Update::Lease(l) => ledger_cmd(l),
        Update::Count(c) => count_cmd(c, count_start(c)),
    });
}

/// The heartbeat: plain commands, not a script (a script call costs Redis 50-85 us by INFO
/// commandstats, these 15-20 us together in `scripts/bench-redis-cost`). Not atomic, and need
/// not be: each instance only adds itself and its waiting marks, removes the silent ones and
/// the old marks, and the count is read last. `Heartbeat::replies` counts what it adds.
fn add_heartbeat(p: &mut redis::Pipeline, hb: &Heartbeat) {
    if !hb.waits.is_empty() {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&hb.waiting_key);
        for key in &hb.waits {
            zadd.arg(hb.now_ms).arg(hb.wait_member(key));
        }
        p.add_command(zadd);
        p.cmd("PEXPIRE").arg(&hb.waiting_key).arg(WAITING_TTL_MS);
        if hb.publish {
            p.cmd("PUBLISH").arg(&hb.channel).arg(hb.wait_message());
        }
    }
    if !hb.beat {
        return;
    }
    p.cmd("ZADD").arg(&hb.key).arg(hb.now_ms).arg(&hb.instance);
    p.cmd("ZREMRANGEBYSCORE")
        .arg(&hb.key)
        .arg("-inf")
        .arg(hb.now_ms.saturating_sub(hb.liveness_ms));
    p.cmd("PEXPIRE").arg(&hb.key).arg(HEARTBEAT_TTL_MS);
    p.cmd("HGETALL").arg(&hb.adjusted_key);
    if hb.hear {
        p.cmd("ZREMRANGEBYSCORE")
            .arg(&hb.waiting_key)
            .arg("-inf")
            .arg(hb.now_ms.saturating_sub(WAIT_MARK_MS));
        p.cmd("ZRANGEBYSCORE")
            .arg(&hb.waiting_key)
            .arg("-inf")
            .arg("+inf");
    }
    p.cmd("ZCARD").arg(&hb.key);
}

/// The round's pipeline for one server: every update (a plain increment's first step), then
/// the heartbeat (periodic rounds).
pub fn pipeline<'a>(
    updates: impl Iterator<Item = &'a Update>,
    hb: Option<&Heartbeat>,
) -> redis::Pipeline {
    let mut p = redis::pipe();
    updates.for_each(|u| add_update(&mut p, u));
    if let Some(hb) = hb {
        add_heartbeat(&mut p, hb);
    }
    p
}

/// What a marked round adds (`journal`), in the set of marks `key`: its own mark, and a read
/// of the last answered one.
#[derive(Debug, Clone, Copy)]
pub struct Marks<'a> {
    pub key: &'a str,
    /// This round's number and when it is sent (unix ms); none: it has no plain increments.
    pub mark: Option<(u64, u64)>,
    /// The last round Redis answered: its number and when it was sent.
    pub probe: Option<(u64, u64)>,
}

/// The mark's commands inside the transaction: add it, trim the set, keep the set alive.
const MARK_COMMANDS: usize = 3;

fn add_mark(p: &mut redis::Pipeline, key: &str, (seq, now_ms): (u64, u64)) {
    p.cmd("ZADD").arg(key).arg(now_ms).arg(seq);
    p.cmd("ZREMRANGEBYSCORE")
        .arg(key)
        .arg("-inf")
        .arg(now_ms.saturating_sub(MARK_KEEP_MS));
    p.cmd("PEXPIRE").arg(key).arg(MARK_KEEP_MS);
}

/// A round's pipeline for one server with its marks (`journal`): the read of the last answered
/// mark (the marks of its instant), then, with a mark, the lease asks, `MULTI`, the
/// increments' first steps and the mark, `EXEC` (without, the updates as [`pipeline`] sends
/// them), then the heartbeat. [`unmark`] gives its replies in [`pipeline`]'s order.
pub fn marked_pipeline(updates: &[Update], hb: Option<&Heartbeat>, m: &Marks) -> redis::Pipeline {
    let mut p = redis::pipe();
    if let Some((_, sent_ms)) = m.probe {
        p.cmd("ZRANGEBYSCORE").arg(m.key).arg(sent_ms).arg(sent_ms);
    }
    let Some(mark) = m.mark else {
        updates.iter().for_each(|u| add_update(&mut p, u));
        if let Some(hb) = hb {
            add_heartbeat(&mut p, hb);
        }
        return p;
    };
    let is_count = |u: &&Update| matches!(u, Update::Count(_));
    updates
        .iter()
        .filter(|u| !is_count(u))
        .for_each(|u| add_update(&mut p, u));
    p.cmd("MULTI");
    updates
        .iter()
        .filter(is_count)
        .for_each(|u| add_update(&mut p, u));
    add_mark(&mut p, m.key, mark);
    p.cmd("EXEC");
    if let Some(hb) = hb {
        add_heartbeat(&mut p, hb);
    }
    p
}

/// What became of a round's marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarksSeen {
    /// Its own mark (`Applied` when it had none).
    pub marked: Marked,
    /// Whether Redis held the probed mark (none: no probe, or the probe was refused).
    pub probe_held: Option<bool>,
    /// What Redis refused of the marks' own commands (`MULTI`, the probe): marks cannot go on.
    pub refusal: Option<ReplyError>,
}

/// The replies of a [`marked_pipeline`] in [`pipeline`]'s order (each update's, then the
/// heartbeat's), and what became of its marks. A transaction Redis refused (a command refused
/// when queued: its error, or `EXECABORT`) answers each increment with that error: none was
/// applied.
pub fn unmark(
    updates: &[Update],
    values: Vec<redis::Value>,
    m: &Marks,
) -> Result<(Vec<redis::Value>, MarksSeen), RoundError> {
    use redis::Value;
    let mut values = values.into_iter();
    let (probe_held, mut refusal) = match m.probe {
        Some((seq, _)) => probe_reply(values.next().unwrap_or(Value::Nil), seq),
        None => (None, None),
    };
    if m.mark.is_none() {
        let seen = MarksSeen {
            marked: Marked::Applied,
            probe_held,
            refusal,
        };
        return Ok((values.collect(), seen));
    }
    let values: Vec<Value> = values.collect();
    let counts = updates
        .iter()
        .filter(|u| matches!(u, Update::Count(_)))
        .count();
    let leases = updates.len() - counts;
    let queued = counts + MARK_COMMANDS;
    if values.len() < leases + queued + 2 {
        return Err(format!("expected a transaction's answers, got {}", values.len()).into());
    }
    let mut values = values.into_iter();
    let mut lease_replies: Vec<Value> = values.by_ref().take(leases).collect();
    let multi = values.next().unwrap_or(Value::Nil);
    let in_queue: Vec<Value> = values.by_ref().take(queued).collect();
    let exec = values.next().unwrap_or(Value::Nil);
    let rest: Vec<Value> = values.collect();
    let is_error = |v: &Value| matches!(v, Value::ServerError(_));
    let (mut count_replies, marked) = if let Value::ServerError(e) = &multi {
        // no transaction: each command ran as it came
        refusal.get_or_insert_with(|| ReplyError::of_server(e));
        (in_queue, Marked::Unmarked)
    } else {
        match exec {
            Value::Array(items) if items.len() == queued => {
                let mark_ok = !items[counts..].iter().any(is_error);
                let marked = if mark_ok {
                    Marked::Applied
                } else {
                    Marked::Unmarked
                };
                (items, marked)
            }
            Value::ServerError(_) => {
                let first = in_queue.iter().find(|v| is_error(v)).cloned();
                let why = first.unwrap_or(exec);
                (vec![why; queued], Marked::Refused)
            }
            other => return Err(format!("unexpected answer to EXEC: {other:?}").into()),
        }
    };
    count_replies.truncate(counts);
    let mut out = Vec::with_capacity(updates.len() + rest.len());
    let (mut l, mut c) = (lease_replies.drain(..), count_replies.into_iter());
    for u in updates {
        let v = match u {
            Update::Count(_) => c.next(),
            Update::Lease(_) => l.next(),
        };
        out.push(v.unwrap_or(Value::Nil));
    }
    out.extend(rest);
    let seen = MarksSeen {
        marked,
        probe_held,
        refusal,
    };
    Ok((out, seen))
}

/// What the probe read: whether Redis holds round `seq`, or its refusal.
fn probe_reply(v: redis::Value, seq: u64) -> (Option<bool>, Option<ReplyError>) {
    match v {
        redis::Value::ServerError(e) => (None, Some(ReplyError::of_server(&e))),
        v => (Some(holds(&v, seq)), None),
    }
}

/// Whether a read of marks (`ZRANGEBYSCORE`) holds round `seq`.
fn holds(v: &redis::Value, seq: u64) -> bool {
    match v {
        redis::Value::Array(items) => items.iter().any(|i| match i {
            redis::Value::BulkString(b) => std::str::from_utf8(b).ok() == Some(&seq.to_string()),
            redis::Value::Int(n) => *n == seq as i64,
            _ => false,
        }),
        _ => false,
    }
}

/// The first replies to the updates `idxs` (in pipeline order): their answers where they are
/// done; the plain increments that take another step are returned. An error reply (the
/// command was refused: NOPERM, OOM, READONLY, WRONGTYPE, an error raised in the script) is
/// no answer: the update goes in `refused`, under the index `idxs` gives it, and the others'
/// answers still count.
pub(super) fn first_replies(
    updates: &[Update],
    idxs: impl Iterator<Item = usize>,
    values: &[redis::Value],
    answers: &mut [Option<Reply>],
    refused: &mut Vec<Refusal>,
) -> Result<Vec<(usize, u8, u64)>, RoundError> {
    let mut pending = Vec::new();
    for (i, v) in idxs.zip(values) {
        if let redis::Value::ServerError(e) = v {
            refused.push(Refusal {
                update: Some(i),
                error: ReplyError::of_server(e),
            });
            continue;
        }
        match updates.get(i) {
            Some(Update::Lease(_)) => {
                let a = answer(v).ok_or_else(|| format!("unexpected answer {v:?}"))?;
                answers[i] = Some(Reply::Lease(a));
            }
            Some(Update::Count(c)) => match count_reply(c, count_start(c), 0, v)? {
                Ok(t) => answers[i] = Some(Reply::Count(t)),
                Err((stage, total)) => pending.push((i, stage, total)),
            },
            None => {}
        }
    }
    Ok(pending)
}

/// Run the later steps of plain increments (`pending`: update index, stage, total so far) on
/// one connection, one pipeline a step; fills `answers` where they end. A later step refused
/// (the `PEXPIREAT` after an applied `INCRBY`) still answers the total, which Redis applied,
/// and goes in `refused` (the key may be left without its expiry until a later round sets it).
pub(super) async fn finish_counts<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    updates: &[Update],
    mut pending: Vec<(usize, u8, u64)>,
    answers: &mut [Option<Reply>],
    refused: &mut Vec<Refusal>,
) -> Result<(), RoundError> {
    while !pending.is_empty() {
        let mut p = redis::pipe();
        p.ignore_errors();
        for &(i, stage, _) in &pending {
            if let Some(Update::Count(c)) = updates.get(i) {
                p.add_command(count_cmd(c, stage));
            }
        }
        let values: Vec<redis::Value> = p.query_async(conn).await?;
        let mut next = Vec::new();
        for (&(i, stage, total), v) in pending.iter().zip(&values) {
            let Some(Update::Count(c)) = updates.get(i) else {
                continue;
            };
            if let redis::Value::ServerError(e) = v {
                refused.push(Refusal {
                    update: Some(i),
                    error: ReplyError::of_server(e),
                });
                answers[i] = Some(Reply::Count(total));
                continue;
            }
            match count_reply(c, stage, total, v)? {
                Ok(t) => answers[i] = Some(Reply::Count(t)),
                Err(step) => next.push((i, step.0, step.1)),
            }
        }
        pending = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::fleet_sync::backend::round::{CountUpdate, ErrorKind, LedgerUpdate};
    use redis::Value::{self, Array, Int, Okay, SimpleString};

    fn count(key: &str) -> Update {
        Update::Count(CountUpdate {
            key: key.into(),
            delta: 1,
            first: false,
            expire_at_ms: 9,
        })
    }

    fn error(text: &str) -> Value {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap_or(Value::Nil)
    }

    fn packed(p: &redis::Pipeline) -> String {
        String::from_utf8_lossy(&p.get_packed_pipeline())
            .split("\r\n")
            .filter(|w| !w.starts_with('*') && !w.starts_with('$'))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn a_marked_round_sends_its_increments_and_mark_in_one_transaction() {
        let lease = Update::Lease(LedgerUpdate::default());
        let updates = [count("a"), lease, count("b")];
        let mark = Marks {
            key: "p:rounds:i",
            mark: Some((7, 100_000)),
            probe: None,
        };
        let text = packed(&marked_pipeline(&updates, None, &mark));
        let multi = text.find("MULTI").unwrap_or(usize::MAX);
        assert!(text.find("EVALSHA") < Some(multi), "{text}");
        assert!(
            text.ends_with(
                "MULTI INCRBY a 1 INCRBY b 1 ZADD p:rounds:i 100000 7 ZREMRANGEBYSCORE p:rounds:i -inf 40000 PEXPIRE p:rounds:i 60000 EXEC "
            ),
            "{text}"
        );
        let queued = || SimpleString("QUEUED".into());
        let script = Array(vec![Int(1); 7]);
        // the transaction ran: the replies in the updates' order
        let values = vec![
            script.clone(),
            Okay,
            queued(),
            queued(),
            queued(),
            queued(),
            queued(),
            Array(vec![Int(3), Int(4), Int(1), Int(0), Int(1)]),
        ];
        let (v, m) = unmark(&updates, values, &mark).unwrap();
        assert_eq!(m.marked, Marked::Applied);
        assert_eq!(v, vec![Int(3), script.clone(), Int(4)]);
        // refused when queued: nothing ran, each increment gets the reason
        let oom = error("OOM command not allowed when used memory > 'maxmemory'.");
        let values = vec![
            script.clone(),
            Okay,
            oom.clone(),
            queued(),
            queued(),
            queued(),
            queued(),
            error("EXECABORT Transaction discarded because of previous errors."),
        ];
        let (v, m) = unmark(&updates, values, &mark).unwrap();
        assert_eq!(m.marked, Marked::Refused);
        assert_eq!(v, vec![oom.clone(), script.clone(), oom]);
        // MULTI refused (an ACL without +multi): each command ran as it came, unmarked
        let noperm = error("NOPERM User gateway has no permissions to run the 'multi' command");
        let values = vec![
            script.clone(),
            noperm,
            Int(5),
            Int(6),
            Int(1),
            Int(0),
            Int(1),
            error("ERR EXEC without MULTI"),
        ];
        let (v, m) = unmark(&updates, values, &mark).unwrap();
        assert_eq!(m.marked, Marked::Unmarked);
        assert_eq!(m.refusal.map(|r| r.kind), Some(ErrorKind::NoPerm), "said");
        assert_eq!(v, vec![Int(5), script, Int(6)]);
        assert!(
            unmark(&updates, vec![Okay], &mark).is_err(),
            "too few answers"
        );
    }

    #[test]
    fn a_heartbeat_adds_its_waiting_marks_and_a_whole_one_trims_and_reads_them() {
        let hb = Heartbeat {
            key: "tg:instances".into(),
            adjusted_key: "tg:instances:adjusted".into(),
            waiting_key: "tg:instances:waiting".into(),
            waits: vec!["tg:{a}:r:0:9".into()],
            channel: "tg:waits".into(),
            publish: false,
            subscribed: false,
            beat: false,
            hear: true,
            instance: "i1".into(),
            now_ms: 5_000,
            liveness_ms: 3_000,
        };
        // marks alone (an early round): kept 10 s past the last writer
        let marks =
            "ZADD tg:instances:waiting 5000 i1 tg:{a}:r:0:9 PEXPIRE tg:instances:waiting 10000 ";
        assert_eq!(packed(&pipeline([].iter(), Some(&hb))), marks);
        // published too, for the holders to hear at once: the instance, then the keys (the
        // marks say so, for the heartbeats of those that hear them to pass over)
        let told = Heartbeat {
            publish: true,
            waits: vec!["tg:{a}:r:0:9".into(), "tg:{b}:r:0:9".into()],
            ..hb.clone()
        };
        assert_eq!(
            packed(&pipeline([].iter(), Some(&told))),
            "ZADD tg:instances:waiting 5000 i1+ tg:{a}:r:0:9 5000 i1+ tg:{b}:r:0:9 PEXPIRE tg:instances:waiting 10000 PUBLISH tg:waits i1\ntg:{a}:r:0:9\ntg:{b}:r:0:9 "
        );
        assert_eq!(told.replies(), 3);
        use crate::services::fleet_sync::backend::round::waits_told;
        let message = told.wait_message();
        assert_eq!(
            waits_told(message.as_bytes(), "i2"),
            Some(vec!["tg:{a}:r:0:9".to_string(), "tg:{b}:r:0:9".to_string()])
        );
        // its own, or none
        assert_eq!(waits_told(message.as_bytes(), "i1"), None);
        assert_eq!(waits_told(b"i3", "i1"), None);
        // a whole heartbeat: the marks of the last 500 ms read, the older dropped
        let beat = Heartbeat {
            beat: true,
            ..hb.clone()
        };
        assert_eq!(
            packed(&pipeline([].iter(), Some(&beat))),
            format!("{marks}ZADD tg:instances 5000 i1 ZREMRANGEBYSCORE tg:instances -inf 2000 PEXPIRE tg:instances 60000 HGETALL tg:instances:adjusted ZREMRANGEBYSCORE tg:instances:waiting -inf 4500 ZRANGEBYSCORE tg:instances:waiting -inf +inf ZCARD tg:instances ")
        );
        // deaf (the read refused once): no reads of the marks
        let deaf = Heartbeat {
            hear: false,
            waits: Vec::new(),
            ..beat
        };
        assert_eq!(
            packed(&pipeline([].iter(), Some(&deaf))),
            "ZADD tg:instances 5000 i1 ZREMRANGEBYSCORE tg:instances -inf 2000 PEXPIRE tg:instances 60000 HGETALL tg:instances:adjusted ZCARD tg:instances "
        );
    }

    #[test]
    fn a_round_reads_back_the_last_answered_mark_first() {
        let updates = [count("a")];
        let probe = Marks {
            key: "k",
            mark: None,
            probe: Some((6, 99_000)),
        };
        let text = packed(&marked_pipeline(&updates, None, &probe));
        assert_eq!(text, "ZRANGEBYSCORE k 99000 99000 INCRBY a 1 ");
        let held = |reply: Value| unmark(&updates, vec![reply, Int(4)], &probe).unwrap();
        let six = Value::BulkString(b"6".to_vec());
        let (v, m) = held(Array(vec![Value::BulkString(b"5".to_vec()), six]));
        assert_eq!((v, m.probe_held), (vec![Int(4)], Some(true)));
        assert_eq!(held(Array(vec![])).1.probe_held, Some(false), "lost");
        // refused (an ACL without +zrangebyscore): not known, and said
        let refused = held(error("NOPERM no")).1;
        assert_eq!(refused.probe_held, None);
        assert_eq!(refused.refusal.map(|r| r.kind), Some(ErrorKind::NoPerm));
        let both = Marks {
            mark: Some((7, 100_000)),
            ..probe
        };
        let text = packed(&marked_pipeline(&updates, None, &both));
        assert!(
            text.starts_with("ZRANGEBYSCORE k 99000 99000 MULTI INCRBY a 1 ZADD k 100000 7"),
            "{text}"
        );
    }
}
