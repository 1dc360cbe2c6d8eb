//! `redis`: the endpoint (URLs as the client reads them), intervals, prefix.

use super::*;

pub(super) fn check_redis_url(c: &mut Checker, path: &str, url: &str) -> bool {
    let ok = ["redis://", "rediss://", "unix://"]
        .iter()
        .any(|s| url.starts_with(s) && url.len() > s.len());
    if !ok {
        c.err(
            path,
            format!(
                "invalid Redis URL {url:?}: expected redis://HOST:PORT (or rediss://, unix://)"
            ),
        );
        return false;
    }
    // as the client will read it at start-up, so that `-t` refuses what start-up would
    if let Err(e) = ::redis::Client::open(url) {
        c.err(path, format!("invalid Redis URL {url:?}: {e}"));
        return false;
    }
    true
}

pub(super) fn check_redis(c: &mut Checker, r: &RedisFile) -> Option<RedisSettings> {
    let endpoint = match (&r.url, &r.cluster) {
        (Some(u), None) => {
            check_redis_url(c, "redis.url", u);
            RedisEndpoint::Single(u.clone())
        }
        (None, Some(nodes)) => {
            if nodes.is_empty() {
                c.err(
                    "redis.cluster",
                    "must list at least one seed node such as \"redis://127.0.0.1:7000\"",
                );
            }
            for (i, n) in nodes.iter().enumerate() {
                check_redis_url(c, &format!("redis.cluster[{i}]"), n);
            }
            RedisEndpoint::Cluster(nodes.clone())
        }
        _ => {
            c.err(
                "redis",
                "give exactly one of `url` (one server) or `cluster` (seed nodes)",
            );
            return None;
        }
    };
    let key_prefix = r
        .key_prefix
        .clone()
        .unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_string());
    if key_prefix.is_empty()
        || !key_prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        c.err(
            "redis.key_prefix",
            format!("invalid key prefix {key_prefix:?}: expected letters, digits, '_', '-' or '.'"),
        );
    }
    Some(RedisSettings {
        endpoint,
        sync_interval: positive(
            c,
            "redis.sync_interval",
            r.sync_interval,
            DEFAULT_SYNC_INTERVAL,
        ),
        timeout: positive(c, "redis.timeout", r.timeout, DEFAULT_REDIS_TIMEOUT),
        key_prefix,
        on_failure: r.on_failure,
    })
}
