//! The `redis` crate's client for the validated `redis` settings. Validation builds one for
//! every URL, as start-up will, so that `-t` refuses what start-up would.

use super::model::RedisAccess;

/// rustls needs its cryptography chosen once per process: ring, the one this build carries.
pub fn tls_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // an error: another part of the process chose first, which serves as well
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The client of one Redis URL, with the credentials and TLS files of the config
/// (`rediss://`: the server's certificate is checked against `tls.ca`, or the system's roots,
/// for the URL's host name, which is also the name sent in SNI).
pub fn client(url: &str, access: &RedisAccess) -> Result<redis::Client, String> {
    let mut info =
        redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| e.to_string())?;
    // no `CLIENT SETINFO` at connect: one command fewer for the ACL docs/operations.md gives
    let mut login = info.redis_settings().clone().set_skip_set_lib_name();
    if let Some(user) = &access.username {
        login = login.set_username(user);
    }
    if let Some(password) = &access.password {
        login = login.set_password(password);
    }
    info = info.set_redis_settings(login);
    tls_crypto();
    match tls_certificates(access) {
        None => redis::Client::open(info).map_err(|e| e.to_string()),
        Some(certs) => redis::Client::build_with_tls(info, certs).map_err(|e| e.to_string()),
    }
}

/// The CA and client certificate of `redis.tls`, as the redis crate takes them (`None`: the
/// system's roots and no client certificate).
pub fn tls_certificates(access: &RedisAccess) -> Option<redis::TlsCertificates> {
    if access.ca.is_none() && access.client.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: access
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: access.ca.clone(),
    })
}

/// The client of a primary that Redis Sentinel names for `master`, asked of the sentinels at
/// `nodes` (URLs: their own user and password, if any, from the first URL that gives them).
/// `rediss://` sentinels mean TLS to the primary too; `redis.tls` applies to both, and
/// `redis.username` / `password_file` to the primary.
pub fn sentinel_client(
    master: &str,
    nodes: &[String],
    access: &RedisAccess,
) -> Result<redis::sentinel::SentinelClient, String> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let mut addrs = Vec::with_capacity(nodes.len());
    let mut login = None;
    for n in nodes {
        let info = redis::IntoConnectionInfo::into_connection_info(n.as_str())
            .map_err(|e| format!("{n:?}: {e}"))?;
        let settings = info.redis_settings();
        if login.is_none() && (settings.username().is_some() || settings.password().is_some()) {
            login = Some((
                settings.username().map(str::to_string),
                settings.password().map(str::to_string),
            ));
        }
        addrs.push(info.addr().clone());
    }
    let tls = nodes.iter().all(|n| n.starts_with("rediss://"));
    let mut b = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(|e| e.to_string())?;
    if let Some((user, password)) = login {
        if let Some(u) = user {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = password {
            b = b.set_client_to_sentinel_password(p);
        }
    }
    if let Some(u) = &access.username {
        b = b.set_client_to_redis_username(u);
    }
    if let Some(p) = &access.password {
        b = b.set_client_to_redis_password(p);
    }
    if tls {
        tls_crypto();
        b = b.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if let Some(certs) = tls_certificates(access) {
            b = b
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_certificates(certs);
        }
    }
    b.build().map_err(|e| e.to_string())
}
