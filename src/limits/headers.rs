//! What a client is told about its quota (contract section 5): `x-ratelimit-*` for the most
//! restrictive tier, `RateLimit-Policy` for every applying tier, `RateLimit` for the most
//! restrictive, and on denial `Retry-After` and a problem+json body. Shadow rules are never
//! shown to clients.

use super::limiter::{Decision, Limiter, TierReport};
use crate::config::model::HeaderSettings;
use crate::problem;
use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use std::fmt::Write;

pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `10s`, `500ms`, `1m`, `1h`: the period as in policy names.
fn write_period(out: &mut String, ms: u64) {
    let _ = if ms != 0 && ms.is_multiple_of(3_600_000) {
        write!(out, "{}h", ms / 3_600_000)
    } else if ms != 0 && ms.is_multiple_of(60_000) {
        write!(out, "{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        write!(out, "{}s", ms / 1000)
    } else {
        write!(out, "{ms}ms")
    };
}

/// Period in seconds for `w=`: an integer, or a decimal for sub-second periods.
fn write_window_secs(out: &mut String, ms: u64) {
    let _ = if ms.is_multiple_of(1000) {
        write!(out, "{}", ms / 1000)
    } else {
        write!(out, "{}.{:03}", ms / 1000, ms % 1000)
    };
}

fn write_name(out: &mut String, limiter: &Limiter, t: &TierReport) {
    out.push('"');
    out.push_str(&limiter.rules[t.rule as usize].rule.id);
    out.push('/');
    write_period(out, t.period_ms);
    out.push('"');
}

/// The tier the client hears about: when allowed, the one with the fewest requests left
/// (ties: the later reset); when denied, the violated tier with the longest wait.
pub fn most_restrictive(d: &Decision, denied: bool) -> Option<&TierReport> {
    let shown = d.tiers.iter().filter(|t| !t.shadow);
    if denied {
        shown
            .filter(|t| !t.verdict.allowed)
            .max_by_key(|t| t.verdict.retry_after_ms)
    } else {
        shown.min_by(|a, b| {
            a.verdict
                .remaining
                .cmp(&b.verdict.remaining)
                .then(b.verdict.reset_ms.cmp(&a.verdict.reset_ms))
        })
    }
}

/// Add the quota headers to a response. Nothing is added when no (non-shadow) rule applied.
pub fn apply(
    resp: &mut ResponseHeader,
    limiter: &Limiter,
    d: &Decision,
    settings: HeaderSettings,
    denied: bool,
) -> pingora::Result<()> {
    let Some(top) = most_restrictive(d, denied) else {
        return Ok(());
    };
    let remaining = if denied { 0 } else { top.verdict.remaining };
    let reset = ceil_secs(top.verdict.reset_ms).max(1);
    if settings.x_ratelimit {
        resp.insert_header("x-ratelimit-limit", HeaderValue::from(top.threshold))?;
        resp.insert_header("x-ratelimit-remaining", HeaderValue::from(remaining))?;
        resp.insert_header("x-ratelimit-reset", HeaderValue::from(reset))?;
    }
    if settings.ietf {
        let mut policy = String::with_capacity(48 * d.tiers.len());
        for t in d.tiers.iter().filter(|t| !t.shadow) {
            if !policy.is_empty() {
                policy.push_str(", ");
            }
            write_name(&mut policy, limiter, t);
            let _ = write!(policy, ";q={};w=", t.threshold);
            write_window_secs(&mut policy, t.period_ms);
        }
        resp.insert_header("ratelimit-policy", policy)?;
        let mut rl = String::with_capacity(48);
        write_name(&mut rl, limiter, top);
        let _ = write!(rl, ";r={remaining};t={reset}");
        resp.insert_header("ratelimit", rl)?;
    }
    Ok(())
}

/// Seconds for `Retry-After` and `retry_after`: when the denying tiers have room again (>= 1).
pub fn retry_after_secs(d: &Decision) -> u64 {
    ceil_secs(d.retry_after_ms()).max(1)
}

/// The problem+json body of a denial.
pub fn denial_body(limiter: &Limiter, d: &Decision, status: u16) -> Bytes {
    let shown: Vec<&TierReport> = d
        .tiers
        .iter()
        .filter(|t| !t.shadow && !t.verdict.allowed)
        .collect();
    let mut detail = String::new();
    if let Some(first) = most_restrictive(d, true) {
        let _ = write!(
            detail,
            "rate limit {} exceeded: {} per ",
            limiter.rules[first.rule as usize].rule.id, first.threshold
        );
        write_period(&mut detail, first.period_ms);
    }
    let mut extra = String::from("\"violated-policies\":[");
    for (i, t) in shown.iter().enumerate() {
        if i > 0 {
            extra.push(',');
        }
        write_name(&mut extra, limiter, t);
    }
    let _ = write!(extra, "],\"retry_after\":{}", retry_after_secs(d));
    let title = if status == 503 {
        "Service Unavailable"
    } else {
        "Too Many Requests"
    };
    problem::body(status, title, &detail, QUOTA_EXCEEDED, &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_and_windows() {
        let mut s = String::new();
        for ms in [1000, 10_000, 500, 60_000, 3_600_000, 1500] {
            write_period(&mut s, ms);
            s.push(' ');
        }
        assert_eq!(s, "1s 10s 500ms 1m 1h 1500ms ");
        let mut w = String::new();
        write_window_secs(&mut w, 500);
        assert_eq!(w, "0.500");
    }
}
