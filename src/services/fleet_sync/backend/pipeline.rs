//! One round's pipeline for one server: the updates (a lease ask runs the ledger script, a
//! plain increment its first step), the heartbeat, and the reading of the first replies and
//! of the later steps.

use super::round::{
    answer, count_cmd, count_reply, count_start, Heartbeat, Refusal, Reply, ReplyError, RoundError,
    Update, HEARTBEAT_TTL_MS,
};
use super::journal::{Marked, MARK_KEEP_MS};
use super::script::ledger_cmd;

fn add_update(p: &mut redis::Pipeline, u: &Update) {
    p.add_command(match u {
        Update::Lease(l) => ledger_cmd(l),
        Update::Count(c) => count_cmd(c, count_start(c)),
    });
}

/// The heartbeat: plain commands, not a script (a script call costs Redis 50-85 us by INFO
/// commandstats, these 15-20 us together in `scripts/bench-redis-cost`). Not atomic, and need not be: each instance only adds itself and
/// removes the silent ones, and the count is read last. Its answer is the last reply.
fn add_heartbeat(p: &mut redis::Pipeline, hb: &Heartbeat) {
    p.cmd("ZADD").arg(&hb.key).arg(hb.now_ms).arg(&hb.instance);
    p.cmd("ZREMRANGEBYSCORE")
        .arg(&hb.key)
        .arg("-inf")
        .arg(hb.now_ms.saturating_sub(hb.liveness_ms));
    p.cmd("PEXPIRE").arg(&hb.key).arg(HEARTBEAT_TTL_MS);
    p.cmd("HGETALL").arg(&hb.adjusted_key);
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

/// A round's mark (`journal`): its number in this instance's set of marks `key`, and when it
/// was sent (unix ms).
#[derive(Debug, Clone, Copy)]
pub struct Mark<'a> {
    pub key: &'a str,
    pub seq: u64,
    pub now_ms: u64,
}

/// The mark's commands inside the transaction: add it, trim the set, keep the set alive.
const MARK_COMMANDS: usize = 3;

fn add_mark(p: &mut redis::Pipeline, m: &Mark) {
    p.cmd("ZADD").arg(m.key).arg(m.now_ms).arg(m.seq);
    p.cmd("ZREMRANGEBYSCORE")
        .arg(m.key)
        .arg("-inf")
        .arg(m.now_ms.saturating_sub(MARK_KEEP_MS));
    p.cmd("PEXPIRE").arg(m.key).arg(MARK_KEEP_MS);
}

/// A round's pipeline for one server with its plain increments marked (`journal`): the lease
/// asks, then `MULTI`, the increments' first steps and the mark, `EXEC`, then the heartbeat.
/// [`unmark`] gives its replies in [`pipeline`]'s order.
pub fn marked_pipeline(updates: &[Update], hb: Option<&Heartbeat>, mark: &Mark) -> redis::Pipeline {
    let mut p = redis::pipe();
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
    add_mark(&mut p, mark);
    p.cmd("EXEC");
    if let Some(hb) = hb {
        add_heartbeat(&mut p, hb);
    }
    p
}

/// The replies of a [`marked_pipeline`] in [`pipeline`]'s order (each update's, then the
/// heartbeat's), and what became of the mark. A transaction Redis refused (a command refused
/// when queued: its error, or `EXECABORT`) answers each increment with that error: none was
/// applied.
pub fn unmark(
    updates: &[Update],
    values: Vec<redis::Value>,
) -> Result<(Vec<redis::Value>, Marked), RoundError> {
    use redis::Value;
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
    let (mut count_replies, marked) = if is_error(&multi) {
        // no transaction: each command ran as it came
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
    Ok((out, marked))
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
    use crate::services::fleet_sync::backend::round::{CountUpdate, LedgerUpdate};
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
        let mark = Mark {
            key: "p:rounds:i",
            seq: 7,
            now_ms: 100_000,
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
        let (v, m) = unmark(&updates, values).unwrap();
        assert_eq!(m, Marked::Applied);
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
        let (v, m) = unmark(&updates, values).unwrap();
        assert_eq!(m, Marked::Refused);
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
        let (v, m) = unmark(&updates, values).unwrap();
        assert_eq!(m, Marked::Unmarked);
        assert_eq!(v, vec![Int(5), script, Int(6)]);
        assert!(unmark(&updates, vec![Okay]).is_err(), "too few answers");
    }
}
