//! `GET /api/usage?rule=<id>&period=<tier>&format=json|csv&limit=<n>&cursor=<c>`: what each
//! tenant used of one tier of one rule in its previous and its current window, for billing.
//! With Redis, fleet-wide (`fleet_sync::usage`: the count keys, contract section 6, a page at a
//! time); without, this instance's counters. Paged: a page holds at least `limit` rows (fewer
//! when it is the last, or ran out of `SCAN` steps) and names where the next begins.
//!
//! The previous window is told while its counts are kept: a sliding window's through the
//! current window (they weigh on it), a fixed or calendar window's keys until `KEY_GRACE_MS`
//! after its end (contract section 6 bounds every key's life), and then, for windows of an hour
//! or more, its usage archive (`fleet_sync::archive`); without either it is `null`.

use super::api::percent_decode;
use crate::config::duration::{parse_duration, write_period};
use crate::config::model::{PartitionBy, Plans};
use crate::limits::limiter::Limiter;
use crate::services::fleet_sync::backend;
use crate::services::fleet_sync::keys::encode;
use crate::services::fleet_sync::usage::{self, Cursor, Row, Windows};
use crate::snapshot::SharedSnapshot;
use http::StatusCode;
use serde_json::{json, Value};
use std::fmt::Write;
use tollgate_limits::algorithm::Quota;

/// Rows a page holds unless `limit` says otherwise, and the most it may ask.
pub const DEFAULT_LIMIT: usize = 1000;
pub const MAX_LIMIT: usize = 10_000;

/// What was refused, and why (a problem+json answer).
pub type Refusal = (StatusCode, String);

fn bad(detail: String) -> Refusal {
    (StatusCode::BAD_REQUEST, detail)
}

/// The request's parameters.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub rule: String,
    pub period: Option<String>,
    pub csv: bool,
    pub limit: usize,
    pub cursor: Option<String>,
}

impl Query {
    pub fn parse(query: &str) -> Result<Query, Refusal> {
        let mut q = Query {
            limit: DEFAULT_LIMIT,
            ..Query::default()
        };
        let mut rule = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(&v.replace('+', " "))
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| bad(format!("{k}: bad percent-encoding")))?;
            match k {
                "rule" => rule = Some(v),
                "period" => q.period = Some(v),
                "format" => {
                    q.csv = match v.as_str() {
                        "json" => false,
                        "csv" => true,
                        _ => return Err(bad(format!("format={v}: expected json or csv"))),
                    }
                }
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| bad(format!("limit={v}: expected 1 to {MAX_LIMIT}")))?
                }
                "cursor" => q.cursor = Some(v),
                _ => {
                    return Err(bad(format!(
                        "unknown parameter {k:?}: expected rule, period, format, limit, cursor"
                    )))
                }
            }
        }
        q.rule = rule.ok_or_else(|| bad("rule=<id> is required".into()))?;
        Ok(q)
    }
}

/// A tier's period as the config names it (`10s`, `1h`, `1mo`).
fn period_text(q: &Quota) -> String {
    let mut s = String::new();
    write_period(&mut s, q.period_ms, q.calendar.map(|c| c.unit));
    s
}

fn same_window(a: &Quota, b: &Quota) -> bool {
    a.period_ms == b.period_ms && a.calendar.map(|c| c.unit) == b.calendar.map(|c| c.unit)
}

/// The tier `period` names among all the rule's tier lists (its own and its plans'), or, none
/// named, the longest.
fn pick_tier(lists: &[Vec<Quota>], period: Option<&str>) -> Result<Quota, String> {
    let mut all: Vec<Quota> = Vec::new();
    for q in lists.iter().flatten() {
        if !all.iter().any(|a| same_window(a, q)) {
            all.push(*q);
        }
    }
    let Some(period) = period else {
        return all
            .iter()
            .max_by_key(|q| q.period_ms)
            .copied()
            .ok_or_else(|| "the rule has no tiers".to_string());
    };
    let fixed_ms = parse_duration(period).ok().map(|d| d.as_millis() as u64);
    all.iter()
        .find(|q| {
            period_text(q) == period || (q.calendar.is_none() && Some(q.period_ms) == fixed_ms)
        })
        .copied()
        .ok_or_else(|| {
            let names: Vec<String> = all.iter().map(period_text).collect();
            format!("period={period}: the rule's tiers are {}", names.join(", "))
        })
}

/// The tier's previous and current windows as of `now_ms`.
fn windows_of(q: &Quota, now_ms: u64) -> Windows {
    let current = q.window_of(now_ms);
    Windows {
        previous: q.window_of(current.0.saturating_sub(1)),
        current,
    }
}

/// A tenant's row, as the answer tells it (`previous`: none once no longer kept).
struct Line {
    tenant: String,
    plan: Option<String>,
    threshold: Option<u64>,
    previous: Option<u64>,
    current: u64,
}

/// Whether the previous window's counts are still kept at `now_ms` (see the module's doc).
fn previous_kept(sliding: bool, windows: Windows, now_ms: u64) -> bool {
    sliding || now_ms < windows.previous.1 + crate::services::fleet_sync::KEY_GRACE_MS
}

/// The tenant a partition names (a digest of a long one stays as its keys spell it).
fn tenant_of(partition: &str) -> String {
    if partition.starts_with("=b2=") {
        return partition.to_string();
    }
    percent_decode(partition)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|| partition.to_string())
}

/// A tenant's plan and its threshold in the tier (none: its plan has no such tier).
fn plan_and_threshold(
    tenant: &[u8],
    plans: &Plans,
    lists: &[Vec<Quota>],
    list_of: impl Fn(Option<usize>) -> u16,
    tier: &Quota,
) -> (Option<String>, Option<u64>) {
    let plan = plans.plan_of(tenant);
    let list = list_of(plan);
    let threshold = lists
        .get(usize::from(list))
        .and_then(|l| l.iter().find(|q| same_window(q, tier)))
        .map(|q| q.threshold);
    let name = plan
        .filter(|_| list != 0)
        .and_then(|p| plans.names.get(p).cloned());
    (name, threshold)
}

/// This instance's counts of the tier (no Redis): every tenant it holds a counter for, in the
/// order of their keys, from after the cursor's.
fn local_rows(
    limiter: &Limiter,
    rule: usize,
    tier: &Quota,
    windows: Windows,
    after: Option<&[u8]>,
) -> Vec<(Vec<u8>, u64, u64)> {
    let limit = &limiter.core.limits[rule];
    let lists = limit.counters.tiers();
    let mut rows = Vec::new();
    limit.counters.read_each(|key, c| {
        if after.is_some_and(|a| key <= a) {
            return;
        }
        let Some(i) = lists
            .get(usize::from(c.list))
            .and_then(|l| l.iter().position(|q| same_window(q, tier)))
        else {
            return;
        };
        let Some(s) = c.tiers.get(i) else { return };
        let counts = if s.window_start_ms == windows.current.0 {
            (s.previous, s.current)
        } else if s.window_start_ms == windows.previous.0 {
            (s.current, 0)
        } else {
            (0, 0)
        };
        if counts != (0, 0) {
            rows.push((key.to_vec(), counts.0, counts.1));
        }
    });
    rows.sort_unstable();
    rows
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Redis's answer to the export refused, with what to do when the ACL says no.
fn unavailable(e: crate::services::fleet_sync::backend::RoundError) -> Refusal {
    let advice = if e.message.to_ascii_lowercase().contains("noperm") {
        ": the export reads the count keys with SCAN and GET and the archive with HSCAN and HMGET; add +scan +hscan +hmget to the user's ACL"
    } else {
        ""
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("redis: {e}{advice}"),
    )
}

/// A page of the fleet's rows from Redis, the next page's cursor, and whether the previous
/// window was read from its archive (asked for with `archive_wanted`: its keys are gone).
async fn fleet_rows(
    settings: &crate::config::model::RedisSettings,
    id: &str,
    (windows, archive_wanted): (Windows, bool),
    q: &Query,
) -> Result<(Vec<Row>, Option<String>, bool), Refusal> {
    use crate::services::fleet_sync::archive::{archive_key, LOCK_FIELD};
    let from = match &q.cursor {
        Some(c) => Cursor::parse(c)
            .ok_or_else(|| bad(format!("cursor={c}: not one this endpoint gave")))?,
        None => Cursor::default(),
    };
    let backend = backend::make(settings).map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))?;
    let prefix = &settings.key_prefix;
    let mut archive = None;
    if archive_wanted {
        let key = archive_key(prefix, id, windows.previous);
        let lock = backend
            .hash_counts(&key, &[LOCK_FIELD])
            .await
            .map_err(unavailable)?;
        archive = lock.first().copied().flatten().map(|_| key);
    }
    let (rows, next) = usage::page(
        backend.as_ref(),
        (prefix, id),
        (windows, archive.as_deref()),
        from,
        q.limit,
    )
    .await
    .map_err(unavailable)?;
    Ok((rows, next.map(|c| c.text()), archive.is_some()))
}

/// A page of rows, the next page's cursor, where they come from, and whether the previous
/// window was read from its archive: fleet-wide, or from this instance.
async fn rows(
    shared: &SharedSnapshot,
    rule: usize,
    tier: &Quota,
    (windows, archive_wanted): (Windows, bool),
    q: &Query,
) -> Result<(Vec<Row>, Option<String>, &'static str, bool), Refusal> {
    let snap = shared.load();
    let cfg = &snap.config;
    let id = snap.limiter.rules[rule].rule.id.clone();
    if let Some(settings) = &cfg.redis {
        let (rows, next, archived) =
            fleet_rows(settings, &id, (windows, archive_wanted), q).await?;
        return Ok((rows, next, "redis", archived));
    }
    if snap.limiter.core.limits[rule]
        .counters
        .algorithm()
        .is_bucket()
    {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("rule {id:?} is a bucket: without Redis it counts no windows to tell"),
        ));
    }
    let after = match &q.cursor {
        Some(c) => {
            Some(unhex(c).ok_or_else(|| bad(format!("cursor={c}: not one this endpoint gave")))?)
        }
        None => None,
    };
    let all = local_rows(&snap.limiter, rule, tier, windows, after.as_deref());
    let more = all.len() > q.limit;
    let page: Vec<(Vec<u8>, u64, u64)> = all.into_iter().take(q.limit).collect();
    let next = more.then(|| page.last().map(|r| hex(&r.0))).flatten();
    let per = &snap.limiter.rules[rule].rule.per;
    let rows = page
        .into_iter()
        .map(|(key, previous, current)| Row {
            partition: crate::services::fleet_sync::keys::redis_partition(per, &key),
            previous,
            current,
        })
        .collect();
    Ok((rows, next, "this instance", false))
}

/// The index of the rule `rule_id` names, if it counts per tenant.
fn rule_of(snap: &crate::snapshot::Snapshot, rule_id: &str) -> Result<usize, Refusal> {
    let rule = snap
        .limiter
        .rules
        .iter()
        .position(|r| r.rule.id == rule_id)
        .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no rule {:?}", rule_id)))?;
    let cr = &snap.limiter.rules[rule];
    if cr.rule.per != PartitionBy::Tenant {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "rule {:?} counts per {}, not per tenant",
                rule_id,
                crate::config::summary::per_text(&cr.rule.per)
            ),
        ));
    }
    Ok(rule)
}

/// `GET /api/usage`: the answer's content type and body, or why not.
pub async fn usage(
    shared: &SharedSnapshot,
    query: &str,
) -> Result<(&'static str, Vec<u8>, Option<String>), Refusal> {
    let q = Query::parse(query)?;
    let snap = shared.load();
    let cfg = &snap.config;
    let rule = rule_of(&snap, &q.rule)?;
    let cr = &snap.limiter.rules[rule];
    let lists = snap.limiter.core.limits[rule].counters.tiers();
    let tier = pick_tier(&lists[..], q.period.as_deref()).map_err(bad)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let windows = windows_of(&tier, now_ms);
    let sliding = snap.limiter.core.limits[rule]
        .counters
        .algorithm()
        .is_sliding();
    let kept = previous_kept(sliding, windows, now_ms);
    let (rows, next, source, archived) = rows(shared, rule, &tier, (windows, !kept), &q).await?;
    let kept = kept || archived;
    let lines: Vec<Line> = rows
        .iter()
        .map(|r| {
            let tenant = tenant_of(&r.partition);
            let (plan, threshold) = plan_and_threshold(
                tenant.as_bytes(),
                &cfg.plans,
                &lists[..],
                |p| cr.list_of(p),
                &tier,
            );
            Line {
                tenant,
                plan,
                threshold,
                previous: kept.then_some(r.previous),
                current: r.current,
            }
        })
        .collect();
    let link = next.as_ref().map(|c| next_link(&q, c));
    let unit = cr.rule.unit.as_deref().unwrap_or(match cr.rule.cost {
        crate::config::model::Cost::One => "requests",
        _ => "units",
    });
    let head = Head {
        rule: &q.rule,
        tier: &tier,
        unit,
        source,
        windows,
        kept,
    };
    if q.csv {
        return Ok((
            "text/csv; charset=utf-8",
            csv(&head, &lines).into_bytes(),
            link,
        ));
    }
    Ok((
        "application/json",
        json_body(&head, &lines, next).to_string().into_bytes(),
        link,
    ))
}

/// What the page says of itself.
struct Head<'a> {
    rule: &'a str,
    tier: &'a Quota,
    unit: &'a str,
    source: &'static str,
    windows: Windows,
    /// Whether the previous window's counts are still kept.
    kept: bool,
}

/// `2026-11-01T00:00:00Z`.
fn instant(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn window_json((start, end): (u64, u64)) -> Value {
    json!({ "start_ms": start, "end_ms": end, "start": instant(start), "end": instant(end) })
}

fn previous_json(h: &Head) -> Value {
    let mut v = window_json(h.windows.previous);
    v["kept"] = Value::Bool(h.kept);
    v
}

fn json_body(h: &Head, lines: &[Line], next: Option<String>) -> Value {
    let tenants: Vec<Value> = lines
        .iter()
        .map(|l| {
            json!({
                "tenant": l.tenant,
                "plan": l.plan,
                "threshold": l.threshold,
                "previous": l.previous,
                "current": l.current,
            })
        })
        .collect();
    json!({
        "rule": h.rule,
        "period": period_text(h.tier),
        "window": crate::limits::inspect::window_of(h.tier),
        "unit": h.unit,
        "source": h.source,
        "previous": previous_json(h),
        "current": window_json(h.windows.current),
        "tenants": tenants,
        "next": next,
    })
}

/// RFC 4180: a field holding a comma, a quote or a line break is quoted, its quotes doubled.
fn csv_field(s: &str, out: &mut String) {
    if s.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&s.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(s);
    }
}

/// One line per tenant: `tenant,plan,threshold,unit,previous_window,previous,current_window,current`
/// (a window as an ISO 8601 interval, `start/end`; `previous` empty once no longer kept).
fn csv(h: &Head, lines: &[Line]) -> String {
    let mut out = String::from(
        "tenant,plan,threshold,unit,previous_window,previous,current_window,current\r\n",
    );
    let interval = |(s, e): (u64, u64)| format!("{}/{}", instant(s), instant(e));
    let (prev, cur) = (interval(h.windows.previous), interval(h.windows.current));
    for l in lines {
        csv_field(&l.tenant, &mut out);
        out.push(',');
        csv_field(l.plan.as_deref().unwrap_or(""), &mut out);
        let threshold = l.threshold.map(|t| t.to_string()).unwrap_or_default();
        let _ = write!(out, ",{threshold},");
        csv_field(h.unit, &mut out);
        let previous = l.previous.map(|p| p.to_string()).unwrap_or_default();
        let _ = write!(out, ",{prev},{previous},{cur},{}\r\n", l.current);
    }
    out
}

/// The next page's address: the same question from `cursor` on.
fn next_link(q: &Query, cursor: &str) -> String {
    let mut url = String::from("/api/usage?rule=");
    encode(q.rule.as_bytes(), &mut url);
    if let Some(p) = &q.period {
        url.push_str("&period=");
        encode(p.as_bytes(), &mut url);
    }
    if q.csv {
        url.push_str("&format=csv");
    }
    let _ = write!(url, "&limit={}&cursor=", q.limit);
    encode(cursor.as_bytes(), &mut url);
    format!("<{url}>; rel=\"next\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(period_ms: u64, threshold: u64) -> Quota {
        Quota {
            threshold,
            period_ms,
            ..Quota::default()
        }
    }

    #[test]
    fn the_query_is_read_with_its_defaults_and_its_mistakes_named() {
        let q = Query::parse("rule=api&period=1h&format=csv&limit=50&cursor=1-0-7").unwrap();
        assert_eq!(
            q,
            Query {
                rule: "api".into(),
                period: Some("1h".into()),
                csv: true,
                limit: 50,
                cursor: Some("1-0-7".into()),
            }
        );
        let q = Query::parse("rule=api").unwrap();
        assert_eq!((q.limit, q.csv, q.period), (DEFAULT_LIMIT, false, None));
        for (bad, says) in [
            ("", "rule=<id> is required"),
            ("rule=a&limit=0", "limit=0: expected 1 to 10000"),
            ("rule=a&limit=10001", "expected 1 to 10000"),
            ("rule=a&format=xml", "format=xml: expected json or csv"),
            ("rule=a&by=x", "unknown parameter \"by\""),
        ] {
            let e = Query::parse(bad).unwrap_err();
            assert!(e.1.contains(says), "{bad}: {}", e.1);
        }
    }

    #[test]
    fn a_period_names_a_tier_of_any_list_and_none_names_the_longest() {
        let lists = vec![
            vec![quota(1000, 10), quota(3_600_000, 100)],
            vec![quota(86_400_000, 5)],
        ];
        assert_eq!(pick_tier(&lists, None).unwrap().period_ms, 86_400_000);
        assert_eq!(pick_tier(&lists, Some("1h")).unwrap().period_ms, 3_600_000);
        assert_eq!(
            pick_tier(&lists, Some("3600")).unwrap().period_ms,
            3_600_000
        );
        assert_eq!(pick_tier(&lists, Some("60m")).unwrap().period_ms, 3_600_000);
        let e = pick_tier(&lists, Some("2h")).unwrap_err();
        assert_eq!(e, "period=2h: the rule's tiers are 1s, 1h, 24h");
    }

    #[test]
    fn the_previous_window_is_the_one_before_the_current_and_kept_a_while() {
        let w = windows_of(&quota(3_600_000, 1), 7_200_000 + 5);
        assert_eq!(w.current, (7_200_000, 10_800_000));
        assert_eq!(w.previous, (3_600_000, 7_200_000));
        let grace = crate::services::fleet_sync::KEY_GRACE_MS;
        assert!(previous_kept(false, w, 7_200_000 + grace - 1));
        assert!(!previous_kept(false, w, 7_200_000 + grace));
        assert!(previous_kept(true, w, 10_799_999));
    }

    #[test]
    fn csv_quotes_what_needs_it_and_tenants_are_decoded() {
        let mut s = String::new();
        csv_field("a,\"b\"", &mut s);
        assert_eq!(s, "\"a,\"\"b\"\"\"");
        assert_eq!(tenant_of("a%2Cb%20c"), "a,b c");
        assert_eq!(tenant_of("=b2=00ff"), "=b2=00ff");
        assert_eq!(unhex(&hex(b"\x00acme")).as_deref(), Some(&b"\x00acme"[..]));
        assert_eq!(unhex("0"), None);
    }
}
