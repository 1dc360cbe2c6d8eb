//! File model -> validated model. Every check reports `FILE:LINE:COLUMN: message` through the
//! locator, names the field and says what would be accepted. All errors of a file are
//! collected, so one run shows every mistake. One module per section of the file (`server`,
//! `dns`, `upstreams`, `routes`, `tenant` (and its `jwt` source), `limits`, `redis`), each
//! using the `checker` they share (never this module); the defaults are in `config::defaults`.

mod checker;
mod dns;
mod jwt;
mod limits;
mod redis;
mod routes;
mod server;
mod tenant;
mod upstreams;

use checker::*;
use dns::*;
use limits::*;
use redis::*;
use routes::*;
use server::*;
use tenant::*;
use upstreams::*;

/// `limits`: the rules inline, or from the file it names (added to `includes`).
fn check_limits(
    c: &mut Checker,
    limits: Option<LimitsFile>,
    plans: &Plans,
    includes: &mut Vec<PathBuf>,
) -> Vec<Arc<Rule>> {
    match limits {
        None => Vec::new(),
        Some(LimitsFile::Inline(list)) => check_rules(c, "limits", &list, plans),
        Some(LimitsFile::Include(name)) => {
            let target = resolve_relative(&c.file, &name);
            includes.push(target.clone());
            match read_include::<Vec<RuleFile>>(c, "limits", "limits", &target) {
                Some((list, inc_loc)) => {
                    let mut inc = Checker {
                        file: target,
                        loc: inc_loc,
                        label: "limits",
                        errors: c.errors,
                        warnings: c.warnings,
                    };
                    check_rules(&mut inc, "", &list, plans)
                }
                None => Vec::new(),
            }
        }
    }
}

/// A rule whose method, host and path no route can match is never applied: a warning (at the
/// rule's `pathPattern`, or at `limits` for an included file).
fn warn_unreachable_rules(c: &mut Checker, routes: &[Route], rules: &[Arc<Rule>], inline: bool) {
    for (i, rule) in rules.iter().enumerate() {
        if rule.enabled && !routes.iter().any(|r| r.matcher.overlaps(&rule.matcher)) {
            let at = if inline {
                format!("limits[{i}].pathPattern")
            } else {
                "limits".to_string()
            };
            c.warn(
                &at,
                format!(
                    "rule {:?} ({}) matches no route: no request will ever count against it",
                    rule.id,
                    rule.matcher.describe()
                ),
            );
        }
    }
}

/// A plan that no rule gives tiers of its own, exempts or routes by, with no queue priority,
/// changes nothing: a warning (its tenants get each rule's `tiers`, as tenants in no plan).
fn warn_plans_without_tiers(
    c: &mut Checker,
    plans: &Plans,
    rules: &[Arc<Rule>],
    routes: &[RouteFile],
) {
    for (i, name) in plans.names.iter().enumerate() {
        let tiers = rules
            .iter()
            .any(|r| r.plan_tiers.get(i).is_some_and(Option::is_some));
        let exempt = rules.iter().any(|r| r.exempt.plans.contains(&i));
        let routed = routes
            .iter()
            .flat_map(|r| r.upstreams.iter().flatten())
            .filter_map(|e| e.when.as_ref()?.plan.as_ref())
            .any(|p| p.list().contains(name));
        let queued = plans.priority.get(i).is_some_and(|&p| p != 0);
        if !(tiers || exempt || routed || queued) {
            c.warn(
                &format!("plans.{name}"),
                format!(
                    "plan {name:?} names no tier: no rule gives it tiers of its own (a rule's `plans: {{ {name}: [...] }}`), exempts it or routes by it, so each of its tenants gets each rule's default `tiers`"
                ),
            );
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
    let dns = check_dns(&mut c, model.dns.as_ref());
    let upstreams = check_upstreams(&mut c, &model.upstreams, dns.as_ref());
    let default_mode = match &model.tenant {
        Some(t) if t.required => TenantMode::Required,
        _ => TenantMode::Optional,
    };
    let routes = check_routes(&mut c, &model.routes, &upstreams, default_mode);
    if !server.request_id {
        no_request_ids(&mut c, &model.routes);
    }
    let (mut plans, members) = check_plans(&mut c, &model.plans, &mut includes);
    let tenant = match &model.tenant {
        Some(t) => check_tenant(
            &mut c,
            t,
            &mut includes,
            &mut plans,
            members,
            !server.trusted_proxies.is_empty(),
        ),
        None => TenantSettings::default(),
    };
    check_split_plans(&mut c, &model.routes, &plans);
    let inline = matches!(model.limits, Some(LimitsFile::Inline(_)));
    let rules = check_limits(&mut c, model.limits, &plans, &mut includes);
    warn_unreachable_rules(&mut c, &routes, &rules, inline);
    warn_plans_without_tiers(&mut c, &plans, &rules, &model.routes);
    let redis = model.redis.as_ref().and_then(|r| check_redis(&mut c, r));
    let tracing = model.tracing.as_ref().map(|t| check_tracing(&mut c, t));
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
        tracing,
        dns: dns.unwrap_or_default(),
        tls,
        warnings,
    })
}

/// `tracing`: an `http://` or `https://` collector, a share from 0 to 1, a tenant `plain` or
/// `hash`.
fn check_tracing(c: &mut Checker, t: &TracingFile) -> TracingSettings {
    let otlp = t.otlp.trim_end_matches('/').to_string();
    let scheme_ok = otlp.starts_with("http://") || otlp.starts_with("https://");
    if !scheme_ok || otlp.parse::<http::Uri>().is_err() {
        c.err(
            "tracing.otlp",
            format!(
                "{:?} is not an OTLP/HTTP endpoint: expected a URL such as http://127.0.0.1:4318",
                t.otlp
            ),
        );
    }
    let sample = t.sample.unwrap_or(0.01);
    if !(0.0..=1.0).contains(&sample) {
        c.err(
            "tracing.sample",
            format!("sample is the share of requests traced, 0 to 1, got {sample}"),
        );
    }
    let hash_tenant = match t.tenant.as_deref() {
        None | Some("plain") => false,
        Some("hash") => true,
        Some(other) => {
            c.err(
                "tracing.tenant",
                format!(
                    "invalid value {other:?}: expected plain or hash{}",
                    suggest(other, ["plain", "hash"])
                ),
            );
            false
        }
    };
    TracingSettings {
        otlp,
        sample: sample.clamp(0.0, 1.0),
        service_name: t
            .service_name
            .clone()
            .unwrap_or_else(|| "tollgate".to_string()),
        hash_tenant,
    }
}
