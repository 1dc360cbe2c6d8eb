//! `routes`, and the method, host and path matchers routes and rules share.

use super::checker::*;

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
        out.push(Route {
            id: r.id.clone(),
            matcher: RequestMatch {
                host: check_host(c, &format!("{base}.host"), &r.host),
                path: check_pattern(c, &format!("{base}.path"), &r.path),
                methods: check_methods(c, &format!("{base}.methods"), &r.methods),
            },
            upstream,
            tenant: match r.tenant {
                None => default_mode,
                Some(TenantModeFile::Required) => TenantMode::Required,
                Some(TenantModeFile::Optional) => TenantMode::Optional,
                Some(TenantModeFile::None) => TenantMode::None,
            },
            access: check_access(c, &base, r),
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
