//! The backend for one Redis server: a round is one pipeline on a connection manager that
//! reconnects by itself.

use super::pipeline::{finish_counts, first_replies, pipeline};
use super::round::{
    adjusted_reply, heartbeat_reply, Exchange, Heartbeat, Refusal, ReplyError, RoundError,
    SyncBackend, Update, HEARTBEAT_REPLIES,
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
}

impl SingleRedis {
    pub fn new(settings: &RedisSettings) -> Result<Self, String> {
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
        Ok(SingleRedis { conn })
    }
}

#[async_trait]
impl SyncBackend for SingleRedis {
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        exchange_on(&mut self.conn.clone(), updates, hb).await
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

/// A round on one server's connection: the pipeline, the scripts loaded if it did not know
/// them, the replies sorted into answers and refusals, the plain increments' expiries.
pub(super) async fn exchange_on<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    updates: &[Update],
    hb: Option<&Heartbeat>,
) -> Result<Exchange, RoundError> {
    let mut p = pipeline(updates.iter(), hb);
    // each command's error in its place: a command Redis refused (a full Redis with
    // `noeviction`: OOM; a replica: READONLY; an ACL: NOPERM; an error in the script) was
    // not applied, the others were
    p.ignore_errors();
    let mut values = query_round(&p, conn).await?;
    let n = updates.len() + if hb.is_some() { HEARTBEAT_REPLIES } else { 0 };
    if values.len() != n {
        return Err(format!("expected {n} answers, got {}", values.len()).into());
    }
    let mut refused = Vec::new();
    let beat = values.split_off(updates.len());
    let instances = match hb.map(|_| heartbeat_reply(&beat)) {
        Some(Ok(n)) => n,
        Some(Err(error)) => {
            refused.push(Refusal {
                update: None,
                error,
            });
            None
        }
        None => None,
    };
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
    Ok(Exchange {
        answers,
        instances,
        adjusted: hb.and_then(|_| adjusted_reply(&beat)),
        refused,
        ..Exchange::default()
    })
}
