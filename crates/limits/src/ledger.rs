//! Fleet accounting for one tier of one counter: the one owner of what this instance admitted,
//! what Redis has confirmed, and what Redis has leased to it. Pure functions of (state, now):
//! the limiter asks for the admission ceiling and commits; the sync service drains asks,
//! and applies Redis's answers. Nothing here talks to Redis.
//!
//! The mechanism (docs/fleet.md): quota leases, a small spare budget, and holding.
//! - Every instance reports, per window, its *cumulative* admitted count (`used`) under a name
//!   of its own (`member`: instance id and window incarnation). Redis adds only the growth to
//!   the window's key, so a round that timed out but was applied is never counted twice, and
//!   a re-sent round changes nothing.
//! - In the same script an instance asks for a *ceiling*: how far its `used` may grow in the
//!   window. Redis grants it out of `threshold - fleet total - what the other instances hold
//!   unused`, so the leases of all instances never add up to more than the threshold.
//! - An ask has two parts: `need`, the requests waiting here right now, which Redis grants
//!   first from all that is free; and a forecast of the demand until the next round, which
//!   Redis grants only out of the *spare budget* (`SPARE_PERCENT` of the threshold, shared by
//!   all instances in proportion to what they ask). So the quota other instances hold unused
//!   is never more than the spare budget, and a burst on one instance finds all the rest free.
//! - A request that finds this instance's lease used is *held* (never refused for that): it
//!   waits for the next round's answer, which carries it as `need`. Nothing is admitted past a
//!   lease (no credit), so leases and direct records alone bound what the fleet admits.
//! - A round carries only the records that have something to say: requests waiting, a lease
//!   half used, counts not yet reported (periodic rounds), or an unused lease to give back.
//!   Forecasts look one sync interval ahead, so a busy counter asks about once an interval.
//! - Far from the limit, no lease at all (*direct* records, thresholds of 1000 and more, not
//!   token buckets): while the fleet's count as last known stays under `DIRECT_ZONE_PERCENT`
//!   of the threshold, an instance admits on its own and reports what it admitted as a plain
//!   increment (`INCRBY`, and `PEXPIREAT` from the key's creator: no script), with at most
//!   `direct_allowance` (a thousandth of the threshold) admitted and not yet reported. A record
//!   that leaves that zone, or has more waiting, asks for leases for the rest of its window.
//!   The script keeps `direct_cap` (what direct records can have admitted in all) out of its
//!   leases until the fleet's count passes it. So busy tenants far from their limits cost one
//!   `INCRBY` an interval, and sparse ones less than one per request.

pub use super::record::{next_gen, Ledger, Orphan};
use crate::algorithm::Algorithm;
use crate::algorithm::Quota;
use crate::algorithm::TierState;

/// The spare budget: the most that all instances together may hold leased and unused beyond
/// the requests waiting for it, in percent of the threshold (at least one request). A burst
/// on one instance finds at least `100 - SPARE_PERCENT`% of the threshold, less what the fleet
/// has admitted, free for it.
pub const SPARE_PERCENT: u64 = 4;

/// Direct records admit while the fleet's count, as last known, stays under this percent of
/// the threshold (less what every instance may admit unreported).
pub const DIRECT_ZONE_PERCENT: u64 = 25;

/// What an instance may admit directly and not yet reported: a thousandth of the threshold
/// (0: no direct admission; thresholds under 1000 always lease).
pub fn direct_allowance(threshold: u64) -> u64 {
    threshold / 1000
}

/// The most all direct records of a window can admit: the zone, and what each instance (at
/// least `COLD_FLEET` counted) may hold unreported. 0 where no record is direct.
pub fn direct_cap(threshold: u64, algorithm: Algorithm, instances: u64) -> u64 {
    if !leaseless(algorithm) || direct_allowance(threshold) == 0 {
        return 0;
    }
    direct_zone(threshold) + instances.max(COLD_FLEET) * direct_allowance(threshold)
}

/// What one direct record may hold admitted and unreported: `direct_allowance`, 0 where no
/// record is direct.
pub fn direct_each(threshold: u64, algorithm: Algorithm) -> u64 {
    if leaseless(algorithm) {
        direct_allowance(threshold)
    } else {
        0
    }
}

fn direct_zone(threshold: u64) -> u64 {
    threshold / 100 * DIRECT_ZONE_PERCENT + threshold % 100 * DIRECT_ZONE_PERCENT / 100
}

/// Whether records of an algorithm may admit without a lease (direct): windows of counts.
/// A bucket's tokens and a sliding log's instants always lease.
fn leaseless(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow)
}

/// The spare budget of a threshold (see `SPARE_PERCENT`); a fixed window under
/// `SMALL_FIXED_UNDER` has `SMALL_FIXED_SPARE_PERCENT`.
pub fn spare(threshold: u64, algorithm: Algorithm) -> u64 {
    let pct = if threshold < SMALL_FIXED_UNDER && algorithm == Algorithm::FixedWindow {
        SMALL_FIXED_SPARE_PERCENT
    } else {
        SPARE_PERCENT
    };
    (threshold / 100 * pct + threshold % 100 * pct / 100).max(1)
}

/// The spare budget of a small fixed window: larger leases, so that a window filling at the
/// limit asks Redis less often (its count is exact whatever the spare: Redis never leases past
/// the threshold).
pub const SMALL_FIXED_SPARE_PERCENT: u64 = 10;

/// Fixed windows under this threshold have the larger spare budget. (Chosen by simulation:
/// 10% for every algorithm made sliding windows with spikes refuse under 0.9x.)
pub const SMALL_FIXED_UNDER: u64 = 500;

/// The fleet size direct records assume at least: instances that start together each see only
/// themselves at first, so a small count seen is not believed.
pub const COLD_FLEET: u64 = 10;

/// Why a tier refuses a request although the algorithm alone would admit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ceiling {
    /// Within what this instance may admit.
    Open,
    /// The lease is used up: wait for the next round, which asks for more.
    LeaseUsed,
    /// The fleet has no room now: two answers in a row could not grant the requests that
    /// waited, or (sliding windows) the weighted count of this moment is full.
    FleetFull,
    /// Redis is down: this instance's share of what was left is used up.
    ShareUsed,
}

/// The part of a sliding window's previous count that still weighs at `now_ms`, rounded up.
pub fn previous_weight(count: u64, window_start_ms: u64, period_ms: u64, now_ms: u64) -> u64 {
    let p = u128::from(period_ms.max(1));
    let w = p - u128::from(now_ms.saturating_sub(window_start_ms)).min(p);
    u64::try_from((u128::from(count) * w).div_ceil(p)).unwrap_or(u64::MAX)
}

/// Whether a record can be direct at all (see the module's header).
pub fn direct_capable(tier: &Quota, algorithm: Algorithm) -> bool {
    leaseless(algorithm) && direct_allowance(tier.threshold) > 0
}

/// May one more request be admitted directly (no lease; `instances` sharing)? Returns the
/// allowance it runs under: the record is direct, fewer than the allowance are unreported,
/// and the fleet's count as last known (a sliding window's weighted count), this request and
/// what every instance may hold unreported stay within the zone.
pub fn direct(
    state: &TierState,
    tier: &Quota,
    algorithm: Algorithm,
    now_ms: u64,
    instances: u64,
    units: u64,
) -> Option<u64> {
    let l = &state.ledger;
    if l.current.leased || !direct_capable(tier, algorithm) {
        return None;
    }
    let allowance = direct_allowance(tier.threshold);
    let prev = if algorithm == Algorithm::SlidingWindow {
        previous_weight(
            state.previous,
            state.window_start_ms,
            tier.period_ms,
            now_ms,
        )
    } else {
        0
    };
    let known = state
        .current
        .saturating_add(prev)
        .saturating_add(units)
        .saturating_add(instances.max(COLD_FLEET) * allowance);
    let unreported = l.current.used.saturating_sub(l.current.sent);
    (unreported.saturating_add(units) <= allowance && known <= direct_zone(tier.threshold))
        .then_some(allowance)
}

/// Does one more request of `units` (its cost; 1 without one) fit what this instance may admit
/// for the fleet? `leased`: Some(instances) when Redis answers; `shared`: Some(instances) when
/// Redis is down under `on_failure: local_share`; neither: no fleet limit applies here.
pub fn ceiling(
    state: &TierState,
    tier: &Quota,
    algorithm: Algorithm,
    now_ms: u64,
    leased: Option<u64>,
    shared: Option<u64>,
    units: u64,
) -> Ceiling {
    let l = &state.ledger;
    let bucket = algorithm.is_bucket();
    let sliding = algorithm.is_sliding().then_some(now_ms);
    if let Some(n) = leased {
        if !l.current.leased && direct_capable(tier, algorithm) {
            // a direct record: within the zone it admits; past it (or with its allowance
            // unreported) the request waits for the lease the next round asks for
            return match direct(state, tier, algorithm, now_ms, n, units) {
                Some(_) => Ceiling::Open,
                None => Ceiling::LeaseUsed,
            };
        }
        // past the lease, a request waits for the round that asks for it: no credit, at any
        // threshold (docs/fleet.md, "The bound")
        if l.current.used + units > l.ceiling {
            return if l.short >= 2 || (l.capped && algorithm == Algorithm::FixedWindow) {
                Ceiling::FleetFull
            } else {
                Ceiling::LeaseUsed
            };
        }
        if let Some(now_ms) = sliding {
            if let Some(full) = sliding_full(state, tier, algorithm, now_ms, units) {
                return full;
            }
        }
    } else if let (Some(n), false) = (shared, bucket) {
        // a token bucket keeps its local bucket alone; a sliding window's threshold at this
        // moment is less what its previous window still weighs (as the fleet last knew it)
        let weight = match algorithm {
            Algorithm::SlidingWindow => previous_weight(
                l.prev_bound.max(state.previous),
                state.window_start_ms,
                tier.period_ms,
                now_ms,
            ),
            _ => 0,
        };
        if let Some((counted, cap)) = share(state, tier.threshold.saturating_sub(weight), n) {
            if counted + units > cap {
                return Ceiling::ShareUsed;
            }
        }
    }
    Ceiling::Open
}

/// A sliding window or log under a lease: the weighted count of this moment is full (no round
/// changes that, time does), or the log waits for its first answer to know its span. `None`:
/// it has room.
///
/// A lease reaches to the cap one round gap ahead: use only what the cap of this moment leaves
/// after what the others held at the answer.
fn sliding_full(
    state: &TierState,
    tier: &Quota,
    algorithm: Algorithm,
    now_ms: u64,
    units: u64,
) -> Option<Ceiling> {
    let l = &state.ledger;
    let p = tier.period_ms;
    let prev = l.prev_bound;
    let weight = if algorithm == Algorithm::SlidingLog {
        // a log: what of the previous window is still in the span, as of the last
        // answer (Redis counts it by instant: the log's ledger script), only less since
        prev
    } else {
        previous_weight(prev, state.window_start_ms, p, now_ms)
    };
    let cap = tier.threshold.saturating_sub(weight);
    if l.current.used + l.others + units <= cap {
        return None;
    }
    // (a log with no answer yet in this window knows the previous window only as a whole,
    // or as its own answers saw it: the next answer says what is still in the span, so the
    // request waits for it)
    let first_answer = algorithm == Algorithm::SlidingLog && l.fair == 0;
    // what the others had admitted at the last answer (`others` less it: what they held
    // unused, which may come back: while the fleet has admitted under 0.9 x the cap of this
    // moment, the request waits for the rounds that may tell it so)
    let others_admitted = l.base.saturating_sub(l.lease_from);
    let admitted = others_admitted + l.current.used + units;
    let held = l.others > others_admitted;
    // (a sliding window's previous window as Redis bounds it counts what the others held
    // unused at its end, until they report: what the fleet had admitted of it, as this
    // instance last heard, is `state.previous`)
    let held_prev = algorithm == Algorithm::SlidingWindow && prev > state.previous;
    let admitted_cap = if held_prev {
        tier.threshold.saturating_sub(previous_weight(
            state.previous,
            state.window_start_ms,
            p,
            now_ms,
        ))
    } else {
        cap
    };
    Some(
        if first_answer || ((held || held_prev) && l.short < 2 && 10 * admitted < 9 * admitted_cap)
        {
            Ceiling::LeaseUsed
        } else {
            Ceiling::FleetFull
        },
    )
}

/// When `ceiling` said Open: how many requests, this one included, the fleet has left as this
/// instance knows it: the threshold less the fleet's count and what the other instances hold
/// (windows), or the bucket's tokens nobody holds and this instance's lease (token buckets);
/// while Redis is down, this instance's share of what was left. `None`: no fleet limit here,
/// or no answer yet in this window (the local count is all there is).
pub fn room(
    state: &TierState,
    tier: &Quota,
    algorithm: Algorithm,
    leased: Option<u64>,
    shared: Option<u64>,
) -> Option<u64> {
    let l = &state.ledger;
    let bucket = algorithm.is_bucket();
    if leased.is_some() {
        if !l.current.leased && direct_capable(tier, algorithm) {
            // direct: the fleet's count as last reported (none yet: the local count alone)
            return l
                .keyed
                .then(|| tier.threshold.saturating_sub(state.current).max(1));
        }
        if l.fair == 0 {
            return None;
        }
        return Some(if bucket {
            l.room
                .saturating_add(l.ceiling.saturating_sub(l.current.used))
                .max(1)
        } else {
            // what the others held unused at the last answer (a log: and what of the previous
            // window is still in the span)
            let held = (l.others + l.current.used).saturating_sub(state.current);
            let prev = if algorithm == Algorithm::SlidingLog {
                l.prev_bound
            } else {
                0
            };
            tier.threshold
                .saturating_sub(state.current + held + prev)
                .max(1)
        });
    }
    match (shared, bucket) {
        (Some(n), false) => {
            share(state, tier.threshold, n).map(|(counted, cap)| cap.saturating_sub(counted).max(1))
        }
        _ => None,
    }
}

/// Without Redis's answers (`on_failure: local_share`, `n` instances): what this instance has
/// counted, and how far it may go. `None`: no cap (alone).
/// - Only this counter's cluster node is down, and it had an answer in this window: its lease
///   stands (the others' leases are theirs), plus its part of what nobody held at that answer.
/// - Otherwise: what was left at the last answer, divided among the instances last seen.
fn share(state: &TierState, threshold: u64, n: u64) -> Option<(u64, u64)> {
    let l = &state.ledger;
    if l.unreachable && l.fair > 0 {
        return Some((
            l.current.used,
            l.ceiling.max(l.current.sent) + l.room / n.max(1),
        ));
    }
    if n <= 1 {
        return None;
    }
    let left = threshold.saturating_sub(l.base);
    let share = if left == 0 { 0 } else { (left / n).max(1) };
    Some((state.current, l.base + share))
}

/// A request held as long as it may while no answer said the fleet is full (the rounds were
/// only slow: a busy machine, a stalling Redis): does it fit as if its counter's Redis node did
/// not answer under `local_share` (`share`)? Its lease, plus its part of what nobody held at
/// the last answer; with no answer yet in this window, a window's part of what was left (a
/// sliding window's: of what the previous window leaves at this moment), and nothing for a
/// token bucket or a sliding log (its answers alone say what of the previous window is still
/// in the span, and the others may have leased all the rest meanwhile).
pub fn fits_after_hold(
    state: &TierState,
    tier: &Quota,
    algorithm: Algorithm,
    (now_ms, n): (u64, u64),
    units: u64,
) -> bool {
    let l = &state.ledger;
    if l.fair > 0 {
        return l.current.used + units <= l.ceiling.max(l.current.sent) + l.room / n.max(1);
    }
    if algorithm.is_bucket() || algorithm == Algorithm::SlidingLog {
        return false;
    }
    let weight = if algorithm.is_sliding() {
        previous_weight(l.prev_bound, state.window_start_ms, tier.period_ms, now_ms)
    } else {
        0
    };
    share(state, tier.threshold.saturating_sub(weight), n.max(2))
        .is_some_and(|(counted, cap)| counted + units <= cap)
}

/// How a request was admitted, for the fleet's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Directly, under this allowance (see `direct`).
    Direct(u64),
    /// Under a lease (or, a shadow rule's, past it).
    Leased,
    /// Without Redis's answers (`on_failure`): a record that can be direct stays so (its
    /// counts go as plain increments when Redis is back); any other leases from now on.
    Unsynced { direct_capable: bool },
}

/// Count one admitted request of `units` (the ledger counts units). Returns whether a round should come now: the request ran
/// past the lease (a shadow rule's), half of the lease is used, or (direct) half of the allowance is unreported.
pub fn commit(state: &mut TierState, how: Admitted, units: u64) -> bool {
    let l = &mut state.ledger;
    l.current.used += units;
    match how {
        Admitted::Direct(allowance) if !l.current.leased => {
            let report = 2 * l.current.used.saturating_sub(l.current.sent) >= allowance;
            l.asking |= report;
            return report;
        }
        Admitted::Unsynced {
            direct_capable: true,
        } if !l.current.leased => return false,
        _ => {}
    }
    l.current.leased = true;
    if l.current.used > l.ceiling {
        l.asking = true;
        return true;
    }
    let lease = l.ceiling.saturating_sub(l.lease_from);
    // (a fixed window's part of a filling window asks again when it is used, not at half:
    // until 2026-11-28 it did when the answer left room to grow it, but the room a window's
    // first asker saw was mostly the others' parts to come, and holders now hear of waits;
    // the seed scenario in the simulation: 2.00 -> 1.87 script calls a second for a tenant,
    // swaying 2.82 -> 2.58, holds p99 302 -> 209 ms)
    let half = 2 * (l.current.used - l.lease_from) >= lease && !l.split;
    l.asking |= half;
    half
}

/// Note that a request was refused as the fleet is full. Returns whether a round should come
/// now: room comes back with time in a sliding window (its previous window weighs less) and
/// a token bucket (it refills), and a sliding window's count of this moment may be full only
/// as of the last answer (what the others held then may have been given back or used since).
/// A fixed window that two answers found full asks again at the periodic round (`drain`):
/// room comes back there only as leases are given back, or when the window ends. One whose
/// used lease reached the cap (`Ledger::capped`) is full at once, without those two answers.
pub fn note_full(state: &mut TierState, algorithm: Algorithm) -> bool {
    let l = &mut state.ledger;
    // a refusal is the lease path's (a direct record holds instead): the record leases
    l.current.leased = true;
    if l.capped && algorithm == Algorithm::FixedWindow && l.short < 2 {
        // its lease reached the cap and is used: the window is full as two answers would
        // say (its count goes at the next periodic round)
        l.short = 2;
        l.filled = true;
    }
    let ask = l.short < 2 || algorithm != Algorithm::FixedWindow;
    l.asking |= ask;
    ask
}

/// Whether a request held here asks at once (`FleetState::ask_at_once`) rather than at the next
/// early round (up to `MIN_ROUND_GAP_MS` later): the record has had no answer in its window yet,
/// and its demand here is quiet: its steady demand an interval (`Ledger::steady`, the lesser of
/// the last two), over a whole window of `period_ms`, is under half of this instance's even
/// part of `threshold` (of `instances`). Such a first ask waits on nothing but Redis. A busy
/// partition's first asks of a window still come as early rounds do, with what it held
/// meanwhile (sized on that demand), and so do a bucket's (its lease outlives the window: a
/// first ask at once there left some simulated fleets' buckets under 0.98 x their refill).
pub fn asks_at_once(
    state: &TierState,
    algorithm: Algorithm,
    (threshold, period_ms): (u64, u64),
    instances: u64,
    interval_ms: u64,
) -> bool {
    let l = &state.ledger;
    if l.fair != 0 || matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket) {
        return false;
    }
    let per_window = u128::from(l.steady) * u128::from(period_ms) / u128::from(interval_ms.max(1));
    per_window * u128::from(instances.max(1)) * 2 < u128::from(threshold)
}

/// Note that a request of `units` was held because the lease is used: the next round asks for
/// it (a direct record asks for leases from now on). `first`: the request was not held before;
/// one that was is asked for again only when the last answer could not grant what waited, or
/// when a new window began since (its asks were of the old one: `Ledger::rehold`).
pub fn note_hold(state: &mut TierState, first: bool, units: u64) {
    let l = &mut state.ledger;
    l.current.leased = true;
    if first || l.short > 0 || l.rehold {
        // a rule charging late: the share of its answers that were charged (one request
        // at least, with what came before)
        let share_milli = match l.answers {
            0 => 1000,
            n => (u64::from(l.charged_answers) * 1000 / u64::from(n)).max(1),
        };
        l.need_milli = l
            .need_milli
            .saturating_add(units.saturating_mul(share_milli));
    }
    l.asking = true;
}

/// The answer of a request admitted by a rule that charges late came, `charged` units (its
/// charge, if any, is committed apart): counted, so that held requests ask for the share of
/// their units that answers are charged.
pub fn note_answer(state: &mut TierState, charged: u64) {
    let l = &mut state.ledger;
    if l.answers >= 1024 {
        l.answers /= 2;
        l.charged_answers /= 2;
    }
    l.answers += 1;
    l.charged_answers += u16::from(charged > 0);
}

/// Note that the count refused a request while Redis answers: after an operator's reset or
/// grant anywhere in the fleet (the heartbeat reads its mark), the record asks at the next
/// round, so that it hears of it; until then it costs Redis nothing.
pub fn note_count_full(state: &mut TierState) {
    state.ledger.count_full = true;
}

/// Redis may have lost what it acknowledged (it failed: a primary killed before its replica
/// had the last writes, a restart without them): each leased record that Redis confirmed counts
/// of in a round drained at or after `since_ms` reports its whole count again at the next
/// round, the previous window's as if it held a lease to give back. The reports are
/// cumulative, so a server that kept them adds nothing; a record whose window the fleet filled
/// would otherwise never report again, and what the lost writes carried would stay missing
/// from Redis. Records answered before `since_ms` had their writes passed on long before the
/// failure. Direct records' plain increments are not idempotent and are not sent again.
pub fn resync(state: &mut TierState, since_ms: u64) {
    let l = &mut state.ledger;
    if l.settled_ms < since_ms {
        return;
    }
    if l.current.leased && l.current.sent > 0 {
        l.asking = true;
    }
    if l.previous.leased && l.previous.sent > 0 {
        l.prev_held = true;
    }
}

/// The tier as a window's grant widens it (`Ledger::grant`): a window or log admits that much
/// past the threshold (a bucket's grant moved its time instead).
pub fn granted(tier: &Quota, state: &TierState, algorithm: Algorithm) -> Quota {
    let grant = state.ledger.grant;
    if grant == 0 || algorithm.is_bucket() {
        return *tier;
    }
    Quota {
        threshold: tier.threshold.saturating_add(grant),
        ..*tier
    }
}

/// What an operator does to a partition's window (`POST /api/tenants/{id}/reset`, `/grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjust {
    /// Without Redis: start the window again (a sliding window: its previous one weighs
    /// nothing; a bucket: full).
    Reset,
    /// Without Redis: `units` more for the current window (a bucket: tokens, up to full).
    Grant(u64),
    /// With Redis: what the fleet's ledger now holds after the operator's call (`grant`, the
    /// window's whole grant; `reset`: the previous window was forgiven too).
    Fleet { grant: u64, reset: bool },
}

/// Apply an operator's adjustment to a tier's state, rolled to now (`period_ms`, `threshold`:
/// the tier's; a bucket's time per token is their ratio).
pub fn adjust(
    state: &mut TierState,
    algorithm: Algorithm,
    how: Adjust,
    (period_ms, threshold): (u64, u64),
) {
    let bucket = algorithm.is_bucket();
    match how {
        Adjust::Reset if bucket => state.tat_ns = 0,
        Adjust::Reset => {
            // what the window counted no longer counts; what was granted and not used (past
            // the threshold, the count used the grant) stays
            let l = &mut state.ledger;
            l.grant -= l.grant.min(state.current.saturating_sub(threshold));
            state.current = 0;
            state.previous = 0;
        }
        Adjust::Grant(units) => {
            let g = state.ledger.grant.saturating_add(units);
            learn_grant(state, g, period_ms, threshold);
        }
        Adjust::Fleet { grant, reset } => {
            learn_grant(state, grant, period_ms, threshold);
            if reset && bucket {
                state.tat_ns = 0;
            } else if reset {
                state.previous = 0;
                state.ledger.prev_bound = 0;
            }
        }
    }
}

/// A window's grant as Redis (or the operator) says it now: it only grows in a window (a
/// reset makes it what the window counted, if that is more); a bucket's new tokens move its
/// time back (never past full).
fn learn_grant(state: &mut TierState, grant: u64, period_ms: u64, threshold: u64) {
    let l = &mut state.ledger;
    if grant <= l.grant {
        return;
    }
    let more = grant - l.grant;
    l.grant = grant;
    // (only a bucket keeps a time; its time per token as `algorithm::interval_ns`)
    if state.tat_ns > 0 {
        let interval =
            (u128::from(period_ms.max(1)) * 1_000_000 / u128::from(threshold.max(1))).max(1);
        let back = u64::try_from(u128::from(more) * interval).unwrap_or(u64::MAX);
        state.tat_ns = state.tat_ns.saturating_sub(back);
    }
}

/// Note that a request of `units` wanted this tier (admitted or not): the size of the next ask.
pub fn note_demand(state: &mut TierState, units: u64, algorithm: Algorithm) {
    state.ledger.demand += units;
    let n = u32::try_from(units).unwrap_or(u32::MAX);
    state.ledger.interval_demand = state.ledger.interval_demand.saturating_add(n);
    // (a fixed window's lease in use stays through a quiet moment: `Ledger::busy`; a sliding
    // window's or a bucket's goes back, since room held idle there refuses others sooner)
    state.ledger.busy |= algorithm == Algorithm::FixedWindow;
}

/// What a round sends for one window record of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub window_start_ms: u64,
    pub gen: u32,
    /// Cumulative admitted count of the record.
    pub used: u64,
    /// The ceiling asked for (`used` or less: nothing more wanted; the lease is given back).
    pub want: u64,
    /// Of `want - used`, the requests waiting here now: granted first, from all that is free.
    pub need: u64,
    /// Of `used`, what Redis confirmed before (token buckets: what it has charged already, if
    /// it lost its record of this member, say by a restart).
    pub confirmed: u64,
    /// What Redis has not confirmed was admitted at or after this (ms; 0: now). Token buckets
    /// charge such tokens from then, so that their refill is not lost (an outage, a restart).
    pub since_ms: u64,
    /// The record is the previous window's.
    pub previous: bool,
    /// Token buckets: the lease this record took over from the previous one (see `Ledger`).
    pub adopt: u64,
    /// Of `used`, what went as plain increments (the script hears of `used - direct`).
    pub direct: u64,
    /// A fixed window's steady demand until the window's end, within `want` (0: none, or
    /// not a fixed window): when the members' such demands fill what is left, Redis leases
    /// each its part of it at once (`script::WINDOWS`), so that a filling window costs a few
    /// calls per instance rather than one for each of the spare budget's small leases.
    pub rest: u64,
    /// A direct record: `used - confirmed` goes as a plain increment (`first`: the key is not
    /// known to exist yet), with no lease asked.
    pub count: bool,
    pub first: bool,
    /// A sliding log's record: Redis counts its units by instant (the log's ledger script), and
    /// answers `prev` as what of the previous window is still in the span.
    pub log: bool,
}

/// What Redis answered for one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The fleet's total for the window (this ask included).
    pub total: u64,
    /// The ceiling granted.
    pub ceiling: u64,
    /// The most this instance should hold unused while others hold leases too.
    pub fair: u64,
    /// What is left that no instance holds.
    pub room: u64,
    /// What the other instances held unused.
    pub held: u64,
    /// Sliding windows: the previous window's count, its leases included (a sliding log: what
    /// of it is still in the span).
    pub prev: u64,
    /// Units granted to the window (`Ledger::grant`; a bucket's: tokens given back).
    pub grant: u64,
    /// A sliding log: the previous window's buckets that leave the span next, oldest first
    /// (bucket, units; `LOG_STEPS` at most, the rest (0, 0)): the member lowers `prev` as
    /// each leaves (`sliding_log::Log::fleet_prev`).
    pub steps: [(u64, u64); LOG_STEPS],
}

/// How many of the previous window's buckets a sliding log's answer names (`Answer::steps`).
pub const LOG_STEPS: usize = 8;

/// How a round sizes its asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Now (ms since the epoch).
    pub now_ms: u64,
    /// Time since the last round: demand over it is the rate, for a record not drained before.
    pub since_ms: u64,
    /// How far ahead a forecast looks (cut at the window's end).
    pub horizon_ms: u64,
    /// Time left in the window.
    pub left_ms: u64,
    /// A periodic round (every `sync_interval`): it reports every count not yet reported and
    /// gives back leases nobody used (`lease_ask`). Early rounds carry only the records that
    /// ask.
    pub periodic: bool,
    /// A token bucket: a lease is tokens out of the fleet's one bucket, which an unused lease
    /// keeps out even after its window has ended (nothing lapses), so it always goes back at a
    /// periodic round, whether or not others hold leases.
    pub bucket: bool,
    /// The tier's spare budget (`spare`): Redis grants no forecast beyond it, so an ask wants
    /// no more (an unused lease is then kept at most that far past what waits: what was leased
    /// for requests that went elsewhere goes back at once).
    pub spare: u64,
    /// What a record never drained (a partition's first ask on this instance) asks for ahead
    /// at least: its even part of the spare budget (`spare` over the fleet's instances, at
    /// least `COLD_FLEET` until the heartbeats have counted them twice: instances started
    /// together each see only themselves at first, and one taking the whole budget left the
    /// others asking per request in the simulation). Its demand so far is one request, and a
    /// lease of what that needs was used within an early round's gap: the seed scenario's
    /// first window took three asks an instance before its part, and takes two.
    pub first_ahead: u64,
    /// What a record never drained of a tier that takes parts (`parts`) asks for until the
    /// window's end at least (`Ask::rest`): its even part of the threshold (the threshold over
    /// the fleet's instances as assumed; 0 for other tiers). Its demand so far says little of
    /// its rate: a cold fleet's first window took about 24 script calls for a tenant of
    /// `scripts/bench-fleet`'s seed scenario where a steady window takes 12 (parts sized on
    /// the first requests' rate, used up, sized again): 1.3 to 1.4 x the seed design's Redis
    /// time from the first request with it, 1.8 to 2.3 x without (docs/fleet.md). A record
    /// that needs less gives it back at the first periodic round that saw no request for it,
    /// and its part is re-split to its share when it hears that others wait on the window.
    pub first_part: u64,
    /// The tier takes parts of a filling window (`parts`): an ask may also carry the steady
    /// demand until the window's end (`Ask::rest`), at `interval_ms` (the time between
    /// periodic rounds) per `Ledger::steady`, looking at most `REST_INTERVALS` intervals ahead.
    pub parts: bool,
    pub interval_ms: u64,
    /// Another instance's requests wait on this window lately (its heartbeat read their
    /// marks, or the waits channel told), and this record holds a part of it (or a lease of a
    /// tier that takes parts) unused: it calls now, with nothing to report too (the call is
    /// what re-splits a part; a lease gives back what its forecast does not need), and at a
    /// periodic round even while its part is less than half used (`periodic_cause`), so that what its
    /// forecast does not need goes to them (the swaying seed scenario: 41 refusals under
    /// 0.9 x threshold in 80 seeds without it).
    pub waited_on: bool,
    /// Time since the last periodic round began (0: this is one, or none yet): the demand
    /// counted since (`Ledger::interval_demand`) over it is a rate before a whole interval
    /// has told one (`steady`).
    pub into_interval_ms: u64,
}

/// Whether a tier's records take parts of a filling window (`Ask::rest`): fixed windows under
/// `SMALL_FIXED_UNDER` (chosen by simulation: with parts at any threshold, a fleet whose load
/// stopped at once refused under 0.9 x threshold while the others' parts went back).
pub fn parts(threshold: u64, algorithm: Algorithm) -> bool {
    algorithm == Algorithm::FixedWindow && threshold < SMALL_FIXED_UNDER
}

/// How many intervals ahead a fixed window's steady demand is forecast at most (a lease of a
/// day's window is not sized by the whole day).
pub const REST_INTERVALS: u64 = 30;

/// The asks of one tier for this round (previous window, current window). An ask wants the
/// requests waiting (`need`) and a forecast: the demand since the record was last drained,
/// over the horizon and a half; without demand, and while others hold leases, the lease is
/// given back at a periodic round. A lease larger than
/// what is asked is lowered here at once, before Redis hears of it, so that this instance
/// never admits what Redis has stopped reserving for it.
pub fn drain(state: &mut TierState, sizing: Sizing) -> [Option<Ask>; 2] {
    if sizing.periodic {
        let l = &mut state.ledger;
        l.steady = l.last_interval.min(l.interval_demand);
        l.last_interval = std::mem::take(&mut l.interval_demand);
    }
    let prev = previous_ask(state);
    let current = if state.ledger.current.leased {
        lease_ask(state, &sizing)
    } else {
        direct_ask(state, &sizing)
    };
    [prev, current]
}

/// Whether `drain` can ask anything of an early round (one not periodic) for this record,
/// others waiting on none of its windows (`Sizing::waited_on` false): the previous window's
/// record holds what Redis has not confirmed or a lease to give back, or the current one asks
/// (`Ledger::asking`: a request waits, half of the lease is used, ...) or holds requests
/// waiting. When not, `drain` asks nothing and changes nothing, and the sync passes the
/// record over before its sizing is made: an early round visited every tracked counter then,
/// and that sizing and `drain` took most of the 69 ns a tier such a visit cost, 22 ns since
/// (perf, a gateway of 3,200 tenants at 21 early rounds a second, every request held for one:
/// the rounds' share of its CPU 15% -> 7%; at 100,000 tenants of two tiers, 14 -> 4 ms a
/// round). An early round now visits only the counters reached since the last one or left
/// asking by it (`RuleCounters::drain_in`, with this as its counters' "still asks").
pub fn asks_early(l: &Ledger) -> bool {
    previous_open(l) || current_asks(l)
}

/// A sliding window's record holds a lease it has not used, or counts Redis has not confirmed:
/// when its window ends, Redis weighs the next window with all of it until the record reports
/// (`previous_ask`), so the sync rolls such a record at its window's end and reports it at
/// once, rather than at the next periodic round (the simulation's parts seed 1445: 1,177
/// refusals under 0.9 x threshold while quiet holders' unused leases weighed for 390 ms).
pub fn holds_to_its_end(l: &Ledger) -> bool {
    l.current.leased && (l.ceiling > l.current.used || l.current.used > l.current.sent)
}

/// The previous window's record holds what Redis has not confirmed or a lease to give back
/// (`previous_ask`: it goes in every round).
fn previous_open(l: &Ledger) -> bool {
    l.previous.used > l.previous.sent || l.prev_held
}

/// The current record asks of any round (`lease_ask`, `direct_ask`): a request waits, half of
/// the lease is used, ... (`Ledger::asking`), or requests are held for its next ask.
fn current_asks(l: &Ledger) -> bool {
    l.asking || l.need_milli > 0
}

/// The previous window's record, while it holds what Redis has not confirmed or a lease to
/// give back.
fn previous_ask(state: &TierState) -> Option<Ask> {
    let l = &state.ledger;
    previous_open(l).then_some(Ask {
        window_start_ms: l.previous_start_ms,
        gen: l.previous.gen,
        used: l.previous.used,
        want: l.previous.used,
        need: 0,
        confirmed: l.previous.sent,
        // (a bucket's: what Redis has not charged was admitted since its last answer, in the
        // record's window; a record never answered counts from now)
        since_ms: if l.settled_ms == 0 {
            0
        } else {
            l.settled_ms
                .min(state.window_start_ms)
                .max(l.previous_start_ms)
        },
        previous: true,
        adopt: 0,
        direct: l.previous.direct,
        rest: 0,
        count: !l.previous.leased,
        first: false,
        log: false,
    })
}

/// A direct record: what was admitted, when half the allowance waits, or at a periodic round.
fn direct_ask(state: &mut TierState, sizing: &Sizing) -> Option<Ask> {
    let window_start_ms = state.window_start_ms;
    let l = &mut state.ledger;
    let unsent = l.current.used > l.current.sent;
    if l.current.gen == 0 || !unsent || !(l.asking || sizing.periodic) {
        return None;
    }
    l.asking = false;
    l.demand = 0;
    l.drained_ms = sizing.now_ms;
    Some(Ask {
        window_start_ms,
        gen: l.current.gen,
        used: l.current.used,
        want: l.current.used,
        need: 0,
        confirmed: l.current.sent,
        since_ms: 0,
        previous: false,
        adopt: 0,
        direct: l.current.direct,
        rest: 0,
        count: true,
        // an earlier report whose round failed may have created the key without expiry
        first: !l.keyed && l.current.sent > 0,
        log: false,
    })
}

/// A leasing record: a round carries a record that asks; a periodic one also what is
/// unreported, and a lease nobody used: a fixed window's since the last periodic round
/// (`Ledger::busy`), others' since the record's last round (given back even when nobody else
/// held a lease at the last answer: an instance that asks later is not heard by the holder).
/// It asks for what waits and the demand forecast over the horizon.
fn lease_ask(state: &mut TierState, sizing: &Sizing) -> Option<Ask> {
    let horizon_ms = sizing.horizon_ms.min(sizing.left_ms.max(1));
    let window_start_ms = state.window_start_ms;
    let l = &mut state.ledger;
    let since_ms = if l.drained_ms == 0 {
        // never drained: its demand came within about one horizon
        horizon_ms.max(sizing.since_ms)
    } else {
        sizing.now_ms.saturating_sub(l.drained_ms)
    };
    // (a lease used since the last periodic round stays through a quiet moment after an
    // early round; each periodic round starts that span again)
    let busy = l.busy;
    l.busy &= !sizing.periodic;
    // others wait on this window (`Sizing::waited_on`): it calls now, even with nothing to
    // report (Redis re-splits the part at the call: `tests/outcomes.rs`'
    // `a_fleet_takes_late_charges` refused in 36 runs of 60 without; the part of one that
    // counted itself alone may be the whole window), and a call after a re-split frees what
    // Redis kept of the part before it (`Ledger::resplit`)
    let include = current_asks(l)
        || (sizing.periodic && periodic_cause(l, busy, sizing.waited_on))
        || sizing.waited_on;
    if sizing.waited_on {
        l.heard_ms = sizing.now_ms;
    }
    if l.current.gen == 0 || !include || (!sizing.periodic && waiting(l, sizing.now_ms)) {
        return None;
    }
    let mut forecast = forecast(l.demand, horizon_ms, since_ms, sizing.spare);
    let mut rest = rest(steady(l, sizing), sizing);
    if l.drained_ms == 0 {
        forecast = forecast.max(sizing.first_ahead);
        rest = rest.max(sizing.first_part);
    }
    let need = l.need();
    let mut want = l
        .current
        .used
        .saturating_add(need)
        .saturating_add(forecast.max(rest));
    if l.granted_waiting {
        // the lease granted to requests that waited stays theirs (and Redis keeps it so)
        want = want.max(l.ceiling);
        l.granted_waiting = false;
    } else if want < l.ceiling && l.demand == 0 && busy && !sizing.waited_on {
        // used since the last periodic round, quiet since this record's last round: the
        // lease stays (not while others wait on the window: what it does not need goes)
        want = l.ceiling;
    } else if want < l.ceiling {
        l.ceiling = want.max(l.current.used);
    }
    l.demand = 0;
    l.need_milli = 0;
    l.asking = false;
    l.drained_ms = sizing.now_ms;
    // (the previous record goes first in the round: what it gives back is there for this one)
    Some(Ask {
        window_start_ms,
        gen: l.current.gen,
        used: l.current.used,
        want,
        need,
        confirmed: l.current.sent,
        // (never answered: its tokens count from now)
        since_ms: if l.settled_ms == 0 {
            0
        } else {
            l.settled_ms.max(window_start_ms)
        },
        previous: false,
        adopt: l.adopt,
        direct: l.current.direct,
        rest,
        count: false,
        first: false,
        log: false,
    })
}

/// Whether a periodic round carries a leasing record that does not ask: to report a count not
/// yet reported, to give back a lease nobody used (`busy`: used since the last periodic round),
/// or refused as full, to ask again. `waited_on`: see `Sizing::waited_on`.
fn periodic_cause(l: &mut Ledger, busy: bool, waited_on: bool) -> bool {
    let give_back = l.ceiling > l.current.used && l.demand == 0 && !busy;
    // refused as full (see `Ceiling::FleetFull`): asked again at the periodic round (room
    // comes back only as leases are given back there, or as time passes); not a part of a
    // filling window whose last answer counted the whole cap admitted (nothing is held to give
    // back): it asks when an operator grants or resets (`count_full`: the heartbeat reads the
    // mark) or its window ends (past 0.9 x the cap instead, one of 1,000 simulated fleets with
    // late charges refused under 0.9 x threshold)
    let full = l.short >= 2 && l.demand > 0;
    let settled = full && l.split && l.filled;
    l.count_full |= settled;
    // a part of a filling fixed window in use reports its count at periodic rounds only past
    // half of it and once what is left would last at most an interval and a half at the
    // last interval's demand (`LASTS_HALVES`): what it holds is its own meanwhile, and when
    // it is used up, the others' asks need its count to tell the fleet's truth (whether the
    // window is full), so the round before that reports it; at every round past half, the
    // simulation's seed scenario made 1.66 script calls a second for a tenant, 1.46 since
    let left = l.ceiling.saturating_sub(l.current.used);
    let rate = u64::from(l.last_interval);
    let lasts = rate > 0 && 2 * left > LASTS_HALVES * rate;
    let fresh = l.split
        && busy
        && !waited_on
        && (lasts
            || 2 * l.current.used.saturating_sub(l.lease_from)
                < l.ceiling.saturating_sub(l.lease_from));
    let report = l.current.used > l.current.sent && !fresh;
    report || give_back || (full && !settled)
}

/// How long a record that called because others waited on its window, and kept its part
/// whole, lets their later waits go unanswered (`Ledger::heard_ms`; chosen by simulation: the
/// swaying seed scenario made 2.19 script calls a second for a tenant without it, 2.04 at
/// 250 ms, 1.98 at 500, 1.92 at 1,000, where its longest hold went from 302 to 502 ms).
pub const HEARD_GAP_MS: u64 = 500;

/// Whether a record holding a part of a filling window (or a lease of a tier that takes
/// parts) calls when it hears that others wait on its window (`Sizing::waited_on`): when Redis
/// keeps what it held before a re-split for it (`Ledger::resplit`: the call lets go of it);
/// when it has used all of it and not yet reported all it admitted (Redis still counts the
/// unreported part as held: the report tells the waiters the fleet's truth, and where the
/// window is full they are refused rather than held until this record's periodic round: in
/// the simulation, 10 per second on 10 instances flat out held p99 296 -> 211 ms, 71 -> 31
/// requests over 300 ms; 10 per second on 3 instances p99 202 -> 154 ms, the longest
/// 624 -> 332 ms); or when it holds some of it unused, unless it called for their waits
/// within `HEARD_GAP_MS` and that answer kept its part whole (within its share: each of a
/// waiter's asks, 100 to 200 ms apart, made every holder call again with nothing to give;
/// `scripts/bench-fleet`'s seed run showed a tenant's window with 6 such calls, beside the
/// waiter's 3 asks, in 300 ms).
pub fn hears_waits(l: &Ledger, now_ms: u64) -> bool {
    let unreported = l.current.used > l.current.sent && l.current.used >= l.ceiling;
    l.resplit
        || unreported
        || (l.ceiling > l.current.used && now_ms >= l.heard_ms.saturating_add(HEARD_GAP_MS))
}

/// In half intervals, how long what is left of a part in use must last at the last
/// interval's demand for a periodic round to keep its count (`periodic_cause`; chosen by
/// simulation: at 2, the swaying seed scenario's holds p99 302 ms instead of 299, 1.36 script
/// calls a second for a tenant instead of 1.46).
pub const LASTS_HALVES: u64 = 3;

/// How long a record whose part of a filling window is used up waits before it asks again
/// (`Ledger::waits`), by how many answers in a row left it waiting on the others: what it
/// waits for comes only with their rounds, so asking at every early round would cost Redis a
/// call each 50 ms and gain nothing (a periodic round carries it anyway).
pub const WAIT_GAPS_MS: [u64; 3] = [0, 100, 200];

/// The record waits on the others and asked too recently to ask again (`WAIT_GAPS_MS`).
fn waiting(l: &Ledger, now_ms: u64) -> bool {
    let gap = WAIT_GAPS_MS[usize::from(l.waits).min(WAIT_GAPS_MS.len() - 1)];
    l.short == 1 && now_ms < l.settled_ms.saturating_add(gap)
}

/// The demand since the last drain (over `since_ms`) over the horizon and a half: at least one
/// request, at most the spare budget (0 without demand).
fn forecast(demand: u64, horizon_ms: u64, since_ms: u64, spare: u64) -> u64 {
    if demand == 0 {
        return 0;
    }
    let d = u128::from(demand) * u128::from(horizon_ms) * 3 / (2 * u128::from(since_ms.max(1)));
    u64::try_from(d).unwrap_or(u64::MAX).clamp(1, spare.max(1))
}

/// The demand an interval a part is sized on: the lesser of the last two intervals'
/// (`Ledger::steady`), or, before two intervals have told it, the last one's (a window's first
/// asks need not wait two intervals to take their part), or, before one has, the demand since
/// the last periodic round at its rate, once a quarter of an interval has passed (the seed
/// scenario's first window: 2.21 -> 2.10 script calls a second for a tenant in the
/// simulation). Also in a window's last two intervals: until 2026-11-28 those waited for two
/// intervals (one may be a spike: simulated fleet seed 1466, 285 a second on 3 instances,
/// refused 6 under 0.9 x before holders heard of waits; it passes now), and a cold fleet's
/// load starting there leased the spare budget's few requests at a time: the seed bench's
/// costliest seconds, 16 script calls a second for a tenant.
fn steady(l: &Ledger, sizing: &Sizing) -> u32 {
    if l.steady != 0 {
        return l.steady;
    }
    let into = sizing.into_interval_ms;
    if l.last_interval == 0 && 4 * into >= sizing.interval_ms && into < sizing.interval_ms {
        // within the first interval, a quarter of it in: its demand so far, at that rate
        let r = u64::from(l.interval_demand).saturating_mul(sizing.interval_ms) / into;
        return u32::try_from(r).unwrap_or(u32::MAX);
    }
    l.last_interval
}

/// A fixed window's steady demand until its end (`Ask::rest`): `steady` units an interval,
/// over what is left of the window (at most `REST_INTERVALS` intervals).
fn rest(steady: u32, sizing: &Sizing) -> u64 {
    if !sizing.parts || steady == 0 || sizing.interval_ms == 0 {
        return 0;
    }
    let ahead = sizing
        .left_ms
        .min(REST_INTERVALS.saturating_mul(sizing.interval_ms));
    let r = u128::from(steady) * u128::from(ahead) / u128::from(sizing.interval_ms);
    u64::try_from(r).unwrap_or(u64::MAX)
}

/// Apply the fleet's total Redis answered to a plain increment (`ask.count`). A total below
/// what this record alone reported means Redis lost the key (a restart): what it had
/// confirmed before is sent again.
pub fn apply_count(state: &mut TierState, ask: &Ask, total: u64, period_ms: u64) {
    let l = &mut state.ledger;
    let confirmed = if total < ask.used {
        ask.used - ask.confirmed
    } else {
        ask.used
    };
    if !ask.previous && l.current.gen == ask.gen && state.window_start_ms == ask.window_start_ms {
        l.current.sent = confirmed;
        l.current.direct = confirmed;
        l.keyed = true;
        l.unreachable = false;
        l.base = total;
        state.current = total + l.current.used.saturating_sub(l.current.sent);
    } else if l.previous.gen == ask.gen && l.previous_start_ms == ask.window_start_ms {
        l.previous.sent = confirmed;
        l.previous.direct = confirmed;
        if l.previous_start_ms + period_ms == state.window_start_ms {
            state.previous = total + l.previous.used.saturating_sub(l.previous.sent);
        }
    }
}

/// A plain increment's round failed in a way that may have applied it (a timeout): take it
/// as applied, so that it is never counted twice.
pub fn assume_counted(state: &mut TierState, ask: &Ask) {
    let l = &mut state.ledger;
    if !ask.previous && l.current.gen == ask.gen && state.window_start_ms == ask.window_start_ms {
        l.current.sent = l.current.sent.max(ask.used);
        l.current.direct = l.current.direct.max(ask.used);
    } else if l.previous.gen == ask.gen && l.previous_start_ms == ask.window_start_ms {
        l.previous.sent = l.previous.sent.max(ask.used);
        l.previous.direct = l.previous.direct.max(ask.used);
    }
}

/// Apply Redis's answer to an ask. Records that have moved on (another window, another
/// incarnation) only take what still concerns them.
pub fn apply(state: &mut TierState, ask: &Ask, answer: Answer, (period_ms, threshold): (u64, u64)) {
    let l = &mut state.ledger;
    if !ask.previous && l.current.gen == ask.gen && state.window_start_ms == ask.window_start_ms {
        l.current.sent = l.current.sent.max(ask.used);
        l.unreachable = false;
        // one round in flight: the record was last drained into this one
        l.settled_ms = l.drained_ms;
        l.base = answer.total;
        l.count_full = false;
        learn_grant(state, answer.grant, period_ms, threshold);
        let l = &mut state.ledger;
        // the script granted the ceiling of what it hears of (the plain increments apart)
        let ceiling = answer.ceiling.saturating_add(ask.direct);
        if answer.total < ask.used && l.current.direct > 0 {
            // Redis lost the key (a restart): the plain increments go again, through the
            // script (it adds only what it has not counted for this record)
            l.current.direct = 0;
            l.asking = true;
        }
        l.resplit = ask.rest > 0 && ceiling < l.ceiling;
        l.ceiling = ceiling;
        l.lease_from = ask.used;
        l.adopt = 0;
        l.granted_waiting = !ask.log && ask.need > 0 && ceiling > ask.used;
        l.split = ask.rest > 0;
        l.rehold = false;
        learn_fullness(l, ask, &answer, ceiling, threshold);
        // requests held since the ask was drained (counted for the next one) are admitted out
        // of what it granted past this instance's count and the requests it asked for: the
        // next ask counts only those that will still wait
        let past = ceiling.saturating_sub(l.current.used.max(ask.used).saturating_add(ask.need));
        l.need_milli = l.need_milli.saturating_sub(past.saturating_mul(1000));
        l.fair = answer.fair.max(1);
        l.room = answer.room;
        l.others = (answer.total + answer.held).saturating_sub(ask.used);
        // Redis bounds what was reported or leased; its leases given back no longer count
        // (this instance's own count of that window, where its previous record is of it: an
        // instance idle for a window has an older one)
        // (a log's answer is what of it is still in the span: this instance's count of that
        // window is in it, instant by instant)
        l.prev_bound = if l.previous_start_ms + period_ms == state.window_start_ms && !ask.log {
            answer.prev.max(l.previous.used)
        } else {
            answer.prev
        };
        state.current = answer.total + (l.current.used - l.current.sent.min(l.current.used));
    } else if l.previous.gen == ask.gen && l.previous_start_ms == ask.window_start_ms {
        l.previous.sent = l.previous.sent.max(ask.used);
        // an answer to an ask of the window that has ended since it was sent may lease what
        // can no longer be used: it goes back at the next round (a sliding window's next
        // window counts it as used until then; a bucket's tokens would be lost)
        l.prev_held = answer.ceiling > l.previous.used;
        if l.previous_start_ms + period_ms == state.window_start_ms {
            // the fleet's count of the previous window, for the sliding window's weight
            // (less what was granted to it)
            state.previous = answer.total.saturating_sub(answer.grant)
                + (l.previous.used - l.previous.sent.min(l.previous.used));
        }
    }
}

/// What an answer says of how full the window is: `filled`, `capped`, `short` and `waits`
/// (see `Ledger`), given the ceiling it granted.
fn learn_fullness(l: &mut Ledger, ask: &Ask, answer: &Answer, ceiling: u64, threshold: u64) {
    let cap = threshold.saturating_add(l.grant);
    let under = answer.total.saturating_mul(10) < cap.saturating_mul(9);
    l.filled = answer.total >= cap;
    // (the whole cap counted or leased, and at least 0.9 x of it counted, or this
    // record's lease reaching it: see `Ledger::capped`)
    let reaches = answer
        .total
        .saturating_add(ceiling.saturating_sub(ask.used))
        >= cap;
    l.capped = answer.room == 0 && (!under || reaches);
    let short = if ceiling >= ask.used + ask.need {
        0
    } else if answer.held > 0 && under {
        // the answer could not grant what waited, but the fleet has admitted under 0.9 x
        // threshold and others hold the rest unused (leases they will use or give back,
        // or one a lost reply granted, which its holder's next round frees): not full
        // yet, so the requests wait on (within their hold limit) and ask again
        1
    } else {
        l.short.saturating_add(1)
    };
    let past_half = answer.total.saturating_mul(2) >= cap;
    l.waits = if short == 1 && l.split && past_half {
        l.waits.saturating_add(1)
    } else {
        0
    };
    l.short = short;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{algorithm, clock::NANOS_PER_MS};

    fn tier(threshold: u64) -> Quota {
        Quota {
            period_ms: 10_000,
            threshold,
            ..Quota::default()
        }
    }

    /// A record that leases (see `direct_records_...` for one that does not).
    fn state() -> TierState {
        let mut s = TierState {
            window_start_ms: 10_000,
            ..TierState::default()
        };
        s.ledger.current.gen = next_gen();
        s.ledger.current.leased = true;
        s
    }

    #[test]
    fn direct_records_admit_far_from_the_limit_and_report_plain_increments() {
        let t = tier(100_000);
        let fixed = Algorithm::FixedWindow;
        assert_eq!(direct_allowance(100_000), 100);
        assert_eq!(direct_cap(100_000, fixed, 3), 25_000 + 10 * 100);
        assert_eq!(
            direct_cap(999, fixed, 3),
            0,
            "small thresholds always lease"
        );
        assert_eq!(direct_cap(100_000, Algorithm::TokenBucket, 3), 0);
        let mut s = state();
        s.ledger.current.leased = false;
        let n = Some(3);
        for i in 1..100 {
            assert_eq!(ceiling(&s, &t, fixed, 0, n, None, 1), Ceiling::Open);
            let d = direct(&s, &t, fixed, 0, 3, 1);
            assert_eq!(d, Some(100));
            // half of the allowance unreported: a round is wanted
            assert_eq!(
                commit(&mut s, Admitted::Direct(100), 1),
                i >= 50,
                "request {i}"
            );
            s.current += 1;
        }
        assert_eq!(room(&s, &t, fixed, n, None), None, "no total known yet");
        let sizing = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: u64::MAX,
            first_ahead: 0,
            first_part: 0,
            now_ms: 1000,
            since_ms: 1000,
            horizon_ms: 1200,
            left_ms: 5000,
            periodic: false,
            bucket: false,
        };
        let [None, Some(ask)] = drain(&mut s, sizing) else {
            panic!("a report")
        };
        assert!(ask.count && !ask.first, "nothing reported before");
        assert_eq!((ask.used, ask.confirmed), (99, 0));
        // a request whose units do not fit the allowance whole is not direct: the
        // script keeps one allowance for each instance still direct, no more
        // (docs/fleet.md, "Far from the limit")
        assert_eq!(direct(&s, &t, fixed, 0, 3, 1), Some(100));
        assert_eq!(direct(&s, &t, fixed, 0, 3, 2), None);
        assert_eq!(direct_each(100_000, fixed), 100);
        assert_eq!(direct_each(100_000, Algorithm::SlidingLog), 0);
        // the fleet had 5000; this record admitted 2 more meanwhile
        s.ledger.current.used += 2;
        s.current += 2;
        apply_count(&mut s, &ask, 5000, 10_000);
        let l = &s.ledger;
        assert_eq!(
            (l.current.sent, l.current.direct, l.keyed, l.base),
            (99, 99, true, 5000)
        );
        assert_eq!(s.current, 5002);
        assert_eq!(room(&s, &t, fixed, n, None), Some(94_998));
        // near the zone's edge (what all instances may hold unreported counted): it leases
        s.current = 25_000 - 10 * 100 - 1;
        assert!(direct(&s, &t, fixed, 0, 3, 1).is_some());
        s.current += 1;
        assert_eq!(direct(&s, &t, fixed, 0, 3, 1), None);
        assert_eq!(ceiling(&s, &t, fixed, 0, n, None, 1), Ceiling::LeaseUsed);
        note_hold(&mut s, true, 1);
        assert!(s.ledger.current.leased);
        let [None, Some(ask)] = drain(&mut s, sizing) else {
            panic!("an ask")
        };
        assert!(!ask.count, "a lease ask, the plain increments apart");
        assert_eq!((ask.used, ask.direct, ask.need), (101, 99, 1));
        let answer = Answer {
            total: 24_000,
            ceiling: 40,
            fair: 100,
            room: 1000,
            held: 0,
            prev: 0,
            grant: 0,
            steps: Default::default(),
        };
        apply(&mut s, &ask, answer, (10_000, 1000));
        assert_eq!(
            s.ledger.ceiling, 139,
            "granted in the script's terms, and the 99"
        );
        assert_eq!(s.ledger.short, 0);
        // Redis lost the key (a restart): what it had confirmed goes again
        let periodic = Sizing {
            periodic: true,
            ..sizing
        };
        let mut r = state();
        r.ledger.current.leased = false;
        r.ledger.current.used = 30;
        r.ledger.current.sent = 20;
        r.ledger.current.direct = 20;
        r.ledger.keyed = true;
        let [None, Some(ask)] = drain(&mut r, periodic) else {
            panic!("a report")
        };
        assert!(!ask.first);
        apply_count(&mut r, &ask, 10, 10_000);
        assert_eq!((r.ledger.current.sent, r.ledger.unsent()), (10, 20));
        // a timed-out report is taken as counted: never twice
        let [None, Some(ask)] = drain(&mut r, periodic) else {
            panic!("a report")
        };
        assume_counted(&mut r, &ask);
        assert_eq!(r.ledger.unsent(), 0);
    }

    #[test]
    fn after_an_outage_leased_records_report_their_whole_counts_again() {
        let sizing = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: 10,
            first_ahead: 0,
            first_part: 0,
            now_ms: 12_000,
            since_ms: 1000,
            horizon_ms: 1200,
            left_ms: 5000,
            periodic: false,
            bucket: false,
        };
        // a window the fleet filled: confirmed, quiet, nothing to say
        let mut s = state();
        s.ledger.current.used = 7;
        s.ledger.current.sent = 7;
        s.ledger.previous = crate::record::Record {
            gen: next_gen(),
            used: 4,
            sent: 4,
            direct: 0,
            leased: true,
        };
        s.ledger.previous_start_ms = 0;
        assert_eq!(drain(&mut s, sizing), [None, None]);
        s.ledger.settled_ms = 11_000;
        // answered before the failure's span: nothing to send again
        resync(&mut s, 11_001);
        assert_eq!(drain(&mut s, sizing), [None, None]);
        resync(&mut s, 11_000);
        let [Some(prev), Some(cur)] = drain(&mut s, sizing) else {
            panic!("both records report again")
        };
        assert_eq!((prev.used, prev.previous, prev.count), (4, true, false));
        assert_eq!((cur.used, cur.confirmed, cur.count), (7, 7, false));
        // once: the current record's ask is drained, the previous one's answered
        let answer = Answer {
            total: 9,
            ceiling: 4,
            fair: 1,
            room: 0,
            held: 0,
            prev: 0,
            grant: 0,
            steps: [(0, 0); LOG_STEPS],
        };
        apply(&mut s, &prev, answer, (10_000, 10));
        assert_eq!(drain(&mut s, sizing), [None, None]);
        // plain increments are not idempotent: a direct record sends nothing again, nor does
        // a record Redis never confirmed anything of (its report goes with its next round)
        let mut d = state();
        d.ledger.current.leased = false;
        d.ledger.current.used = 3;
        d.ledger.current.sent = 3;
        let mut fresh = state();
        fresh.ledger.current.used = 2;
        for s in [&mut d, &mut fresh] {
            s.ledger.settled_ms = 11_000;
            resync(s, 0);
            assert!(!s.ledger.asking && !s.ledger.prev_held);
        }
    }

    #[test]
    fn a_record_admits_its_lease_alone_and_holds_the_rest_at_any_threshold() {
        for threshold in [10, 499, 500, 1000, 100_000] {
            let t = tier(threshold);
            let mut s = state();
            s.ledger.current.leased = true;
            // no answer yet: no credit, the first request waits for the round
            assert_eq!(
                ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(10), None, 1),
                Ceiling::LeaseUsed
            );
            // leased 2 with room to spare: 2, then the third waits again
            s.ledger.ceiling = 2;
            s.ledger.fair = 49;
            s.ledger.room = threshold;
            for _ in 0..2 {
                assert_eq!(
                    ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(10), None, 1),
                    Ceiling::Open
                );
                commit(&mut s, Admitted::Leased, 1);
                s.current += 1;
            }
            assert_eq!(
                ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(10), None, 1),
                Ceiling::LeaseUsed,
                "{threshold}"
            );
        }
    }

    /// A lease ask of the current record of `s`.
    fn lease_ask(s: &TierState, used: u64, want: u64, need: u64) -> Ask {
        Ask {
            window_start_ms: s.window_start_ms,
            gen: s.ledger.current.gen,
            used,
            want,
            need,
            confirmed: 0,
            since_ms: 0,
            previous: false,
            adopt: 0,
            direct: 0,
            rest: 0,
            count: false,
            first: false,
            log: false,
        }
    }

    /// An answer that leaves nobody any room: the fleet's `total`, this record's `ceiling`,
    /// and what the others hold unused.
    fn no_room(total: u64, ceiling: u64, held: u64) -> Answer {
        Answer {
            total,
            ceiling,
            fair: 1,
            room: 0,
            held,
            prev: 0,
            grant: 0,
            steps: Default::default(),
        }
    }

    #[test]
    fn answers_without_room_refuse_only_once_the_fleet_is_near_full() {
        let t = tier(100);
        let mut s = state();
        let ask = lease_ask(&s, 0, 1, 1);
        // the fleet at 50 of 100, the others holding the rest: not full, ask again
        let short = |total, held| no_room(total, 0, held);
        for _ in 0..5 {
            apply(&mut s, &ask, short(50, 50), (10_000, 100));
            assert_eq!(s.ledger.short, 1);
            assert_eq!(
                ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(3), None, 1),
                Ceiling::LeaseUsed
            );
        }
        // at 90, two such answers: full
        apply(&mut s, &ask, short(90, 10), (10_000, 100));
        assert_eq!(s.ledger.short, 2);
        assert_eq!(
            ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(3), None, 1),
            Ceiling::FleetFull
        );
        // nobody holding anything at 50: that answer is the fleet's truth (full as far as
        // Redis knows: say a sliding window's weighted count), counted towards a refusal
        let mut s = state();
        let ask = lease_ask(&s, 0, 1, 1);
        apply(&mut s, &ask, short(50, 0), (10_000, 100));
        apply(&mut s, &ask, short(50, 0), (10_000, 100));
        assert_eq!(s.ledger.short, 2);
    }

    /// A sliding window's cap of this moment, full within the lease only with what the others
    /// hold unused (a lease another instance took for a spike): while the fleet has admitted
    /// under 0.9 x that cap, the request waits for the rounds that may give it back rather
    /// than be refused until time frees it (the simulation's parts seed 1785: 326 refusals
    /// under 0.9 x threshold); past it, or after two answers that could not grant, refused.
    #[test]
    fn a_sliding_window_full_only_with_the_others_unused_leases_waits_for_them() {
        let t = tier(1000);
        let sliding = Algorithm::SlidingWindow;
        let mut s = state();
        // the last answer: the fleet counted 500, this instance's 100 of them; the others
        // hold 300 unused (others: 400 admitted and 300 held); its lease reaches 300
        s.ledger.base = 500;
        s.ledger.lease_from = 100;
        s.ledger.others = 700;
        s.ledger.ceiling = 300;
        s.ledger.current.used = 250;
        s.ledger.fair = 10;
        let at = |s: &TierState| ceiling(s, &t, sliding, 19_999, Some(3), None, 1);
        // the cap of this moment: 1000; 250 + 700 + 1 fits
        assert_eq!(at(&s), Ceiling::Open);
        // 300 + 700 + 1 is past it, within the lease; the fleet has admitted 400 + 300
        s.ledger.ceiling = 400;
        s.ledger.current.used = 300;
        assert_eq!(at(&s), Ceiling::LeaseUsed, "waits for the others' leases");
        // with the others' leases used (nothing held), the moment is full
        s.ledger.base = 800;
        assert_eq!(at(&s), Ceiling::FleetFull);
        // held, but the fleet past 0.9 x the cap: full too
        s.ledger.base = 500;
        s.ledger.others = 950;
        s.ledger.current.used = 100 + 400;
        s.ledger.ceiling = 600;
        assert_eq!(at(&s), Ceiling::FleetFull, "900 admitted");
        // and after two answers that could not grant what waited
        s.ledger.others = 700;
        s.ledger.current.used = 300;
        s.ledger.short = 2;
        assert_eq!(at(&s), Ceiling::FleetFull);
    }

    /// A request held as long as it may, with no answer yet in its window: a fixed window
    /// takes its part of the threshold, a sliding window its part of what the previous
    /// window leaves; a sliding log, whose answers alone know what of the previous window is
    /// still in the span (and the others may have leased all the rest meanwhile), refuses.
    #[test]
    fn after_a_hold_without_an_answer_a_window_takes_only_its_part_of_what_is_left() {
        let t = tier(1000);
        let mut s = state();
        s.ledger.current.used = 99;
        s.current = 99;
        s.ledger.prev_bound = 800;
        let fits =
            |s: &TierState, algorithm, now_ms| fits_after_hold(s, &t, algorithm, (now_ms, 5), 1);
        // a fixed window: 1000 / 5
        assert!(fits(&s, Algorithm::FixedWindow, 10_000));
        // a sliding window at its start: the previous window weighs 800, 200 / 5 = 40
        assert!(!fits(&s, Algorithm::SlidingWindow, 10_000));
        s.ledger.current.used = 39;
        s.current = 39;
        assert!(fits(&s, Algorithm::SlidingWindow, 10_000));
        s.ledger.current.used = 40;
        s.current = 40;
        assert!(!fits(&s, Algorithm::SlidingWindow, 10_000));
        // half way through it weighs 400: 600 / 5 = 120
        assert!(fits(&s, Algorithm::SlidingWindow, 15_000));
        assert!(!fits(&s, Algorithm::SlidingLog, 15_000));
        s.ledger.current.used = 0;
        s.current = 0;
        assert!(!fits(&s, Algorithm::SlidingLog, 15_000));
        assert!(!fits(&s, Algorithm::TokenBucket, 15_000));
    }

    #[test]
    fn admits_up_to_the_lease_and_asks_at_half_of_it() {
        let t = tier(1000);
        let mut s = state();
        s.ledger.current.leased = true;
        // no answer yet: the first request waits for the round
        assert_eq!(
            ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(3), None, 1),
            Ceiling::LeaseUsed
        );
        let ask = lease_ask(&s, 0, 30, 1);
        let answer = Answer {
            total: 0,
            ceiling: 30,
            fair: 1000,
            room: 970,
            held: 0,
            prev: 0,
            grant: 0,
            steps: Default::default(),
        };
        apply(&mut s, &ask, answer, (10_000, 1000));
        for _ in 0..14 {
            assert_eq!(
                ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(3), None, 1),
                Ceiling::Open
            );
            assert!(!commit(&mut s, Admitted::Leased, 1));
        }
        assert!(
            commit(&mut s, Admitted::Leased, 1),
            "half of the lease used"
        );
        while s.ledger.current.used < 30 {
            commit(&mut s, Admitted::Leased, 1);
        }
        assert_eq!(
            ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(3), None, 1),
            Ceiling::LeaseUsed,
            "the window had room, but nothing past the lease"
        );
        assert_eq!(
            ceiling(&s, &t, Algorithm::FixedWindow, 0, None, None, 1),
            Ceiling::Open,
            "alone"
        );
    }

    #[test]
    fn a_forecast_wants_no_more_than_the_spare_budget() {
        // a burst's rate would forecast thousands; Redis grants a forecast only out of the
        // spare budget, so the ask keeps no more than that past what waits
        let mut s = state();
        s.ledger.current.used = 2000;
        s.ledger.current.sent = 1990; // a periodic round reports it
        s.ledger.ceiling = 2500; // leased for 500 requests that went elsewhere
        s.ledger.fair = 100;
        s.ledger.demand = 2000;
        s.ledger.drained_ms = 900;
        let periodic = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: spare(3000, Algorithm::FixedWindow),
            first_ahead: 0,
            first_part: 0,
            now_ms: 1000,
            since_ms: 100,
            horizon_ms: 250,
            left_ms: 5000,
            periodic: true,
            bucket: false,
        };
        assert_eq!(spare(3000, Algorithm::FixedWindow), 120);
        assert_eq!(spare(100, Algorithm::FixedWindow), 10);
        assert_eq!(spare(100, Algorithm::SlidingWindow), 4);
        let [_, Some(ask)] = drain(&mut s, periodic) else {
            panic!("an ask")
        };
        assert_eq!((ask.used, ask.need, ask.want), (2000, 0, 2120));
        assert_eq!(s.ledger.ceiling, 2120, "the rest goes back with this round");
    }

    #[test]
    fn a_lease_granted_to_a_window_that_ended_on_the_way_goes_back() {
        let t = tier(100);
        let mut s = state();
        s.ledger.current.used = 40;
        s.ledger.ceiling = 40;
        s.ledger.need_milli = 20_000;
        let sizing = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: spare(100, Algorithm::FixedWindow),
            first_ahead: 0,
            first_part: 0,
            now_ms: 19_990,
            since_ms: 100,
            horizon_ms: 250,
            left_ms: 10,
            periodic: false,
            bucket: false,
        };
        let [None, Some(ask)] = drain(&mut s, sizing) else {
            panic!("an ask")
        };
        // the window ends before the answer: the record rolls, its lease used up
        assert_eq!(
            algorithm::roll(&mut s, &t, Algorithm::FixedWindow, 20_000 * NANOS_PER_MS),
            None
        );
        assert!(!s.ledger.prev_held);
        let granted = Answer {
            total: 40,
            ceiling: 64,
            fair: 4,
            room: 36,
            held: 0,
            prev: 0,
            grant: 0,
            steps: Default::default(),
        };
        apply(&mut s, &ask, granted, (10_000, 1000));
        assert!(
            s.ledger.prev_held,
            "24 leased to a window nobody can admit in"
        );
        let [Some(back), None] = drain(
            &mut s,
            Sizing {
                now_ms: 20_050,
                ..sizing
            },
        ) else {
            panic!("the previous record gives its lease back")
        };
        assert!(back.previous);
        assert_eq!((back.used, back.want), (40, 40));
    }

    /// Issue 43's hidden waits (fleet_sim seed 1512: a spike of 529 held 1.2 s, then refused
    /// under 0.9 x threshold): the answer granted what the held requests asked for, and the
    /// next round began before they were decided again; its drain, seeing no demand, gave the
    /// lease back. It is kept for them (and asked for whole, so that Redis keeps it too).
    #[test]
    fn a_lease_granted_to_waiting_requests_outlives_the_next_drain() {
        let t = tier(3000);
        let mut s = state();
        s.ledger.current.used = 5;
        s.ledger.current.sent = 5;
        s.ledger.ceiling = 5;
        for _ in 0..524 {
            note_hold(&mut s, true, 1);
        }
        let sizing = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: spare(3000, Algorithm::FixedWindow),
            first_ahead: 0,
            first_part: 0,
            now_ms: 10_100,
            since_ms: 100,
            horizon_ms: 250,
            left_ms: 5000,
            periodic: false,
            bucket: false,
        };
        let [None, Some(ask)] = drain(&mut s, sizing) else {
            panic!("an ask")
        };
        assert_eq!(ask.need, 524);
        let granted = Answer {
            total: 1063,
            ceiling: 529,
            fair: 90,
            room: 955,
            held: 105,
            prev: 0,
            grant: 0,
            steps: Default::default(),
        };
        apply(&mut s, &ask, granted, (10_000, 3000));
        // the next round drains before the held requests are decided again
        let [None, Some(next)] = drain(
            &mut s,
            Sizing {
                now_ms: 10_150,
                periodic: true,
                ..sizing
            },
        ) else {
            panic!("an ask")
        };
        assert_eq!(s.ledger.ceiling, 529, "the lease stays theirs");
        assert!(next.want >= 529, "and Redis keeps it: {next:?}");
        for _ in 0..524 {
            assert_eq!(
                ceiling(&s, &t, Algorithm::FixedWindow, 10_150, Some(3), None, 1),
                Ceiling::Open
            );
            commit(&mut s, Admitted::Leased, 1);
        }
        // a drain after that lowers an unused lease again
        s.ledger.ceiling = 600;
        let _ = drain(
            &mut s,
            Sizing {
                now_ms: 10_200,
                periodic: true,
                ..sizing
            },
        );
        assert!(s.ledger.ceiling < 600, "{}", s.ledger.ceiling);
    }

    /// Requests held at a window's end asked for leases of that window: in the new one they
    /// ask again when held again (fleet_sim seed 943: a token bucket's held requests never
    /// asked after the roll, waited their hold out and took a share of room others had
    /// been leased). What was held since the last drain is carried over too.
    #[test]
    fn requests_held_across_a_window_end_ask_again_in_the_new_window() {
        let t = tier(100);
        let mut s = state();
        s.ledger.current.used = 40;
        s.ledger.ceiling = 40;
        note_hold(&mut s, true, 1);
        note_hold(&mut s, true, 1);
        assert_eq!(s.ledger.need(), 2);
        // held once more after a round that granted nothing: asked for already, not again
        s.ledger.need_milli = 0;
        note_hold(&mut s, false, 1);
        assert_eq!(s.ledger.need(), 0);
        s.ledger.need_milli = 3000;
        assert_eq!(
            algorithm::roll(&mut s, &t, Algorithm::FixedWindow, 20_000 * NANOS_PER_MS),
            None
        );
        assert_eq!(
            s.ledger.need(),
            3,
            "what was not asked for yet is asked in the new window"
        );
        assert!(s.ledger.asking);
        note_hold(&mut s, false, 1);
        assert_eq!(
            s.ledger.need(),
            4,
            "held again in the new window: asks again"
        );
        // (a sliding log's span still holds the old window: its requests wait on as before)
        let mut log = state();
        assert_eq!(
            algorithm::roll(&mut log, &t, Algorithm::SlidingLog, 20_000 * NANOS_PER_MS),
            None
        );
        assert!(!log.ledger.rehold);
    }

    #[test]
    fn drain_asks_for_what_waits_and_the_demand_and_only_what_has_something_to_say() {
        let mut s = state();
        s.ledger.current.used = 100;
        s.ledger.current.sent = 90;
        s.ledger.ceiling = 500;
        s.ledger.fair = 100; // not the first ask of the window
        s.ledger.demand = 10; // 10 in the last 100 ms: 0.1/ms x 250 ms x 1.5 = 37
        s.ledger.drained_ms = 900;
        let early = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: u64::MAX,
            first_ahead: 0,
            first_part: 0,
            now_ms: 1000,
            since_ms: 100,
            horizon_ms: 250,
            left_ms: 5000,
            periodic: false,
            bucket: false,
        };
        assert_eq!(
            drain(&mut s, early),
            [None, None],
            "an early round: nothing asks here"
        );
        let periodic = Sizing {
            periodic: true,
            ..early
        };
        let [prev, cur] = drain(&mut s, periodic);
        let cur = cur.expect("unsent counts are reported");
        assert_eq!(prev, None);
        assert_eq!((cur.used, cur.want, cur.need), (100, 137, 0));
        assert_eq!(s.ledger.ceiling, 137, "lowered before Redis hears of it");
        assert_eq!((s.ledger.demand, s.ledger.drained_ms), (0, 1000));
        // held requests ask in any round, first
        note_hold(&mut s, true, 1);
        note_hold(&mut s, true, 1);
        let later = Sizing {
            spare: u64::MAX,
            now_ms: 1100,
            ..early
        };
        let [_, Some(held)] = drain(&mut s, later) else {
            panic!("an ask")
        };
        assert_eq!((held.used, held.need, held.want), (100, 2, 102));
        // a lease nobody used since the last round (a sliding window's, or a fixed window's
        // with no request since the last periodic round) goes back at a periodic round, even
        // when nobody else held one at the last answer: one that asks later is not heard by
        // the holder, and would wait for the window's end (docs/fleet.md)
        s.ledger.current.sent = 100;
        s.ledger.ceiling = 130;
        let quiet = Sizing {
            spare: u64::MAX,
            now_ms: 1200,
            ..periodic
        };
        let mut b = s;
        let [_, Some(back)] = drain(&mut s, quiet) else {
            panic!("an unused lease goes back")
        };
        assert_eq!((back.used, back.want), (100, 100));
        assert_eq!(s.ledger.ceiling, 100);
        // a bucket's tokens go back all the same
        let bucket = Sizing {
            bucket: true,
            ..quiet
        };
        let [_, Some(back)] = drain(&mut b, bucket) else {
            panic!("a bucket gives its unused tokens back")
        };
        assert_eq!((back.used, back.want, b.ledger.ceiling), (100, 100, 100));
        // idle, sent and nothing held: nothing to send
        assert_eq!(drain(&mut s, quiet), [None, None]);
    }

    /// docs/fleet.md "A round": a fixed window's lease used since the last periodic round stays
    /// through a quiet moment right after an early round (giving it back there made the record
    /// ask again within the next request or two, a round each time); one unused since the last
    /// periodic round goes back. A sliding window's goes back at the quiet moment.
    #[test]
    fn a_fixed_windows_lease_in_use_stays_through_a_quiet_moment() {
        let sizing = |now_ms, periodic| Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: u64::MAX,
            first_ahead: 0,
            first_part: 0,
            now_ms,
            since_ms: 100,
            horizon_ms: 1200,
            left_ms: 5000,
            periodic,
            bucket: false,
        };
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let mut s = state();
            s.ledger.fair = 10; // not the window's first ask
            s.ledger.current.used = 10;
            s.ledger.current.sent = 10;
            s.ledger.ceiling = 20;
            s.ledger.drained_ms = 900;
            // used since the last periodic round, then an early round
            note_demand(&mut s, 1, algorithm);
            s.ledger.current.used = 11;
            s.ledger.asking = true;
            let [_, Some(early)] = drain(&mut s, sizing(1000, false)) else {
                panic!("the early round asks")
            };
            assert_eq!(early.used, 11);
            // (answered), then the periodic round right after: no request since the early one
            s.ledger.current.sent = 11;
            let periodic = drain(&mut s, sizing(1010, true));
            if algorithm == Algorithm::FixedWindow {
                assert_eq!(periodic, [None, None], "the lease in use stays");
                assert!(s.ledger.ceiling > 11);
                // a whole interval unused: it goes back at the next periodic round
                let [_, Some(back)] = drain(&mut s, sizing(2010, true)) else {
                    panic!("the unused lease goes back")
                };
                assert_eq!((back.used, back.want, s.ledger.ceiling), (11, 11, 11));
                // but not while others wait on the window (`Sizing::waited_on`): what it does
                // not need goes at once
                let mut w = state();
                w.ledger.fair = 10;
                w.ledger.current.used = 11;
                w.ledger.current.sent = 11;
                w.ledger.ceiling = 20;
                w.ledger.busy = true;
                let told = Sizing {
                    waited_on: true,
                    ..sizing(1010, true)
                };
                let [_, Some(back)] = drain(&mut w, told) else {
                    panic!("a lease waited on calls")
                };
                assert_eq!((back.want, w.ledger.ceiling), (11, 11));
            } else {
                let [_, Some(back)] = periodic else {
                    panic!("a sliding window's lease goes back at the quiet moment")
                };
                assert_eq!((back.used, back.want), (11, 11));
            }
        }
    }

    /// An early round's sizing of a tier that takes parts, others waiting on it or not.
    fn early_sizing(now_ms: u64, waited_on: bool) -> Sizing {
        Sizing {
            periodic: false,
            waited_on,
            ..periodic_sizing(now_ms, true)
        }
    }

    /// A periodic round's sizing, 5 s before the window's end, sync every second.
    fn periodic_sizing(now_ms: u64, parts: bool) -> Sizing {
        Sizing {
            parts,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: 20,
            first_ahead: 0,
            first_part: 0,
            now_ms,
            since_ms: 1000,
            horizon_ms: 1200,
            left_ms: 5000,
            periodic: true,
            bucket: false,
        }
    }

    #[test]
    fn a_fixed_windows_ask_carries_its_steady_demand_until_the_windows_end() {
        let sizing = periodic_sizing;
        let mut s = state();
        s.ledger.drained_ms = 1000;
        let interval = |s: &mut TierState, demand: u64, now_ms: u64, fixed: bool| {
            note_demand(s, demand, Algorithm::FixedWindow);
            s.ledger.asking = true;
            let [_, ask] = drain(s, sizing(now_ms, fixed));
            ask.map_or(0, |a| a.rest)
        };
        // one interval of demand is taken as its rate where more than two intervals are left
        // (a window's first asks take their part at once), and two are steady: 13 an
        // interval, 5 intervals left
        assert_eq!(interval(&mut s, 13, 2000, true), 65);
        assert_eq!(interval(&mut s, 13, 3000, true), 65);
        // a spike counts as the lesser interval around it, and an interval without demand ends
        // it
        assert_eq!(interval(&mut s, 500, 4000, true), 65);
        assert_eq!(interval(&mut s, 0, 5000, true), 0);
        // not a tier that takes parts: never
        interval(&mut s, 13, 6000, false);
        assert_eq!(interval(&mut s, 13, 7000, false), 0);
        // with two intervals left, one interval's demand too
        let mut short = state();
        short.ledger.drained_ms = 1000;
        note_demand(&mut short, 13, Algorithm::FixedWindow);
        short.ledger.asking = true;
        let two_left = Sizing {
            left_ms: 2000,
            ..sizing(2000, true)
        };
        let [_, ask] = drain(&mut short, two_left);
        assert_eq!(ask.map(|a| a.rest), Some(26));
        // within the first interval (no periodic round has told one yet), the demand since the
        // last periodic round at its rate, once a quarter of the interval has passed: 4 in
        // 250 ms, 16 an interval, 5 intervals left
        let first = |into_interval_ms| {
            let mut f = state();
            f.ledger.drained_ms = 1000;
            note_demand(&mut f, 4, Algorithm::FixedWindow);
            f.ledger.asking = true;
            let early = Sizing {
                periodic: false,
                into_interval_ms,
                ..sizing(1250, true)
            };
            drain(&mut f, early)[1].map(|a| a.rest)
        };
        assert_eq!(first(250), Some(80));
        // sooner, a few requests may be a burst: not yet
        assert_eq!(first(200), Some(0));
        // and it looks no further than `REST_INTERVALS` intervals (a day's window)
        let day = Sizing {
            left_ms: 86_400_000,
            ..sizing(8000, true)
        };
        note_demand(&mut s, 13, Algorithm::FixedWindow);
        s.ledger.asking = true;
        let [_, ask] = drain(&mut s, day);
        assert_eq!(ask.map(|a| a.rest), Some(13 * REST_INTERVALS));
    }

    #[test]
    fn only_small_fixed_windows_take_parts_of_a_filling_window() {
        assert!(parts(499, Algorithm::FixedWindow));
        assert!(!parts(SMALL_FIXED_UNDER, Algorithm::FixedWindow));
        for a in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
            Algorithm::SlidingLog,
        ] {
            assert!(!parts(200, a), "{a:?}");
        }
    }

    #[test]
    fn a_lease_asks_again_at_half_and_a_part_when_used_up() {
        for (split, room, asks) in [(true, 0, false), (true, 33, false), (false, 0, true)] {
            let mut s = state();
            s.ledger.fair = 7;
            s.ledger.ceiling = 66;
            s.ledger.split = split;
            s.ledger.room = room;
            let asked = (0..33).fold(false, |_, _| commit(&mut s, Admitted::Leased, 1));
            assert_eq!(asked, asks, "split {split}, room {room}");
            // past its ceiling, every lease asks
            let past = (0..34).fold(false, |_, _| commit(&mut s, Admitted::Leased, 1));
            assert!(past, "split {split}, room {room}: used up");
        }
    }

    /// A record's first ask (a request waits), then its ask a second later with its first
    /// lease, 7, used and one more request waiting; an early round, the fleet 3 instances.
    fn first_then_drained(parts: bool, first_ahead: u64, first_part: u64) -> (Ask, Ask) {
        let sizing = Sizing {
            periodic: false,
            first_ahead,
            first_part,
            ..periodic_sizing(10_050, parts)
        };
        let mut s = state();
        let ask = |s: &mut TierState, sizing| {
            note_demand(s, 1, Algorithm::FixedWindow);
            note_hold(s, true, 1);
            match drain(s, sizing) {
                [None, Some(ask)] => ask,
                other => panic!("a waiting request's record asks: {other:?}"),
            }
        };
        let first = ask(&mut s, sizing);
        s.ledger.current.used = 7;
        s.ledger.ceiling = 7;
        let later = ask(
            &mut s,
            Sizing {
                now_ms: 11_050,
                ..sizing
            },
        );
        (first, later)
    }

    #[test]
    fn a_records_first_ask_takes_its_even_part_and_later_asks_its_demand() {
        // spare 20: its even part, 6, ahead of the request
        let (first, later) = first_then_drained(false, 20 / 3, 0);
        assert_eq!(
            (first.used, first.need, first.want),
            (0, 1, 1 + 6),
            "one and its part ahead"
        );
        // drained once: its demand sizes what it asks ahead (one request in a second: 1)
        assert_eq!(
            (later.need, later.want),
            (1, 7 + 1 + 1),
            "its demand, not the first part"
        );
        // without a part to take (`first_ahead` 0), a first ask wants what its demand says
        let (first, _) = first_then_drained(false, 0, 0);
        assert!(first.want < 1 + 6, "{first:?}");
        // a tier that takes parts (threshold 200): its even part of the threshold until the
        // window's end, at once (`first_part`); drained once, its own demand until the end
        let (first, later) = first_then_drained(true, 20 / 3, 200 / 3);
        assert_eq!(
            (first.need, first.rest, first.want),
            (1, 66, 1 + 66),
            "its part at once"
        );
        assert!(later.rest < 66, "its demand, not the first part: {later:?}");
    }

    #[test]
    fn a_part_of_a_filling_window_reports_at_periodic_rounds_only_near_its_end() {
        let sizing = |now_ms| periodic_sizing(now_ms, true);
        let mut s = state();
        s.ledger.fair = 7;
        s.ledger.split = true;
        s.ledger.ceiling = 66;
        s.ledger.drained_ms = 1000;
        // a third of it used, requests still coming: its count waits
        s.ledger.current.used = 22;
        note_demand(&mut s, 22, Algorithm::FixedWindow);
        assert_eq!(drain(&mut s, sizing(2000)), [None, None]);
        // past half, but the 32 left last more than an interval and a half at 12 an
        // interval: its count waits still
        s.ledger.current.used = 34;
        note_demand(&mut s, 12, Algorithm::FixedWindow);
        assert_eq!(drain(&mut s, sizing(3000)), [None, None]);
        // 17 left at 15 an interval: it may be used up before the next round but one, and
        // this one reports it
        s.ledger.current.used = 49;
        note_demand(&mut s, 15, Algorithm::FixedWindow);
        let [_, Some(ask)] = drain(&mut s, sizing(4000)) else {
            panic!("near the end of its part, the record reports")
        };
        assert_eq!(ask.used, 49);
        // a spare-budget lease (not a part) reports at every periodic round, as before
        let mut t = state();
        t.ledger.fair = 7;
        t.ledger.ceiling = 66;
        t.ledger.current.used = 22;
        note_demand(&mut t, 22, Algorithm::FixedWindow);
        assert!(drain(&mut t, sizing(2000))[1].is_some());
    }

    #[test]
    fn a_used_part_waiting_on_the_others_asks_again_less_and_less_often() {
        let early = |now_ms| Sizing {
            periodic: false,
            ..periodic_sizing(now_ms, true)
        };
        // the answer to a part's ask: nothing more, the others hold 20 unused, the fleet at
        // `total` of 200
        let wait = |s: &mut TierState, ask: &Ask, total: u64| {
            apply(s, ask, no_room(total, 66, 20), (10_000, 200));
            assert_eq!(s.ledger.short, 1, "the requests wait on");
            note_hold(s, false, 1);
        };
        let mut s = state();
        s.ledger.steady = 13;
        s.ledger.ceiling = 66;
        s.ledger.current.used = 66;
        note_demand(&mut s, 1, Algorithm::FixedWindow);
        note_hold(&mut s, true, 1);
        // past half of the cap: 100 ms after the first answer that leaves it waiting, then
        // 200 ms (`WAIT_GAPS_MS`), not at every early round
        let mut asks = Vec::new();
        for now_ms in (5000..5700).step_by(50) {
            if let [_, Some(ask)] = drain(&mut s, early(now_ms)) {
                assert!(ask.rest > 0, "a part");
                asks.push(now_ms);
                wait(&mut s, &ask, 150);
            }
        }
        assert_eq!(asks, [5000, 5100, 5300, 5500]);
        // a periodic round carries it whenever it comes
        assert!(drain(&mut s, periodic_sizing(5650, true))[1].is_some());
        // under half of the cap (a refusal there would be one under 0.9 x threshold: what
        // the others hold may come back at any round), it asks at every early round
        let mut t = state();
        t.ledger.steady = 13;
        t.ledger.ceiling = 66;
        t.ledger.current.used = 66;
        note_hold(&mut t, true, 1);
        for now_ms in (5000..5300).step_by(50) {
            let [_, Some(ask)] = drain(&mut t, early(now_ms)) else {
                panic!("under half of the cap, the record asks at {now_ms}")
            };
            wait(&mut t, &ask, 90);
        }
    }

    #[test]
    fn a_part_waited_on_calls_at_once_even_with_nothing_to_report() {
        // a part of 66, 20 used and reported; its call re-splits it to 40 (the others' demand
        // grew): Redis keeps the 66 for it until its next call
        let mut s = state();
        s.ledger.steady = 13;
        s.ledger.ceiling = 66;
        s.ledger.current.used = 20;
        s.ledger.asking = true;
        let [_, Some(ask)] = drain(&mut s, early_sizing(5000, false)) else {
            panic!("it asks")
        };
        assert!(ask.rest > 0, "a part");
        apply(&mut s, &ask, no_room(100, 40, 30), (10_000, 200));
        assert!(s.ledger.resplit && s.ledger.ceiling == 40);
        assert_eq!(s.ledger.current.sent, 20, "nothing left to report");
        // nobody waits: no call
        assert!(drain(&mut s, early_sizing(5100, false))[1].is_none());
        // others wait on the window: it calls, with nothing to report, so that Redis lets go
        // of the 66 (and re-splits a part it has not cut yet: the call is what re-splits)
        let [_, Some(ask)] = drain(&mut s, early_sizing(5150, true)) else {
            panic!("a part waited on calls")
        };
        apply(&mut s, &ask, no_room(100, 40, 10), (10_000, 200));
        assert!(!s.ledger.resplit, "the part as it is now");
        // a part never cut, all reported (one taken while its instance counted itself alone):
        // waited on, it calls, so that Redis cuts it to its share
        let mut w = state();
        w.ledger.split = true;
        w.ledger.ceiling = 6;
        assert!(drain(&mut w, early_sizing(5000, false))[1].is_none());
        assert!(drain(&mut w, early_sizing(5050, true))[1].is_some());
    }

    #[test]
    fn a_record_that_does_not_ask_early_is_left_as_it_was_by_an_early_round() {
        // records drawn over the fields an early round's drain reads: where `asks_early`
        // says no, the drain asks nothing and changes nothing (the sync passes such a record
        // over); where it says yes, the drain may ask
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut draw = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut passed, mut asked) = (0, 0);
        for _ in 0..20_000 {
            let mut s = state();
            let l = &mut s.ledger;
            l.current.leased = draw(2) == 0;
            l.current.used = draw(100);
            l.current.sent = draw(100).min(l.current.used);
            l.previous.used = draw(3);
            l.previous.sent = draw(3).min(l.previous.used);
            l.prev_held = draw(4) == 0;
            l.asking = draw(3) == 0;
            l.need_milli = [0, 0, 1, 1000][draw(4) as usize];
            l.ceiling = draw(120);
            l.lease_from = draw(50);
            l.demand = draw(20);
            l.busy = draw(2) == 0;
            l.split = draw(2) == 0;
            l.granted_waiting = draw(2) == 0;
            l.short = draw(3) as u8;
            l.waits = draw(3) as u8;
            l.settled_ms = 4900 + draw(200);
            l.drained_ms = 4800 + draw(200);
            l.steady = draw(30) as u32;
            let before = s;
            let asks = drain(&mut s, early_sizing(5000, false));
            if asks_early(&before.ledger) {
                asked += usize::from(asks.iter().any(Option::is_some));
            } else {
                assert_eq!(asks, [None, None], "{before:?}");
                assert_eq!(s, before, "left as it was");
                passed += 1;
            }
        }
        assert!(
            passed > 1000 && asked > 1000,
            "{passed} passed over, {asked} asked"
        );
    }

    /// A part of 66 of a filling window (steady demand 13 an interval), `used` of it admitted.
    fn part_of_66(used: u64) -> TierState {
        let mut s = state();
        s.ledger.steady = 13;
        s.ledger.split = true;
        s.ledger.ceiling = 66;
        s.ledger.current.used = used;
        s
    }

    #[test]
    fn a_part_kept_whole_at_a_call_for_waits_lets_the_next_waits_go_for_a_while() {
        let mut s = part_of_66(50);
        assert!(hears_waits(&s.ledger, 5000), "16 unused: it hears");
        let [_, Some(ask)] = drain(&mut s, early_sizing(5000, true)) else {
            panic!("a part waited on calls")
        };
        // the answer keeps its 66: within its share
        apply(&mut s, &ask, no_room(180, 66, 20), (10_000, 200));
        assert!(!s.ledger.resplit);
        assert!(
            !hears_waits(&s.ledger, 5100),
            "the waiter's next ask: no call"
        );
        assert!(!hears_waits(&s.ledger, 5000 + HEARD_GAP_MS - 1));
        assert!(hears_waits(&s.ledger, 5000 + HEARD_GAP_MS));
        // a call whose answer re-split it: the next waits are heard at once (Redis keeps the
        // part as it was until its next call)
        let [_, Some(ask)] = drain(&mut s, early_sizing(5600, true)) else {
            panic!("a part waited on calls")
        };
        apply(&mut s, &ask, no_room(180, 58, 20), (10_000, 200));
        assert!(s.ledger.resplit && s.ledger.ceiling == 58);
        assert!(hears_waits(&s.ledger, 5650));
        // used up and not re-split, all of it reported: nothing to give or tell
        s.ledger.resplit = false;
        s.ledger.heard_ms = 0;
        s.ledger.current.used = 58;
        s.ledger.current.sent = 58;
        assert!(!hears_waits(&s.ledger, 9000));
    }

    #[test]
    fn a_used_up_part_with_unreported_counts_reports_them_when_others_wait() {
        let mut s = part_of_66(66);
        s.ledger.current.sent = 50;
        // it called for their waits a moment ago, and kept its part: all the same, its 16
        // unreported units are held for it in Redis's eyes, and the waiters wait on them
        s.ledger.heard_ms = 4900;
        assert!(hears_waits(&s.ledger, 5000), "16 unreported: it hears");
        let [_, Some(ask)] = drain(&mut s, early_sizing(5000, true)) else {
            panic!("a part waited on with unreported counts calls")
        };
        assert_eq!(ask.used, 66, "it reports all it admitted");
        apply(&mut s, &ask, no_room(200, 66, 20), (10_000, 200));
        assert!(
            !hears_waits(&s.ledger, 5100),
            "reported: nothing more to tell"
        );
    }

    #[test]
    fn only_a_quiet_records_first_ask_in_its_window_goes_at_once() {
        // 100 a minute on 4 instances, rounds every second: an even part is 25 a window
        let at_once = |s: &TierState, algorithm: Algorithm| {
            asks_at_once(s, algorithm, (100, 60_000), 4, 1000)
        };
        let mut s = state();
        assert!(
            at_once(&s, Algorithm::FixedWindow),
            "no demand known: quiet"
        );
        assert!(at_once(&s, Algorithm::SlidingWindow));
        assert!(at_once(&s, Algorithm::SlidingLog));
        assert!(
            !at_once(&s, Algorithm::TokenBucket),
            "a bucket's lease outlives windows"
        );
        assert!(!at_once(&s, Algorithm::LeakyBucket));
        // one unit an interval is 60 a window: 60 x 4 instances x 2 is over 100
        s.ledger.steady = 1;
        assert!(
            !at_once(&s, Algorithm::FixedWindow),
            "60 a window is no quiet demand"
        );
        s.ledger.steady = 0;
        s.ledger.last_interval = 40;
        assert!(
            at_once(&s, Algorithm::FixedWindow),
            "one busy interval is not steady"
        );
        s.ledger.fair = 3;
        assert!(
            !at_once(&s, Algorithm::FixedWindow),
            "answered in its window: not a first ask"
        );
        // 10 a second on 10 instances, rounds every second: one unit an interval is busy
        let mut t = state();
        t.ledger.steady = 1;
        assert!(!asks_at_once(
            &t,
            Algorithm::FixedWindow,
            (10, 1000),
            10,
            1000
        ));
        t.ledger.steady = 0;
        assert!(asks_at_once(
            &t,
            Algorithm::FixedWindow,
            (10, 1000),
            10,
            1000
        ));
    }

    #[test]
    fn local_share_lowers_a_sliding_windows_threshold_by_what_its_previous_window_weighs() {
        // 100 a window on 2 instances, Redis down; the fleet had admitted 20 of this window
        // and 60 of the previous one, which weighs half (30) halfway through this one
        let t = tier(100);
        let mut s = state();
        s.ledger.base = 20;
        s.previous = 60;
        s.ledger.prev_bound = 60;
        let at = |s: &TierState, current: u64, algorithm: Algorithm| {
            let s = TierState { current, ..*s };
            ceiling(&s, &t, algorithm, 15_000, None, Some(2), 1)
        };
        // a sliding window: 20 + (100 - 30 - 20) / 2 = 45
        assert_eq!(at(&s, 44, Algorithm::SlidingWindow), Ceiling::Open);
        assert_eq!(at(&s, 45, Algorithm::SlidingWindow), Ceiling::ShareUsed);
        // a fixed window: 20 + (100 - 20) / 2 = 60
        assert_eq!(at(&s, 59, Algorithm::FixedWindow), Ceiling::Open);
        assert_eq!(at(&s, 60, Algorithm::FixedWindow), Ceiling::ShareUsed);
    }

    #[test]
    fn a_part_refused_as_full_in_a_window_counted_full_stops_asking_until_a_grant() {
        let full_part = |total: u64| {
            let mut s = state();
            s.ledger.steady = 13;
            s.ledger.ceiling = 66;
            s.ledger.current.used = 66;
            s.ledger.current.sent = 66;
            note_demand(&mut s, 1, Algorithm::FixedWindow);
            note_hold(&mut s, true, 1);
            let early = Sizing {
                periodic: false,
                ..periodic_sizing(5000, true)
            };
            let [_, Some(ask)] = drain(&mut s, early) else {
                panic!("a part that ran out asks")
            };
            assert!(ask.rest > 0, "a part");
            // two answers that grant nothing: refused as full (`short` 2)
            for _ in 0..2 {
                apply(&mut s, &ask, no_room(total, 66, 0), (10_000, 200));
            }
            assert_eq!(s.ledger.short, 2);
            s.ledger.need_milli = 0;
            s.ledger.last_interval = 13;
            note_demand(&mut s, 13, Algorithm::FixedWindow);
            s
        };
        // at 200 of 200, the periodic round carries nothing; an operator's grant would be
        // heard (`count_full`: the sync service asks for it after the heartbeat's mark)
        let mut s = full_part(200);
        assert_eq!(drain(&mut s, periodic_sizing(6000, true)), [None, None]);
        assert!(s.ledger.count_full);
        // at 199 (another instance holds one unused, which it may give back) it asks at each
        // periodic round, as any record refused as full
        let mut s = full_part(199);
        assert!(drain(&mut s, periodic_sizing(6000, true))[1].is_some());
    }

    #[test]
    fn a_used_lease_that_reached_the_cap_is_refused_as_full_without_asking() {
        let t = tier(200);
        // an answer leasing this record up to `ceiling` (from 50), with nobody left any room
        let capped = |total, held, ceiling| {
            let mut s = state();
            s.ledger.current.used = 50;
            let ask = lease_ask(&s, 50, 100, 0);
            apply(&mut s, &ask, no_room(total, ceiling, held), (10_000, 200));
            s.ledger.current.used = ceiling;
            s.ledger.current.leased = true;
            s
        };
        // 180 of 200 counted (0.9 x), the others holding the rest: once the lease is used,
        // full at once, and no round is asked for it
        let mut s = capped(180, 10, 60);
        assert_eq!(s.ledger.short, 0, "the answer granted what was asked");
        let full = ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(1), None, 1);
        assert_eq!(full, Ceiling::FleetFull);
        assert!(!note_full(&mut s, Algorithm::FixedWindow), "no ask");
        assert_eq!(s.ledger.short, 2);
        // 150 counted (under 0.9 x) and this lease of 50 reaching 200: the same
        let s = capped(150, 0, 100);
        let full = ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(1), None, 1);
        assert_eq!(full, Ceiling::FleetFull);
        // 170 counted (under 0.9 x), the others holding the rest unused: they may give it
        // back, so the requests wait for a round that asks
        let s = capped(170, 20, 60);
        let held = ceiling(&s, &t, Algorithm::FixedWindow, 0, Some(1), None, 1);
        assert_eq!(held, Ceiling::LeaseUsed);
        // a sliding window gets room back with time: not full for this
        let s = capped(180, 10, 60);
        assert_ne!(
            ceiling(&s, &t, Algorithm::SlidingWindow, 0, Some(1), None, 1),
            Ceiling::FleetFull
        );
    }

    #[test]
    fn answers_move_counts_from_unsent_to_the_fleet_total() {
        let mut s = state();
        s.ledger.current.used = 7;
        s.current = 7;
        s.ledger.demand = 1;
        let sizing = Sizing {
            parts: false,
            interval_ms: 1000,
            waited_on: false,
            into_interval_ms: 0,
            spare: u64::MAX,
            first_ahead: 0,
            first_part: 0,
            now_ms: 1000,
            since_ms: 1000,
            horizon_ms: 250,
            left_ms: 5000,
            periodic: true,
            bucket: false,
        };
        let [_, Some(ask)] = drain(&mut s, sizing) else {
            panic!("an ask")
        };
        s.ledger.current.used += 2; // admitted while the round was in flight
        let answer = Answer {
            total: 50,
            ceiling: 20,
            fair: 10,
            room: 0,
            held: 0,
            prev: 0,
            grant: 0,
            steps: Default::default(),
        };
        apply(&mut s, &ask, answer, (10_000, 1000));
        assert_eq!(s.ledger.current.sent, 7);
        assert_eq!(s.current, 52, "the fleet's 50 and the 2 not yet sent");
        assert_eq!(s.ledger.ceiling, 20);
        assert_eq!(s.ledger.unsent(), 2);
    }

    #[test]
    fn a_second_roll_before_an_answer_hands_over_the_oldest_record() {
        let mut s = state();
        s.ledger.current.used = 5;
        assert_eq!(s.ledger.roll(10_000, false, true), None);
        assert_eq!(
            (s.ledger.previous.used, s.ledger.previous_start_ms),
            (5, 10_000)
        );
        s.ledger.current.used = 3;
        let orphan = s
            .ledger
            .roll(20_000, false, true)
            .expect("unsent counts kept");
        assert_eq!((orphan.window_start_ms, orphan.used), (10_000, 5));
        assert_eq!(s.ledger.previous.used, 3);
    }
}
