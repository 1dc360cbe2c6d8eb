//! The backend for one Redis server: a round is one pipeline on a connection manager that
//! reconnects by itself.

use super::journal::{Journal, Marked, Repair};
use super::pipeline::{
    finish_counts, first_replies, marked_pipeline, pipeline, unmark, Marks, MarksSeen,
};
use super::round::{
    beat_reply, Beat, CountUpdate, Exchange, Heartbeat, Refusal, ReplyError, RoundError,
    SyncBackend, Update,
};
use super::round::{HashPage, ScanPage};
use super::scan::{counts_on, scan_on};
use super::script::{load_scripts, no_script};
use crate::config::model::{RedisEndpoint, RedisSettings};
use crate::config::redis_client::client;
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// Run a round's pipeline (its errors come back in place, as replies); if the server does not
/// know the scripts (first use, a restart, a failover, `SCRIPT FLUSH`), load them and run once
/// more the calls that it did not know, and only those: a script that was not known ran
/// nothing, while the rest of the pipeline (plain increments) ran, and would count twice if it
/// were sent again. When Redis refuses to load them (an ACL without `+script|load`), that
/// refusal takes the place of each NOSCRIPT reply, so that the round says why.
async fn query_round<C: redis::aio::ConnectionLike>(
    p: &redis::Pipeline,
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::Value>> {
    let mut values: Vec<redis::Value> = p.query_async(conn).await?;
    if !no_script(&values) {
        return Ok(values);
    }
    if let Err(e) = load_scripts(conn).await {
        let Some(refusal) = ReplyError::of_redis(&e) else {
            return Err(e);
        };
        return Ok(refused_load(values, &refusal));
    }
    // (the calls Redis did not know: in pipeline order, as their replies come back)
    let unknown: Vec<bool> = values
        .iter()
        .map(|v| no_script(std::slice::from_ref(v)))
        .collect();
    let mut again = redis::pipe();
    again.ignore_errors();
    for (cmd, _) in p.cmd_iter().zip(&unknown).filter(|(_, &u)| u) {
        again.add_command(cmd.clone());
    }
    let replies: Vec<redis::Value> = again.query_async(conn).await?;
    let places = unknown
        .iter()
        .enumerate()
        .filter(|(_, &u)| u)
        .map(|(i, _)| i);
    for (i, v) in places.zip(replies) {
        values[i] = v;
    }
    Ok(values)
}

/// The replies of a round whose scripts Redis would not load: each NOSCRIPT reply becomes the
/// load's own error reply.
pub(super) fn refused_load(values: Vec<redis::Value>, refusal: &ReplyError) -> Vec<redis::Value> {
    let text = format!("-{}\r\n", refusal.message.replace(['\r', '\n'], " "));
    let replacement = redis::parse_redis_value(text.as_bytes()).ok();
    values
        .into_iter()
        .map(|v| match (&v, &replacement) {
            (redis::Value::ServerError(e), Some(r))
                if e.kind() == Some(redis::ServerErrorKind::NoScript) =>
            {
                r.clone()
            }
            _ => v,
        })
        .collect()
}

/// One Redis server, through a connection manager that reconnects by itself.
pub struct SingleRedis {
    conn: ConnectionManager,
    /// The rounds' plain increments and their marks (`journal`; `None`: not marked).
    journal: Option<parking_lot::Mutex<Journal>>,
}

impl SingleRedis {
    /// `marks`: the key of this instance's marks, when its rounds' plain increments are marked.
    pub fn new(settings: &RedisSettings, marks: Option<String>) -> Result<Self, String> {
        let RedisEndpoint::Single(url) = &settings.endpoint else {
            return Err("not a single-server endpoint".into());
        };
        let client = client(url, &settings.access)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            // one quick retry, so that a refusal (a certificate, a password) comes back
            // within the round's timeout with its reason; rounds themselves retry later
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_secs(1));
        let conn = client
            .get_connection_manager_lazy(config)
            .map_err(|e| e.to_string())?;
        Ok(SingleRedis {
            conn,
            journal: marks
                .map(|k| parking_lot::Mutex::new(Journal::numbered_from(k, unix_ms() * 1000))),
        })
    }

    /// A round with its plain increments marked: first, after an exchange that did not end
    /// with an answer, the check of the kept rounds and the repair (see `journal`).
    async fn marked_exchange(
        &self,
        journal: &parking_lot::Mutex<Journal>,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        let mut conn = self.conn.clone();
        let key = journal.lock().key().to_string();
        let check = journal.lock().wants_check();
        let counts: Vec<CountUpdate> = updates
            .iter()
            .filter_map(|u| match u {
                Update::Count(c) => Some(c.clone()),
                Update::Lease(_) => None,
            })
            .collect();
        let now_ms = unix_ms();
        // kept before anything is sent (see `journal`)
        let seq = journal.lock().begin(counts, now_ms);
        let mut refused_read = None;
        if check {
            match self.check(journal, &key, &mut conn, seq).await {
                Ok(refusal) => refused_read = refusal,
                Err(e) => {
                    // nothing of this round was sent: its increments go with a later one
                    journal.lock().unapplied(seq);
                    return Err(RoundError {
                        unapplied: true,
                        ..e
                    });
                }
            }
        }
        let marks = Marks {
            key: &key,
            mark: seq.map(|seq| (seq, now_ms)),
            probe: journal.lock().probe(),
        };
        match exchange_on(&mut conn, updates, hb, Some(&marks)).await {
            Ok((mut ex, seen)) => {
                note_answer(journal, seq, updates, &mut ex, seen, refused_read);
                Ok(ex)
            }
            Err(e) => {
                if e.unapplied {
                    journal.lock().unapplied(seq);
                }
                Err(e)
            }
        }
    }

    /// Read which kept rounds Redis holds, and send again, in a transaction with its own
    /// mark, what it does not (`current`: the exchange's own round, not sent yet). A refused
    /// read is returned: it stops the marks (the kept rounds are taken as applied, as before
    /// marks); an error without an answer fails the exchange (checked again with the next).
    async fn check(
        &self,
        journal: &parking_lot::Mutex<Journal>,
        key: &str,
        conn: &mut ConnectionManager,
        current: Option<u64>,
    ) -> Result<Option<ReplyError>, RoundError> {
        let read: redis::RedisResult<Vec<u64>> = redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg("-inf")
            .arg("+inf")
            .query_async(conn)
            .await;
        let marks = match read {
            Ok(m) => m,
            Err(e) => return ReplyError::of_redis(&e).map(Some).ok_or_else(|| e.into()),
        };
        let now_ms = unix_ms();
        let (kept, repair) = {
            let mut j = journal.lock();
            (j.kept(), j.repair(&marks, now_ms, current))
        };
        log::debug!(
            "redis: check: {} mark(s) held, {} round(s) of {} count(s) kept: {repair:?}",
            marks.len(),
            kept.0,
            kept.1
        );
        let (seq, again) = match repair {
            Repair::Nothing => return Ok(None),
            Repair::Emptied { rounds } => {
                log::warn!("redis: the server holds none of this instance's round marks (restarted without its data?); {rounds} round(s) not sent again: each count comes back with its record's next report");
                return Ok(None);
            }
            Repair::Again(seq, again) => (seq, again),
        };
        let repair: Vec<Update> = again.into_iter().map(Update::Count).collect();
        let (marked, keys) = send_repair(conn, key, (seq, now_ms), &repair).await?;
        let sent = repair.len() - keys.len();
        let mut j = journal.lock();
        match marked {
            // none of it ran: it stays, without an answer, for the next check (the ledger
            // took these counts as sent long ago: nobody else sends them)
            Marked::Refused => j.lost_sight(),
            _ => {
                j.answered(Some(seq), marked, &keys, unix_ms());
                // the increments refused one by one: kept again, without a mark
                let again: Vec<CountUpdate> = repair
                    .iter()
                    .filter_map(|u| match u {
                        Update::Count(c) if keys.contains(&c.key.as_str()) => Some(c.clone()),
                        _ => None,
                    })
                    .collect();
                j.requeue(again, unix_ms());
            }
        }
        drop(j);
        if marked == Marked::Applied && sent > 0 {
            log::info!("redis: {sent} count(s) of rounds the server did not hold sent again");
        }
        Ok(None)
    }
}

/// What a marked round's answer tells the journal (`seq`: its round): the increments Redis
/// refused one by one, its mark, whether the probed mark was there; a refusal of the marks' own
/// commands (`refused_read`: the check's) stops them, and is counted with the round's.
fn note_answer(
    journal: &parking_lot::Mutex<Journal>,
    seq: Option<u64>,
    updates: &[Update],
    ex: &mut Exchange,
    seen: Option<MarksSeen>,
    refused_read: Option<ReplyError>,
) {
    let refused: Vec<&str> = ex
        .refused
        .iter()
        .filter_map(|r| updates.get(r.update?))
        .filter(|u| matches!(u, Update::Count(_)))
        .map(|u| u.key())
        .collect();
    let MarksSeen {
        marked,
        probe_held,
        refusal,
    } = seen.unwrap_or(MarksSeen {
        marked: Marked::Applied,
        probe_held: None,
        refusal: None,
    });
    let mut j = journal.lock();
    j.answered(seq, marked, &refused, unix_ms());
    j.settled();
    if probe_held == Some(false) {
        // the server lost a round it answered, with no round failing (a replica promoted
        // under a connection that came back by itself): check next time
        j.lost_sight();
    }
    let refusal = refused_read.or(refusal);
    let stop = marked == Marked::Unmarked || refusal.is_some();
    if stop {
        j.turn_off();
    }
    drop(j);
    if stop {
        log::warn!(
            "redis: a round's plain increments could not be marked ({}); they go unmarked from now on, and a failover may lose some (the user's ACL needs +multi +exec +zrangebyscore)",
            refusal.as_ref().map_or("a mark's command failed", |r| r.message.as_str())
        );
    }
    // counted and shown as any error reply (the heartbeat's place: no update's)
    if let Some(error) = refusal {
        ex.refused.push(Refusal {
            update: None,
            error,
        });
    }
}

/// Send a repair (`mark`: its number and time) in its own transaction, each increment with its
/// expiry (the key may be gone with the round it repeats): what became of its mark, and the
/// keys of the increments Redis refused one by one.
async fn send_repair<'a>(
    conn: &mut ConnectionManager,
    key: &str,
    mark: (u64, u64),
    repair: &'a [Update],
) -> Result<(Marked, Vec<&'a str>), RoundError> {
    let marks = Marks {
        key,
        mark: Some(mark),
        probe: None,
    };
    let mut p = marked_pipeline(repair, None, &marks);
    p.ignore_errors();
    let values: Vec<redis::Value> = p.query_async(conn).await?;
    let (values, MarksSeen { marked, .. }) = unmark(repair, values, &marks)?;
    let mut answers = vec![None; repair.len()];
    let mut refused = Vec::new();
    let pending = first_replies(repair, 0..repair.len(), &values, &mut answers, &mut refused)?;
    finish_counts(conn, repair, pending, &mut answers, &mut refused).await?;
    let keys = refused
        .iter()
        .filter_map(|r| repair.get(r.update?))
        .map(|u| u.key())
        .collect();
    Ok((marked, keys))
}

/// The time marks are scored by (unix ms).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[async_trait]
impl SyncBackend for SingleRedis {
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        match &self.journal {
            Some(j) if !j.lock().is_off() => self.marked_exchange(j, updates, hb).await,
            _ => Ok(exchange_on(&mut self.conn.clone(), updates, hb, None)
                .await?
                .0),
        }
    }

    async fn invoke(&self, call: &redis::ScriptInvocation<'_>) -> Result<redis::Value, RoundError> {
        Ok(call.invoke_async(&mut self.conn.clone()).await?)
    }

    async fn scan(
        &self,
        _server: usize,
        cursor: u64,
        pattern: &str,
        count: u64,
    ) -> Result<ScanPage, RoundError> {
        scan_on(&mut self.conn.clone(), cursor, pattern, count).await
    }

    async fn hscan(&self, key: &str, cursor: u64, count: u64) -> Result<HashPage, RoundError> {
        super::scan::hscan_on(&mut self.conn.clone(), key, cursor, count).await
    }

    async fn hash_counts(
        &self,
        key: &str,
        fields: &[&str],
    ) -> Result<Vec<Option<u64>>, RoundError> {
        super::scan::hash_counts_on(&mut self.conn.clone(), key, fields).await
    }

    async fn counts(
        &self,
        _server: usize,
        keys: &[String],
    ) -> Result<Vec<Option<u64>>, RoundError> {
        counts_on(&mut self.conn.clone(), keys).await
    }
}

/// A round on one server's connection: the pipeline (with `marks`, see `journal`), the
/// scripts loaded if it did not know them, the replies sorted into answers and refusals, the
/// plain increments' expiries; and what became of the marks.
pub(super) async fn exchange_on<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    updates: &[Update],
    hb: Option<&Heartbeat>,
    marks: Option<&Marks<'_>>,
) -> Result<(Exchange, Option<MarksSeen>), RoundError> {
    let mut p = match marks {
        Some(m) => marked_pipeline(updates, hb, m),
        None => pipeline(updates.iter(), hb),
    };
    // each command's error in its place: a command Redis refused (a full Redis with
    // `noeviction`: OOM; a replica: READONLY; an ACL: NOPERM; an error in the script) was
    // not applied, the others were
    p.ignore_errors();
    let values = query_round(&p, conn).await?;
    let (mut values, seen) = match marks {
        Some(m) => {
            let (v, seen) = unmark(updates, values, m)?;
            (v, Some(seen))
        }
        None => (values, None),
    };
    let n = updates.len() + hb.map_or(0, Heartbeat::replies);
    if values.len() != n {
        return Err(format!("expected {n} answers, got {}", values.len()).into());
    }
    let mut refused = Vec::new();
    let replies = values.split_off(updates.len());
    let mut told = Beat::default();
    if let Some(hb) = hb {
        let (beat, error) = beat_reply(hb, &replies);
        told = beat;
        refused.extend(error.map(|error| Refusal {
            update: None,
            error,
        }));
    }
    // the refused updates have no answer: they go again with a later round, and their
    // counters fall back to `on_failure` meanwhile
    let mut answers = vec![None; updates.len()];
    let pending = first_replies(
        updates,
        0..updates.len(),
        &values,
        &mut answers,
        &mut refused,
    )?;
    finish_counts(conn, updates, pending, &mut answers, &mut refused).await?;
    let ex = Exchange {
        answers,
        instances: told.instances,
        adjusted: told.adjusted,
        waited: told.waited,
        unheard: told.unheard,
        unpublished: told.unpublished,
        refused,
        ..Exchange::default()
    };
    Ok((ex, seen))
}
