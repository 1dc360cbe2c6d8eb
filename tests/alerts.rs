//! examples/ops/alerts.yaml (issue 45 item 4) through `promtool test rules`, on the series real
//! gateways produce: one whose Redis does not answer, whose pool's only server is down and
//! whose last reload failed; one whose rule refuses 9 requests in 10. Two scrapes of each
//! (before and after) become 20 minutes of series (counters growing steadily from the first
//! value to the second, gauges at the second), and the alerts that must fire, and those that
//! must not, are checked; a wrong expectation fails promtool.

mod common;

use common::*;
use serde_yaml::{Mapping, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const MINUTES: u32 = 20;

/// `/metrics` as (series, value), and the type of each metric.
fn scrape(gw: &Gateway) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let text = gw.metrics();
    let mut types = BTreeMap::new();
    let mut series = BTreeMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut p = t.split(' ');
            if let (Some(name), Some(kind)) = (p.next(), p.next()) {
                types.insert(name.to_string(), kind.to_string());
            }
        } else if !line.starts_with('#') {
            if let Some((s, v)) = line.rsplit_once(' ') {
                if let Ok(v) = v.parse::<f64>() {
                    series.insert(s.to_string(), v);
                }
            }
        }
    }
    (series, types)
}

/// The metric's name of a series, and its kind (a histogram's `_bucket` is a counter).
fn is_counter(series: &str, types: &BTreeMap<String, String>) -> bool {
    let name = series.split('{').next().unwrap_or(series);
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|b| types.get(*b).is_some_and(|t| t == "histogram"));
    match base {
        Some(_) => true,
        None => types.get(name).is_some_and(|t| t == "counter"),
    }
}

/// promtool's input series of one gateway, as `instance`.
fn input_series(
    instance: &str,
    before: &BTreeMap<String, f64>,
    after: &(BTreeMap<String, f64>, BTreeMap<String, String>),
) -> Vec<Value> {
    let (after, types) = after;
    let labels = format!("instance=\"{instance}\",job=\"tollgate\"");
    after
        .iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(s, b)| {
            let series = match s.strip_suffix('}') {
                Some(open) => format!("{open},{labels}}}"),
                None => format!("{s}{{{labels}}}"),
            };
            let values = if is_counter(s, types) {
                let a = before.get(s).copied().unwrap_or(0.0);
                format!("{a}+{}x{MINUTES}", (b - a) / f64::from(MINUTES))
            } else {
                format!("{b}x{MINUTES}")
            };
            let mut m = Mapping::new();
            m.insert("series".into(), series.into());
            m.insert("values".into(), values.into());
            Value::Mapping(m)
        })
        .collect()
}

/// An alert `name` expected with `labels` (and its summary, rendered from the rules file).
fn expected(rules: &Value, name: &str, labels: &[(&str, &str)]) -> Value {
    let rule = rules["groups"][0]["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|r| r["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name}"));
    let mut summary = rule["annotations"]["summary"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut exp = Mapping::new();
    exp.insert("severity".into(), rule["labels"]["severity"].clone());
    for (k, v) in labels {
        summary = summary.replace(&format!("{{{{ $labels.{k} }}}}"), v);
        exp.insert((*k).into(), (*v).into());
    }
    let mut alert = Mapping::new();
    alert.insert("exp_labels".into(), Value::Mapping(exp));
    let mut ann = Mapping::new();
    ann.insert("summary".into(), summary.into());
    alert.insert("exp_annotations".into(), Value::Mapping(ann));
    Value::Mapping(alert)
}

fn alert_test(name: &str, alerts: Vec<Value>) -> Value {
    let mut t = Mapping::new();
    t.insert("eval_time".into(), format!("{MINUTES}m").into());
    t.insert("alertname".into(), name.into());
    t.insert("exp_alerts".into(), Value::Sequence(alerts));
    Value::Mapping(t)
}

fn promtool(dir: &TempDir, series: &[Value], alerts: &[Value]) -> (bool, String) {
    let rules = repo().join("examples/ops/alerts.yaml");
    let mut test = Mapping::new();
    test.insert("interval".into(), "1m".into());
    test.insert("input_series".into(), Value::Sequence(series.to_vec()));
    test.insert("alert_rule_test".into(), Value::Sequence(alerts.to_vec()));
    let mut file = Mapping::new();
    file.insert(
        "rule_files".into(),
        vec![Value::from(rules.display().to_string())].into(),
    );
    file.insert("evaluation_interval".into(), "1m".into());
    file.insert("tests".into(), vec![Value::Mapping(test)].into());
    let path = dir.write(
        "alerts.test.yaml",
        &serde_yaml::to_string(&file).unwrap_or_default(),
    );
    let out = std::process::Command::new("promtool")
        .args(["test", "rules", &path.display().to_string()])
        .output()
        .expect("promtool (make deps-test installs Debian's prometheus)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_alerts_fire_on_what_gateways_report_and_only_then() {
    // gateway 1: Redis not answering, the pool's one server down, a failed reload
    let up = Upstream::start("app");
    let dead = free_port();
    let broken = one_route_config(up.addr, 1, "").replace(
        &format!("servers: [\"{}\"]\n", up.addr),
        &format!("servers: [\"127.0.0.1:{dead}\"]\n    health_check: {{ interval: 100ms, timeout: 100ms }}\n"),
    ) + &format!("redis:\n  url: redis://127.0.0.1:{}\n  sync_interval: 100ms\n", free_port());
    let gw1 = Gateway::start(&broken);
    let before1 = scrape(&gw1).0;
    let down =
        format!("tollgate_upstream_server_healthy{{pool=\"app\",server=\"127.0.0.1:{dead}\"}} 0");
    assert!(
        eventually(Duration::from_secs(10), || gw1.metrics().contains(&down)),
        "{}",
        gw1.metrics()
    );
    assert!(!gw1.reload(&broken.replace("upstream: app", "upstream: nope")));
    assert!(eventually(Duration::from_secs(5), || {
        let m = gw1.metrics();
        metric_sum(&m, "tollgate_redis_sync_total")
            > before1
                .iter()
                .filter(|(s, _)| s.starts_with("tollgate_redis_sync_total"))
                .map(|(_, v)| v)
                .sum::<f64>()
    }));
    let after1 = scrape(&gw1);
    // gateway 2: a rule of 1 an hour, asked 10 times
    let limited = one_route_config(up.addr, 1, "")
        + "limits:\n  - id: tight\n    pathPattern: /**\n    per: global\n    tiers: [{ period: 1h, threshold: 1 }]\n";
    let gw2 = Gateway::start(&limited);
    let before2 = scrape(&gw2).0;
    let statuses: Vec<u16> = (0..10).map(|_| gw2.get("/x", &[]).status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        9,
        "{statuses:?}"
    );
    let after2 = scrape(&gw2);

    let mut series = input_series("gw1", &before1, &after1);
    series.extend(input_series("gw2", &before2, &after2));
    let rules: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("examples/ops/alerts.yaml")).unwrap_or_default(),
    )
    .unwrap_or(Value::Null);
    let base = [("instance", "gw1"), ("job", "tollgate")];
    let server = format!("127.0.0.1:{dead}");
    let with = |more: &[(&'static str, &str)]| -> Vec<(&str, String)> {
        base.iter()
            .map(|(k, v)| (*k, v.to_string()))
            .chain(more.iter().map(|(k, v)| (*k, v.to_string())))
            .collect()
    };
    let exp = |name: &str, labels: Vec<(&str, String)>| {
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        alert_test(name, vec![expected(&rules, name, &l)])
    };
    let alerts = vec![
        exp("TollgateRedisUnreachable", with(&[])),
        exp("TollgateReloadFailed", with(&[])),
        exp("TollgatePoolDown", with(&[("pool", "app")])),
        exp(
            "TollgateUpstreamServerUnhealthy",
            with(&[("pool", "app"), ("server", &server)]),
        ),
        exp(
            "TollgateRefusalsHigh",
            vec![
                ("instance", "gw2".into()),
                ("job", "tollgate".into()),
                ("rule", "tight".into()),
            ],
        ),
        // nothing held long, no error replies, no token issuer
        alert_test("TollgateHoldsLong", vec![]),
        alert_test("TollgateRedisErrorReplies", vec![]),
        alert_test("TollgateJwksFetchFailing", vec![]),
    ];
    let dir = TempDir::new();
    let (ok, out) = promtool(&dir, &series, &alerts);
    assert!(ok, "{out}");
    // the check can fail: an alert expected that does not fire
    let mut wrong = alerts.clone();
    wrong.push(exp("TollgateHoldsLong", with(&[])));
    let (ok, out) = promtool(&dir, &series, &wrong);
    assert!(!ok, "{out}");
}
