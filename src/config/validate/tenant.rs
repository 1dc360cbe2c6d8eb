//! `tenant` sources and `plans` (inline or a file), and the plans API keys carry.

use super::checker::*;
use super::jwt::check_jwt;
use super::routes::check_pattern;

/// A plan member, where it was written (for the check against the API keys' tenants).
pub(super) struct Member {
    tenant: String,
    file: PathBuf,
    pos: Pos,
    path: String,
    label: &'static str,
}

/// `plans`: a map of plan name to tenants, or a file holding it.
pub(super) fn check_plans(
    c: &mut Checker,
    plans: &Option<PlansFile>,
    includes: &mut Vec<PathBuf>,
) -> (Plans, Vec<Member>) {
    match plans {
        None => (Plans::default(), Vec::new()),
        Some(PlansFile::Inline(map)) => plans_of(c, "plans.", map),
        Some(PlansFile::Include(name)) => {
            let target = resolve_relative(&c.file, name);
            includes.push(target.clone());
            match read_include::<BTreeMap<String, PlanFile>>(c, "plans", "plans.", &target) {
                Some((map, loc)) => {
                    let mut inc = Checker {
                        file: target,
                        loc,
                        label: "plans.",
                        errors: c.errors,
                        warnings: c.warnings,
                    };
                    plans_of(&mut inc, "", &map)
                }
                None => (Plans::default(), Vec::new()),
            }
        }
    }
}

/// `prefix`: how paths start in `c`'s file (`plans.` in the main file, nothing in a plans file,
/// whose messages are labelled `plans.`).
fn plans_of(
    c: &mut Checker,
    prefix: &str,
    plans: &BTreeMap<String, PlanFile>,
) -> (Plans, Vec<Member>) {
    let mut out = Plans::default();
    let mut members = Vec::new();
    for (name, plan) in plans {
        let base = format!("{prefix}{name}");
        if !valid_id(name) {
            c.err_key(&base, format!("invalid plan name {name:?}: {ID_RULE}"));
        }
        if !(-1_000_000..=1_000_000).contains(&plan.priority) {
            c.err(
                &format!("{base}.priority"),
                format!(
                    "priority must be -1000000 to 1000000, got {}",
                    plan.priority
                ),
            );
        }
        let idx = out.names.len();
        out.names.push(name.clone());
        out.priority.push(plan.priority);
        // `premium: [a, b]` lists at `premium[i]`, the map form at `premium.tenants[i]`
        let list = if c.loc.at(&format!("{base}.tenants")) != c.loc.at(&base) {
            format!("{base}.tenants")
        } else {
            base.clone()
        };
        for (i, t) in plan.tenants.iter().enumerate() {
            let path = format!("{list}[{i}]");
            if t.is_empty() {
                c.err(&path, "tenant id must not be empty");
                continue;
            }
            let key: Box<[u8]> = t.as_bytes().into();
            if let Some(prev) = out.by_tenant.insert(key, idx) {
                c.err(
                    &path,
                    format!(
                        "tenant {t:?} is already in plan {:?}: a tenant belongs to one plan",
                        out.names[prev]
                    ),
                );
            }
            members.push(Member {
                tenant: t.clone(),
                file: c.file.clone(),
                pos: c.loc.at(&path),
                path,
                label: c.label,
            });
        }
    }
    (out, members)
}

/// The keys of one `api_key` source (a map in the main file or a keys file): key -> tenant,
/// and each key's plan joins `plans`.
/// A key's `plan`: a known plan, the same for every key of its tenant (written to `plans`).
fn key_plan(c: &mut Checker, base: &str, plan: &str, tenant: &str, plans: &mut Plans) {
    match plans.names.iter().position(|n| n == plan) {
        None => c.err(
            &format!("{base}.plan"),
            format!(
                "unknown plan {plan:?}: expected one of the plans under `plans` ({}){}",
                plans.names.join(", "),
                suggest(plan, plans.names.iter().map(String::as_str))
            ),
        ),
        Some(idx) => {
            let t: Box<[u8]> = tenant.as_bytes().into();
            match plans.by_tenant.get(&t) {
                Some(&prev) if prev != idx => c.err(
                    &format!("{base}.plan"),
                    format!(
                        "tenant {:?} is already in plan {:?}: a tenant belongs to one plan",
                        tenant, plans.names[prev]
                    ),
                ),
                _ => {
                    plans.by_tenant.insert(t, idx);
                }
            }
        }
    }
}

/// Keys stored as they are: none also stored as its digest for another tenant, and one warning
/// (at the first) that they are readable by anyone who reads the file.
fn check_plain_keys(
    c: &mut Checker,
    prefix: &str,
    keys: &BTreeMap<String, KeyFile>,
    out: &ApiKeys,
) {
    // the same key both as itself and as its digest: one tenant, or the file contradicts itself
    for (key, tenant) in &out.plain {
        match out.hashed.get(&key_digest(key)) {
            Some(other) if other != tenant => c.err_key(
                &format!("{prefix}{key}"),
                format!("this key's digest is also in the file, for tenant {other:?}: a key has one tenant"),
            ),
            _ => {}
        }
    }
    // one warning, at the first key stored as it is
    if let Some(first) = keys.keys().find(|k| out.plain.contains_key(*k)) {
        let more = match out.plain.len() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more)"),
        };
        c.warn(
            &format!("{prefix}{first}"),
            format!(
                "this API key{more} is stored as it is: anyone who reads the file can use it; store the key's digest instead (`tollgate hash-key` prints it: `sha256:...`)"
            ),
        );
    }
}

fn check_keys(
    c: &mut Checker,
    prefix: &str,
    keys: &BTreeMap<String, KeyFile>,
    plans: &mut Plans,
    key_tenants: &mut HashSet<String>,
) -> ApiKeys {
    let mut out = ApiKeys::default();
    for (key, entry) in keys {
        let base = format!("{prefix}{key}");
        if key.is_empty() || entry.tenant.is_empty() {
            c.err(&base, "keys and tenants must not be empty");
            continue;
        }
        let digest = match key.strip_prefix(KEY_DIGEST_PREFIX) {
            None => None,
            Some(hex) => match parse_key_digest(hex) {
                Some(d) => Some(d),
                None => {
                    c.err_key(
                        &base,
                        format!("{KEY_DIGEST_PREFIX} must be followed by the 64 hex digits of the key's SHA-256 digest (`tollgate hash-key` prints it), got {} characters", hex.len()),
                    );
                    continue;
                }
            },
        };
        key_tenants.insert(entry.tenant.clone());
        if let Some(plan) = &entry.plan {
            key_plan(c, &base, plan, &entry.tenant, plans);
        }
        let tenant = entry.tenant.clone();
        match digest {
            Some(d) => {
                if let Some(prev) = out.hashed.insert(d, tenant) {
                    if prev != entry.tenant {
                        c.err_key(
                            &base,
                            "this digest is written twice (in other case) with different tenants",
                        );
                    }
                }
            }
            None => {
                out.plain.insert(key.clone(), tenant);
            }
        }
    }
    check_plain_keys(c, prefix, keys, &out);
    out
}

/// A tenant source any client can fill in with any tenant id: trusted (a warning), or not
/// trusted while no proxy is (nothing will use it).
fn warn_claimable(c: &mut Checker, at: &str, what: &str, trusted: bool, trusted_proxies: bool) {
    if trusted {
        c.warn(
            at,
            format!("{what} is trusted: any client can claim any tenant with it; trust it only behind a proxy that sets it (or list the proxy in server.trusted_proxies instead)"),
        );
    } else if !trusted_proxies {
        c.warn(
            at,
            format!("{what} is not trusted and server.trusted_proxies is empty: no request will use it; list the proxies that set it, or add trusted: true"),
        );
    }
}

/// `tenant.from[i].api_key`: its header, and its keys from `keys` or `keys_file`.
fn check_api_key(
    c: &mut Checker,
    base: &str,
    k: &ApiKeyFile,
    plans: &mut Plans,
    includes: &mut Vec<PathBuf>,
    key_tenants: &mut HashSet<String>,
) -> (Option<HeaderName>, Option<ApiKeys>) {
    let header = header_name(c, &format!("{base}.api_key.header"), &k.header);
    let keys = match (&k.keys, &k.keys_file) {
        (Some(map), None) => Some(check_keys(
            c,
            &format!("{base}.api_key.keys."),
            map,
            plans,
            key_tenants,
        )),
        (None, Some(f)) => {
            let target = resolve_relative(&c.file, f);
            includes.push(target.clone());
            read_include::<BTreeMap<String, KeyFile>>(
                c,
                &format!("{base}.api_key.keys_file"),
                "keys_file.",
                &target,
            )
            .map(|(map, loc)| {
                let mut inc = Checker {
                    file: target,
                    loc,
                    label: "keys_file.",
                    errors: c.errors,
                    warnings: c.warnings,
                };
                check_keys(&mut inc, "", &map, plans, key_tenants)
            })
        }
        _ => {
            c.err(
                &format!("{base}.api_key"),
                "give exactly one of `keys` (a map of key to tenant) or `keys_file` (a YAML file holding that map)",
            );
            None
        }
    };
    (header, keys)
}

/// A plan member that no key maps to is probably a typo (only known when keys exist): an
/// error under `tenant.strict`, else a warning.
fn check_unkeyed_members(
    c: &mut Checker,
    strict: bool,
    members: &[Member],
    key_tenants: &HashSet<String>,
) {
    for m in members.iter().filter(|m| !key_tenants.contains(&m.tenant)) {
        let message = format!(
            "{}{}: tenant {:?} is not the tenant of any API key (a typo?)",
            m.label, m.path, m.tenant
        );
        if strict {
            c.errors.push(ConfigError::new(&m.file, m.pos, message));
        } else {
            c.warnings.push(ConfigError::new(
                &m.file,
                m.pos,
                format!("warning: {message}; tenant.strict: true makes this an error"),
            ));
        }
    }
}

/// `tenant.from[i].path`: a pattern capturing the tenant with one `{tenant}` segment.
fn check_path_source(
    c: &mut Checker,
    base: &str,
    p: &str,
    trusted: bool,
    trusted_proxies: bool,
) -> TenantSource {
    let pat = check_pattern(c, &format!("{base}.path"), p);
    if !pat.has_capture() && PathPattern::compile(p).is_ok() {
        c.err(
            &format!("{base}.path"),
            format!("path {p:?} must capture the tenant with one `{{tenant}}` segment"),
        );
    }
    warn_claimable(
        c,
        &format!("{base}.path"),
        &format!("path {p}"),
        trusted,
        trusted_proxies,
    );
    TenantSource::Path {
        pattern: pat,
        trusted,
    }
}

/// `tenant.forward_header`: the header the upstream is told the tenant in (none: off), and
/// the one stripped from requests (the default's when off).
fn check_forward_header(
    c: &mut Checker,
    f: Option<&ForwardHeaderFile>,
) -> (Option<HeaderName>, HeaderName) {
    match f {
        None => (Some(default_tenant_header()), default_tenant_header()),
        Some(ForwardHeaderFile::Off) => (None, default_tenant_header()),
        Some(ForwardHeaderFile::Name(h)) => {
            let name =
                header_name(c, "tenant.forward_header", h).unwrap_or_else(default_tenant_header);
            (Some(name.clone()), name)
        }
    }
}

pub(super) fn check_tenant(
    c: &mut Checker,
    t: &TenantFile,
    includes: &mut Vec<PathBuf>,
    plans: &mut Plans,
    members: Vec<Member>,
    trusted_proxies: bool,
) -> TenantSettings {
    let mut sources = Vec::new();
    let mut hidden = Vec::new();
    let mut jwks = Vec::new();
    let mut key_tenants = HashSet::new();
    let mut any_keys = false;
    for (i, s) in t.from.iter().enumerate() {
        let base = format!("tenant.from[{i}]");
        let claimable = |c: &mut Checker, at: &str, what: &str, trusted: bool| {
            warn_claimable(c, at, what, trusted, trusted_proxies)
        };
        match s {
            TenantSourceFile::ApiKey(k) => {
                any_keys = true;
                let (header, keys) = check_api_key(c, &base, k, plans, includes, &mut key_tenants);
                if let (Some(header), Some(keys)) = (header, keys) {
                    if k.hide.unwrap_or(true) {
                        hidden.push(header.clone());
                    }
                    sources.push(TenantSource::ApiKey { header, keys });
                }
            }
            TenantSourceFile::Jwt(j) => {
                let at = format!("{base}.jwt");
                if let Some(src) = check_jwt(c, &at, j, plans, includes, &mut jwks) {
                    if src.settings.hide {
                        hidden.push(src.settings.header.clone());
                    }
                    sources.push(TenantSource::Jwt(src));
                }
            }
            TenantSourceFile::Path(p, trusted) => {
                sources.push(check_path_source(c, &base, p, *trusted, trusted_proxies));
            }
            TenantSourceFile::Header(h, trusted) => {
                if let Some(name) = header_name(c, &format!("{base}.header"), h) {
                    claimable(
                        c,
                        &format!("{base}.header"),
                        &format!("header {name}"),
                        *trusted,
                    );
                    sources.push(TenantSource::Header {
                        name,
                        trusted: *trusted,
                    });
                }
            }
            TenantSourceFile::ClientIp(_) => sources.push(TenantSource::ClientIp),
        }
    }
    if any_keys {
        check_unkeyed_members(c, t.strict, &members, &key_tenants);
    }
    let (forward_header, strip_header) = check_forward_header(c, t.forward_header.as_ref());
    TenantSettings {
        sources,
        required: t.required,
        hidden,
        forward_name: forward_header.as_ref().map_or_else(bytes::Bytes::new, |h| {
            bytes::Bytes::copy_from_slice(h.as_str().as_bytes())
        }),
        forward_header,
        strip_header,
        jwks,
    }
}
