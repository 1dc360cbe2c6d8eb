//! File model -> validated model. Every check reports `FILE:LINE:COLUMN: message` through the
//! locator, names the field and says what would be accepted. All errors of a file are
//! collected, so one run shows every mistake.

use super::duration::{format_duration, ConfDuration};
use super::error::{ConfigError, ConfigErrors, Pos};
use super::file::*;
use super::locate::Locator;
use super::model::*;
use crate::matching::{HostMatch, MethodSet, PathPattern, RequestMatch};
use crate::tls::{valid_host, CertKey, Certificates, PairError};
use http::header::HeaderName;
use ipnet::IpNet;
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Default per-upstream timeouts (documented in the README).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(500);
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_COUNTERS_PER_RULE: usize = 200_000;
pub const MAX_TIERS: usize = 16;
pub const DEFAULT_MAX_REQUEST_HEADER_BYTES: usize = 64 * 1024;
pub const MAX_REQUEST_HEADER_BYTES: usize = 1_048_575;
pub const DEFAULT_CLIENT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRIES: usize = 2;
pub const MAX_RETRIES: usize = 16;

/// One file being validated: its path, its position index and the errors found so far.
struct Checker<'a> {
    file: PathBuf,
    loc: Locator,
    /// Prepended to paths in messages (an included limits file says `limits[0]...`).
    label: &'static str,
    errors: &'a mut Vec<ConfigError>,
    /// What is accepted but probably not meant (printed by `-t`, logged at load).
    warnings: &'a mut Vec<ConfigError>,
}

impl Checker<'_> {
    fn push(&mut self, pos: Pos, path: &str, message: String) {
        let label = self.label;
        self.errors.push(ConfigError::new(
            &self.file,
            pos,
            format!("{label}{path}: {message}"),
        ));
    }

    /// An error about the value at `path`.
    fn err(&mut self, path: &str, message: impl Into<String>) {
        self.push(self.loc.at(path), path, message.into());
    }

    /// A warning about the value at `path`.
    fn warn(&mut self, path: &str, message: impl Into<String>) {
        let label = self.label;
        let message = message.into();
        self.warnings.push(ConfigError::new(
            &self.file,
            self.loc.at(path),
            format!("warning: {label}{path}: {message}"),
        ));
    }

    /// An error about the key `path` itself (a name that is wrong, not its value).
    fn err_key(&mut self, path: &str, message: impl Into<String>) {
        self.push(self.loc.key(path), path, message.into());
    }
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

const ID_RULE: &str = "expected letters, digits, '_' or '-' ([A-Za-z0-9_-]+)";

fn header_name(c: &mut Checker, path: &str, name: &str) -> Option<HeaderName> {
    match HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()) {
        Ok(h) if !name.trim().is_empty() => Some(h),
        _ => {
            c.err(
                path,
                format!("invalid header name {name:?}: expected a token such as \"x-org-id\""),
            );
            None
        }
    }
}

fn positive(c: &mut Checker, path: &str, d: Option<ConfDuration>, default: Duration) -> Duration {
    match d {
        None => default,
        Some(ConfDuration(d)) if d.is_zero() => {
            c.err(path, "must be greater than 0, e.g. \"100ms\" or 1");
            default
        }
        Some(ConfDuration(d)) => d,
    }
}

fn resolve_relative(base_file: &Path, target: &str) -> PathBuf {
    let t = Path::new(target);
    if t.is_absolute() {
        t.to_path_buf()
    } else {
        base_file.parent().unwrap_or_else(|| Path::new(".")).join(t)
    }
}

/// Read and deserialize an included YAML file; errors name that file, and paths inside it are
/// written from `label` (the key that includes it).
fn read_include<T: serde::de::DeserializeOwned>(
    including: &mut Checker,
    key_path: &str,
    label: &str,
    file: &Path,
) -> Option<(T, Locator)> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            including.err(key_path, format!("cannot read {}: {e}", file.display()));
            return None;
        }
    };
    let loc = Locator::new(&text);
    let duplicates = loc.duplicate_errors(file, label);
    if !duplicates.is_empty() {
        including.errors.extend(duplicates);
        return None;
    }
    match serde_yaml::from_str::<T>(&text) {
        Ok(v) => Some((v, loc)),
        Err(e) => {
            let mut err = ConfigError::from_yaml(file, &e);
            if err.message.starts_with('[') || err.message.starts_with(".[") {
                err.message = format!("{label}{}", err.message.trim_start_matches('.'));
            }
            including.errors.push(err);
            None
        }
    }
}

/// Validate a parsed file model. `file` is the main config's path.
pub fn validate(file: &Path, loc: Locator, model: FileConfig) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut includes = Vec::new();
    let mut c = Checker {
        file: file.to_path_buf(),
        loc,
        label: "",
        errors: &mut errors,
        warnings: &mut warnings,
    };

    let (server, tls) = check_server(&mut c, &model.server);
    let upstreams = check_upstreams(&mut c, &model.upstreams);
    let routes = check_routes(&mut c, &model.routes, &upstreams);
    let tenant = match &model.tenant {
        Some(t) => check_tenant(&mut c, t, &mut includes),
        None => TenantSettings::default(),
    };
    let plans = check_plans(&mut c, &model.plans);
    let rules = match model.limits {
        None => Vec::new(),
        Some(LimitsFile::Inline(list)) => check_rules(&mut c, "limits", &list, &plans),
        Some(LimitsFile::Include(name)) => {
            let target = resolve_relative(file, &name);
            includes.push(target.clone());
            match read_include::<Vec<RuleFile>>(&mut c, "limits", "limits", &target) {
                Some((list, inc_loc)) => {
                    let mut inc = Checker {
                        file: target,
                        loc: inc_loc,
                        label: "limits",
                        errors: c.errors,
                        warnings: c.warnings,
                    };
                    check_rules(&mut inc, "", &list, &plans)
                }
                None => Vec::new(),
            }
        }
    };
    let redis = model.redis.as_ref().and_then(|r| check_redis(&mut c, r));
    let headers = model
        .headers
        .map(|h| HeaderSettings {
            x_ratelimit: h.x_ratelimit,
            ietf: h.ietf,
        })
        .unwrap_or_default();

    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        file: file.to_path_buf(),
        includes,
        server,
        upstreams,
        routes,
        tenant,
        plans,
        rules,
        redis,
        headers,
        tls,
        warnings,
    })
}

/// Read a certificate and key pair named at `path` (`path.cert`, `path.key`), relative to the
/// config file.
fn check_pair(c: &mut Checker, path: &str, cert: &str, key: &str) -> Option<Arc<CertKey>> {
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

fn check_server(c: &mut Checker, s: &ServerFile) -> (ServerSettings, Certificates) {
    let mut listen = Vec::new();
    let mut listen_tls = Vec::new();
    let mut certs = Certificates::default();
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
    let max_request_header_bytes = match s.max_request_header_bytes {
        Some(n) if !(1024..=MAX_REQUEST_HEADER_BYTES).contains(&n) => {
            c.err(
                "server.max_request_header_bytes",
                format!("must be between 1024 and {MAX_REQUEST_HEADER_BYTES} (1 MiB, pingora's own limit)"),
            );
            DEFAULT_MAX_REQUEST_HEADER_BYTES
        }
        Some(n) => n,
        None => DEFAULT_MAX_REQUEST_HEADER_BYTES,
    };
    if s.max_body_bytes == Some(0) {
        c.err(
            "server.max_body_bytes",
            "must be at least 1 (leave it out for no limit)",
        );
    }
    let client_header_timeout = positive(
        c,
        "server.client_header_timeout",
        s.client_header_timeout,
        DEFAULT_CLIENT_HEADER_TIMEOUT,
    );
    let admin = s
        .admin
        .as_ref()
        .and_then(|a| match a.parse::<SocketAddr>() {
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
        });
    let threads = match s.threads {
        Some(0) => {
            c.err("server.threads", "must be at least 1");
            1
        }
        Some(n) if n > 1024 => {
            c.err("server.threads", "must be at most 1024");
            1
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut trusted = Vec::new();
    for (i, t) in s.trusted_proxies.iter().enumerate() {
        let parsed = t
            .parse::<IpNet>()
            .or_else(|_| t.parse::<IpAddr>().map(IpNet::from));
        match parsed {
            Ok(n) => trusted.push(n.trunc()),
            Err(_) => c.err(
                &format!("server.trusted_proxies[{i}]"),
                format!(
                    "invalid network {t:?}: expected an address or CIDR such as \"10.0.0.0/8\""
                ),
            ),
        }
    }
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
        listen,
        listen_tls,
        h2c: s.h2c,
        max_request_header_bytes,
        max_body_bytes: s.max_body_bytes,
        client_header_timeout,
        admin,
        threads,
        trusted_proxies: trusted,
        grace_period,
        access_log: s.access_log,
        error_log: s.error_log.clone(),
        pid_file: s
            .pid_file
            .clone()
            .unwrap_or_else(|| "/tmp/tollgate.pid".to_string()),
        upgrade_sock: s
            .upgrade_sock
            .clone()
            .unwrap_or_else(|| "/tmp/tollgate_upgrade.sock".to_string()),
    };
    (settings, certs)
}

fn resolve_server(text: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !text.contains(':') {
        return Err(format!(
            "invalid server {text:?}: expected HOST:PORT such as \"127.0.0.1:9001\""
        ));
    }
    match text.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| format!("server {text:?} resolves to no address")),
        Err(e) => Err(format!(
            "invalid server {text:?}: {e}; expected HOST:PORT such as \"127.0.0.1:9001\""
        )),
    }
}

/// `upstreams.NAME.tls`: the SNI name, and the CA file read now.
fn check_upstream_tls(c: &mut Checker, base: &str, t: &UpstreamTlsFile) -> UpstreamTls {
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
        let file = resolve_relative(&c.file, ca);
        let path = format!("{base}.tls.ca");
        match std::fs::read(&file) {
            Err(e) => {
                c.err(&path, format!("cannot read {}: {e}", file.display()));
                None
            }
            Ok(pem) => match crate::tls::X509::stack_from_pem(&pem) {
                Ok(list) if !list.is_empty() => Some(Arc::new(list.into_boxed_slice())),
                _ => {
                    c.err(
                        &path,
                        format!("{} holds no PEM certificate", file.display()),
                    );
                    None
                }
            },
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

fn check_upstreams(c: &mut Checker, ups: &BTreeMap<String, UpstreamFile>) -> Vec<UpstreamSpec> {
    let mut out = Vec::new();
    if ups.is_empty() {
        c.err("upstreams", "must define at least one upstream pool");
    }
    for (name, u) in ups {
        let base = format!("upstreams.{name}");
        if !valid_id(name) {
            c.err_key(&base, format!("invalid upstream name {name:?}: {ID_RULE}"));
        }
        let mut servers = Vec::new();
        if u.servers.is_empty() {
            c.err(
                &format!("{base}.servers"),
                "must list at least one server such as \"127.0.0.1:9001\"",
            );
        }
        for (i, s) in u.servers.iter().enumerate() {
            match resolve_server(s) {
                Ok(a) if servers.contains(&a) => c.err(
                    &format!("{base}.servers[{i}]"),
                    format!("{s} is listed twice"),
                ),
                Ok(a) => servers.push(a),
                Err(e) => c.err(&format!("{base}.servers[{i}]"), e),
            }
        }
        let health_check = u.health_check.as_ref().map(|h| {
            let interval = positive(
                c,
                &format!("{base}.health_check.interval"),
                Some(h.interval),
                Duration::from_secs(1),
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
                (
                    hc.path.clone(),
                    hc.host.clone().unwrap_or_else(|| "localhost".to_string()),
                )
            });
            HealthCheckSpec {
                interval,
                timeout,
                http,
            }
        });
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
        let tls = u.tls.as_ref().map(|t| check_upstream_tls(c, &base, t));
        out.push(UpstreamSpec {
            name: name.clone(),
            servers,
            balance: u.balance,
            health_check,
            connect_timeout,
            read_timeout,
            retries,
            tls,
        });
    }
    out
}

fn check_methods(c: &mut Checker, path: &str, m: &Option<Vec<String>>) -> MethodSet {
    match m {
        None => MethodSet::ALL,
        Some(list) => MethodSet::parse(list).unwrap_or_else(|e| {
            c.err(path, e);
            MethodSet::ALL
        }),
    }
}

fn check_pattern(c: &mut Checker, path: &str, p: &str) -> PathPattern {
    PathPattern::compile(p).unwrap_or_else(|e| {
        c.err(path, e);
        PathPattern::any() // never used: the config is rejected
    })
}

fn check_host(c: &mut Checker, path: &str, h: &Option<String>) -> Option<HostMatch> {
    h.as_ref().and_then(|h| match HostMatch::parse(h) {
        Ok(m) => Some(m),
        Err(e) => {
            c.err(path, e);
            None
        }
    })
}

fn check_routes(c: &mut Checker, routes: &[RouteFile], ups: &[UpstreamSpec]) -> Vec<Route> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let base = format!("routes[{i}]");
        if !valid_id(&r.id) {
            c.err(
                &format!("{base}.id"),
                format!("invalid route id {:?}: {ID_RULE}", r.id),
            );
        } else if !seen.insert(r.id.clone()) {
            c.err(
                &format!("{base}.id"),
                format!("duplicate route id {:?}", r.id),
            );
        }
        let upstream = match ups.iter().position(|u| u.name == r.upstream) {
            Some(i) => i,
            None => {
                let names: Vec<&str> = ups.iter().map(|u| u.name.as_str()).collect();
                c.err(
                    &format!("{base}.upstream"),
                    format!(
                        "unknown upstream {:?}: expected one of the pools under `upstreams` ({})",
                        r.upstream,
                        names.join(", ")
                    ),
                );
                0
            }
        };
        out.push(Route {
            id: r.id.clone(),
            matcher: RequestMatch {
                host: check_host(c, &format!("{base}.host"), &r.host),
                path: check_pattern(c, &format!("{base}.path"), &r.path),
                methods: check_methods(c, &format!("{base}.methods"), &r.methods),
            },
            upstream,
        });
    }
    out
}

fn check_tenant(c: &mut Checker, t: &TenantFile, includes: &mut Vec<PathBuf>) -> TenantSettings {
    let mut sources = Vec::new();
    for (i, s) in t.from.iter().enumerate() {
        let base = format!("tenant.from[{i}]");
        match s {
            TenantSourceFile::ApiKey(k) => {
                let header = header_name(c, &format!("{base}.api_key.header"), &k.header);
                let keys = match (&k.keys, &k.keys_file) {
                    (Some(map), None) => Some(map.clone()),
                    (None, Some(f)) => {
                        let target = resolve_relative(&c.file, f);
                        includes.push(target.clone());
                        read_include::<BTreeMap<String, String>>(
                            c,
                            &format!("{base}.api_key.keys_file"),
                            "keys_file",
                            &target,
                        )
                        .map(|(m, _)| m)
                    }
                    _ => {
                        c.err(
                            &format!("{base}.api_key"),
                            "give exactly one of `keys` (a map of key to tenant) or `keys_file` (a YAML file holding that map)",
                        );
                        None
                    }
                };
                if let (Some(header), Some(keys)) = (header, keys) {
                    if let Some((_, _)) = keys.iter().find(|(k, v)| k.is_empty() || v.is_empty()) {
                        c.err(
                            &format!("{base}.api_key"),
                            "keys and tenants must not be empty",
                        );
                    }
                    sources.push(TenantSource::ApiKey {
                        header,
                        keys: keys.into_iter().collect(),
                    });
                }
            }
            TenantSourceFile::Path(p) => {
                let pat = check_pattern(c, &format!("{base}.path"), p);
                if !pat.has_capture() && PathPattern::compile(p).is_ok() {
                    c.err(
                        &format!("{base}.path"),
                        format!("path {p:?} must capture the tenant with one `{{tenant}}` segment"),
                    );
                }
                sources.push(TenantSource::Path(pat));
            }
            TenantSourceFile::Header(h) => {
                if let Some(h) = header_name(c, &format!("{base}.header"), h) {
                    sources.push(TenantSource::Header(h));
                }
            }
            TenantSourceFile::ClientIp(_) => sources.push(TenantSource::ClientIp),
        }
    }
    let (forward_header, strip_header) = match &t.forward_header {
        None => (Some(default_tenant_header()), default_tenant_header()),
        Some(ForwardHeaderFile::Off) => (None, default_tenant_header()),
        Some(ForwardHeaderFile::Name(h)) => {
            let name =
                header_name(c, "tenant.forward_header", h).unwrap_or_else(default_tenant_header);
            (Some(name.clone()), name)
        }
    };
    TenantSettings {
        sources,
        required: t.required,
        forward_header,
        strip_header,
    }
}

fn check_plans(c: &mut Checker, plans: &BTreeMap<String, Vec<String>>) -> Plans {
    let mut out = Plans::default();
    for (name, tenants) in plans {
        let base = format!("plans.{name}");
        if !valid_id(name) {
            c.err_key(&base, format!("invalid plan name {name:?}: {ID_RULE}"));
        }
        let idx = out.names.len();
        out.names.push(name.clone());
        for (i, t) in tenants.iter().enumerate() {
            if t.is_empty() {
                c.err(&format!("{base}[{i}]"), "tenant id must not be empty");
                continue;
            }
            let key: Box<[u8]> = t.as_bytes().into();
            if let Some(prev) = out.by_tenant.insert(key, idx) {
                c.err(
                    &format!("{base}[{i}]"),
                    format!(
                        "tenant {t:?} is already in plan {:?}: a tenant belongs to one plan",
                        out.names[prev]
                    ),
                );
            }
        }
    }
    out
}

fn check_tiers(c: &mut Checker, base: &str, tiers: &[TierFile]) -> Vec<Tier> {
    if tiers.is_empty() {
        c.err(
            base,
            "must list at least one tier such as { period: 10, threshold: 100 }",
        );
    }
    if tiers.len() > MAX_TIERS {
        c.err(
            &format!("{base}[{MAX_TIERS}]"),
            format!(
                "a rule has at most {MAX_TIERS} tiers, this one has {}",
                tiers.len()
            ),
        );
    }
    let mut out: Vec<Tier> = Vec::new();
    for (i, t) in tiers.iter().enumerate().take(MAX_TIERS) {
        let p = format!("{base}[{i}]");
        let period = t.period.0;
        if period.is_zero() {
            c.err(
                &format!("{p}.period"),
                "period must be greater than 0 (seconds, or a string such as \"500ms\")",
            );
        }
        if t.threshold.0 <= 0 {
            c.err(
                &format!("{p}.threshold"),
                format!(
                    "threshold must be a positive integer, got {}",
                    t.threshold.0
                ),
            );
        }
        if out.iter().any(|o| o.period == period) {
            c.err(
                &format!("{p}.period"),
                format!(
                    "two tiers have the period {}: merge them (the lower threshold wins)",
                    format_duration(period)
                ),
            );
        }
        out.push(Tier {
            period,
            threshold: t.threshold.0.max(1) as u64,
        });
    }
    out
}

fn check_per(c: &mut Checker, path: &str, per: &Option<String>) -> PartitionBy {
    match per.as_deref() {
        None | Some("tenant") => PartitionBy::Tenant,
        Some("ip") => PartitionBy::Ip,
        Some("global") => PartitionBy::Global,
        Some(s) if s.starts_with("header:") => match header_name(c, path, &s["header:".len()..]) {
            Some(h) => PartitionBy::Header(h),
            None => PartitionBy::Tenant,
        },
        Some(other) => {
            c.err(
                path,
                format!("invalid value {other:?}: expected tenant, ip, global or header:<name>"),
            );
            PartitionBy::Tenant
        }
    }
}

fn check_rules(c: &mut Checker, prefix: &str, list: &[RuleFile], plans: &Plans) -> Vec<Arc<Rule>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let base = if prefix.is_empty() {
            format!("[{i}]")
        } else {
            format!("{prefix}[{i}]")
        };
        if !valid_id(&r.id) {
            c.err(
                &format!("{base}.id"),
                format!("invalid rule id {:?}: {ID_RULE}", r.id),
            );
        } else if !seen.insert(r.id.clone()) {
            c.err(
                &format!("{base}.id"),
                format!("duplicate rule id {:?}", r.id),
            );
        }
        let tiers = check_tiers(c, &format!("{base}.tiers"), &r.tiers);
        let mut plan_tiers: Vec<Option<Vec<Tier>>> = vec![None; plans.names.len()];
        for (plan, pt) in &r.plans {
            let p = format!("{base}.plans.{plan}");
            match plans.names.iter().position(|n| n == plan) {
                Some(idx) => plan_tiers[idx] = Some(check_tiers(c, &p, pt)),
                None => c.err_key(
                    &p,
                    format!(
                        "unknown plan {plan:?}: expected one of the plans under `plans` ({})",
                        if plans.names.is_empty() {
                            "none defined".to_string()
                        } else {
                            plans.names.join(", ")
                        }
                    ),
                ),
            }
        }
        let status = match (r.action, r.status) {
            (_, None) => 429,
            (Action::Shadow, Some(_)) => {
                c.err(
                    &format!("{base}.status"),
                    "status applies to action reject or delay, not shadow (which never blocks)",
                );
                429
            }
            (_, Some(s)) if s == 429 || s == 503 => s,
            (_, Some(s)) => {
                c.err(
                    &format!("{base}.status"),
                    format!("invalid status {s}: expected 429 or 503"),
                );
                429
            }
        };
        let max_delay = match (r.action, r.max_delay) {
            (Action::Delay, d) => positive(c, &format!("{base}.max_delay"), d, DEFAULT_MAX_DELAY),
            (_, Some(_)) => {
                c.err(
                    &format!("{base}.max_delay"),
                    "max_delay applies only to action: delay",
                );
                DEFAULT_MAX_DELAY
            }
            (_, None) => DEFAULT_MAX_DELAY,
        };
        let per = check_per(c, &format!("{base}.per"), &r.per);
        if per != PartitionBy::Tenant && !r.plans.is_empty() {
            c.err_key(
                &format!("{base}.plans"),
                "plans give tenants their own tiers: they apply only to rules with `per: tenant`",
            );
        }
        out.push(Arc::new(Rule {
            id: r.id.clone(),
            enabled: r.enabled,
            matcher: RequestMatch {
                methods: check_methods(c, &format!("{base}.methods"), &r.methods),
                path: check_pattern(c, &format!("{base}.pathPattern"), &r.path_pattern),
                host: check_host(c, &format!("{base}.host"), &r.host),
            },
            per,
            algorithm: r.algorithm,
            tiers,
            plan_tiers,
            action: r.action,
            status,
            max_delay,
        }));
    }
    out
}

fn check_redis_url(c: &mut Checker, path: &str, url: &str) -> bool {
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
    if let Err(e) = redis::Client::open(url) {
        c.err(path, format!("invalid Redis URL {url:?}: {e}"));
        return false;
    }
    true
}

fn check_redis(c: &mut Checker, r: &RedisFile) -> Option<RedisSettings> {
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
        .unwrap_or_else(|| "tollgate".to_string());
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
            Duration::from_secs(1),
        ),
        timeout: positive(c, "redis.timeout", r.timeout, Duration::from_millis(100)),
        key_prefix,
        on_failure: r.on_failure,
    })
}
