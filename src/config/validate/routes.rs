//! `routes`, and the method, host and path matchers routes and rules share.

use super::checker::*;
use crate::config::duration::format_duration;

pub(super) fn check_methods(c: &mut Checker, path: &str, m: &Option<Vec<String>>) -> MethodSet {
    match m {
        None => MethodSet::ALL,
        Some(list) => MethodSet::parse(list).unwrap_or_else(|e| {
            c.err(path, e);
            MethodSet::ALL
        }),
    }
}

pub(super) fn check_pattern(c: &mut Checker, path: &str, p: &str) -> PathPattern {
    PathPattern::compile(p).unwrap_or_else(|e| {
        c.err(path, e);
        PathPattern::any() // never used: the config is rejected
    })
}

pub(super) fn check_host(c: &mut Checker, path: &str, h: &Option<String>) -> Option<HostMatch> {
    h.as_ref().and_then(|h| match HostMatch::parse(h) {
        Ok(m) => Some(m),
        Err(e) => {
            c.err(path, e);
            None
        }
    })
}

pub(super) fn check_routes(
    c: &mut Checker,
    routes: &[RouteFile],
    ups: &[UpstreamSpec],
    default_mode: TenantMode,
) -> Vec<Route> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let base = format!("routes[{i}]");
        check_id(c, &base, "route", &r.id, &mut seen);
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
        if let Some(pool) = ups.get(upstream).filter(|u| {
            u.protocol == UpstreamProtocol::Http1 && crate::grpc::names_service(&r.path)
        }) {
            c.warn(
                &format!("{base}.path"),
                format!(
                    "{} names gRPC methods, but pool {:?} speaks HTTP/1.1, which cannot carry gRPC (its calls are answered INTERNAL): set the pool's protocol to h2 or h2c",
                    r.path, pool.name
                ),
            );
        }
        let methods = check_methods(c, &format!("{base}.methods"), &r.methods);
        out.push(Route {
            id: r.id.clone(),
            matcher: RequestMatch {
                host: check_host(c, &format!("{base}.host"), &r.host),
                path: check_pattern(c, &format!("{base}.path"), &r.path),
                methods,
            },
            upstream,
            tenant: match r.tenant {
                None => default_mode,
                Some(TenantModeFile::Required) => TenantMode::Required,
                Some(TenantModeFile::Optional) => TenantMode::Optional,
                Some(TenantModeFile::None) => TenantMode::None,
            },
            access: check_access(c, &base, r),
            cors: r
                .cors
                .as_ref()
                .map(|cf| Box::new(check_cors(c, &format!("{base}.cors"), cf, methods))),
            timeouts: r
                .timeouts
                .as_ref()
                .map(|t| check_timeouts(c, &format!("{base}.timeouts"), t))
                .unwrap_or_default(),
            request_headers: r
                .request_headers
                .as_ref()
                .map(|h| Box::new(check_header_ops(c, &format!("{base}.request_headers"), h))),
            response_headers: r
                .response_headers
                .as_ref()
                .map(|h| Box::new(check_header_ops(c, &format!("{base}.response_headers"), h))),
            strip_prefix: r
                .strip_prefix
                .as_ref()
                .and_then(|p| check_prefix(c, &format!("{base}.strip_prefix"), p)),
        });
    }
    out
}

/// A route's `allow` and `deny` (none: every client may use it).
fn check_access(c: &mut Checker, base: &str, r: &RouteFile) -> Option<AccessList> {
    if r.allow.is_none() && r.deny.is_empty() {
        return None;
    }
    let allow = r.allow.as_ref().map(|list| {
        if list.is_empty() {
            c.err(
                &format!("{base}.allow"),
                "an empty allow list refuses every client: list the networks that may use the route, or remove `allow`",
            );
        }
        check_networks(c, &format!("{base}.allow"), list)
    });
    let deny = check_networks(c, &format!("{base}.deny"), &r.deny);
    Some(AccessList { allow, deny })
}

/// The quota headers a page on another origin may read (`Access-Control-Expose-Headers`).
const QUOTA_HEADERS: [&str; 7] = [
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
    "x-ratelimit-retry-after",
];

/// The methods a preflight may ask for when `cors.methods` is not given and the route takes
/// every method.
const CORS_METHODS: [&str; 6] = ["GET", "HEAD", "PUT", "PATCH", "POST", "DELETE"];

/// A route's `cors` (`route_methods`: the route's own, the default for `cors.methods`).
fn check_cors(c: &mut Checker, base: &str, f: &CorsFile, route_methods: MethodSet) -> Cors {
    let origins = match &f.origins {
        OriginsFile::Any(s) if s == "*" => None,
        OriginsFile::Any(s) => {
            c.err(
                &format!("{base}.origins"),
                format!("{s:?}: expected \"*\" (any origin) or a list of origins such as [\"https://app.example.com\"]"),
            );
            None
        }
        OriginsFile::List(list) => {
            if list.is_empty() {
                c.err(
                    &format!("{base}.origins"),
                    "an empty list lets no page call the route: list origins, or \"*\"",
                );
            }
            let mut out = Vec::with_capacity(list.len());
            for (i, o) in list.iter().enumerate() {
                match origin(o) {
                    Ok(o) => out.push(o),
                    Err(e) => c.err(&format!("{base}.origins[{i}]"), e),
                }
            }
            Some(out)
        }
    };
    if f.credentials && origins.is_none() {
        c.err(
            &format!("{base}.credentials"),
            "credentials need a list of origins: browsers refuse `Access-Control-Allow-Origin: *` on a request with credentials",
        );
    }
    let methods = match &f.methods {
        Some(_) => check_methods(c, &format!("{base}.methods"), &f.methods),
        None if route_methods.is_all() => MethodSet::parse(&CORS_METHODS).unwrap_or(MethodSet::ALL),
        None => route_methods,
    };
    let headers = f
        .headers
        .as_ref()
        .map(|list| header_names(c, &format!("{base}.headers"), list));
    let allow_headers = headers
        .as_ref()
        .and_then(|h| joined(h.iter().map(HeaderName::as_str)));
    let mut expose = header_names(c, &format!("{base}.expose_headers"), &f.expose_headers);
    for q in QUOTA_HEADERS {
        if !expose.iter().any(|h| h.as_str() == q) {
            expose.push(HeaderName::from_static(q));
        }
    }
    let max_age = f
        .max_age
        .map(|ConfDuration(d)| http::HeaderValue::from(d.as_secs()));
    Cors {
        origins,
        methods,
        allow_methods: joined(methods.names().into_iter())
            .unwrap_or(http::HeaderValue::from_static("GET")),
        headers,
        allow_headers,
        expose: joined(expose.iter().map(HeaderName::as_str))
            .unwrap_or(http::HeaderValue::from_static("ratelimit")),
        credentials: f.credentials,
        max_age,
    }
}

/// A serialized origin, `scheme://host[:port]`, in lower case.
fn origin(text: &str) -> Result<String, String> {
    let bad = || {
        format!("{text:?} is not an origin: expected scheme://host[:port] with nothing after it, such as \"https://app.example.com\"")
    };
    let uri: http::Uri = text.parse().map_err(|_| bad())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(bad());
    };
    if text.ends_with('/')
        || uri.query().is_some()
        || authority.as_str().contains('@')
        || authority.host().contains('*')
    {
        return Err(bad());
    }
    Ok(format!("{scheme}://{authority}").to_ascii_lowercase())
}

/// Header names of a list, in lower case (an invalid one is an error at its place).
fn header_names(c: &mut Checker, path: &str, list: &[String]) -> Vec<HeaderName> {
    let mut out = Vec::with_capacity(list.len());
    for (i, h) in list.iter().enumerate() {
        match HeaderName::from_bytes(h.as_bytes()) {
            Ok(n) => out.push(n),
            Err(_) => c.err(
                &format!("{path}[{i}]"),
                format!("{h:?} is not a header name"),
            ),
        }
    }
    out
}

/// `a, b, c` as one header value (`None` for none).
fn joined<'a>(names: impl Iterator<Item = &'a str>) -> Option<http::HeaderValue> {
    let text = names.collect::<Vec<_>>().join(", ");
    (!text.is_empty())
        .then(|| http::HeaderValue::from_str(&text).ok())
        .flatten()
}

/// A route's `timeouts`: each greater than 0; a `total` under `connect` or `read` is
/// probably not meant (it cuts them short).
fn check_timeouts(c: &mut Checker, base: &str, t: &RouteTimeoutsFile) -> RouteTimeouts {
    let mut one = |key: &str, d: Option<ConfDuration>| {
        d.map(|ConfDuration(d)| {
            if d.is_zero() {
                c.err(
                    &format!("{base}.{key}"),
                    "must be greater than 0, e.g. \"500ms\" or 2 (omit the key for the pool's)",
                );
            }
            d
        })
    };
    let out = RouteTimeouts {
        connect: one("connect", t.connect),
        read: one("read", t.read),
        total: one("total", t.total),
    };
    if let Some(total) = out.total {
        for (key, d) in [("connect", out.connect), ("read", out.read)] {
            if d.is_some_and(|d| d > total) {
                c.warn(
                    &format!("{base}.total"),
                    format!(
                        "{} is shorter than {key} ({}): total cuts it short",
                        format_duration(total),
                        format_duration(d.unwrap_or_default())
                    ),
                );
            }
        }
    }
    out
}

/// Headers a route may not set, add or remove: the framing of the message, which the gateway
/// keeps.
const FRAMING: [&str; 6] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "keep-alive",
];

/// A route's `request_headers` or `response_headers`.
fn check_header_ops(c: &mut Checker, base: &str, f: &HeaderOpsFile) -> HeaderOps {
    let name = |c: &mut Checker, path: String, n: &str| -> Option<HeaderName> {
        match HeaderName::from_bytes(n.as_bytes()) {
            Ok(h) if FRAMING.contains(&h.as_str()) => {
                c.err(
                    &path,
                    format!("{n} is the message's framing, which the gateway keeps"),
                );
                None
            }
            Ok(h) => Some(h),
            Err(_) => {
                c.err(&path, format!("{n:?} is not a header name"));
                None
            }
        }
    };
    let mut out = HeaderOps::default();
    for (i, n) in f.remove.iter().enumerate() {
        if let Some(h) = name(c, format!("{base}.remove[{i}]"), n) {
            out.remove.push(h);
        }
    }
    for (kind, map) in [("set", &f.set), ("add", &f.add)] {
        for (n, v) in map {
            let path = format!("{base}.{kind}.{n}");
            let (Some(h), Some(t)) = (name(c, path.clone(), n), template(c, &path, v)) else {
                continue;
            };
            if kind == "set" {
                out.set.push((h, t));
            } else {
                out.add.push((h, t));
            }
        }
    }
    out
}

/// A header value with `${tenant}`, `${plan}`, `${route}`, `${client_ip}`, `${request_id}`.
fn template(c: &mut Checker, path: &str, text: &str) -> Option<Template> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        if at > 0 {
            pieces.push(Piece::Text(rest[..at].to_string()));
        }
        let Some(end) = rest[at..].find('}') else {
            c.err(path, format!("{text:?}: \"${{\" without its \"}}\""));
            return None;
        };
        let var = &rest[at + 2..at + end];
        match Var::NAMES.iter().find(|(n, _)| *n == var) {
            Some((_, v)) => pieces.push(Piece::Var(*v)),
            None => {
                let names: Vec<String> = Var::NAMES
                    .iter()
                    .map(|(n, _)| format!("${{{n}}}"))
                    .collect();
                c.err(
                    path,
                    format!(
                        "unknown variable ${{{var}}}: expected one of {}",
                        names.join(", ")
                    ),
                );
                return None;
            }
        }
        rest = &rest[at + end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    for p in &pieces {
        if let Piece::Text(t) = p {
            if http::HeaderValue::from_str(t).is_err() {
                c.err(path, format!("{text:?} is not a header value"));
                return None;
            }
        }
    }
    Some(Template(pieces))
}

/// `strip_prefix`: `/api`, at least one segment, no trailing slash, no pattern.
fn check_prefix(c: &mut Checker, path: &str, p: &str) -> Option<String> {
    let ok = p.starts_with('/')
        && p.len() > 1
        && !p.ends_with('/')
        && !p.contains(['*', '{', '?', '#', '%'])
        && !p.contains("//");
    if !ok {
        c.err(
            path,
            format!("{p:?}: expected a leading path such as \"/api\" (a slash first, none last, no pattern or escape)"),
        );
    }
    ok.then(|| p.to_string())
}
