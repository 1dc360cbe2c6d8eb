//! The backend for a primary that Redis Sentinel names: the sentinels are asked where the
//! primary is (`SENTINEL MASTERS`, then `ROLE` on it, by the `redis` crate's Sentinel
//! client), and rounds go to it as to one server, until a round fails or the server answers
//! that it is a replica (READONLY: a failover demoted it); the next round asks the sentinels
//! again. A round in between has nowhere to go and fails: its counters fall back to
//! `on_failure`, and their cumulative reports reach the new primary with the next round.

use super::round::{ErrorKind, Exchange, Heartbeat, RoundError, SyncBackend, Update};
use super::round::{HashPage, ScanPage};
use super::scan::{counts_on, scan_on};
use super::single::exchange_on;
use crate::config::model::{RedisEndpoint, RedisSettings};
use crate::config::redis_client::sentinel_client;
use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use std::time::Duration;

/// A primary found through Redis Sentinel.
pub struct SentinelRedis {
    /// Asks the sentinels; one question at a time.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the primary they named last, until it fails.
    primary: std::sync::Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl SentinelRedis {
    pub fn new(settings: &RedisSettings) -> Result<Self, String> {
        let RedisEndpoint::Sentinel { master, nodes } = &settings.endpoint else {
            return Err("not a sentinel endpoint".into());
        };
        Ok(SentinelRedis {
            sentinels: tokio::sync::Mutex::new(sentinel_client(master, nodes, &settings.access)?),
            primary: std::sync::Mutex::new(None),
            timeout: settings.timeout,
        })
    }

    /// The connection to the primary: the one in use, or one to where the sentinels say it
    /// is now (each step within the timeout).
    async fn primary(&self) -> Result<MultiplexedConnection, RoundError> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let ask = async {
            let mut sentinels = self.sentinels.lock().await;
            sentinels.get_async_connection_with_config(&config).await
        };
        // the sentinels, then the primary's ROLE, then the connection: three steps
        let conn = match tokio::time::timeout(self.timeout * 3, ask).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(RoundError {
                    message: format!("no primary from the sentinels: {e}"),
                    unapplied: true,
                })
            }
            Err(_) => {
                return Err(RoundError {
                    message: format!(
                        "no primary from the sentinels within {:?}",
                        self.timeout * 3
                    ),
                    unapplied: true,
                })
            }
        };
        if let Ok(mut slot) = self.primary.lock() {
            *slot = Some(conn.clone());
        }
        Ok(conn)
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.primary.lock().ok().and_then(|c| c.clone())
    }

    fn forget(&self) {
        if let Ok(mut slot) = self.primary.lock() {
            *slot = None;
        }
    }
}

#[async_trait]
impl SyncBackend for SentinelRedis {
    async fn exchange(
        &self,
        updates: &[Update],
        hb: Option<&Heartbeat>,
    ) -> Result<Exchange, RoundError> {
        let mut conn = self.primary().await?;
        let result = exchange_on(&mut conn, updates, hb, None)
            .await
            .map(|(ex, _)| ex);
        let demoted = |e: &Exchange| {
            e.refused
                .iter()
                .any(|r| r.error.kind == ErrorKind::ReadOnly)
        };
        if result.as_ref().map_or(true, demoted) {
            self.forget();
        }
        result
    }

    async fn invoke(&self, call: &redis::ScriptInvocation<'_>) -> Result<redis::Value, RoundError> {
        let mut conn = self.primary().await?;
        let result = call.invoke_async(&mut conn).await;
        if result.is_err() {
            self.forget();
        }
        Ok(result?)
    }

    async fn scan(
        &self,
        _server: usize,
        cursor: u64,
        pattern: &str,
        count: u64,
    ) -> Result<ScanPage, RoundError> {
        let result = scan_on(&mut self.primary().await?, cursor, pattern, count).await;
        if result.is_err() {
            self.forget();
        }
        result
    }

    async fn hscan(&self, key: &str, cursor: u64, count: u64) -> Result<HashPage, RoundError> {
        let result = super::scan::hscan_on(&mut self.primary().await?, key, cursor, count).await;
        if result.is_err() {
            self.forget();
        }
        result
    }

    async fn hash_counts(
        &self,
        key: &str,
        fields: &[&str],
    ) -> Result<Vec<Option<u64>>, RoundError> {
        let result = super::scan::hash_counts_on(&mut self.primary().await?, key, fields).await;
        if result.is_err() {
            self.forget();
        }
        result
    }

    async fn counts(
        &self,
        _server: usize,
        keys: &[String],
    ) -> Result<Vec<Option<u64>>, RoundError> {
        let result = counts_on(&mut self.primary().await?, keys).await;
        if result.is_err() {
            self.forget();
        }
        result
    }
}
