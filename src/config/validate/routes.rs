//! `routes`, and the method, host and path matchers routes and rules share.

use super::checker::*;
use crate::config::duration::format_duration;
use crate::matching::methods::NAMES;

pub(super) fn check_methods(c: &mut Checker, path: &str, m: &Option<Vec<String>>) -> MethodSet {
    match m {
        None => MethodSet::ALL,
        Some(list) => MethodSet::parse(list).unwrap_or_else(|e| {
            // an unknown method: at its place, with the one probably meant
            let unknown = list
                .iter()
                .position(|n| MethodSet::parse(std::slice::from_ref(n)).is_err());
            match unknown {
                Some(i) => c.err(
                    &format!("{path}[{i}]"),
                    format!("{e}{}", suggest(&list[i].to_ascii_uppercase(), NAMES)),
                ),
                None => c.err(path, e),
            }
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
        let (upstream, split) = check_pools(c, &base, r, ups);
        let pools = split.as_ref().map_or(vec![upstream], |s| {
            s.entries.iter().map(|e| e.pool).collect()
        });
        if let Some(pool) = pools
            .iter()
            .filter_map(|&p| ups.get(p))
            .find(|u| u.protocol == UpstreamProtocol::Http1 && crate::grpc::names_service(&r.path))
        {
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
            split,
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
            rewrite: r.rewrite.as_ref().and_then(|rw| {
                if r.strip_prefix.is_some() {
                    c.err(
                        &format!("{base}.rewrite"),
                        "a route has `strip_prefix` or `rewrite`, not both (a pattern can strip a prefix too)",
                    );
                }
                check_rewrite(c, &format!("{base}.rewrite"), rw)
            }),
        });
    }
    out
}

/// The index of pool `name` (`path` names it in an error).
fn pool_named(c: &mut Checker, path: &str, name: &str, ups: &[UpstreamSpec]) -> usize {
    ups.iter().position(|u| u.name == name).unwrap_or_else(|| {
        let names: Vec<&str> = ups.iter().map(|u| u.name.as_str()).collect();
        c.err(
            path,
            format!(
                "unknown upstream {name:?}: expected one of the pools under `upstreams` ({}){}",
                names.join(", "),
                suggest(name, names.iter().copied())
            ),
        );
        0
    })
}

/// A route's `upstream`, or its `upstreams` (and `sticky`): exactly one of the two.
fn check_pools(
    c: &mut Checker,
    base: &str,
    r: &RouteFile,
    ups: &[UpstreamSpec],
) -> (usize, Option<Box<Split>>) {
    match (&r.upstream, &r.upstreams) {
        (Some(name), None) => {
            if r.sticky.is_some() {
                c.err(
                    &format!("{base}.sticky"),
                    "sticky needs several pools: list them under `upstreams`",
                );
            }
            (pool_named(c, &format!("{base}.upstream"), name, ups), None)
        }
        (None, Some(list)) => {
            let split = check_split(c, &format!("{base}.upstreams"), list, ups, r.sticky);
            let default = split.entries.iter().find(|e| e.when.is_none());
            (default.map_or(0, |e| e.pool), Some(Box::new(split)))
        }
        (Some(_), Some(_)) => {
            c.err(
                &format!("{base}.upstreams"),
                "a route has `upstream` or `upstreams`, not both",
            );
            (0, None)
        }
        (None, None) => {
            c.err(
                base,
                "a route needs `upstream` (its pool) or `upstreams` (pools with weights)",
            );
            (0, None)
        }
    }
}

/// A route's `upstreams`: each pool known and listed once, weights that can take traffic.
fn check_split(
    c: &mut Checker,
    base: &str,
    list: &[SplitEntryFile],
    ups: &[UpstreamSpec],
    sticky: Option<StickyFile>,
) -> Split {
    let mut entries: Vec<SplitEntry> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let at = format!("{base}[{i}]");
        let pool = pool_named(c, &format!("{at}.pool"), &e.pool, ups);
        let when = e
            .when
            .as_ref()
            .map(|w| check_when(c, &format!("{at}.when"), w));
        if when.is_none() && entries.iter().any(|x| x.pool == pool && x.when.is_none()) {
            c.err(
                &format!("{at}.pool"),
                format!("pool {:?} is listed twice: give it one weight", e.pool),
            );
        }
        entries.push(SplitEntry {
            pool,
            weight: e.weight.unwrap_or(1),
            when,
        });
    }
    let defaults = entries.iter().filter(|e| e.when.is_none());
    if defaults.clone().map(|e| u64::from(e.weight)).sum::<u64>() == 0 {
        c.err(
            base,
            "no entry without `when` has a weight above 0: the requests no `when` takes would have no pool",
        );
    }
    if entries.iter().map(|e| u64::from(e.weight)).sum::<u64>() > u64::from(u32::MAX) {
        c.err(base, "the weights add up to more than 4294967295");
    }
    Split {
        entries,
        sticky: sticky == Some(StickyFile::Tenant),
    }
}

/// An entry's `when`: at least one condition; header names and values valid.
fn check_when(c: &mut Checker, base: &str, w: &WhenFile) -> When {
    let list = |o: &Option<OneOrMany>| o.as_ref().map_or(&[][..], |l| l.list()).to_vec();
    let mut when = When {
        plans: list(&w.plan),
        tenants: list(&w.tenant)
            .into_iter()
            .map(|t| t.into_bytes().into_boxed_slice())
            .collect(),
        headers: Vec::new(),
    };
    for (name, value) in &w.header {
        let at = format!("{base}.header.{name}");
        match (
            HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(v)) => when.headers.push((n, v)),
            (Err(_), _) => c.err(&at, format!("{name:?} is no header name")),
            (_, Err(_)) => c.err(&at, format!("{value:?} is no header value")),
        }
    }
    if when.plans.is_empty() && when.tenants.is_empty() && w.header.is_empty() {
        c.err(
            base,
            "an empty `when` always holds: name a plan, a tenant or a header, or remove it",
        );
    }
    when
}

/// Each `when.plan` of the routes names a plan (checked once the plans are known).
pub(super) fn check_split_plans(c: &mut Checker, routes: &[RouteFile], known: &Plans) {
    for (i, r) in routes.iter().enumerate() {
        for (j, e) in r.upstreams.iter().flatten().enumerate() {
            let Some(plans) = e.when.as_ref().and_then(|w| w.plan.as_ref()) else {
                continue;
            };
            for p in plans.list().iter().filter(|p| !known.names.contains(p)) {
                c.err(
                    &format!("routes[{i}].upstreams[{j}].when.plan"),
                    format!(
                        "unknown plan {p:?}: expected one of the plans ({}){}",
                        known.names.join(", "),
                        suggest(p, known.names.iter().map(String::as_str))
                    ),
                );
            }
        }
    }
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

/// With `server.request_id: false` there is no id: a route's header value naming
/// `${request_id}` is an error at its place.
pub(super) fn no_request_ids(c: &mut Checker, routes: &[RouteFile]) {
    for (i, r) in routes.iter().enumerate() {
        for (side, ops) in [
            ("request_headers", &r.request_headers),
            ("response_headers", &r.response_headers),
        ] {
            let Some(ops) = ops else { continue };
            for (kind, map) in [("set", &ops.set), ("add", &ops.add)] {
                for (n, v) in map.iter().filter(|(_, v)| v.contains("${request_id}")) {
                    c.err(
                        &format!("routes[{i}].{side}.{kind}.{n}"),
                        format!("{v:?} names ${{request_id}}, but server.request_id is false: no request has an id"),
                    );
                }
            }
        }
    }
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
    // without variables, the value is made once (its text was checked above)
    let fixed = match pieces.as_slice() {
        [] => Some(http::HeaderValue::from_static("")),
        [Piece::Text(t)] => http::HeaderValue::from_str(t).ok(),
        _ => None,
    };
    Some(fixed.map_or(Template::Pieces(pieces), Template::Fixed))
}

/// `strip_prefix`: `/api`, at least one segment, no trailing slash, no pattern.
/// The most a `rewrite.pattern` may compile to (the regex crate's own default is 10 MiB).
const REWRITE_SIZE_LIMIT: usize = 1 << 20;

/// A route's `rewrite`: a pattern that compiles, and a `to` that is a path (a slash first,
/// path characters) whose `$` names only the pattern's groups.
fn check_rewrite(c: &mut Checker, base: &str, rw: &PathRewriteFile) -> Option<Box<PathRewrite>> {
    let pattern = regex::RegexBuilder::new(&rw.pattern)
        .size_limit(REWRITE_SIZE_LIMIT)
        .build();
    let pattern = match pattern {
        Ok(p) => p,
        Err(e) => {
            // the crate's message spans lines (the pattern, a caret): one line here
            let why = e
                .to_string()
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
            c.err(
                &format!("{base}.pattern"),
                format!("not a regular expression: {why}"),
            );
            return None;
        }
    };
    let to = &rw.to;
    // its text without the groups (each empty) is a path an upstream may be sent; the groups
    // are parts of a normalized path
    let literal = regex::Regex::new("^")
        .ok()
        .map(|any| any.replace("", to.as_str()).into_owned());
    let is_path = literal.is_some_and(|l| {
        l.starts_with('/')
            && !l.contains(['?', '#'])
            && l.parse::<http::uri::PathAndQuery>().is_ok()
    });
    if !is_path {
        c.err(
            &format!("{base}.to"),
            format!("{to:?}: expected a path (a slash first, then path characters and `$1` or `${{name}}` for the pattern's groups)"),
        );
        return None;
    }
    if let Some(group) = unknown_group(&pattern, to) {
        c.err(
            &format!("{base}.to"),
            format!(
                "${{{group}}}: the pattern has no such group (groups: $1 to ${}, or by name)",
                pattern.captures_len() - 1
            ),
        );
        return None;
    }
    Some(Box::new(PathRewrite {
        pattern,
        to: to.clone(),
    }))
}

/// A group `to` names (`$1`, `${1}`, `$name`, `${name}`; `$$` is a dollar) that `pattern`
/// does not have.
fn unknown_group(pattern: &regex::Regex, to: &str) -> Option<String> {
    let names: Vec<&str> = pattern.capture_names().flatten().collect();
    let known = |g: &str| match g.parse::<usize>() {
        Ok(n) => n < pattern.captures_len(),
        Err(_) => names.contains(&g),
    };
    let mut rest = to;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let group = if let Some(braced) = rest.strip_prefix('{') {
            let end = braced.find('}').unwrap_or(braced.len());
            &braced[..end]
        } else if rest.starts_with('$') {
            rest = &rest[1..];
            continue;
        } else {
            let end = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        };
        if !known(group) {
            return Some(group.to_string());
        }
    }
    None
}

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
