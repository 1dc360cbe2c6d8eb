//! Where counts go: one pipelined round trip per round. Each counter is an atomic Lua script
//! (INCRBY, then PEXPIREAT at an absolute time every instance computes alike, so no key is
//! ever left without a TTL); the round ends with the heartbeat that counts live instances.

use crate::config::model::{RedisEndpoint, RedisSettings};
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// One counter's increment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Increment {
    pub key: String,
    pub delta: u64,
    /// Unix ms at which the key expires.
    pub expire_at_ms: u64,
}

/// This instance's heartbeat.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub key: String,
    pub instance: String,
    pub now_ms: u64,
    /// Instances not heard from for this long are no longer counted.
    pub liveness_ms: u64,
}

#[async_trait]
pub trait SyncBackend: Send + Sync {
    /// Apply the increments; return each counter's fleet total and the live instance count.
    async fn exchange(&self, incs: &[Increment], hb: &Heartbeat)
        -> Result<(Vec<u64>, u64), String>;
}

pub const INCR_SCRIPT: &str = "local v = redis.call('INCRBY', KEYS[1], ARGV[1]) \
redis.call('PEXPIREAT', KEYS[1], ARGV[2]) return v";

pub const HEARTBEAT_SCRIPT: &str = "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) \
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[3]) \
redis.call('PEXPIRE', KEYS[1], ARGV[4]) return redis.call('ZCARD', KEYS[1])";

/// How long the heartbeat set outlives its last writer.
pub const HEARTBEAT_TTL_MS: u64 = 60_000;

fn add_increment(p: &mut redis::Pipeline, i: &Increment) {
    p.cmd("EVAL")
        .arg(INCR_SCRIPT)
        .arg(1)
        .arg(&i.key)
        .arg(i.delta)
        .arg(i.expire_at_ms);
}

fn add_heartbeat(p: &mut redis::Pipeline, hb: &Heartbeat) {
    p.cmd("EVAL")
        .arg(HEARTBEAT_SCRIPT)
        .arg(1)
        .arg(&hb.key)
        .arg(hb.now_ms)
        .arg(&hb.instance)
        .arg(hb.liveness_ms)
        .arg(HEARTBEAT_TTL_MS);
}

/// The round's pipeline for one server: every increment, then the heartbeat.
pub fn pipeline(incs: &[Increment], hb: &Heartbeat) -> redis::Pipeline {
    let mut p = redis::pipe();
    incs.iter().for_each(|i| add_increment(&mut p, i));
    add_heartbeat(&mut p, hb);
    p
}

fn split_reply(mut values: Vec<i64>, n: usize) -> Result<(Vec<u64>, u64), String> {
    if values.len() != n + 1 {
        return Err(format!("expected {} answers, got {}", n + 1, values.len()));
    }
    let instances = values.pop().unwrap_or(1).max(1) as u64;
    Ok((
        values.into_iter().map(|v| v.max(0) as u64).collect(),
        instances,
    ))
}

/// Check the endpoint's URLs (no connection is made; usable before a runtime exists).
pub fn check(settings: &RedisSettings) -> Result<(), String> {
    let urls = match &settings.endpoint {
        RedisEndpoint::Single(u) => std::slice::from_ref(u),
        RedisEndpoint::Cluster(n) => n.as_slice(),
    };
    for u in urls {
        redis::Client::open(u.as_str()).map_err(|e| format!("{u}: {e}"))?;
    }
    Ok(())
}

/// The backend for the configured endpoint. Call inside the runtime: connections are made
/// lazily and in the background.
pub fn make(settings: &RedisSettings) -> Result<Box<dyn SyncBackend>, String> {
    Ok(match &settings.endpoint {
        RedisEndpoint::Single(_) => Box::new(SingleRedis::new(settings)?),
        RedisEndpoint::Cluster(_) => Box::new(ClusterRedis::new(settings)?),
    })
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
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(1)
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
        incs: &[Increment],
        hb: &Heartbeat,
    ) -> Result<(Vec<u64>, u64), String> {
        let mut conn = self.conn.clone();
        let values: Vec<i64> = pipeline(incs, hb)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        split_reply(values, incs.len())
    }
}

/// A Redis Cluster: the slot map is read from `CLUSTER SLOTS` and kept until a round fails;
/// each round sends one pipeline to each master that owns some of the keys, all at once.
/// Keys carry the `{partition}` hash tag, so a tenant's counters share a slot.
pub struct ClusterRedis {
    seeds: Vec<String>,
    timeout: Duration,
    topology: tokio::sync::Mutex<Option<Topology>>,
}

struct Topology {
    /// (first slot, last slot, index into `nodes`)
    slots: Vec<(u16, u16, usize)>,
    nodes: Vec<redis::aio::MultiplexedConnection>,
}

impl Topology {
    fn node_of(&self, key: &str) -> Option<usize> {
        let slot = key_slot(key.as_bytes());
        self.slots
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .map(|(_, _, n)| *n)
    }
}

/// CRC16 (XMODEM), as Redis Cluster computes key slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key: of its `{hash tag}` if it has a non-empty one.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    }
}

impl ClusterRedis {
    pub fn new(settings: &RedisSettings) -> Result<Self, String> {
        let RedisEndpoint::Cluster(seeds) = &settings.endpoint else {
            return Err("not a cluster endpoint".into());
        };
        Ok(ClusterRedis {
            seeds: seeds.clone(),
            timeout: settings.timeout,
            topology: tokio::sync::Mutex::new(None),
        })
    }

    async fn connect(&self, url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())
    }

    /// Read the slot map from the first seed that answers, and connect to every master.
    async fn discover(&self) -> Result<Topology, String> {
        let mut last_error = String::from("no seed nodes");
        for seed in &self.seeds {
            let mut conn = match self.connect(seed).await {
                Ok(c) => c,
                Err(e) => {
                    last_error = e;
                    continue;
                }
            };
            let reply: redis::Value = match redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await
            {
                Ok(v) => v,
                Err(e) => {
                    last_error = e.to_string();
                    continue;
                }
            };
            let redis::Value::Array(ranges) = reply else {
                return Err("unexpected CLUSTER SLOTS answer".into());
            };
            let scheme = if seed.starts_with("rediss://") {
                "rediss"
            } else {
                "redis"
            };
            let mut addrs: Vec<String> = Vec::new();
            let mut slots = Vec::new();
            for r in ranges {
                let redis::Value::Array(parts) = r else {
                    continue;
                };
                let (Some(a), Some(b), Some(redis::Value::Array(master))) = (
                    parts.first().and_then(int),
                    parts.get(1).and_then(int),
                    parts.get(2),
                ) else {
                    continue;
                };
                let (Some(host), Some(port)) =
                    (master.first().and_then(text), master.get(1).and_then(int))
                else {
                    continue;
                };
                let addr = format!("{scheme}://{host}:{port}");
                let idx = addrs.iter().position(|x| *x == addr).unwrap_or_else(|| {
                    addrs.push(addr.clone());
                    addrs.len() - 1
                });
                slots.push((a as u16, b as u16, idx));
            }
            let mut nodes = Vec::with_capacity(addrs.len());
            for a in &addrs {
                nodes.push(self.connect(a).await?);
            }
            return Ok(Topology { slots, nodes });
        }
        Err(last_error)
    }
}

#[async_trait]
impl SyncBackend for ClusterRedis {
    async fn exchange(
        &self,
        incs: &[Increment],
        hb: &Heartbeat,
    ) -> Result<(Vec<u64>, u64), String> {
        let mut guard = self.topology.lock().await;
        if guard.is_none() {
            *guard = Some(self.discover().await?);
        }
        let Some(topo) = guard.as_ref() else {
            return Err("no cluster topology".into());
        };
        // group by master: one pipeline (one round trip) per node
        let hb_node = topo
            .node_of(&hb.key)
            .ok_or("no node for the heartbeat slot")?;
        let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); topo.nodes.len()];
        for (i, inc) in incs.iter().enumerate() {
            let n = topo.node_of(&inc.key).ok_or("no node for a key's slot")?;
            per_node[n].push(i);
        }
        let mut tasks = Vec::new();
        for (n, idxs) in per_node.iter().enumerate() {
            if idxs.is_empty() && n != hb_node {
                continue;
            }
            let mut p = redis::pipe();
            idxs.iter().for_each(|&i| add_increment(&mut p, &incs[i]));
            if n == hb_node {
                add_heartbeat(&mut p, hb);
            }
            let mut conn = topo.nodes[n].clone();
            tasks.push((
                n,
                tokio::spawn(async move { p.query_async::<Vec<i64>>(&mut conn).await }),
            ));
        }
        let mut totals = vec![0u64; incs.len()];
        let mut instances = 1;
        let mut failed = None;
        for (n, task) in tasks {
            match task.await {
                Ok(Ok(values)) => {
                    for (k, &i) in per_node[n].iter().enumerate() {
                        totals[i] = values.get(k).copied().unwrap_or(0).max(0) as u64;
                    }
                    if n == hb_node {
                        instances = values.last().copied().unwrap_or(1).max(1) as u64;
                    }
                }
                Ok(Err(e)) => failed = Some(e.to_string()),
                Err(e) => failed = Some(e.to_string()),
            }
        }
        if let Some(e) = failed {
            // slots may have moved or a node is gone: read the map again next round
            *guard = None;
            return Err(e);
        }
        Ok((totals, instances))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // reference values from the Redis Cluster specification / CLUSTER KEYSLOT
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"tollgate:{acme}:r:0:10"), key_slot(b"acme"));
        assert_eq!(
            key_slot(b"a{}b"),
            key_slot(b"a{}b"),
            "empty tag: the whole key"
        );
    }

    #[test]
    fn replies_split_into_totals_and_instances() {
        assert_eq!(split_reply(vec![5, 7, 3], 2).unwrap(), (vec![5, 7], 3));
        assert!(split_reply(vec![5], 2).is_err());
    }
}
