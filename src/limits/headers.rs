//! What a client is told about its quota (contract section 5): `x-ratelimit-*` for the most
//! restrictive tier, `RateLimit-Policy` for every applying tier, `RateLimit` for the most
//! restrictive, and on denial `Retry-After` and a problem+json body. Shadow rules are never
//! shown to clients.
//!
//! The texts of each tier are made once per config (`policy::TierText`), and a
//! `RateLimit-Policy` value once per set of applying tiers (`policy::PolicyCache`), so an
//! allowed request formats one short string (`RateLimit`).

use super::limiter::Limiter;
use super::policy::{PolicyCache, TierText};
use crate::config::duration::write_period;
use crate::config::model::HeaderSettings;
use crate::problem;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;
use std::fmt::Write;
use std::sync::OnceLock;
use tollgate_limits::decision::{Decision, TierReport};

/// The detail of a 503 under `on_failure: deny` (no Redis detail for clients).
pub const UNCHECKABLE: &str =
    "the rate limits of this request cannot be checked right now; try again shortly";

pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// A header value for a number; the small ones are made once and shared.
fn number(v: u64) -> HeaderValue {
    static SMALL: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let small = SMALL.get_or_init(|| (0..=1024u64).map(HeaderValue::from).collect());
    small
        .get(v as usize)
        .cloned()
        .unwrap_or_else(|| block::value(&[itoa::Buffer::new().format(v)]))
}

/// Values made for one answer (a large count, `RateLimit`), cut from a block of this thread
/// (`BytesMut::split`) instead of allocated each: a block is reused once every value cut from
/// it is dropped, and Pingora's copy of an HTTP/2 answer's head clones each value by a
/// reference count instead of moving it to shared storage (a second allocation).
mod block {
    use bytes::BytesMut;
    use http::HeaderValue;
    use std::cell::RefCell;

    /// A block's size: about ten answers' values. Small, because one value still alive (the
    /// head of a long stream, which Pingora keeps) keeps its whole block.
    const SIZE: usize = 512;

    thread_local! {
        static BLOCK: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    }

    /// A header value of `parts` one after another (empty if they are not a valid value).
    pub fn value(parts: &[&str]) -> HeaderValue {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let cut = BLOCK.try_with(|b| {
            let mut b = b.try_borrow_mut().ok()?;
            if b.capacity() < len {
                b.reserve(SIZE.max(len));
            }
            for p in parts {
                b.extend_from_slice(p.as_bytes());
            }
            Some(b.split().freeze())
        });
        match cut.ok().flatten() {
            Some(bytes) => HeaderValue::from_maybe_shared(bytes),
            None => HeaderValue::from_bytes(parts.concat().as_bytes()),
        }
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

pub fn text<'l>(limiter: &'l Limiter, t: &TierReport) -> Option<&'l TierText> {
    limiter
        .rules
        .get(t.rule as usize)?
        .texts
        .get(t.list as usize)?
        .get(t.tier as usize)
}

impl PolicyCache {
    fn value(&self, limiter: &Limiter, d: &Decision) -> Option<HeaderValue> {
        let key: SmallVec<[u32; 4]> = d
            .tiers
            .iter()
            .filter(|t| !t.shadow && t.tier == 0)
            .map(|t| (u32::from(t.rule) << 16) | u32::from(t.list))
            .collect();
        if let Some(v) = self.0.read().get(&key) {
            return Some(v.clone());
        }
        let mut policy = String::with_capacity(48 * d.tiers.len());
        for t in d.tiers.iter().filter(|t| !t.shadow) {
            if !policy.is_empty() {
                policy.push_str(", ");
            }
            policy.push_str(&text(limiter, t)?.policy);
        }
        let v = HeaderValue::try_from(policy).ok()?;
        let mut map = self.0.write();
        if map.len() < PolicyCache::MAX {
            map.insert(key, v.clone());
        }
        Some(v)
    }
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
        fewest_left(shown)
    }
}

/// The tier with the fewest left among `shown` (ties: the later reset).
fn fewest_left<'d>(shown: impl Iterator<Item = &'d TierReport>) -> Option<&'d TierReport> {
    shown.min_by(|a, b| {
        a.verdict
            .remaining
            .cmp(&b.verdict.remaining)
            .then(b.verdict.reset_ms.cmp(&a.verdict.reset_ms))
    })
}

/// The tiers the headers tell: `x-ratelimit-*`'s first, then the others `RateLimit` lists.
/// One unit, or a denial: the most restrictive tier (after a denial, the violated one with the
/// longest wait, with nothing left). Several units on an admitted request (requests and tokens,
/// say): each unit's tier with the fewest left, in its own terms, requests first:
/// `x-ratelimit-*` tell the requests tier (when none applies, the first unit's).
fn told<'d>(limiter: &Limiter, d: &'d Decision, denied: bool) -> SmallVec<[&'d TierReport; 2]> {
    let mut out = SmallVec::new();
    if !limiter.mixed_units || denied {
        if let Some(t) = most_restrictive(d, denied) {
            out.push(t);
        }
        return out;
    }
    let unit = |t: &TierReport| {
        limiter
            .rules
            .get(usize::from(t.rule))
            .map_or(0, |cr| cr.unit)
    };
    let shown = || d.tiers.iter().filter(|t| !t.shadow);
    let mut units: SmallVec<[u16; 2]> = SmallVec::new();
    for t in shown() {
        let u = unit(t);
        if !units.contains(&u) {
            units.push(u);
        }
    }
    // requests (0) first, then the units in the order the rules name them (their numbers),
    // whatever order the decision locked the counters in
    units.sort_unstable();
    for u in units {
        if let Some(t) = fewest_left(shown().filter(|t| unit(t) == u)) {
            out.push(t);
        }
    }
    out
}

/// One item of `RateLimit`: the tier's name, (remaining, seconds), and room to format both.
type Item<'t> = (&'t str, (u64, u64), [itoa::Buffer; 2]);

/// `RateLimit`'s value for the tiers `told`, each with (remaining, seconds) from `left`, cut
/// from this thread's block (see `block`).
fn rate_limit_value(
    limiter: &Limiter,
    told: &[&TierReport],
    left: impl Fn(&TierReport) -> (u64, u64),
) -> HeaderValue {
    let mut numbers: SmallVec<[Item; 2]> = SmallVec::new();
    for &t in told {
        if let Some(tt) = text(limiter, t) {
            numbers.push((&tt.name, left(t), [itoa::Buffer::new(); 2]));
        }
    }
    let mut parts: SmallVec<[&str; 12]> = SmallVec::new();
    for (i, (name, (r, back), [rb, tb])) in numbers.iter_mut().enumerate() {
        if i > 0 {
            parts.push(", ");
        }
        parts.extend([&**name, ";r=", rb.format(*r), ";t=", tb.format(*back)]);
    }
    block::value(&parts)
}

/// Add the quota headers to a response's headers. Nothing is added when no (non-shadow) rule
/// applied.
pub fn apply(
    headers: &mut HeaderMap,
    limiter: &Limiter,
    d: &Decision,
    settings: HeaderSettings,
    denied: bool,
) {
    if !settings.x_ratelimit && !settings.ietf {
        return;
    }
    let told = told(limiter, d, denied);
    let Some(&top) = told.first() else {
        return;
    };
    let Some(top_text) = text(limiter, top) else {
        return;
    };
    // what is left, and when quota comes back (`t=`): after a denial, when the violated tier
    // admits again (a sliding window's or a bucket's wait is not its window's end), as
    // `Retry-After` says
    let left = |t: &TierReport| {
        if denied && !t.verdict.allowed {
            (0, ceil_secs(t.verdict.retry_after_ms).max(1))
        } else {
            (t.verdict.remaining, ceil_secs(t.verdict.reset_ms).max(1))
        }
    };
    let policy = if settings.ietf {
        limiter.policy_cache.value(limiter, d)
    } else {
        None
    };
    let rl = settings
        .ietf
        .then(|| rate_limit_value(limiter, &told, left));
    let (remaining, _) = left(top);
    let reset = ceil_secs(top.verdict.reset_ms).max(1);
    // The two values that change with every request (`remaining`, `RateLimit`) are marked
    // sensitive: HTTP/2 then sends them as never-indexed literals (RFC 7541 6.2.3) instead of
    // filling the connection's HPACK table with values that never come again, each of which
    // h2 0.4's encoder compares with every later value of the name. Measured on gRPC (HTTP/2
    // both ways, BENCHMARKS.md): 2.4K instructions per request less with 3 rules.
    headers.reserve(QUOTA_HEADERS);
    if settings.x_ratelimit {
        headers.insert(X_LIMIT, top_text.limit.clone());
        let mut v = number(remaining);
        v.set_sensitive(true);
        headers.insert(X_REMAINING, v);
        headers.insert(X_RESET, number(reset));
    }
    if settings.ietf {
        if let Some(policy) = policy {
            headers.insert(POLICY, policy);
        }
        if let Some(mut v) = rl {
            v.set_sensitive(true);
            headers.insert(RATELIMIT, v);
        }
    }
}

/// The most quota headers `apply` adds.
pub const QUOTA_HEADERS: usize = 5;

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Seconds for `Retry-After` and `retry_after`: when the denying tiers have room again (>= 1).
pub fn retry_after_secs(d: &Decision) -> u64 {
    ceil_secs(d.retry_after_ms()).max(1)
}

/// A denial by a limit: an enforcing tier was exceeded. Otherwise the request was refused
/// for want of the fleet's counts (`on_failure: deny`, Redis out of reach).
pub fn limit_exceeded(d: &Decision) -> bool {
    d.tiers.iter().any(|t| !t.shadow && !t.verdict.allowed)
}

/// The problem+json body of a denial.
pub fn denial_body(limiter: &Limiter, d: &Decision, status: u16) -> Bytes {
    if !limit_exceeded(d) {
        // `on_failure: deny` with the shared counts out of reach: no limit was exceeded
        return problem::body(
            503,
            "Service Unavailable",
            UNCHECKABLE,
            "about:blank",
            &[("retry_after", retry_after_secs(d).into())],
        );
    }
    let mut detail = String::new();
    if let Some(first) = most_restrictive(d, true) {
        let _ = write!(
            detail,
            "rate limit {} exceeded: {} per ",
            limiter.rules[first.rule as usize].rule.id, first.threshold
        );
        write_period(&mut detail, first.period_ms, first.calendar);
    }
    let violated: Vec<serde_json::Value> = d
        .tiers
        .iter()
        .filter(|t| !t.shadow && !t.verdict.allowed)
        .filter_map(|t| text(limiter, t))
        .map(|tt| tt.name.trim_matches('"').into())
        .collect();
    let extra = [
        ("violated-policies", serde_json::Value::Array(violated)),
        ("retry_after", retry_after_secs(d).into()),
    ];
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
    use crate::config::model::Tier;
    use crate::limits::limiter::tests::{rig, rule};
    use crate::limits::policy::tier_texts;
    use std::time::Duration;

    #[test]
    fn tier_texts_in_contract_form() {
        let t = tier_texts(
            "get-product",
            &[
                Tier {
                    calendar: None,
                    queue: None,
                    period: Duration::from_secs(10),
                    threshold: 50,
                },
                Tier {
                    calendar: None,
                    queue: None,
                    period: Duration::from_millis(500),
                    threshold: 5,
                },
                Tier {
                    calendar: None,
                    queue: None,
                    period: Duration::from_secs(60),
                    threshold: 100,
                },
            ],
            None,
        );
        assert_eq!(&*t[0].name, "\"get-product/10s\"");
        assert_eq!(&*t[0].policy, "\"get-product/10s\";q=50;w=10");
        assert_eq!(&*t[1].policy, "\"get-product/500ms\";q=5;w=1");
        assert_eq!(&*t[2].name, "\"get-product/1m\"");
        assert_eq!(t[2].limit, "100");
        // a quota in units of its own says so (`qu`)
        let tokens = [Tier {
            calendar: None,
            queue: None,
            period: Duration::from_secs(60),
            threshold: 100_000,
        }];
        let t = tier_texts("llm", &tokens, Some("tokens"));
        assert_eq!(&*t[0].policy, "\"llm/1m\";q=100000;w=60;qu=\"tokens\"");
        assert_eq!(number(7), "7");
        assert_eq!(number(123_456), "123456");
    }

    /// The values that change with every request are marked sensitive, so that HTTP/2's HPACK
    /// sends them as never-indexed literals: indexing them fills a connection's table with
    /// values never seen again (and h2 0.4's encoder walks every value of a name it holds).
    /// The values that stay (the limit, the reset second, the policy) are indexed as usual.
    #[test]
    fn quota_values_that_change_per_request_are_never_indexed() {
        let r = rig(&rule("calls", "", "1h", 1000));
        let d = r.decide("/x", "t");
        let mut h = HeaderMap::new();
        apply(&mut h, &r.limiter, &d, r.cfg.headers, false);
        let sensitive = |name: &str| h.get(name).map(HeaderValue::is_sensitive);
        assert_eq!(sensitive("x-ratelimit-remaining"), Some(true));
        assert_eq!(sensitive("ratelimit"), Some(true));
        assert_eq!(sensitive("x-ratelimit-limit"), Some(false));
        assert_eq!(sensitive("x-ratelimit-reset"), Some(false));
        assert_eq!(sensitive("ratelimit-policy"), Some(false));
    }

    /// Units other than requests are told in the order the rules name them, whatever order the
    /// decision's tiers are in (it locks counters by their `uid`, which a reload may reorder).
    #[test]
    fn units_are_told_in_rule_order_after_requests() {
        let rules = [
            rule("tokens", "    unit: tokens\n", "1h", 500),
            rule("bytes", "    unit: content-bytes\n", "1h", 9000),
            rule("calls", "", "1h", 1000),
        ]
        .concat();
        let r = rig(&rules);
        let mut d = r.decide("/x", "t");
        for order in [false, true] {
            if order {
                d.tiers.reverse();
            }
            let mut h = HeaderMap::new();
            apply(&mut h, &r.limiter, &d, r.cfg.headers, false);
            let rl = h
                .get("ratelimit")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let names: Vec<&str> = rl.split(", ").filter_map(|i| i.split(';').next()).collect();
            assert_eq!(
                names,
                ["\"calls/1h\"", "\"tokens/1h\"", "\"bytes/1h\""],
                "{rl}"
            );
            assert_eq!(
                h.get("x-ratelimit-limit").map(|v| v.as_bytes()),
                Some(&b"1000"[..])
            );
        }
    }
}
