//! One round's pipeline for one server: the updates (a lease ask runs the ledger script, a
//! plain increment its first step), the heartbeat, and the reading of the first replies and
//! of the later steps.

use super::round::{
    answer, count_cmd, count_reply, count_start, Heartbeat, Refusal, Reply, ReplyError, RoundError,
    Update, HEARTBEAT_TTL_MS,
};
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
