//! `upstreams`: servers (addresses, or names looked up by `dns`), balancing, health checks,
//! timeouts, retries, TLS.

use super::checker::*;
use super::dns::{look_up_names, Pending};

/// One entry of `servers`: an address, or a name looked up when the config is loaded (and
/// again while the pool runs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ServerText {
    Addr(SocketAddr),
    Name(String, u16),
}

pub(super) fn parse_server(text: &str) -> Result<ServerText, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(ServerText::Addr(a));
    }
    let expected = "expected HOST:PORT such as \"127.0.0.1:9001\" or \"api.internal:8080\"";
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("invalid server {text:?}: {expected}"));
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => return Err(format!("invalid port in {text:?}: {expected}")),
    };
    // a name may end with the root's dot (`api.internal.`: no search domain is tried)
    if !valid_host(host.strip_suffix('.').unwrap_or(host)) || host.starts_with("*.") {
        return Err(format!("invalid host in {text:?}: {expected}"));
    }
    Ok(ServerText::Name(host.to_string(), port))
}

/// `upstreams.NAME.tls`: the SNI name, and the CA file read now.
pub(super) fn check_upstream_tls(c: &mut Checker, base: &str, t: &UpstreamTlsFile) -> UpstreamTls {
    if !valid_host(&t.sni) || t.sni.starts_with("*.") {
        c.err(
            &format!("{base}.tls.sni"),
            format!(
                "invalid name {:?}: expected a host name such as \"api.internal\"",
                t.sni
            ),
        );
    }
    let ca = t.ca.as_ref().and_then(|ca| {
        let path = format!("{base}.tls.ca");
        let (file, pem) = c.read_file(&path, ca)?;
        match crate::config::certificates::X509::stack_from_pem(&pem) {
            Ok(list) if !list.is_empty() => Some(Arc::new(list.into_boxed_slice())),
            _ => {
                c.err(
                    &path,
                    format!("{} holds no PEM certificate", file.display()),
                );
                None
            }
        }
    });
    if !t.verify {
        c.warn(
            &format!("{base}.tls.verify"),
            "false: the servers' certificates are not checked",
        );
    }
    UpstreamTls {
        sni: t.sni.clone(),
        ca,
        verify: t.verify,
    }
}

/// A pool's `servers`: at least one, each once; the addresses, and the names (with their
/// index) to look up.
fn check_servers(
    c: &mut Checker,
    base: &str,
    u: &UpstreamFile,
) -> (Vec<SocketAddr>, Vec<(usize, String, u16)>) {
    let (mut servers, mut names) = (Vec::new(), Vec::new());
    if u.servers.is_empty() {
        c.err(
            &format!("{base}.servers"),
            "must list at least one server such as \"127.0.0.1:9001\"",
        );
    }
    let mut seen = HashSet::new();
    for (i, s) in u.servers.iter().enumerate() {
        let path = format!("{base}.servers[{i}]");
        match parse_server(s) {
            Ok(parsed) if !seen.insert(parsed.clone()) => {
                c.err(&path, format!("{s} is listed twice"))
            }
            Ok(ServerText::Addr(a)) => servers.push(a),
            Ok(ServerText::Name(host, port)) => names.push((i, host, port)),
            Err(e) => c.err(&path, e),
        }
    }
    (servers, names)
}

/// A pool's `health_check`: TCP, HTTP on a path, or gRPC (HTTP/2 pools only).
fn check_health(c: &mut Checker, base: &str, u: &UpstreamFile) -> Option<HealthCheckSpec> {
    u.health_check.as_ref().map(|h| {
        let interval = positive(
            c,
            &format!("{base}.health_check.interval"),
            h.interval,
            DEFAULT_HEALTH_INTERVAL,
        );
        let timeout = positive(
            c,
            &format!("{base}.health_check.timeout"),
            h.timeout,
            DEFAULT_HEALTH_TIMEOUT,
        );
        let http = h.http.as_ref().map(|hc| {
            if !hc.path.starts_with('/') {
                c.err(
                    &format!("{base}.health_check.http.path"),
                    format!("invalid path {:?}: must start with '/'", hc.path),
                );
            }
            HealthProbe::Http {
                path: hc.path.clone(),
                host: hc
                    .host
                    .clone()
                    .unwrap_or_else(|| DEFAULT_HEALTH_HOST.to_string()),
            }
        });
        let grpc = h.grpc.as_ref().map(|g| {
            let path = format!("{base}.health_check.grpc");
            if h.http.is_some() {
                // as Envoy's one of http_health_check / grpc_health_check: one kind of check
                c.err_key(
                    &path,
                    "a check is http or grpc, not both: the gRPC check asks grpc.health.v1.Health/Check, it has no path or host",
                );
            } else if matches!(u.protocol.as_deref(), None | Some("http1")) {
                c.err_key(
                    &path,
                    "the gRPC check speaks HTTP/2: give the pool `protocol: h2c` (plain TCP) or `protocol: h2` (with `tls`)",
                );
            }
            HealthProbe::Grpc {
                service: g.service.clone(),
            }
        });
        HealthCheckSpec {
            interval,
            timeout,
            probe: http.or(grpc).unwrap_or(HealthProbe::Tcp),
        }
    })
}

/// A pool's `max_in_flight` and `queue` (priority shaping).
fn check_shaping(c: &mut Checker, base: &str, u: &UpstreamFile) -> Option<Shaping> {
    match (u.max_in_flight, &u.queue) {
        (None, None) => None,
        (None, Some(_)) => {
            c.err_key(
                &format!("{base}.queue"),
                "queue applies to a pool with max_in_flight: requests wait there while the pool is full",
            );
            None
        }
        (Some(n), q) => {
            if !(1..=1_000_000).contains(&n) {
                c.err(
                    &format!("{base}.max_in_flight"),
                    format!("max_in_flight must be 1 to 1000000, got {n}"),
                );
            }
            let queue_max = match q.as_ref().map(|q| q.max) {
                None => 0,
                Some(m) if (0..=1_000_000).contains(&m) => m as usize,
                Some(m) => {
                    c.err(
                        &format!("{base}.queue.max"),
                        format!("queue.max must be 0 to 1000000, got {m}"),
                    );
                    0
                }
            };
            let queue_timeout = positive(
                c,
                &format!("{base}.queue.timeout"),
                q.as_ref().and_then(|q| q.timeout),
                DEFAULT_QUEUE_TIMEOUT,
            );
            Some(Shaping {
                max_in_flight: n.clamp(1, 1_000_000) as usize,
                queue_max,
                queue_timeout,
            })
        }
    }
}

/// `upstreams.NAME.protocol` and `max_streams_per_connection`.
fn check_protocol(c: &mut Checker, base: &str, u: &UpstreamFile) -> (UpstreamProtocol, usize) {
    let path = format!("{base}.protocol");
    let protocol = match u.protocol.as_deref() {
        None | Some("http1") => UpstreamProtocol::Http1,
        Some("h2") => {
            if u.tls.is_none() {
                c.err(
                    &path,
                    "h2 is HTTP/2 over TLS: give the pool a `tls` section, or use h2c for HTTP/2 over plain TCP",
                );
            }
            UpstreamProtocol::H2
        }
        Some("h2c") => {
            if u.tls.is_some() {
                c.err(&path, "h2c is HTTP/2 over plain TCP: with `tls`, use h2");
            }
            UpstreamProtocol::H2c
        }
        Some(other) => {
            c.err(
                &path,
                format!(
                    "unknown protocol {other:?}: expected http1, h2 or h2c{}",
                    if other
                        .to_ascii_lowercase()
                        .replace('/', "")
                        .starts_with("http2")
                    {
                        "; HTTP/2 is `h2` (over `tls`) or `h2c` (over plain TCP)".to_string()
                    } else {
                        suggest(other, ["http1", "h2", "h2c"])
                    }
                ),
            );
            UpstreamProtocol::Http1
        }
    };
    let streams = match u.max_streams_per_connection {
        Some(n) if !(1..=MAX_STREAMS_PER_CONNECTION).contains(&n) => {
            c.err(
                &format!("{base}.max_streams_per_connection"),
                format!("must be between 1 and {MAX_STREAMS_PER_CONNECTION}"),
            );
            DEFAULT_MAX_STREAMS_PER_CONNECTION
        }
        Some(n) => {
            if protocol == UpstreamProtocol::Http1 {
                c.warn(
                    &format!("{base}.max_streams_per_connection"),
                    "applies to HTTP/2 pools only (protocol h2 or h2c): an HTTP/1.1 connection carries one request at a time",
                );
            }
            n
        }
        None => DEFAULT_MAX_STREAMS_PER_CONNECTION,
    };
    (protocol, streams)
}

/// `upstreams`; the names of `servers` are looked up with `dns` (`None`: the `dns` section is
/// wrong, and they are not).
pub(super) fn check_upstreams(
    c: &mut Checker,
    ups: &BTreeMap<String, UpstreamFile>,
    dns: Option<&DnsSettings>,
) -> Vec<UpstreamSpec> {
    let mut out = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    if ups.is_empty() {
        c.err("upstreams", "must define at least one upstream pool");
    }
    for (name, u) in ups {
        let base = format!("upstreams.{name}");
        if !valid_id(name) {
            c.err_key(&base, format!("invalid upstream name {name:?}: {ID_RULE}"));
        }
        let (servers, names) = check_servers(c, &base, u);
        let pool = out.len();
        pending.extend(names.into_iter().map(|(i, h, p)| (pool, i, h, p)));
        out.push(check_pool(c, &base, name, u, servers));
    }
    if let Some(dns) = dns {
        look_up_names(c, dns, &mut out, pending);
    }
    out
}

/// One pool, but for its servers given by name (added once looked up).
fn check_pool(
    c: &mut Checker,
    base: &str,
    name: &str,
    u: &UpstreamFile,
    servers: Vec<SocketAddr>,
) -> UpstreamSpec {
    let health_check = check_health(c, base, u);
    let connect_timeout = positive(
        c,
        &format!("{base}.connect_timeout"),
        u.connect_timeout,
        DEFAULT_CONNECT_TIMEOUT,
    );
    let read_timeout = positive(
        c,
        &format!("{base}.read_timeout"),
        u.read_timeout,
        DEFAULT_READ_TIMEOUT,
    );
    let retries = match u.retries {
        Some(n) if n > MAX_RETRIES => {
            c.err(
                &format!("{base}.retries"),
                format!("must be at most {MAX_RETRIES}"),
            );
            DEFAULT_RETRIES
        }
        Some(n) => n,
        None => DEFAULT_RETRIES,
    };
    let tls = u.tls.as_ref().map(|t| check_upstream_tls(c, base, t));
    let shaping = check_shaping(c, base, u);
    let (protocol, max_streams_per_connection) = check_protocol(c, base, u);
    UpstreamSpec {
        protocol,
        max_streams_per_connection,
        shaping,
        name: name.to_string(),
        servers,
        names: Vec::new(),
        balance: u.balance,
        health_check,
        connect_timeout,
        read_timeout,
        retries,
        tls,
    }
}
