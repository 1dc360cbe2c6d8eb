//! The one-screen summary printed by `tollgate -t`.

use super::duration::format_duration;
use super::model::*;
use std::fmt::Write;

pub(crate) fn tiers_text(tiers: &[Tier]) -> String {
    tiers
        .iter()
        .map(|t| match &t.calendar {
            // a calendar tier in words, with its zone: `10/1 day in America/New_York`
            Some(c) => format!("{}/{}", t.threshold, super::duration::calendar_words(c)),
            None => format!("{}/{}", t.threshold, t.label()),
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// A rule's action with what it does, as `-t` and `/api/status` tell it: `reject with 429`,
/// `delay up to 500ms, then reject with 429`.
pub(crate) fn action_text(r: &Rule) -> String {
    match (r.action, &r.shadowban) {
        (Action::Reject, _) => format!("reject with {}", r.status),
        (Action::Delay, _) => format!(
            "delay up to {}, then reject with {}",
            format_duration(r.max_delay),
            r.status
        ),
        (Action::Shadow, _) => "shadow (counts and reports, refuses nothing)".into(),
        (Action::Throttle, _) => format!("throttle to {} B/s", r.throttle_bps),
        (Action::Shadowban, Some(b)) => format!("shadowban ({} {})", b.status, b.content_type),
        (a, _) => a.to_string(),
    }
}

pub(crate) fn per_text(p: &PartitionBy) -> String {
    match p {
        PartitionBy::Tenant => "tenant".into(),
        PartitionBy::Ip => "ip".into(),
        PartitionBy::Global => "global".into(),
        PartitionBy::Header(h) => format!("header:{h}"),
    }
}

fn trust_text(trusted: bool) -> &'static str {
    if trusted {
        ", trusted"
    } else {
        ", from trusted_proxies only"
    }
}

/// An algorithm as the config file spells it.
pub(crate) fn algorithm_text(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::SlidingWindow => "sliding_window",
        Algorithm::TokenBucket => "token_bucket",
        Algorithm::SlidingLog => "sliding_log",
        Algorithm::LeakyBucket => "leaky_bucket",
    }
}

pub fn summary(cfg: &Config) -> String {
    let mut s = String::new();
    write_server(&mut s, cfg);
    write_upstreams(&mut s, cfg);
    write_routes(&mut s, cfg);
    write_tenant(&mut s, cfg);
    write_rules(&mut s, cfg);
    write_redis_and_headers(&mut s, cfg);
    s
}

/// `-t`: the file, its includes, the listeners.
fn write_server(s: &mut String, cfg: &Config) {
    let _ = writeln!(s, "configuration {} is valid", cfg.file.display());
    for inc in &cfg.includes {
        let _ = writeln!(s, "  includes {}", inc.display());
    }
    let listen: Vec<String> = cfg
        .server
        .listen
        .iter()
        .zip(&cfg.server.listen_tls)
        .map(|(a, tls)| match (tls, cfg.server.h2c) {
            (true, _) => format!("{a} (tls, h2)"),
            (false, true) => format!("{a} (h2c)"),
            (false, false) => a.to_string(),
        })
        .collect();
    let _ = writeln!(
        s,
        "listeners: {}  admin: {}  threads: {}",
        listen.join(", "),
        cfg.server
            .admin
            .map_or("none".to_string(), |a| a.to_string()),
        cfg.server.threads
    );
}

/// A server given by name, with the addresses it has now: `api.internal:8080 = 10.0.0.7, 10.0.0.8`.
fn name_text(n: &ServerName) -> String {
    let addrs: Vec<String> = n.addrs.iter().map(|a| a.to_string()).collect();
    format!("{}:{} = {}", n.host, n.port, addrs.join(" "))
}

/// `-t`: the pools (and, when a server is given by name, how names are looked up).
fn write_upstreams(s: &mut String, cfg: &Config) {
    if cfg.upstreams.iter().any(|u| !u.names.is_empty()) {
        let d = &cfg.dns;
        let servers: Vec<String> = d.servers.iter().map(|a| a.to_string()).collect();
        let _ = writeln!(
            s,
            "dns: {}, answers kept {} to {}",
            if servers.is_empty() {
                "nameservers of /etc/resolv.conf".to_string()
            } else {
                format!("nameservers {}", servers.join(", "))
            },
            format_duration(d.min_ttl),
            format_duration(d.max_ttl)
        );
    }
    let _ = writeln!(s, "upstreams ({}):", cfg.upstreams.len());
    for u in &cfg.upstreams {
        let servers: Vec<String> = u
            .servers
            .iter()
            .map(|a| a.to_string())
            .chain(u.names.iter().map(name_text))
            .collect();
        let hc = match &u.health_check {
            None => "no health check".to_string(),
            Some(h) => {
                let every = format_duration(h.interval);
                match &h.probe {
                    HealthProbe::Tcp => format!("tcp every {every}"),
                    HealthProbe::Http { path, .. } => format!("http {path} every {every}"),
                    HealthProbe::Grpc { service } if service.is_empty() => {
                        format!("grpc every {every}")
                    }
                    HealthProbe::Grpc { service } => format!("grpc {service:?} every {every}"),
                }
            }
        };
        let protocol = match u.protocol {
            UpstreamProtocol::Http1 => String::new(),
            p => format!(" {}", p.as_str()),
        };
        let shaping = u.shaping.map_or_else(String::new, |sh| {
            format!(
                ", max_in_flight {} (queue {}, timeout {})",
                sh.max_in_flight,
                sh.queue_max,
                format_duration(sh.queue_timeout)
            )
        });
        let _ = writeln!(
            s,
            "  {:<16} {}{protocol} [{}] {hc}{shaping}",
            u.name,
            u.balance,
            servers.join(", ")
        );
    }
}

/// `-t`: the routes, first match first.
fn write_routes(s: &mut String, cfg: &Config) {
    let _ = writeln!(s, "routes ({}, first match wins):", cfg.routes.len());
    for r in &cfg.routes {
        let _ = writeln!(
            s,
            "  {:<16} {} -> {} (tenant {}){}{}",
            r.id,
            r.matcher.describe(),
            r.pools_text(&cfg.upstreams),
            match r.tenant {
                TenantMode::Required => "required",
                TenantMode::Optional => "optional",
                TenantMode::None => "none",
            },
            r.access.as_ref().map_or_else(String::new, access_text),
            r.cors.as_deref().map_or_else(String::new, cors_text)
        );
    }
}

/// `-t`: where tenants come from, and the plans.
fn write_tenant(s: &mut String, cfg: &Config) {
    let sources: Vec<String> = cfg
        .tenant
        .sources
        .iter()
        .map(|src| match src {
            TenantSource::ApiKey { header, keys } => {
                let hide = if cfg.tenant.hidden.contains(header) {
                    ", hidden"
                } else {
                    ""
                };
                let hashed = match keys.hashed.len() {
                    0 => String::new(),
                    n if n == keys.len() => " as digests".to_string(),
                    n => format!(", {n} as digests"),
                };
                format!("api_key({header}, {} keys{hashed}{hide})", keys.len())
            }
            TenantSource::Jwt(j) => {
                let issuers: Vec<&str> = j.issuers.iter().map(|i| i.issuer.as_str()).collect();
                let hide = if j.settings.hide { ", hidden" } else { "" };
                format!(
                    "jwt({}, tenant from claim {}, issuers {}{hide})",
                    j.settings.header,
                    j.settings.tenant_claim.as_str(),
                    issuers.join(" ")
                )
            }
            TenantSource::Path { pattern, trusted } => {
                format!("path({}{})", pattern.as_str(), trust_text(*trusted))
            }
            TenantSource::Header { name, trusted } => {
                format!("header({name}{})", trust_text(*trusted))
            }
            TenantSource::ClientIp => "client_ip".to_string(),
        })
        .collect();
    let _ = writeln!(
        s,
        "tenant: from [{}], required: {}",
        sources.join(", "),
        cfg.tenant.required
    );
    if !cfg.plans.names.is_empty() {
        let plans: Vec<String> = cfg
            .plans
            .names
            .iter()
            .zip(&cfg.plans.priority)
            .map(|(n, &p)| match p {
                0 => n.clone(),
                p => format!("{n} (priority {p})"),
            })
            .collect();
        let _ = writeln!(s, "plans: {}", plans.join(", "));
    }
}

/// What a request costs a rule and when it counts: ` cost 5`, ` cost from header x-cost (max
/// 100, default 1)`, ` unit tokens`, ` counting answers 2xx, 404, grpc OK`; empty for one
/// request counted at once.
pub(crate) fn charge_text(r: &Rule) -> String {
    let mut out = String::new();
    match &r.cost {
        Cost::One => {}
        Cost::Units(n) => {
            let _ = write!(out, " cost {n}");
        }
        Cost::Header { name, max, default } => {
            let _ = write!(
                out,
                " cost from header {name} (max {max}, default {default})"
            );
        }
        Cost::Response {
            name,
            max,
            default,
            trailer,
        } => {
            let kind = if *trailer { "trailer" } else { "header" };
            let _ = write!(
                out,
                " cost from response {kind} {name} (max {max}, default {default})"
            );
        }
    }
    if let Some(u) = &r.unit {
        let _ = write!(out, " unit {u}");
    }
    if let Some(c) = &r.count_when {
        let mut parts: Vec<String> = Vec::new();
        let mut code = 100u16;
        while code < 600 {
            if code.is_multiple_of(100) && (code..code + 100).all(|s| c.status.contains(s)) {
                parts.push(format!("{}xx", code / 100));
                code += 100;
                continue;
            }
            if c.status.contains(code) {
                parts.push(code.to_string());
            }
            code += 1;
        }
        for (i, name) in crate::grpc::NAMES.iter().enumerate() {
            if i < 32 && c.grpc & (1 << i) != 0 {
                parts.push(format!("grpc {name}"));
            }
        }
        let _ = write!(out, " counting answers {}", parts.join(", "));
    }
    out
}

/// `-t`: every rule, with its plans' tiers.
fn write_rules(s: &mut String, cfg: &Config) {
    let _ = writeln!(s, "rules ({}):", cfg.rules.len());
    for r in &cfg.rules {
        let action = action_text(r);
        let tiers = if r.tiers.is_empty() {
            String::new()
        } else {
            format!(" tiers {}", tiers_text(&r.tiers))
        };
        let concurrency = r
            .concurrency
            .map_or_else(String::new, |n| format!(" concurrency {n}"));
        let _ = writeln!(
            s,
            "  {:<16} {} per {} {} {}{tiers}{concurrency}{}{}{}",
            r.id,
            r.matcher.describe(),
            per_text(&r.per),
            r.algorithm,
            action,
            charge_text(r),
            exempt_text(&r.exempt, &cfg.plans),
            if r.enabled { "" } else { " (disabled)" }
        );
        for (i, pt) in r.plan_tiers.iter().enumerate() {
            if let Some(t) = pt {
                let _ = writeln!(
                    s,
                    "  {:<16}   plan {}: {}",
                    "",
                    cfg.plans.names[i],
                    tiers_text(t)
                );
            }
        }
    }
}

/// `-t`: the fleet's Redis and the quota headers.
fn write_redis_and_headers(s: &mut String, cfg: &Config) {
    match &cfg.redis {
        None => {
            let _ = writeln!(s, "redis: none (counts are local to this process)");
        }
        Some(r) => {
            let mode = match &r.endpoint {
                RedisEndpoint::Single(u) => format!("single {}", redact(u)),
                RedisEndpoint::Cluster(n) => format!(
                    "cluster [{}]",
                    n.iter().map(|u| redact(u)).collect::<Vec<_>>().join(", ")
                ),
                RedisEndpoint::Sentinel { master, nodes } => format!(
                    "sentinel {master} [{}]",
                    nodes
                        .iter()
                        .map(|u| redact(u))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let _ = writeln!(
                s,
                "redis: {mode}, sync every {}, timeout {}, prefix {}, on_failure {}",
                format_duration(r.sync_interval),
                format_duration(r.timeout),
                r.key_prefix,
                r.on_failure
            );
        }
    }
    let _ = writeln!(
        s,
        "headers: x-ratelimit {}, ietf {}",
        on_off(cfg.headers.x_ratelimit),
        on_off(cfg.headers.ietf)
    );
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Hide a password in a Redis URL (`redis://:secret@host` -> `redis://***@host`).
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

fn networks_text(nets: &[ipnet::IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// ` cors [origins]` of a route.
fn cors_text(c: &Cors) -> String {
    match &c.origins {
        None => " cors [*]".to_string(),
        Some(list) => format!(" cors [{}]", list.join(", ")),
    }
}

/// ` allow [..] deny [..]` of a route.
fn access_text(a: &AccessList) -> String {
    let mut out = String::new();
    if let Some(allow) = &a.allow {
        let _ = write!(out, " allow [{}]", networks_text(allow));
    }
    if !a.deny.is_empty() {
        let _ = write!(out, " deny [{}]", networks_text(&a.deny));
    }
    out
}

/// ` exempt: ips [..], tenants [..], plans [..]` of a rule (nothing when it has none).
pub(crate) fn exempt_text(e: &Exempt, plans: &Plans) -> String {
    if e.is_empty() {
        return String::new();
    }
    let mut parts = Vec::new();
    if !e.ips.is_empty() {
        parts.push(format!("ips [{}]", networks_text(&e.ips)));
    }
    if !e.tenants.is_empty() {
        let t: Vec<String> = e
            .tenants
            .iter()
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .collect();
        parts.push(format!("tenants [{}]", t.join(", ")));
    }
    if !e.plans.is_empty() {
        let p: Vec<&str> = e
            .plans
            .iter()
            .filter_map(|&i| plans.names.get(i).map(String::as_str))
            .collect();
        parts.push(format!("plans [{}]", p.join(", ")));
    }
    if e.unplanned {
        parts.push("tenants in no plan".to_string());
    }
    format!(" exempt: {}", parts.join(", "))
}
