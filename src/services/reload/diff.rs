//! What a reload changes, for its log: rules added, removed and changed (their counts kept or
//! reset, by the counters' identity: rule id, algorithm, `per` and tier periods), and pools
//! added, removed and changed (and the `dns` section their names are looked up with).

use crate::config::model::{Config, Rule, Tier};
use crate::config::summary::{algorithm_text, per_text, tiers_text};
use tollgate_limits::store::RuleIdentity;

/// The tier lists of a rule as the limiter keys its counters: `tiers`, then each plan's own.
fn lists(rule: &Rule, cfg: &Config) -> Vec<(Option<String>, Vec<Tier>)> {
    let mut out = vec![(None, rule.tiers.clone())];
    for (p, tiers) in rule.plan_tiers.iter().enumerate() {
        if let (Some(t), Some(name)) = (tiers, cfg.plans.names.get(p)) {
            out.push((Some(name.clone()), t.clone()));
        }
    }
    out
}

fn identity(rule: &Rule, cfg: &Config) -> RuleIdentity {
    RuleIdentity::of(
        &rule.id,
        rule.algorithm,
        &rule.per,
        lists(rule, cfg)
            .into_iter()
            .map(|(n, t)| (n, Tier::periods(&t))),
    )
}

fn lists_text(lists: &[(Option<String>, Vec<Tier>)]) -> String {
    lists
        .iter()
        .map(|(plan, tiers)| match plan {
            Some(p) => format!("{p}: {}", tiers_text(tiers)),
            None => tiers_text(tiers),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything but the tiers that makes a rule decide differently.
fn other_fields(rule: &Rule) -> String {
    format!(
        "{:?} {:?} {:?} {} {:?} {:?} {} {:?} {:?} {:?} {:?} {:?}",
        rule.matcher,
        rule.action,
        rule.status,
        rule.enabled,
        rule.max_delay,
        rule.shadowban,
        rule.throttle_bps,
        rule.concurrency,
        rule.exempt,
        rule.count_when,
        rule.cost,
        rule.unit
    )
}

/// What changed in a rule kept across a reload (`a` in `old`, `b` in `new`), and whether its
/// counts are kept. `None`: nothing the log tells.
fn rule_change(id: &str, (a, old): (&Rule, &Config), (b, new): (&Rule, &Config)) -> Option<String> {
    let (la, lb) = (lists(a, old), lists(b, new));
    let mut what = Vec::new();
    if la != lb {
        what.push(format!("tiers {} -> {}", lists_text(&la), lists_text(&lb)));
    }
    if a.algorithm != b.algorithm {
        what.push(format!(
            "algorithm {} -> {}",
            algorithm_text(a.algorithm),
            algorithm_text(b.algorithm)
        ));
    }
    if a.per != b.per {
        what.push(format!("per {} -> {}", per_text(&a.per), per_text(&b.per)));
    }
    if other_fields(a) != other_fields(b) {
        what.push("matching or action".to_string());
    }
    if what.is_empty() {
        return None;
    }
    let what = what.join(", ");
    let counts = if identity(a, old) == identity(b, new) {
        "counts kept".to_string()
    } else {
        let mut why = Vec::new();
        if a.algorithm != b.algorithm {
            why.push("algorithm");
        }
        if a.per != b.per {
            why.push("per");
        }
        if why.is_empty() {
            why.push("tier periods or plan lists");
        }
        format!("counts reset ({} changed)", why.join(", "))
    };
    Some(format!("rule {id} changed: {what}; {counts}"))
}

/// The pools added, removed and changed, a line each.
fn pool_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let pools =
        |c: &Config| -> Vec<String> { c.upstreams.iter().map(|u| u.name.clone()).collect() };
    let (pa, pb) = (pools(old), pools(new));
    let pool_added: Vec<&str> = pb
        .iter()
        .filter(|p| !pa.contains(p))
        .map(String::as_str)
        .collect();
    let pool_removed: Vec<&str> = pa
        .iter()
        .filter(|p| !pb.contains(p))
        .map(String::as_str)
        .collect();
    let pool_changed: Vec<&str> = new
        .upstreams
        .iter()
        .filter(|u| old.upstreams.iter().any(|o| o.name == u.name && o != *u))
        .map(|u| u.name.as_str())
        .collect();
    for (what, list) in [
        ("pools added", pool_added),
        ("pools removed", pool_removed),
        ("pools changed", pool_changed),
    ] {
        if !list.is_empty() {
            out.push(format!("{what}: {}", list.join(", ")));
        }
    }
    if old.dns != new.dns {
        out.push("dns changed: servers given by name are looked up with the new settings".into());
    }
    out
}

/// One line per change, in the order: rules added, removed, changed; pools.
pub fn changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    // a disabled rule counts nothing: as good as absent
    let enabled = |c: &'_ Config| -> Vec<(String, usize)> {
        c.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.enabled)
            .map(|(i, r)| (r.id.clone(), i))
            .collect()
    };
    let (before, after) = (enabled(old), enabled(new));
    let find = |list: &[(String, usize)], id: &str| list.iter().find(|(x, _)| x == id).map(|x| x.1);
    let added: Vec<&str> = after
        .iter()
        .filter(|(id, _)| find(&before, id).is_none())
        .map(|(id, _)| id.as_str())
        .collect();
    let removed: Vec<&str> = before
        .iter()
        .filter(|(id, _)| find(&after, id).is_none())
        .map(|(id, _)| id.as_str())
        .collect();
    if !added.is_empty() {
        out.push(format!("rules added: {}", added.join(", ")));
    }
    if !removed.is_empty() {
        out.push(format!("rules removed: {}", removed.join(", ")));
    }
    for (id, j) in &after {
        let Some(i) = find(&before, id) else {
            continue;
        };
        if let Some(line) = rule_change(id, (&old.rules[i], old), (&new.rules[*j], new)) {
            out.push(line);
        }
    }
    out.extend(pool_changes(old, new));
    out
}

#[cfg(test)]
mod tests {
    use super::changes;
    use std::path::Path;

    fn config(rule: &str, servers: &str) -> crate::config::Config {
        let text = format!(
            "server:\n  listen: [\"127.0.0.1:1\"]\nupstreams:\n  app:\n    servers: [{servers}]\nroutes:\n  - {{ id: all, path: /**, upstream: app }}\nplans:\n  gold: [acme]\nlimits:\n{rule}  - {{ id: other, pathPattern: /o/**, tiers: [{{ period: 1s, threshold: 5 }}] }}\n"
        );
        crate::config::load_str(Path::new("t.yaml"), &text).expect("valid")
    }

    #[test]
    fn a_reload_names_what_changed_and_whether_counts_stay() {
        let rule = |tiers: &str, extra: &str| {
            format!("  - {{ id: api, pathPattern: /**, tiers: [{tiers}]{extra} }}\n")
        };
        let base = config(&rule("{ period: 1h, threshold: 5 }", ""), "\"127.0.0.1:9\"");
        let same = |c: &crate::config::Config| changes(&base, c);
        // nothing changed
        assert!(same(&config(
            &rule("{ period: 1h, threshold: 5 }", ""),
            "\"127.0.0.1:9\""
        ))
        .is_empty());
        // a threshold: counts kept
        assert_eq!(
            same(&config(
                &rule("{ period: 1h, threshold: 3 }", ""),
                "\"127.0.0.1:9\""
            )),
            ["rule api changed: tiers 5/1h -> 3/1h; counts kept"]
        );
        // a plan gaining its own tiers: the rule's tier lists change, counts reset
        assert_eq!(
            same(&config(
                &rule("{ period: 1h, threshold: 5 }", ", plans: { gold: [{ period: 1h, threshold: 50 }] }"),
                "\"127.0.0.1:9\""
            )),
            ["rule api changed: tiers 5/1h -> 5/1h, gold: 50/1h; counts reset (tier periods or plan lists changed)"]
        );
        // a calendar month's zone: other windows, counts reset
        let month = |tz: &str| {
            config(
                &rule(
                    "{ period: 1mo, threshold: 5 }",
                    &format!(", calendar: {{ tz: {tz} }}"),
                ),
                "\"127.0.0.1:9\"",
            )
        };
        assert_eq!(
            changes(&month("Europe/Berlin"), &month("Asia/Kolkata")),
            ["rule api changed: tiers 5/1 month in Europe/Berlin -> 5/1 month in Asia/Kolkata; counts reset (tier periods or plan lists changed)"]
        );
        // an algorithm, and a pool
        assert_eq!(
            same(&config(
                &rule("{ period: 1h, threshold: 5 }", ", algorithm: sliding_window"),
                "\"127.0.0.1:8\""
            )),
            [
                "rule api changed: algorithm fixed_window -> sliding_window; counts reset (algorithm changed)",
                "pools changed: app",
            ]
        );
        // what an action does, the requests in flight, and what a rule counts
        for extra in [
            ", concurrency: 4",
            ", action: throttle, throttle: { rate: 1MB/s }",
            ", exempt: { tenants: [acme] }",
            ", count_when: { status: [401] }",
            ", cost: 2",
            ", unit: tokens",
        ] {
            assert_eq!(
                same(&config(
                    &rule("{ period: 1h, threshold: 5 }", extra),
                    "\"127.0.0.1:9\""
                )),
                ["rule api changed: matching or action; counts kept"],
                "{extra}"
            );
        }
        let throttled = |rate: &str| {
            let extra = format!(", action: throttle, throttle: {{ rate: {rate} }}");
            config(
                &rule("{ period: 1h, threshold: 5 }", &extra),
                "\"127.0.0.1:9\"",
            )
        };
        assert_eq!(
            changes(&throttled("1MB/s"), &throttled("2MB/s")),
            ["rule api changed: matching or action; counts kept"]
        );
    }
}
