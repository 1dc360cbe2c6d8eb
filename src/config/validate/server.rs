//! `server`: listeners (with their TLS certificates), `server.certificates`, client limits, the process.

use super::checker::*;

/// Read a certificate and key pair named at `path` (`path.cert`, `path.key`), relative to the
/// config file.
pub(super) fn check_pair(
    c: &mut Checker,
    path: &str,
    cert: &str,
    key: &str,
) -> Option<Arc<CertKey>> {
    let cert_file = resolve_relative(&c.file, cert);
    let key_file = resolve_relative(&c.file, key);
    match CertKey::load(&cert_file, &key_file) {
        Ok(pair) => Some(Arc::new(pair)),
        Err(PairError::Cert(m)) => {
            c.err(&format!("{path}.cert"), m);
            None
        }
        Err(PairError::Key(m)) => {
            c.err(&format!("{path}.key"), m);
            None
        }
    }
}

/// `server.max_request_header_bytes`, within 1 KiB and pingora's own limit.
fn check_header_bytes(c: &mut Checker, n: Option<usize>) -> usize {
    match n {
        Some(n) if !(1024..=MAX_REQUEST_HEADER_BYTES).contains(&n) => {
            c.err(
                "server.max_request_header_bytes",
                format!("must be between 1024 and {MAX_REQUEST_HEADER_BYTES} (1 MiB, pingora's own limit)"),
            );
            DEFAULT_MAX_REQUEST_HEADER_BYTES
        }
        Some(n) => n,
        None => DEFAULT_MAX_REQUEST_HEADER_BYTES,
    }
}

/// `server.admin`: an address of its own, not a data plane listener's.
fn check_admin(c: &mut Checker, admin: Option<&str>, listen: &[SocketAddr]) -> Option<SocketAddr> {
    admin.and_then(|a| match a.parse::<SocketAddr>() {
        Ok(addr) => {
            if listen.contains(&addr) {
                c.err("server.admin", format!("{a} is also a data plane listener"));
            }
            Some(addr)
        }
        Err(_) => {
            c.err(
                "server.admin",
                format!("invalid address {a:?}: expected IP:PORT such as \"127.0.0.1:9090\""),
            );
            None
        }
    })
}

/// `server.threads`: 1 to `MAX_THREADS`; the machine's parallelism when left out.
fn check_threads(c: &mut Checker, threads: Option<usize>) -> usize {
    match threads {
        Some(0) => {
            c.err("server.threads", "must be at least 1");
            1
        }
        Some(n) if n > MAX_THREADS => {
            c.err("server.threads", format!("must be at most {MAX_THREADS}"));
            1
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// `server.client_header_timeout`, `send_timeout` and `keepalive_timeout`: positive.
fn check_timeouts(c: &mut Checker, s: &ServerFile) -> (Duration, Duration, Duration) {
    (
        positive(
            c,
            "server.client_header_timeout",
            s.client_header_timeout,
            DEFAULT_CLIENT_HEADER_TIMEOUT,
        ),
        positive(
            c,
            "server.send_timeout",
            s.send_timeout,
            DEFAULT_SEND_TIMEOUT,
        ),
        positive(
            c,
            "server.keepalive_timeout",
            s.keepalive_timeout,
            DEFAULT_KEEPALIVE_TIMEOUT,
        ),
    )
}

pub(super) fn check_server(c: &mut Checker, s: &ServerFile) -> (ServerSettings, Certificates) {
    let mut certs = Certificates::default();
    let (listen, listen_tls) = check_listeners(c, s, &mut certs);
    check_certificates(c, s, &mut certs, &listen_tls);
    let max_request_header_bytes = check_header_bytes(c, s.max_request_header_bytes);
    if s.max_body_bytes == Some(0) {
        c.err(
            "server.max_body_bytes",
            "must be at least 1 (leave it out for no limit)",
        );
    }
    let (client_header_timeout, send_timeout, keepalive_timeout) = check_timeouts(c, s);
    for (key, n) in [
        ("server.max_connections", s.max_connections),
        ("server.max_connections_per_ip", s.max_connections_per_ip),
    ] {
        if n == Some(0) {
            c.err(key, "must be at least 1 (leave it out for the default)");
        }
    }
    let http2 = check_http2(c, s.http2.as_ref());
    let admin = check_admin(c, s.admin.as_deref(), &listen);
    let threads = check_threads(c, s.threads);
    let trusted = check_networks(c, "server.trusted_proxies", &s.trusted_proxies);
    let grace_period = match s.grace_period {
        Some(ConfDuration(d)) => d,
        None => DEFAULT_GRACE_PERIOD,
    };
    let max_counters_per_rule = match s.max_counters_per_rule {
        Some(0) => {
            c.err("server.max_counters_per_rule", "must be at least 1");
            1
        }
        Some(n) => n,
        None => DEFAULT_MAX_COUNTERS_PER_RULE,
    };
    let settings = ServerSettings {
        max_counters_per_rule,
        admin_token: check_token(c, &s.admin_token),
        listen,
        listen_tls,
        h2c: s.h2c,
        max_request_header_bytes,
        max_body_bytes: s.max_body_bytes,
        client_header_timeout,
        send_timeout,
        keepalive_timeout,
        max_connections: s.max_connections.filter(|&n| n > 0),
        max_connections_per_ip: s.max_connections_per_ip.filter(|&n| n > 0),
        http2,
        admin,
        threads,
        trusted_proxies: trusted,
        grace_period,
        access_log: s.access_log,
        quota_endpoint: check_quota_endpoint(c, &s.quota_endpoint),
        error_log: s.error_log.clone(),
        pid_file: s
            .pid_file
            .clone()
            .unwrap_or_else(|| DEFAULT_PID_FILE.to_string()),
        upgrade_sock: s
            .upgrade_sock
            .clone()
            .unwrap_or_else(|| DEFAULT_UPGRADE_SOCK.to_string()),
        watch_config: s.watch_config,
        log_json: s.log_format == LogFormatFile::Json,
        request_id: s.request_id,
    };
    (settings, certs)
}

/// `server.listen`: each address once, with its TLS pair (added to `certs`); the addresses,
/// and whether each terminates TLS.
fn check_http2(c: &mut Checker, h: Option<&Http2File>) -> Http2Limits {
    let mut limits = Http2Limits {
        max_concurrent_streams: DEFAULT_H2_MAX_CONCURRENT_STREAMS,
        max_streams_per_second: DEFAULT_H2_MAX_STREAMS_PER_SECOND,
        max_premature_resets: DEFAULT_H2_MAX_PREMATURE_RESETS,
    };
    let Some(h) = h else {
        return limits;
    };
    match h.max_concurrent_streams {
        Some(n) if !(1..=MAX_H2_MAX_CONCURRENT_STREAMS).contains(&n) => c.err(
            "server.http2.max_concurrent_streams",
            format!("must be between 1 and {MAX_H2_MAX_CONCURRENT_STREAMS}"),
        ),
        Some(n) => limits.max_concurrent_streams = n,
        None => {}
    }
    match h.max_streams_per_second {
        Some(0) => c.err("server.http2.max_streams_per_second", "must be at least 1"),
        Some(n) => limits.max_streams_per_second = n,
        None => {}
    }
    if let Some(n) = h.max_premature_resets {
        limits.max_premature_resets = n;
    }
    limits
}

fn check_listeners(
    c: &mut Checker,
    s: &ServerFile,
    certs: &mut Certificates,
) -> (Vec<SocketAddr>, Vec<bool>) {
    let mut listen = Vec::new();
    let mut listen_tls = Vec::new();
    if s.listen.0.is_empty() {
        c.err(
            "server.listen",
            "must list at least one address such as \"0.0.0.0:8080\"",
        );
    }
    for (i, entry) in s.listen.0.iter().enumerate() {
        let a = entry.addr();
        let path = match entry {
            ListenFile::Addr(_) => format!("server.listen[{i}]"),
            ListenFile::Map(_) => format!("server.listen[{i}].addr"),
        };
        match a.parse::<SocketAddr>() {
            Ok(addr) => {
                if listen.contains(&addr) {
                    c.err(&path, format!("{a} is listed twice"));
                }
                if let Some(tls) = entry.tls() {
                    let tls_path = format!("server.listen[{i}].tls");
                    if let Some(pair) = check_pair(c, &tls_path, &tls.cert, &tls.key) {
                        certs.add_listener(addr, pair);
                    }
                }
                listen.push(addr);
                listen_tls.push(entry.tls().is_some());
            }
            Err(_) => c.err(
                &path,
                format!("invalid address {a:?}: expected IP:PORT such as \"0.0.0.0:8080\" or \"[::]:8080\""),
            ),
        }
    }
    (listen, listen_tls)
}

/// `server.certificates`: host names chosen by SNI, each once, on a TLS listener.
fn check_certificates(
    c: &mut Checker,
    s: &ServerFile,
    certs: &mut Certificates,
    listen_tls: &[bool],
) {
    for (i, cf) in s.certificates.iter().enumerate() {
        let path = format!("server.certificates[{i}]");
        if cf.hosts.is_empty() {
            c.err(
                &format!("{path}.hosts"),
                "must list at least one host such as \"api.example.com\" or \"*.example.com\"",
            );
        }
        let pair = check_pair(c, &path, &cf.cert, &cf.key);
        for (j, h) in cf.hosts.iter().enumerate() {
            let hpath = format!("{path}.hosts[{j}]");
            if !valid_host(h) {
                c.err(
                    &hpath,
                    format!("invalid host {h:?}: expected a name such as \"api.example.com\" or \"*.example.com\""),
                );
            } else if let Some(pair) = &pair {
                if !certs.add_host(h, pair.clone()) {
                    c.err(&hpath, format!("{h} has a certificate already"));
                }
            }
        }
    }
    if !s.certificates.is_empty() && !listen_tls.contains(&true) {
        c.err(
            "server.certificates",
            "no listener has tls: give one entry of server.listen a tls: { cert, key }",
        );
    }
}

/// `server.quota_endpoint`: one literal path (no glob, no query), kept normalized as requests
/// are.
fn check_quota_endpoint(c: &mut Checker, path: &Option<String>) -> Option<String> {
    let p = path.as_ref()?;
    let literal = p.starts_with('/')
        && !p.contains(['*', '?', '#', '{', '}'])
        && p.bytes().all(|b| b.is_ascii_graphic());
    if !literal {
        c.err(
            "server.quota_endpoint",
            format!("{p:?} is not a path: expected one literal path such as \"/quota\" (no glob, no query)"),
        );
        return None;
    }
    Some(crate::matching::normalize_path(p).into_owned())
}

/// `server.admin_token`: printable, no spaces, long enough to be a secret.
fn check_token(c: &mut Checker, token: &Option<String>) -> Option<String> {
    let t = token.as_ref()?;
    if t.len() < MIN_ADMIN_TOKEN_CHARS || !t.bytes().all(|b| b.is_ascii_graphic()) {
        c.err(
            "server.admin_token",
            "must be at least 16 printable characters without spaces (e.g. from `openssl rand -hex 16`)",
        );
    }
    Some(t.clone())
}
