//! The backend for a Redis Cluster: a round is one pipeline per slot, sent to the slots'
//! masters at once, and a node that does not answer holds up only its own slots.

use super::pipeline::{finish_counts, first_replies, pipeline};
use super::round::{
    beat_reply, Beat, Exchange, Heartbeat, Refusal, Reply, ReplyError, RoundError, SyncBackend,
    Update,
};
use super::round::{HashPage, ScanPage};
use super::script::{no_script, sources};
use super::single::refused_load;
use crate::config::model::{RedisEndpoint, RedisSettings};
use crate::config::redis_client::tls_crypto;
use async_trait::async_trait;
use std::collections::HashMap;
use std::time::Duration;

/// A Redis Cluster, through the `redis` crate's cluster client (it reads the slot map, follows
/// failovers and MOVED answers, and keeps one multiplexed connection per node). Keys carry the
/// `{partition}` hash tag, so a tenant's keys share a slot; a round sends one pipeline per slot,
/// all at once (the client multiplexes them on each node's connection), each bounded by the
/// timeout. A node that does not answer holds up only its own slots: the others' answers are
/// applied, and its counts wait for a later round (rounds are idempotent). The client retries
/// nothing itself (`retries(0)`): a round is sent again whole by the next round, so that a
/// request is never applied twice; an answer that the map is stale (MOVED) makes it read the
/// map again before the next one.
pub struct ClusterRedis {
    client: redis::cluster::ClusterClient,
    timeout: Duration,
    /// Made at the first round (the gateway starts with the cluster down as with it up).
    conn: tokio::sync::Mutex<Option<redis::cluster_async::ClusterConnection>>,
    /// The slots whose last round did not answer.
    down: parking_lot::Mutex<std::collections::HashSet<redis::cluster_routing::Slot>>,
}

impl ClusterRedis {
    pub fn new(settings: &RedisSettings) -> Result<Self, String> {
        let RedisEndpoint::Cluster(seeds) = &settings.endpoint else {
            return Err("not a cluster endpoint".into());
        };
        let access = &settings.access;
        tls_crypto();
        let mut infos = Vec::with_capacity(seeds.len());
        for url in seeds {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| e.to_string())?;
            // no `CLIENT SETINFO` at connect: one command fewer for the ACL docs/operations.md gives
            let login = info.redis_settings().clone().set_skip_set_lib_name();
            infos.push(info.set_redis_settings(login));
        }
        // a user or password in a seed's URL applies to every node, as the client does
        let mut b = redis::cluster::ClusterClientBuilder::new(infos)
            .connection_timeout(settings.timeout)
            .response_timeout(settings.timeout)
            .retries(0);
        if let Some(user) = &access.username {
            b = b.username(user);
        }
        if let Some(password) = &access.password {
            b = b.password(password);
        }
        if let Some(certs) = crate::config::redis_client::tls_certificates(access) {
            b = b.certs(certs);
        }
        Ok(ClusterRedis {
            client: b.build().map_err(|e| e.to_string())?,
            timeout: settings.timeout,
            conn: tokio::sync::Mutex::new(None),
            down: Default::default(),
        })
    }

    /// The cluster connection, made now if it is not yet (reading the slot map from a seed).
    async fn connection(&self) -> Result<redis::cluster_async::ClusterConnection, RoundError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let made = tokio::time::timeout(self.timeout * 2, self.client.get_async_connection())
            .await
            .map_err(|_| RoundError {
                message: format!("no cluster node answered within {:?}", self.timeout * 2),
                unapplied: true,
            })?
            .map_err(|e| RoundError {
                message: e.to_string(),
                // nothing was sent yet
                unapplied: true,
            })?;
        *guard = Some(made.clone());
        Ok(made)
    }

    /// Note which slots answered this round (`heard`) and which did not. Returns how many are
    /// down now.
    fn note_down(&self, heard: Vec<(redis::cluster_routing::Slot, bool)>) -> usize {
        let mut down = self.down.lock();
        for (slot, ok) in heard {
            if ok {
                down.remove(&slot);
            } else {
                down.insert(slot);
            }
        }
        down.len()
    }
}

/// One slot's pipeline on the cluster connection (loading the script on that slot's master if
/// it does not know it): its replies, in order.
async fn query_slot(
    conn: &mut redis::cluster_async::ClusterConnection,
    p: &redis::Pipeline,
    n: usize,
    route: redis::cluster_routing::Route,
) -> redis::RedisResult<Vec<redis::Value>> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let to = || SingleNodeRoutingInfo::SpecificNode(route);
    // the cluster client answers a pipeline's replies as they are, errors included
    match conn.route_pipeline(p.clone(), 0, n, to()).await {
        Ok(values) if no_script(&values) => {
            // a script that was not known ran nothing: the pipeline goes again whole (a slot's
            // pipeline holds no plain increment, which would count twice: on a cluster every
            // record leases)
            for source in sources() {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(source);
                if let Err(e) = conn
                    .route_command(load, RoutingInfo::SingleNode(to()))
                    .await
                {
                    // refused (an ACL without `+script|load`): the round says why
                    return match ReplyError::of_redis(&e) {
                        Some(refusal) => Ok(refused_load(values, &refusal)),
                        None => Err(e),
                    };
                }
            }
            conn.route_pipeline(p.clone(), 0, n, to()).await
        }
        r => r,
    }
}

/// What one slot's pipeline got back: the answers by the slot's own indexes, what its
/// heartbeat told (when it carried it), and the refusals.
type SlotAnswers = (Vec<Option<Reply>>, Beat, Vec<Refusal>);

/// One slot's pipeline (`n` replies expected) to its master, bounded by `timeout`; `hb`:
/// the heartbeat it carries.
async fn exchange_slot(
    mut conn: redis::cluster_async::ClusterConnection,
    slot: redis::cluster_routing::Slot,
    (p, n): (redis::Pipeline, usize),
    (mine, hb): (Vec<Update>, Option<Heartbeat>),
    timeout: Duration,
) -> Result<SlotAnswers, RoundError> {
    use redis::cluster_routing::{Route, SlotAddr};
    let run = async {
        let route = Route::with_slot(slot, SlotAddr::Master);
        let values = query_slot(&mut conn, &p, n, route).await?;
        if values.len() != n {
            return Err(format!("expected {n} answers, got {}", values.len()).into());
        }
        let mut answers = vec![None; mine.len()];
        let mut refused = Vec::new();
        let (values, beat) = values.split_at(mine.len());
        let pending = first_replies(&mine, 0..mine.len(), values, &mut answers, &mut refused)?;
        finish_counts(&mut conn, &mine, pending, &mut answers, &mut refused).await?;
        let mut told = Beat::default();
        if let Some(hb) = &hb {
            let (beat, error) = beat_reply(hb, beat);
            told = beat;
            refused.extend(error.map(|error| Refusal {
                update: None,
                error,
            }));
        }
        Ok::<_, RoundError>((answers, told, refused))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| RoundError::from(format!("no answer within {timeout:?}")))
        .and_then(|r| r)
}

/// A slot's answers into the round's (`idxs`: the round's index of each of the slot's).
fn merge_slot(out: &mut Exchange, idxs: &[usize], with_hb: bool, answered: SlotAnswers) {
    let (answers, told, refused) = answered;
    for (k, &i) in idxs.iter().enumerate() {
        out.answers[i] = answers.get(k).copied().flatten();
    }
    // the slot's own indexes, back to the round's
    out.refused.extend(refused.into_iter().map(|r| Refusal {
        update: r.update.and_then(|k| idxs.get(k).copied()),
        error: r.error,
    }));
    if with_hb {
        out.instances = told.instances;
        out.adjusted = told.adjusted;
        out.waited = told.waited;
        out.unheard = told.unheard;
        out.unpublished = told.unpublished;
    }
    out.slots_answered += 1;
}

#[async_trait]
impl SyncBackend for ClusterRedis {
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        use redis::cluster_routing::Slot;
        let conn = self.connection().await?;
        // group by slot: one pipeline each (a pipeline may not cross slots)
        let mut slots: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, u) in updates.iter().enumerate() {
            slots.entry(Slot::for_key(u.key())).or_default().push(i);
        }
        let hb_slot = hb.map(|hb| Slot::for_key(&hb.key));
        if let Some(s) = hb_slot {
            slots.entry(s).or_default();
        }
        let mut tasks = Vec::with_capacity(slots.len());
        for (slot, idxs) in slots {
            let with_hb = hb.filter(|_| Some(slot) == hb_slot);
            let p = pipeline(idxs.iter().filter_map(|&i| updates.get(i)), with_hb);
            let n = idxs.len() + with_hb.map_or(0, Heartbeat::replies);
            let mine: Vec<Update> = idxs
                .iter()
                .filter_map(|&i| updates.get(i).cloned())
                .collect();
            let task = tokio::spawn(exchange_slot(
                conn.clone(),
                slot,
                (p, n),
                (mine, with_hb.cloned()),
                self.timeout,
            ));
            tasks.push((slot, idxs, with_hb.is_some(), task));
        }
        let mut out = Exchange {
            answers: vec![None; updates.len()],
            ..Exchange::default()
        };
        let mut last_error = None;
        let mut heard = Vec::with_capacity(tasks.len());
        for (slot, idxs, with_hb, task) in tasks {
            let result = task
                .await
                .map_err(|e| RoundError::from(e.to_string()))
                .and_then(|r| r);
            match result {
                Ok(answered) => {
                    merge_slot(&mut out, &idxs, with_hb, answered);
                    heard.push((slot, true));
                }
                Err(e) => {
                    out.slots_failed += 1;
                    heard.push((slot, false));
                    last_error = Some(e);
                }
            }
        }
        out.slots_down = self.note_down(heard);
        match last_error {
            Some(e) if out.slots_answered == 0 => Err(e),
            Some(e) => {
                out.slot_error = Some(e.message);
                Ok(out)
            }
            None => Ok(out),
        }
    }

    fn deadline(&self, timeout: Duration) -> Duration {
        // the connection first (a seed's connect and the slot map), then the slots' answers
        timeout * 3 + timeout / 2
    }

    async fn invoke(&self, call: &redis::ScriptInvocation<'_>) -> Result<redis::Value, RoundError> {
        // (the client sends it to the master of its keys' slot)
        let mut conn = self.connection().await?;
        Ok(call.invoke_async(&mut conn).await?)
    }

    async fn servers(&self) -> Result<usize, RoundError> {
        Ok(self.primaries().await?.len())
    }

    async fn scan(
        &self,
        server: usize,
        cursor: u64,
        pattern: &str,
        count: u64,
    ) -> Result<ScanPage, RoundError> {
        use redis::cluster_routing::RoutingInfo;
        let node = self.primary(server).await?;
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let mut conn = self.connection().await?;
        let v = conn
            .route_command(scan, RoutingInfo::SingleNode(node))
            .await?;
        let (cursor, keys): (u64, Vec<String>) =
            redis::from_redis_value(v).map_err(|e| RoundError::from(e.to_string()))?;
        Ok(ScanPage { keys, cursor })
    }

    async fn counts_by_key(&self, keys: &[String]) -> Result<Vec<Option<u64>>, RoundError> {
        // one at a time, each to the master of its slot (the client routes a command by its key)
        let mut conn = self.connection().await?;
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            let v: Option<String> = redis::cmd("GET").arg(k).query_async(&mut conn).await?;
            out.push(v.and_then(|s| s.parse().ok()));
        }
        Ok(out)
    }

    async fn hscan(&self, key: &str, cursor: u64, count: u64) -> Result<HashPage, RoundError> {
        super::scan::hscan_on(&mut self.connection().await?, key, cursor, count).await
    }

    async fn hash_counts(
        &self,
        key: &str,
        fields: &[&str],
    ) -> Result<Vec<Option<u64>>, RoundError> {
        super::scan::hash_counts_on(&mut self.connection().await?, key, fields).await
    }

    async fn counts(&self, server: usize, keys: &[String]) -> Result<Vec<Option<u64>>, RoundError> {
        let node = self.primary(server).await?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for k in keys {
            p.cmd("GET").arg(k);
        }
        let mut conn = self.connection().await?;
        let values = conn.route_pipeline(p, 0, keys.len(), node).await?;
        // an error reply (a slot moved meanwhile) is the read's error, not a missing key
        values
            .into_iter()
            .map(|v| match v {
                redis::Value::ServerError(e) => Err(RoundError::from(format!("{e:?}"))),
                v => Ok(redis::from_redis_value::<Option<String>>(v)
                    .ok()
                    .flatten()
                    .and_then(|s| s.parse().ok())),
            })
            .collect()
    }
}

impl ClusterRedis {
    /// Primary `server` of `primaries`; an error when there is none such any more (the
    /// cluster's primaries changed since the reader counted them).
    async fn primary(
        &self,
        server: usize,
    ) -> Result<redis::cluster_routing::SingleNodeRoutingInfo, RoundError> {
        self.primaries().await?.into_iter().nth(server).ok_or_else(|| {
            RoundError::from(format!(
                "the cluster's primaries changed during the read (no primary {server} now): start again"
            ))
        })
    }

    /// The cluster's primaries (`CLUSTER SLOTS`), by address, sorted: a scan visits them in
    /// this order.
    async fn primaries(
        &self,
    ) -> Result<Vec<redis::cluster_routing::SingleNodeRoutingInfo>, RoundError> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let mut conn = self.connection().await?;
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let v = conn
            .route_command(
                slots,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        let mut out: Vec<(String, u16)> = Vec::new();
        if let redis::Value::Array(ranges) = v {
            for range in ranges {
                // [start, end, [host, port, id, ...] (the primary), replicas...]
                let redis::Value::Array(fields) = range else {
                    continue;
                };
                if let Some(redis::Value::Array(node)) = fields.get(2) {
                    let host = node
                        .first()
                        .and_then(|h| redis::from_redis_value_ref(h).ok());
                    let port = node
                        .get(1)
                        .and_then(|p| redis::from_redis_value_ref(p).ok());
                    if let (Some(host), Some(port)) = (host, port) {
                        out.push((host, port));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out
            .into_iter()
            .map(|(host, port)| SingleNodeRoutingInfo::ByAddress { host, port })
            .collect())
    }
}
