//! `POST /api/tenants/{id}/reset` and `POST /api/tenants/{id}/grant`: a support desk's reset
//! of a tenant's quota, or a grant of more units in the current window of one tier, for the
//! rules that count per tenant. With Redis, fleet-wide (`fleet_sync::adjust`: every instance
//! honours it from its next answer, within a round); without, on this instance's counters.
//! Always logged: what, for whom, by whom (the body's `by`) and from where.

use crate::config::model::PartitionBy;
use crate::config::model::RedisSettings;
use crate::services::fleet_sync::adjust::{self, Op, Target};
use crate::services::fleet_sync::backend::{self, SyncBackend};
use crate::snapshot::SharedSnapshot;
use http::StatusCode;
use serde_json::{json, Value};
use tollgate_limits::clock::NANOS_PER_MS;
use tollgate_limits::ledger::Adjust;
use tollgate_limits::partition::PartitionValue;

/// The most a grant may give at once (quota headers stay valid Structured Field integers).
pub const MAX_GRANT: u64 = 1_000_000_000_000;

/// The request's body: `{}` or `{"rule": "api"}` for a reset (none: every rule counting per
/// tenant); `{"rule": "api", "tier": 0, "units": 1000}` for a grant (`tier` may be left out
/// when the rule has one). `by`: who asks, for the log.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    rule: Option<String>,
    tier: Option<usize>,
    units: Option<u64>,
    by: Option<String>,
}

/// Which of the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Reset,
    Grant,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Reset => "reset",
            Action::Grant => "grant",
        }
    }
}

/// What was refused, and why (a problem+json answer).
pub type Refusal = (StatusCode, String);

fn unprocessable(detail: String) -> Refusal {
    (StatusCode::UNPROCESSABLE_ENTITY, detail)
}

/// One tier to adjust: the rule's index, its tier list and the tier.
struct Pick {
    rule: usize,
    list: u16,
    tier: usize,
}

/// The body and what it asks for, or why it cannot be done.
fn parse(body: &[u8], action: Action) -> Result<(Body, Op), Refusal> {
    let body: Body = if body.iter().all(u8::is_ascii_whitespace) {
        Body::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("the body is not what {} takes: {e}", action.name()),
            )
        })?
    };
    let op = match (action, body.units) {
        (Action::Reset, None) => Op::Reset,
        (Action::Reset, Some(_)) => {
            return Err(unprocessable(
                "a reset takes no \"units\" (a grant does)".into(),
            ))
        }
        (Action::Grant, Some(n)) if (1..=MAX_GRANT).contains(&n) => Op::Grant(n),
        (Action::Grant, _) => {
            return Err(unprocessable(format!(
                "a grant names its \"units\": a whole number from 1 to {MAX_GRANT}"
            )))
        }
    };
    Ok((body, op))
}

/// Redis, when the config syncs: its settings and a backend of the call's own (the rounds'
/// is the sync service's).
type FleetLink<'a> = Option<(&'a RedisSettings, Box<dyn SyncBackend>)>;

/// Carry out a reset or a grant for `tenant` as `body` says (`peer`: who sent it, for the log).
pub async fn adjust(
    shared: &SharedSnapshot,
    tenant: &[u8],
    action: Action,
    body: &[u8],
    peer: &str,
) -> Result<Value, Refusal> {
    let (body, op) = parse(body, action)?;
    let snap = shared.load();
    let cfg = &snap.config;
    let limiter = &snap.limiter;
    let picks = pick(limiter, &body, action, cfg.plans.plan_of(tenant))?;
    let fleet: FleetLink = match &cfg.redis {
        Some(settings) => Some((
            settings,
            backend::make(settings).map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))?,
        )),
        None => None,
    };
    let key = PartitionValue::Bytes(tenant).key_buf();
    let mut done: Vec<Value> = Vec::new();
    let mut failed = None;
    for p in &picks {
        match apply(limiter, &fleet, (&key, p), op).await {
            Ok(Some(v)) => done.push(v),
            Ok(None) => {}
            Err(why) => {
                failed = Some(why);
                break;
            }
        }
    }
    let mut told = fleet.is_some();
    if let (Some((settings, backend)), None, false) = (&fleet, &failed, done.is_empty()) {
        // the fleet's heartbeats read the mark: the counters their counts refuse hear of it
        let mark = limiter.core.now_ns();
        if let Err(e) = adjust::mark(settings, backend.as_ref(), mark).await {
            // (made, but the instances whose counts refuse hear of it only at their next ask)
            log::warn!(
                "admin: the mark that tells the other instances of an adjustment was not set: {e}"
            );
            told = false;
        }
    }
    let said = Said {
        tenant: &String::from_utf8_lossy(tenant),
        op,
        who: body.by.as_deref().unwrap_or("-"),
        peer,
        done: &done,
    };
    said.log(failed.as_deref(), fleet.is_some())?;
    Ok(json!({
        "tenant": said.tenant,
        "action": action.name(),
        "units": body.units,
        "by": body.by,
        "fleet": fleet.is_some(),
        // with Redis: whether the other instances were told at once (else at their next ask)
        "told_at_once": told,
        "tiers": done,
    }))
}

/// One tier: through Redis (then on this instance as Redis answered), or on this instance
/// alone. Its line of the answer (`None`: the tier is gone), or why Redis did not take it.
async fn apply(
    limiter: &crate::limits::limiter::Limiter,
    fleet: &FleetLink<'_>,
    (key, p): (&[u8], &Pick),
    op: Op,
) -> Result<Option<Value>, String> {
    let cr = &limiter.rules[p.rule];
    let limit = &limiter.core.limits[p.rule];
    let Some(quota) = limit.tiers(p.list).get(p.tier).copied() else {
        return Ok(None);
    };
    let mut grant = None;
    let how = match (fleet, op) {
        (Some((settings, backend)), _) => {
            let target = Target {
                rule_id: &cr.rule.id,
                algorithm: limit.counters.algorithm(),
                per: &cr.rule.per,
                store_key: key,
                quota: &quota,
            };
            let now_ms = limiter.core.now_ns() / NANOS_PER_MS;
            let g = adjust::fleet(settings, backend.as_ref(), &target, op, now_ms)
                .await
                .map_err(|e| format!("rule {} tier {}: {e}", cr.rule.id, p.tier))?;
            grant = Some(g);
            Adjust::Fleet {
                grant: g,
                reset: op == Op::Reset,
            }
        }
        (None, Op::Reset) => Adjust::Reset,
        (None, Op::Grant(n)) => Adjust::Grant(n),
    };
    let rule = u16::try_from(p.rule).unwrap_or(u16::MAX);
    limiter.core.adjust(rule, (key, p.list), p.tier, how);
    Ok(Some(json!({
        "rule": cr.rule.id,
        "tier": p.tier,
        "period_ms": quota.period_ms,
        "threshold": quota.threshold,
        "window_grant": grant,
    })))
}

/// What an adjustment did, for the log.
struct Said<'a> {
    tenant: &'a str,
    op: Op,
    who: &'a str,
    peer: &'a str,
    done: &'a [Value],
}

impl Said<'_> {
    /// Log it (`failed`: why Redis did not take the rest, which is then the answer).
    fn log(&self, failed: Option<&str>, fleet: bool) -> Result<(), Refusal> {
        let what = match self.op {
            Op::Reset => "reset".to_string(),
            Op::Grant(n) => format!("grant of {n}"),
        };
        // (`by` is the caller's text: escaped, so that it cannot forge a log line)
        let (tenant, who, peer) = (self.tenant, self.who.escape_debug(), self.peer);
        let tiers: Vec<String> = self
            .done
            .iter()
            .map(|d| format!("{}/{}", d["rule"].as_str().unwrap_or(""), d["tier"]))
            .collect();
        let tiers = tiers.join(", ");
        if let Some(why) = failed {
            log::warn!(
                "admin: {what} for tenant {tenant:?} by {who} from {peer}: Redis did not take it ({why}); done for [{tiers}] only"
            );
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "Redis did not take the {what} ({why}); done for [{tiers}] only: nothing else changed"
                ),
            ));
        }
        let scope = if fleet {
            "fleet-wide"
        } else {
            "this instance (no redis)"
        };
        log::info!("admin: {what} for tenant {tenant:?} by {who} from {peer}: [{tiers}], {scope}");
        Ok(())
    }
}

/// The tiers a request names: a grant's one tier of one rule; a reset's every tier of one
/// rule, or of every rule counting per tenant.
fn pick(
    limiter: &crate::limits::limiter::Limiter,
    body: &Body,
    action: Action,
    plan: Option<usize>,
) -> Result<Vec<Pick>, Refusal> {
    let per_tenant: Vec<usize> = match &body.rule {
        Some(id) => {
            let Some(i) = limiter.rules.iter().position(|r| &r.rule.id == id) else {
                return Err(unprocessable(format!(
                    "no rule {id:?} in the running config"
                )));
            };
            if limiter.rules[i].rule.per != PartitionBy::Tenant {
                let per = match &limiter.rules[i].rule.per {
                    PartitionBy::Ip => "ip".to_string(),
                    PartitionBy::Global => "global".to_string(),
                    PartitionBy::Header(h) => format!("header {h}"),
                    PartitionBy::Tenant => "tenant".to_string(),
                };
                return Err(unprocessable(format!(
                    "rule {id:?} counts per {per}, not per tenant: only rules counting per tenant can be reset or granted for a tenant"
                )));
            }
            vec![i]
        }
        None if action == Action::Grant => {
            return Err(unprocessable("a grant names its \"rule\"".into()))
        }
        None => (0..limiter.rules.len())
            .filter(|&i| limiter.rules[i].rule.per == PartitionBy::Tenant)
            .collect(),
    };
    let mut picks = Vec::new();
    for i in per_tenant {
        if action == Action::Grant && limiter.core.limits[i].counters.algorithm().is_bucket() {
            return Err(unprocessable(format!(
                "rule {:?} is a {}: a bucket refills on its own and takes no grant (a reset fills it)",
                limiter.rules[i].rule.id,
                limiter.core.limits[i].counters.algorithm()
            )));
        }
        let list = limiter.rules[i].list_of(plan);
        let n = limiter.core.limits[i].tiers(list).len();
        match (action, body.tier) {
            (_, Some(t)) if t >= n => {
                return Err(unprocessable(format!(
                    "rule {:?} has {n} tier(s) for this tenant: \"tier\" is from 0 to {}",
                    limiter.rules[i].rule.id,
                    n.saturating_sub(1)
                )))
            }
            (_, Some(t)) => picks.push(Pick {
                rule: i,
                list,
                tier: t,
            }),
            (Action::Grant, None) if n > 1 => {
                return Err(unprocessable(format!(
                    "rule {:?} has {n} tiers for this tenant: name one with \"tier\" (0 to {})",
                    limiter.rules[i].rule.id,
                    n - 1
                )))
            }
            (_, None) => picks.extend((0..n).map(|tier| Pick {
                rule: i,
                list,
                tier,
            })),
        }
    }
    Ok(picks)
}
