//! `redis`: the endpoint (URLs as the client reads them), intervals, prefix.

use super::checker::*;

pub(super) fn check_redis_url(c: &mut Checker, path: &str, url: &str) -> bool {
    check_url(c, path, url, &format!("{url:?}"))
}

/// `url` checked, named `shown` in errors (a URL from a file may hold a password: not shown).
fn check_url(c: &mut Checker, path: &str, url: &str, shown: &str) -> bool {
    let ok = ["redis://", "rediss://", "unix://"]
        .iter()
        .any(|s| url.starts_with(s) && url.len() > s.len());
    if !ok {
        c.err(
            path,
            format!(
                "invalid Redis URL {shown}: expected redis://HOST:PORT (or rediss://, unix://)"
            ),
        );
        return false;
    }
    // as the client will read it at start-up, so that `-t` refuses what start-up would
    if let Err(e) = ::redis::Client::open(url) {
        c.err(path, format!("invalid Redis URL {shown}: {e}"));
        return false;
    }
    true
}

/// `redis.url_file`: the URL the file holds (trimmed), checked without showing it.
fn url_from_file(c: &mut Checker, r: &RedisFile) -> Option<Option<String>> {
    let Some(name) = &r.url_file else {
        return Some(r.url.clone());
    };
    if r.url.is_some() {
        c.err("redis.url_file", "give `url` or `url_file`, not both");
        return None;
    }
    let (file, bytes) = c.read_file("redis.url_file", name)?;
    let url = String::from_utf8_lossy(&bytes).trim().to_string();
    let shown = format!("in {}", file.display());
    check_url(c, "redis.url_file", &url, &shown).then_some(Some(url))
}

pub(super) fn check_redis(c: &mut Checker, r: &RedisFile) -> Option<RedisSettings> {
    let url = url_from_file(c, r)?;
    let endpoint = match (&url, &r.cluster, &r.sentinel) {
        (Some(u), None, None) => {
            if r.url_file.is_none() {
                check_redis_url(c, "redis.url", u);
            }
            RedisEndpoint::Single(u.clone())
        }
        (None, Some(nodes), None) => {
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
        (None, None, Some(s)) => check_sentinel(c, &s.master, &s.nodes),
        _ => {
            c.err(
                "redis",
                "give exactly one of `url` or `url_file` (one server), `cluster` (seed nodes) or `sentinel` \
                 (a primary that Redis Sentinel names)",
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
    let access = check_access(c, r, &endpoint);
    let single = matches!(endpoint, RedisEndpoint::Single(_));
    if r.plain_increments == Some(true) && !single {
        c.err(
            "redis.plain_increments",
            "only with url: behind a cluster or Sentinel every record leases (plain increments are not idempotent, and a promoted replica may lack the last ones)",
        );
    }
    Some(RedisSettings {
        plain_increments: single && r.plain_increments.unwrap_or(true),
        endpoint,
        access,
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

/// `redis.sentinel`: the master's name and the sentinels' URLs (TCP, all with TLS or none).
fn check_sentinel(c: &mut Checker, master: &str, nodes: &[String]) -> RedisEndpoint {
    if master.is_empty()
        || master
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        c.err(
            "redis.sentinel.master",
            format!("invalid master name {master:?}: the name the sentinels monitor, such as \"mymaster\""),
        );
    }
    if nodes.is_empty() {
        c.err(
            "redis.sentinel.nodes",
            "must list at least one sentinel such as \"redis://127.0.0.1:26379\"",
        );
    }
    for (i, n) in nodes.iter().enumerate() {
        let path = format!("redis.sentinel.nodes[{i}]");
        if n.starts_with("unix://") {
            c.err(
                &path,
                format!("{n:?}: sentinels are reached over TCP (redis:// or rediss://)"),
            );
        } else {
            check_redis_url(c, &path, n);
        }
    }
    let tls = nodes.iter().filter(|n| n.starts_with("rediss://")).count();
    if tls != 0 && tls != nodes.len() {
        c.err(
            "redis.sentinel.nodes",
            "mixes redis:// and rediss:// sentinels: the scheme also says how the primary is reached, so give one",
        );
    }
    RedisEndpoint::Sentinel {
        master: master.to_string(),
        nodes: nodes.to_vec(),
    }
}

/// A PEM file named in the config (relative to it), read now.
fn read_pem(c: &mut Checker, path: &str, name: &str) -> Option<Vec<u8>> {
    let (file, pem) = c.read_file(path, name)?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        c.err(path, format!("{} holds no PEM block", file.display()));
        return None;
    }
    Some(pem)
}

/// `redis.username`, `redis.password_file` and `redis.tls`: read now, checked against what
/// the URLs already say.
fn check_access(c: &mut Checker, r: &RedisFile, endpoint: &RedisEndpoint) -> RedisAccess {
    let urls = endpoint.urls();
    // a sentinel's URL holds the sentinel's own login; `username` and `password_file` are the
    // primary's
    let sentinel = matches!(endpoint, RedisEndpoint::Sentinel { .. });
    let infos: Vec<_> = urls
        .iter()
        .filter(|_| !sentinel)
        .filter_map(|u| ::redis::Client::open(u.as_str()).ok())
        .map(|cl| cl.get_connection_info().redis_settings().clone())
        .collect();
    let mut access = RedisAccess::default();
    let errors_before = c.errors.len();
    if let Some(user) = &r.username {
        if user.is_empty()
            || user
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            c.err("redis.username", format!("invalid user name {user:?}"));
        } else if infos.iter().any(|i| i.username().is_some()) {
            c.err(
                "redis.username",
                "the URL names a user too: give it in one place",
            );
        } else {
            access.username = Some(user.clone());
        }
    }
    let path = "redis.password_file";
    if let Some((file, bytes)) = r.password_file.as_ref().and_then(|n| c.read_file(path, n)) {
        // one line: the trailing newline an editor or `echo` adds is not part of it
        let text = String::from_utf8(bytes).unwrap_or_default();
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        if password.is_empty() || password.contains('\n') {
            let message = format!(
                "{} must hold the password on one line (UTF-8)",
                file.display()
            );
            c.err(path, message);
        } else if infos.iter().any(|i| i.password().is_some()) {
            c.err(path, "the URL holds a password too: give it in one place");
        } else {
            access.password = Some(password.to_string());
        }
    }
    if let Some(tls) = &r.tls {
        check_tls(c, tls, &urls, &mut access);
    }
    if c.errors.len() == errors_before {
        // as start-up will build the client, so that `-t` refuses what start-up would
        if let RedisEndpoint::Sentinel { master, nodes } = endpoint {
            if let Err(e) = crate::config::redis_client::sentinel_client(master, nodes, &access) {
                c.err("redis.sentinel", e);
            }
            return access;
        }
        for u in &urls {
            if let Err(e) = crate::config::redis_client::client(u, &access) {
                c.err("redis", format!("{u:?}: {e}"));
                break;
            }
        }
    }
    access
}

/// `redis.tls`: for `rediss://` URLs only; its PEM files read now.
fn check_tls(c: &mut Checker, tls: &RedisTlsFile, urls: &[&String], access: &mut RedisAccess) {
    if let Some(u) = urls.iter().find(|u| !u.starts_with("rediss://")) {
        c.err(
            "redis.tls",
            format!("applies to rediss:// URLs only, and {u:?} is not one"),
        );
    }
    access.ca = tls.ca.as_ref().and_then(|f| read_pem(c, "redis.tls.ca", f));
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let cert = read_pem(c, "redis.tls.cert", cert);
            let key = read_pem(c, "redis.tls.key", key);
            if let (Some(cert), Some(key)) = (cert, key) {
                access.client = Some((cert, key));
            }
        }
        (Some(_), None) => c.err("redis.tls", "`cert` needs its `key`"),
        (None, Some(_)) => c.err("redis.tls", "`key` needs its `cert`"),
        (None, None) => {}
    }
}
