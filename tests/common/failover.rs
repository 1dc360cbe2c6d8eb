//! Redis under faults with two gateways and wrk (`cluster`, `sentinel`): the rules `all` (never
//! denies: its counts are what Redis must hold) and `tiny` (full long before the fault), the
//! load, and what the gateways say they admitted.

use super::{eventually, metric_sum, Gateway, TempDir};
use std::process::{Command, Stdio};
use std::time::Duration;

/// wrk over the five tenants, every other request on `/tiny/x`.
pub fn wrk(dir: &TempDir, gw: &Gateway, secs: u64) -> std::process::Child {
    let lua = r#"local n = 0
request = function()
  n = n + 1
  local path = (n % 2 == 0) and "/tiny/x" or "/x"
  return wrk.format("GET", path, { ["x-org-id"] = "t" .. (n % 5) })
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d errors=%d\n", summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"#;
    let script = dir.write("load.lua", lua);
    Command::new("wrk")
        .args(["-t1", "-c4", &format!("-d{secs}s"), "-s"])
        .arg(&script)
        .arg(format!("http://{}/", gw.addr))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wrk (install wrk)")
}

/// (requests, socket errors) of a finished wrk.
pub fn wrk_result(child: std::process::Child) -> (u64, u64) {
    let out = child.wait_with_output().expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT from wrk:\n{text}"));
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("requests"), field("errors"))
}

/// Answers with a 5xx status, from the gateway's metrics.
pub fn five_xx(gw: &Gateway) -> f64 {
    gw.metrics()
        .lines()
        .filter(|l| l.starts_with("tollgate_requests_total{") && l.contains("status=\"5"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What the gateways admitted under rule `rule`.
pub fn allowed(gws: &[&Gateway], rule: &str) -> f64 {
    gws.iter()
        .map(|g| {
            metric_sum(
                &g.metrics(),
                &format!(
                    "tollgate_ratelimit_decisions_total{{decision=\"allowed\",rule=\"{rule}\""
                ),
            )
        })
        .sum()
}

/// Deltas the gateways have not reported yet.
pub fn pending(gws: &[&Gateway]) -> f64 {
    gws.iter()
        .map(|g| metric_sum(&g.metrics(), "tollgate_redis_pending_deltas"))
        .sum()
}

/// Denials of rule `rule` on `gw`.
fn denied(gw: &Gateway, rule: &str) -> f64 {
    metric_sum(
        &gw.metrics(),
        &format!("tollgate_ratelimit_decisions_total{{decision=\"denied\",rule=\"{rule}\""),
    )
}

/// Until both gateways refuse `tiny`'s requests: full before the fault (`holds`: what Redis
/// holds for a rule, for the message).
pub fn until_tiny_is_full(gws: [&Gateway; 2], holds: impl Fn(&str) -> i64) {
    assert!(
        eventually(Duration::from_secs(5), || gws
            .iter()
            .all(|g| denied(g, "tiny") > 0.0)),
        "the tiny limit is not full: Redis holds {}",
        holds("tiny")
    );
    // (`all` reports at the gateways' rounds: on a busy machine `tiny` can fill first)
    assert!(
        eventually(Duration::from_secs(5), || holds("all") > 0),
        "counting before the fault"
    );
}

/// After the fault and the load: wrk saw no socket error, the gateways answered no 5xx
/// (`on_failure: local_share`) and refused nothing under `all`, and Redis ends up holding
/// exactly what they admitted under `all`, each count once. Then `tiny` (200 per tenant,
/// full before the fault) drifted by at most its threshold per tenant (the bound of a
/// window Redis fails in); says what it measured after `what`.
pub fn nothing_failed_or_lost(
    gws: [&Gateway; 2],
    results: &[(u64, u64)],
    tenants: usize,
    holds: impl Fn(&str) -> i64,
    what: &str,
) {
    for (gw, (requests, errors)) in gws.iter().zip(results) {
        assert!(*requests > 1000, "{requests} requests");
        assert_eq!(*errors, 0, "socket errors");
        assert_eq!(five_xx(gw), 0.0, "no 5xx with on_failure: local_share");
        assert_eq!(
            denied(gw, "all"),
            0.0,
            "a request under its limit was refused"
        );
    }
    assert!(
        eventually(Duration::from_secs(10), || pending(&gws) == 0.0
            && holds("all") as f64 == allowed(&gws, "all")),
        "Redis holds {} of {} admitted",
        holds("all"),
        allowed(&gws, "all")
    );
    let tiny = holds("tiny");
    let drift = tiny - 200 * tenants as i64;
    let said = allowed(&gws, "tiny");
    eprintln!(
        "{what}; {} requests; tiny admitted {tiny} for a limit of {} (drift {drift}); the gateways say they admitted {said}",
        results.iter().map(|r| r.0).sum::<u64>(),
        200 * tenants
    );
    assert!(
        (0..=200 * tenants as i64).contains(&drift),
        "drift {drift}; the gateways say they admitted {said}"
    );
}
