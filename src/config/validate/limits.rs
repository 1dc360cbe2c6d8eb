//! `limits`: rules and their tiers.

use super::*;

pub(super) fn check_tiers(c: &mut Checker, base: &str, tiers: &[TierFile]) -> Vec<Tier> {
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

pub(super) fn check_per(c: &mut Checker, path: &str, per: &Option<String>) -> PartitionBy {
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

pub(super) fn check_rules(
    c: &mut Checker,
    prefix: &str,
    list: &[RuleFile],
    plans: &Plans,
) -> Vec<Arc<Rule>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let base = if prefix.is_empty() {
            format!("[{i}]")
        } else {
            format!("{prefix}[{i}]")
        };
        check_id(c, &base, "rule", &r.id, &mut seen);
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
