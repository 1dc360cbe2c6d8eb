//! The waits channel's listener. An instance whose requests wait on its used-up part of a
//! filling window publishes the window's count key with its waiting mark (`pipeline`,
//! `Heartbeat::publish`); every instance listens on a connection of its own (`SUBSCRIBE
//! <key prefix>:waits`), so that a holder of an unused part hears of the wait within a round
//! trip rather than at its next heartbeat. Where it listens: the one server, the first cluster
//! seed that answers (a Redis Cluster passes a `PUBLISH` to every node), or the primary the
//! sentinels name. While it does not listen (connecting, after a failover, an ACL without the
//! channel) the heartbeats read the marks as before.

use super::round::{waits_channel, waits_told};
use crate::config::model::{RedisEndpoint, RedisSettings};
use crate::config::redis_client::{client, sentinel_client};
use futures_util::StreamExt;
use std::time::Duration;

/// How often a quiet subscription is checked (`PING`): a server gone without closing the
/// connection is found within this and the timeout.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Reconnecting: the first wait, doubled up to the last.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MOST: Duration = Duration::from_secs(5);

/// What the listener tells its owner.
pub enum Heard {
    /// Subscribed (`true`), or no longer (`false`).
    Subscribed(bool),
    /// Another instance's requests wait on these count keys.
    Waits(Vec<String>),
}

/// Listen on the waits channel until dropped (the sync's `redis` section changed), telling
/// `tell` what is heard; reconnects after a failure. An ACL that refuses the channel ends it
/// (logged once).
pub async fn listen(settings: RedisSettings, instance: String, tell: impl Fn(Heard)) {
    let channel = waits_channel(&settings.key_prefix);
    let mut retry = RETRY_FIRST;
    // the last failure logged: a new reason is logged at WARN, the same one again not
    let mut failed: Option<String> = None;
    for attempt in 0usize.. {
        match subscribe(&settings, attempt, &channel).await {
            Ok((sink, stream)) => {
                if failed.take().is_some() {
                    log::info!("redis: listening on the waits channel {channel} again");
                }
                tell(Heard::Subscribed(true));
                retry = RETRY_FIRST;
                let why = hear(sink, stream, &instance, settings.timeout, &tell).await;
                tell(Heard::Subscribed(false));
                log::info!("redis: the waits channel {channel} closed ({why}); listening again");
            }
            Err(e) if e.code() == Some("NOPERM") => {
                log::warn!("redis: cannot listen on the waits channel {channel} ({e}); this instance hears of the others' waits at its heartbeats only (the user's ACL needs +subscribe and the channel)");
                return;
            }
            Err(e) => {
                let why = e.to_string();
                if failed.as_ref() != Some(&why) {
                    log::warn!("redis: cannot listen on the waits channel {channel} ({why}); the heartbeats read the others' waits meanwhile; trying again");
                    failed = Some(why);
                }
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MOST);
    }
}

/// A subscription to `channel` on the server of attempt `attempt`, within the timeout.
async fn subscribe(
    settings: &RedisSettings,
    attempt: usize,
    channel: &str,
) -> redis::RedisResult<(redis::aio::PubSubSink, redis::aio::PubSubStream)> {
    let timeout = settings.timeout.max(Duration::from_millis(100)) * 3;
    let connect = async {
        let client = match &settings.endpoint {
            RedisEndpoint::Single(url) => client(url, &settings.access),
            RedisEndpoint::Cluster(nodes) => match nodes.get(attempt % nodes.len().max(1)) {
                Some(url) => client(url, &settings.access),
                None => Err("no cluster seed".to_string()),
            },
            RedisEndpoint::Sentinel { master, nodes } => {
                match sentinel_client(master, nodes, &settings.access) {
                    Ok(mut s) => s.async_get_client().await.map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            }
        }
        .map_err(|e| redis::RedisError::from((redis::ErrorKind::Client, "client", e)))?;
        let (mut sink, stream) = client.get_async_pubsub().await?.split();
        sink.subscribe(channel).await?;
        Ok((sink, stream))
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(r) => r,
        Err(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no subscription within the timeout",
        ))),
    }
}

/// Hear the channel until the connection ends or a `PING` goes unanswered: why it ended.
async fn hear(
    mut sink: redis::aio::PubSubSink,
    mut stream: redis::aio::PubSubStream,
    instance: &str,
    timeout: Duration,
    tell: &impl Fn(Heard),
) -> String {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(m) => {
                    if let Some(keys) = waits_told(m.get_payload_bytes(), instance) {
                        tell(Heard::Waits(keys));
                    }
                }
                None => return "the connection ended".into(),
            },
            _ = ping.tick() => {
                let pong = tokio::time::timeout(timeout.max(PING_EVERY / 5), sink.ping::<redis::Value>());
                match pong.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return e.to_string(),
                    Err(_) => return "no answer to PING".into(),
                }
            }
        }
    }
}
