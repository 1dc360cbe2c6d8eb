//! `limits`: rules and their tiers.

use super::checker::*;
use super::routes::{check_host, check_methods, check_pattern};

/// A tier's period: a length, or a calendar unit in `zone` (only a fixed window has one).
fn check_period(
    c: &mut Checker,
    p: &str,
    t: &TierFile,
    algorithm: Algorithm,
    zone: &str,
) -> (Duration, Option<Calendar>) {
    let (period, calendar) = match t.period {
        PeriodFile::Fixed(d) => (d, None),
        PeriodFile::Calendar(unit) => {
            if algorithm != Algorithm::FixedWindow {
                c.err(
                    &format!("{p}.period"),
                    format!(
                        "a calendar period ({}) needs algorithm fixed_window: a {algorithm} has no calendar; write a fixed length such as 24h",
                        unit.as_str()
                    ),
                );
            }
            let cal = Calendar::new(unit, zone)
                .or_else(|_| Calendar::new(unit, "UTC"))
                .ok();
            (Duration::from_millis(unit.nominal_ms()), cal)
        }
    };
    if period.is_zero() {
        c.err(
            &format!("{p}.period"),
            "period must be greater than 0 (seconds, or a string such as \"500ms\")",
        );
    }
    (period, calendar)
}

/// A tier's threshold: positive, within what the headers can carry (and a sliding log keep).
fn check_threshold(c: &mut Checker, p: &str, threshold: i64, algorithm: Algorithm) {
    if threshold <= 0 {
        c.err(
            &format!("{p}.threshold"),
            format!("threshold must be a positive integer, got {}", threshold),
        );
    }
    if threshold > MAX_THRESHOLD {
        c.err(
            &format!("{p}.threshold"),
            format!(
                "threshold {} is too large: the RateLimit headers carry it as a Structured \
                 Field integer, at most {MAX_THRESHOLD} (15 digits)",
                threshold
            ),
        );
    }
    if algorithm == Algorithm::SlidingLog && threshold > MAX_LOG_THRESHOLD {
        c.err(
            &format!("{p}.threshold"),
            format!(
                "threshold {} is too large for sliding_log, which keeps every admission of \
                 the period (at most {MAX_LOG_THRESHOLD}): use sliding_window, which counts \
                 in two windows and is within a few percent",
                threshold
            ),
        );
    }
}

/// A rule's tiers (or a plan's). `zone`: the rule's calendar time zone (checked by the
/// caller), for tiers of `1d`, `1w`, `1mo`, which only a fixed window counts.
pub(super) fn check_tiers(
    c: &mut Checker,
    base: &str,
    tiers: &[TierFile],
    (algorithm, queue): (Algorithm, Option<u64>),
    zone: &str,
) -> Vec<Tier> {
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
        let (period, calendar) = check_period(c, &p, t, algorithm, zone);
        check_threshold(c, &p, t.threshold.0, algorithm);
        let threshold = t.threshold.0.max(1) as u64;
        let tier = Tier {
            period,
            threshold,
            calendar,
            queue: (algorithm == Algorithm::LeakyBucket).then(|| queue.unwrap_or(threshold)),
        };
        if out
            .iter()
            .any(|o| o.period == period && o.calendar.is_some() == calendar.is_some())
        {
            c.err(
                &format!("{p}.period"),
                format!(
                    "two tiers have the period {}: merge them (the lower threshold wins)",
                    tier.label()
                ),
            );
        }
        out.push(tier);
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
            // `header x-user`, `header=x-user`: the name after another separator
            let sep = [' ', '=', '-', '_'];
            let meant = match other.strip_prefix("header") {
                Some(name) if name.starts_with(sep) && !name.trim_start_matches(sep).is_empty() => {
                    format!(
                        "; did you mean `header:{}`?",
                        name.trim_start_matches(sep).trim()
                    )
                }
                _ => suggest(other, ["tenant", "ip", "global"]),
            };
            c.err(
                path,
                format!(
                    "invalid value {other:?}: expected tenant, ip, global or header:<name>{meant}"
                ),
            );
            PartitionBy::Tenant
        }
    }
}

/// A rule's `concurrency`: 1 to `MAX_CONCURRENCY` requests in flight.
fn check_concurrency(c: &mut Checker, base: &str, concurrency: Option<i64>) -> Option<u32> {
    match concurrency {
        None => None,
        Some(n) if (1..=MAX_CONCURRENCY).contains(&n) => Some(n as u32),
        Some(n) => {
            c.err(
                &format!("{base}.concurrency"),
                format!("concurrency must be 1 to {MAX_CONCURRENCY} requests in flight, got {n}"),
            );
            None
        }
    }
}

/// A rule's own tiers (none for a `concurrency` limit alone, which rejects).
fn check_rule_tiers(
    c: &mut Checker,
    base: &str,
    r: &RuleFile,
    (zone, queue): (&str, Option<u64>),
) -> Vec<Tier> {
    if r.tiers.is_empty() && r.concurrency.is_none() && !r.plans.is_empty() {
        // only its plans' tiers (checked with them), for their tenants only
        Vec::new()
    } else if r.tiers.is_empty() && r.concurrency.is_none() {
        // none at all: at `tiers: []`, or at the rule's `id` when it has no `tiers` key
        let tiers = format!("{base}.tiers");
        let written = c.loc.key(&tiers) != c.loc.at(base);
        let pos = if written {
            c.loc.at(&tiers)
        } else {
            c.loc.key(&format!("{base}.id"))
        };
        c.push(
            pos,
            &tiers,
            "must list at least one tier such as { period: 10, threshold: 100 } (or, to limit only some plans' tenants, give tiers per plan under `plans`; or set `concurrency`)".to_string(),
        );
        Vec::new()
    } else if r.tiers.is_empty() && r.concurrency.is_some() {
        // a concurrency limit alone
        if r.action != Action::Reject {
            c.err(
                &format!("{base}.action"),
                format!("action {} applies to tiers; a rule with only `concurrency` rejects (status 429 or 503)", r.action),
            );
        }
        Vec::new()
    } else {
        check_tiers(
            c,
            &format!("{base}.tiers"),
            &r.tiers,
            (r.algorithm, queue),
            zone,
        )
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
        let zone = check_calendar(c, &base, r);
        let queue = check_queue(c, &base, r);
        let concurrency = check_concurrency(c, &base, r.concurrency);
        let tiers = check_rule_tiers(c, &base, r, (&zone, queue));
        let plan_tiers = check_plan_tiers(c, &base, r, plans, (&zone, queue));
        let exempt = only_for_its_plans(c, &base, r, plans, &plan_tiers);
        let status = check_status(c, &base, r);
        let max_delay = check_max_delay(c, &base, r);
        let shadowban = check_shadowban(c, &base, r);
        let throttle_bps = check_throttle(c, &base, r);
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
            shadowban,
            throttle_bps,
            concurrency,
            exempt,
            count_when: check_count_when(c, &base, r),
            cost: check_cost(c, &base, r),
            unit: check_unit(c, &base, r),
        }));
    }
    out
}

/// A rule's `calendar`: its time zone (an IANA name; UTC without it), for tiers of `1d`, `1w`
/// or `1mo`, which it must have. Returns the zone the tiers use (UTC when it is unknown: the
/// error is reported here, once).
fn check_calendar(c: &mut Checker, base: &str, r: &RuleFile) -> String {
    let Some(cal) = &r.calendar else {
        return "UTC".to_string();
    };
    let calendar_tier = r
        .tiers
        .iter()
        .chain(r.plans.values().flatten())
        .any(|t| matches!(t.period, PeriodFile::Calendar(_)));
    if !calendar_tier {
        c.err_key(
            &format!("{base}.calendar"),
            "calendar sets the time zone of tiers whose period is 1d, 1w or 1mo; this rule has none",
        );
    }
    match Calendar::new(CalendarUnit::Day, &cal.tz) {
        Ok(_) => cal.tz.clone(),
        Err(e) => {
            c.err(&format!("{base}.calendar.tz"), e);
            "UTC".to_string()
        }
    }
}

/// A rule's `unit`: a lowercase token of up to 32 letters, digits and dashes (`request`, the
/// default, leaves `qu` out). The draft registers `request`, `content-bytes` and
/// `concurrent-requests`; a cost is often in units of its own (`tokens`).
fn check_unit(c: &mut Checker, base: &str, r: &RuleFile) -> Option<Box<str>> {
    let unit = r.unit.as_deref()?;
    let ok = (1..=32).contains(&unit.len())
        && unit.as_bytes()[0].is_ascii_lowercase()
        && unit
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        c.err(
            &format!("{base}.unit"),
            format!("{unit:?} is not a unit: expected a lowercase name of up to 32 letters, digits and dashes, such as tokens or content-bytes"),
        );
        return None;
    }
    (unit != "request").then(|| unit.into())
}

/// A rule's `count_when`: statuses (`401`), classes (`"5xx"`) and gRPC statuses (`UNAVAILABLE`
/// or `14`); not with `action: delay` (a delayed request would wait for a count taken after
/// its answer), nor without tiers.
fn check_count_when(c: &mut Checker, base: &str, r: &RuleFile) -> Option<CountWhen> {
    let cw = r.count_when.as_ref()?;
    let path = format!("{base}.count_when");
    if r.action == Action::Delay {
        c.err(
            &path,
            "count_when counts a request after its answer; action delay would hold requests for a count not yet taken: use reject, shadow, shadowban or throttle",
        );
    }
    if r.tiers.is_empty() {
        c.err(
            &path,
            "count_when applies to `tiers` (a rate), not to `concurrency` alone",
        );
    }
    if cw.status.is_empty() && cw.grpc_status.is_empty() {
        c.err_key(
            &format!("{path}.status"),
            "lists at least one status (401) or class (\"5xx\"), or count_when lists grpc_status",
        );
    }
    let mut set = CountWhen::default();
    for (i, st) in cw.status.iter().enumerate() {
        match st {
            StatusFile::Code(n) if (100..=599).contains(n) => set.status.insert(*n as u16),
            StatusFile::Class(class)
                if class.len() == 3
                    && matches!(class.as_bytes()[0], b'1'..=b'5')
                    && class[1..].eq_ignore_ascii_case("xx") =>
            {
                let first = u16::from(class.as_bytes()[0] - b'0') * 100;
                (first..first + 100).for_each(|s| set.status.insert(s));
            }
            other => c.err(
                &format!("{path}.status[{i}]"),
                format!(
                    "{} is not a status: expected 100 to 599, or a class such as \"5xx\"",
                    match other {
                        StatusFile::Code(n) => n.to_string(),
                        StatusFile::Class(s) => format!("{s:?}"),
                    }
                ),
            ),
        }
    }
    for (i, st) in cw.grpc_status.iter().enumerate() {
        let code = match st {
            StatusFile::Code(n) => u8::try_from(*n)
                .ok()
                .and_then(|n| crate::grpc::code_of(&n.to_string())),
            StatusFile::Class(name) => crate::grpc::code_of(name),
        };
        match code {
            Some(code) => set.grpc |= 1 << code,
            None => c.err(
                &format!("{path}.grpc_status[{i}]"),
                format!(
                    "{} is not a gRPC status: expected 0 to 16 or a name such as UNAVAILABLE or RESOURCE_EXHAUSTED",
                    match st {
                        StatusFile::Code(n) => n.to_string(),
                        StatusFile::Class(s) => format!("{s:?}"),
                    }
                ),
            ),
        }
    }
    Some(set)
}

/// `status`: 429 or 503, for the actions that answer with it (and `concurrency`).
fn check_status(c: &mut Checker, base: &str, r: &RuleFile) -> u16 {
    match (r.action, r.status) {
        (_, None) => 429,
        (Action::Shadow | Action::Shadowban | Action::Throttle, Some(_))
            if r.concurrency.is_none() =>
        {
            c.err(
                &format!("{base}.status"),
                format!(
                    "status applies to action reject or delay (and to concurrency), not {}{}",
                    r.action,
                    match r.action {
                        Action::Shadow => " (which never blocks)",
                        Action::Shadowban => " (its answer is `shadowban.status`)",
                        _ => " (which proxies the request)",
                    }
                ),
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
    }
}

/// `queue`: only with `algorithm: leaky_bucket`, 0 (no waiting: a request passes only on its
/// turn) to `MAX_QUEUE`. None: each tier queues up to its threshold.
fn check_queue(c: &mut Checker, base: &str, r: &RuleFile) -> Option<u64> {
    let q = r.queue?;
    let path = format!("{base}.queue");
    if r.algorithm != Algorithm::LeakyBucket {
        c.err(
            &path,
            format!(
                "queue applies only to algorithm: leaky_bucket (this rule is {})",
                r.algorithm
            ),
        );
        return None;
    }
    if !(0..=MAX_QUEUE).contains(&q) {
        c.err(
            &path,
            format!("queue must be 0 to {MAX_QUEUE} requests waiting, got {q}"),
        );
        return None;
    }
    Some(q as u64)
}

/// `max_delay`: only with `action: delay`.
fn check_max_delay(c: &mut Checker, base: &str, r: &RuleFile) -> Duration {
    match (r.action, r.max_delay) {
        (Action::Delay, d) => positive(c, &format!("{base}.max_delay"), d, DEFAULT_MAX_DELAY),
        (_, Some(_)) => {
            c.err(
                &format!("{base}.max_delay"),
                "max_delay applies only to action: delay",
            );
            DEFAULT_MAX_DELAY
        }
        (_, None) => DEFAULT_MAX_DELAY,
    }
}

/// `throttle.rate` of `action: throttle`, in bytes per second (0: not throttled).
fn check_throttle(c: &mut Checker, base: &str, r: &RuleFile) -> u64 {
    match (&r.throttle, r.action) {
        (Some(t), Action::Throttle) => parse_rate(&t.rate.0).unwrap_or_else(|e| {
            c.err(&format!("{base}.throttle.rate"), e);
            1
        }),
        (None, Action::Throttle) => {
            c.err(
                &format!("{base}.action"),
                "action throttle needs `throttle: { rate: 64KiB/s }`, the pace of an over-limit response",
            );
            1
        }
        (Some(_), _) => {
            c.err_key(
                &format!("{base}.throttle"),
                "throttle applies only to action: throttle",
            );
            1
        }
        (None, _) => 0,
    }
}

/// Each plan's own tiers (indexed like `Plans::names`); the plans must exist.
fn check_plan_tiers(
    c: &mut Checker,
    base: &str,
    r: &RuleFile,
    plans: &Plans,
    (zone, queue): (&str, Option<u64>),
) -> Vec<Option<Vec<Tier>>> {
    let mut plan_tiers: Vec<Option<Vec<Tier>>> = vec![None; plans.names.len()];
    for (plan, pt) in &r.plans {
        let p = format!("{base}.plans.{plan}");
        match plans.names.iter().position(|n| n == plan) {
            Some(_) if pt.is_empty() => c.err(
                &p,
                format!("a plan's tiers replace the rule's for its tenants: list at least one tier such as {{ period: 10, threshold: 100 }}, or remove `{plan}` to give them the rule's `tiers`"),
            ),
            Some(idx) => plan_tiers[idx] = Some(check_tiers(c, &p, pt, (r.algorithm, queue), zone)),
            None => c.err_key(&p, unknown_plan(plan, plans)),
        }
    }
    plan_tiers
}

/// A rule's `cost`: at least 1 and at most its smallest threshold (a request that costs more
/// could never pass); from a request header, its `max` likewise and a `default` up to it; from
/// the answer (`response_header`), `max` the smallest threshold unless given (one answer fills
/// a window at most). Not with `concurrency` alone; a cost from the answer not with
/// `action: delay` (as `count_when`).
/// A number of units (`what` at `at`): 1 to the rule's smallest threshold (`why` says why).
fn units_within(
    c: &mut Checker,
    (at, what, why): (&str, &str, &str),
    n: i64,
    smallest: i64,
) -> u64 {
    if n < 1 || n > smallest {
        c.err(
            at,
            format!(
                "{what} must be 1 to {smallest} (the rule's smallest threshold: {why}), got {n}"
            ),
        );
        1
    } else {
        n as u64
    }
}

/// Where a cost is read: its header's name, whether from the answer, and whether from its
/// trailers. `None`: not exactly one of them named.
fn cost_source(
    c: &mut Checker,
    path: &str,
    h: &CostHeaderFile,
) -> Option<(Option<HeaderName>, bool, bool)> {
    Some(match (&h.header, &h.response_header, &h.response_trailer) {
        (Some(name), None, None) => (
            header_name(c, &format!("{path}.header"), name),
            false,
            false,
        ),
        (None, Some(name), None) => (
            header_name(c, &format!("{path}.response_header"), name),
            true,
            false,
        ),
        (None, None, Some(name)) => (
            header_name(c, &format!("{path}.response_trailer"), name),
            true,
            true,
        ),
        _ => {
            c.err(
            path,
            "cost names one of a request `header`, a `response_header` or a `response_trailer` (the upstream's answer carries the cost), exactly one of them",
        );
            return None;
        }
    })
}

/// A cost's `default` (when its header is missing): 1 to `max`, 1 when left out.
fn cost_default(c: &mut Checker, path: &str, default: Option<i64>, max: u64) -> u64 {
    match default {
        None => 1,
        Some(d) if (1..=max as i64).contains(&d) => d as u64,
        Some(d) => {
            c.err(
                &format!("{path}.default"),
                format!("default must be 1 to max ({max}), got {d}"),
            );
            1
        }
    }
}

fn check_cost(c: &mut Checker, base: &str, r: &RuleFile) -> Cost {
    let Some(cost) = &r.cost else {
        return Cost::One;
    };
    let path = format!("{base}.cost");
    let smallest = r
        .tiers
        .iter()
        .chain(r.plans.values().flatten())
        .map(|t| t.threshold.0)
        .min();
    let Some(smallest) = smallest else {
        c.err_key(
            &path,
            "cost applies to `tiers` (a rate), not to `concurrency` alone",
        );
        return Cost::One;
    };
    if smallest < 1 {
        // the tiers' own errors say why
        return Cost::One;
    }
    let units = |c: &mut Checker, at: &str, n: i64, what: &str, why: &str| {
        units_within(c, (at, what, why), n, smallest)
    };
    const NEVER: &str = "a request that costs more could never pass";
    let h = match cost {
        CostFile::Units(n) => {
            return match units(c, &path, *n, "cost", NEVER) {
                1 => Cost::One,
                n => Cost::Units(n),
            }
        }
        CostFile::Header(h) => h,
    };
    let Some((name, at_answer, trailer)) = cost_source(c, &path, h) else {
        return Cost::One;
    };
    if at_answer && r.action == Action::Delay {
        c.err(
            &path,
            "a cost taken from the answer is charged after it; action delay would hold requests for a charge not yet taken: use reject, shadow, shadowban or throttle",
        );
    }
    let max = match (h.max, at_answer) {
        (Some(m), false) => units(c, &format!("{path}.max"), m, "max", NEVER),
        (Some(m), true) => units(
            c,
            &format!("{path}.max"),
            m,
            "max",
            "one answer fills a window at most",
        ),
        (None, true) => smallest as u64,
        (None, false) => {
            c.err(
                &path,
                "a cost from a request header needs `max`: a larger value is refused (400)",
            );
            1
        }
    };
    let default = cost_default(c, &path, h.default, max);
    match (name, at_answer) {
        (Some(name), false) => Cost::Header { name, max, default },
        (Some(name), true) => Cost::Response {
            name,
            max,
            default,
            trailer,
        },
        (None, _) => Cost::One,
    }
}

fn unknown_plan(name: &str, plans: &Plans) -> String {
    format!(
        "unknown plan {name:?}: expected one of the plans under `plans` ({}){}",
        if plans.names.is_empty() {
            "none defined".to_string()
        } else {
            plans.names.join(", ")
        },
        suggest(name, plans.names.iter().map(String::as_str))
    )
}

/// A rule's `exempt`; and, for a rule with no `tiers` of its own, whose plans' tiers are all
/// it has: every request of no plan or of a plan it gives no tiers, which a warning names.
fn only_for_its_plans(
    c: &mut Checker,
    base: &str,
    r: &RuleFile,
    plans: &Plans,
    plan_tiers: &[Option<Vec<Tier>>],
) -> Exempt {
    let mut exempt = check_exempt(c, base, r, plans);
    if r.tiers.is_empty() && r.concurrency.is_some() && !r.plans.is_empty() {
        c.warn_key(
            &format!("{base}.plans"),
            format!(
                "rule {:?} has `concurrency` and no `tiers`: its plans' tiers are not counted (give the rule `tiers` too, or move them to a rule of their own)",
                r.id
            ),
        );
    }
    if !r.tiers.is_empty() || r.concurrency.is_some() || r.plans.is_empty() {
        return exempt;
    }
    exempt.unplanned = true;
    let mut left: Vec<&str> = Vec::new();
    for (i, name) in plans.names.iter().enumerate() {
        if plan_tiers.get(i).is_none_or(Option::is_none) {
            left.push(name);
            if !exempt.plans.contains(&i) {
                exempt.plans.push(i);
            }
        }
    }
    let plans_left = match left.as_slice() {
        [] => String::new(),
        [one] => format!(" and of plan {one}"),
        more => format!(" and of plans {}", more.join(", ")),
    };
    c.warn_key(
        &format!("{base}.plans"),
        format!(
            "rule {:?} has no `tiers` of its own: it limits only the tenants of the plans it names; requests of tenants in no plan{plans_left} are not limited by it (give the rule `tiers` to limit them)",
            r.id
        ),
    );
    exempt
}

/// A rule's `exempt`: client networks, tenants and plans it neither counts nor refuses.
fn check_exempt(c: &mut Checker, base: &str, r: &RuleFile, plans: &Plans) -> Exempt {
    let Some(e) = &r.exempt else {
        return Exempt::default();
    };
    let mut plan_ids = Vec::new();
    for (i, name) in e.plans.iter().enumerate() {
        match plans.names.iter().position(|n| n == name) {
            Some(p) => plan_ids.push(p),
            None => c.err(
                &format!("{base}.exempt.plans[{i}]"),
                unknown_plan(name, plans),
            ),
        }
    }
    for (i, t) in e.tenants.iter().enumerate() {
        if t.is_empty() {
            c.err(
                &format!("{base}.exempt.tenants[{i}]"),
                "a tenant id is not empty",
            );
        }
    }
    Exempt {
        ips: check_networks(c, &format!("{base}.exempt.ips"), &e.ips),
        tenants: e
            .tenants
            .iter()
            .map(|t| t.as_bytes().to_vec().into_boxed_slice())
            .collect(),
        plans: plan_ids,
        unplanned: false,
    }
}

/// `shadowban: { status, body, content_type }` of a shadowban rule (default 200, `{}`, JSON).
fn check_shadowban(c: &mut Checker, base: &str, r: &RuleFile) -> Option<Arc<ShadowbanReply>> {
    match (&r.shadowban, r.action) {
        (Some(_), a) if a != Action::Shadowban => {
            c.err_key(
                &format!("{base}.shadowban"),
                "shadowban applies only to action: shadowban",
            );
            None
        }
        (_, Action::Shadowban) => {
            let f = r.shadowban.as_ref();
            let status = f.and_then(|f| f.status).unwrap_or(DEFAULT_SHADOWBAN_STATUS);
            if !(200..=599).contains(&status) {
                c.err(
                    &format!("{base}.shadowban.status"),
                    format!("invalid status {status}: expected 200 to 599"),
                );
            }
            let content_type = f
                .and_then(|f| f.content_type.clone())
                .unwrap_or_else(|| DEFAULT_SHADOWBAN_CONTENT_TYPE.to_string());
            if http::HeaderValue::from_str(&content_type).is_err() {
                c.err(
                    &format!("{base}.shadowban.content_type"),
                    format!("invalid content type {content_type:?}"),
                );
            }
            let body = f
                .and_then(|f| f.body.clone())
                .unwrap_or_else(|| DEFAULT_SHADOWBAN_BODY.to_string());
            Some(Arc::new(ShadowbanReply {
                status,
                content_type,
                body: bytes::Bytes::from(body),
            }))
        }
        _ => None,
    }
}

/// A rate in bytes per second: `64KiB/s`, `1.5MB/s`, `500000` (decimal units are powers of
/// 1000, binary ones of 1024; `/s` may be left out).
pub(crate) fn parse_rate(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("invalid rate {text:?}: expected bytes per second such as \"64KiB/s\", \"1MB/s\" or 500000")
    };
    let t = text.trim();
    let t = t.strip_suffix("/s").unwrap_or(t).trim();
    let split = t
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "KiB" => 1024.0,
        "MB" => 1e6,
        "MiB" => 1024.0 * 1024.0,
        "GB" => 1e9,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let v = n * mult;
    if !(1.0..1e15).contains(&v) {
        return Err(format!(
            "invalid rate {text:?}: must be at least 1 byte per second"
        ));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_in_decimal_and_binary_units() {
        assert_eq!(parse_rate("64KiB/s"), Ok(65536));
        assert_eq!(parse_rate("1MB/s"), Ok(1_000_000));
        assert_eq!(parse_rate("1.5 MiB"), Ok(1_572_864));
        assert_eq!(parse_rate("500000"), Ok(500_000));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("10 parsecs/s").is_err());
    }
}
