//! The Rust twin of the ledger scripts (one per algorithm family, `script::Family`, in
//! `src/services/fleet_sync/backend/script.rs`): the same keys and answers on a model of Redis,
//! for the fleet simulation and the ledger's tests. `tests/ledger_script.rs` holds the two to the
//! same answers on a real redis-server. Included by the tests that use it
//! (`#[path = "common/ledger_model.rs"] mod ledger_model;`).
#![allow(dead_code)]

use std::collections::HashMap;
use tollgate::services::fleet_sync::backend::round::{CountUpdate, LedgerUpdate, Reply, Update};
use tollgate::services::fleet_sync::backend::script::bucket_arg;
use tollgate_limits::ledger::Answer;

/// The ledger scripts in Rust, on a model of the keys (`strings`: the counters, `hashes`: the
/// ledgers). Expiry is not modelled.
pub fn ledger_model(
    strings: &mut HashMap<String, i64>,
    hashes: &mut HashMap<String, HashMap<String, i64>>,
    up: &LedgerUpdate,
) -> Answer {
    let as_i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let (used, want, now) = (as_i(up.used), as_i(up.want), as_i(up.now_ms));
    let get =
        |h: &HashMap<String, i64>, kind: &str, id: &str| h.get(&format!("{kind}:{id}")).copied();
    let (mut prev, mut prevw) = (0, 0);
    let mut steps: Vec<(u64, u64)> = Vec::new();
    // what an operator granted to the window (a bucket's: tokens, given back by its time)
    let grant_of = |hashes: &HashMap<String, HashMap<String, i64>>, key: &str| {
        hashes
            .get(key)
            .and_then(|h| h.get("g:"))
            .copied()
            .unwrap_or(0)
    };
    let grant = grant_of(hashes, &up.ledger_key);
    let mut cap = as_i(up.cap) + if up.bucket_ns > 0 { 0 } else { grant };
    if up.log.bucket_ms > 0 && up.prev_ledger_key != up.ledger_key {
        if let Some(ph) = hashes.get(&up.prev_ledger_key) {
            for (name, &v) in ph {
                if let Some(b) = name.strip_prefix("b:") {
                    if let Some(b) = b.parse::<u64>().ok().filter(|&b| b >= up.log.from) {
                        prev += v;
                        steps.push((b, v.max(0) as u64));
                    }
                } else if let Some(id) = name.strip_prefix("c:") {
                    prev += (v - get(ph, "u", id).unwrap_or(0)).max(0);
                }
            }
        }
        prev = (prev - grant_of(hashes, &up.prev_ledger_key)).max(0);
        prevw = prev;
        cap -= prevw;
        steps.sort_unstable();
    } else if up.weight_ms > 0 {
        prev = strings.get(&up.prev_key).copied().unwrap_or(0);
        if let Some(ph) = hashes.get(&up.prev_ledger_key) {
            for (name, &c) in ph {
                if let Some(id) = name.strip_prefix("c:") {
                    prev += (c - get(ph, "u", id).unwrap_or(0)).max(0);
                }
            }
        }
        prev = (prev - grant_of(hashes, &up.prev_ledger_key)).max(0);
        let p = as_i(up.period_ms).max(1);
        prevw = (prev * as_i(up.weight_ms) + p - 1).div_euclid(p);
        cap -= prevw;
    }
    // token buckets: leases the previous window's records hold until they move here
    let mut prev_leased = 0;
    if let Some(ph) = hashes.get(&up.prev_key).filter(|_| up.bucket_ns > 0) {
        for (name, &c) in ph {
            if let Some(id) = name.strip_prefix("c:") {
                if get(ph, "e", id).unwrap_or(0) > now {
                    prev_leased += (c - get(ph, "u", id).unwrap_or(0)).max(0);
                }
            }
        }
    }
    let h = hashes.entry(up.ledger_key.clone()).or_default();
    let adopted = up.adopt > 0 && !h.contains_key(&format!("c:{}", up.member));
    if adopted {
        h.insert(format!("c:{}", up.member), as_i(up.adopt));
        h.insert(format!("e:{}", up.member), as_i(up.lease_until_ms));
    }
    let mut mine = get(h, "u", &up.member).unwrap_or(0);
    if used > mine {
        *strings.entry(up.key.clone()).or_insert(0) += used - mine;
        h.insert(format!("u:{}", up.member), used);
        if up.log.bucket_ms > 0 {
            let mut g = used - mine;
            let mut at = up.log.last;
            for &(b, n) in up.log.units.iter().rev() {
                if g <= 0 {
                    break;
                }
                let n = as_i(n).min(g);
                at = b;
                *h.entry(format!("b:{b}")).or_insert(0) += n;
                g -= n;
            }
            if g > 0 {
                *h.entry(format!("b:{at}")).or_insert(0) += g;
            }
        }
        mine = used;
    }
    let total = strings.get(&up.key).copied().unwrap_or(0);
    let dcap = as_i(up.direct_cap);
    let reserve = if dcap > 0 {
        let scripted: i64 = h
            .iter()
            .filter(|(name, _)| name.starts_with("u:"))
            .map(|(_, &v)| v)
            .sum();
        let own = format!("c:{}", up.member);
        let others = h
            .keys()
            .filter(|name| name.starts_with("c:") && **name != own)
            .count() as i64;
        let left = (dcap - (total - scripted)).max(0);
        if total + prevw < dcap {
            left
        } else {
            left.min((as_i(up.instances) - others - 1).max(0) * as_i(up.direct_each))
        }
    } else {
        0
    };
    let desire = (want - mine).max(0);
    let (mut held, mut active, mut wanted) = (0, 0, 0);
    for (name, &ceiling) in h.iter() {
        let Some(id) = name.strip_prefix("c:") else {
            continue;
        };
        if id != up.member && get(h, "e", id).unwrap_or(0) > now {
            active += 1;
            // (a part re-split at its holder's last call: what it held before, until its next)
            let ceiling = ceiling.max(get(h, "p", id).unwrap_or(0));
            held += (ceiling - get(h, "u", id).unwrap_or(0)).max(0);
            wanted += get(h, "d", id).unwrap_or(0).max(desire);
        }
    }
    let mut keep = mine;
    if let Some(c) = get(h, "c", &up.member) {
        if get(h, "e", &up.member).unwrap_or(0) > now {
            keep = mine.max(want.min(c));
        }
    }
    // this member's call: what it held before a re-split is its count now (0 written over it)
    if get(h, "p", &up.member).unwrap_or(0) > 0 {
        h.insert(format!("p:{}", up.member), 0);
    }
    // a fixed window filling: each member's part of what nobody has admitted
    let mut split = None;
    if up.rest > 0 && up.bucket_ns == 0 && up.log.bucket_ms == 0 {
        let pool = cap - total - reserve;
        let others = (as_i(up.instances) - 1 - active).max(0);
        let demand = desire + others * desire + wanted;
        if demand >= pool && pool > 0 {
            // as Lua computes it, in floating point
            split = Some((pool as f64 * desire as f64 / demand as f64).floor() as i64);
        } else if pool > 0 {
            // a window that will not fill: each its own demand until the end
            split = Some(desire);
        }
    }
    // a part larger than its share of it (the others' demand grew): re-split, what it held
    // kept for it until its next call (it may admit up to that meanwhile)
    if let Some(split) = split {
        if split > 0 && keep > mine + split {
            h.insert(format!("p:{}", up.member), keep);
            keep = mine + split;
        }
    }
    let fair_part = |avail: i64| {
        if active > 0 {
            // as Lua computes it, in floating point
            let d = desire.max(1) as f64;
            ((avail as f64 * d / (d + wanted as f64)).ceil() as i64).max(1)
        } else {
            avail
        }
    };
    let (need, spare) = (as_i(up.need), as_i(up.spare));
    // as Lua computes it, in floating point, µs to the ns; the bucket's time stored whole
    let tb: f64 = bucket_arg(up.bucket_ns).parse().unwrap_or(0.0);
    let mut tat = 0;
    let avail = if up.bucket_ns > 0 {
        let now_us = (now * 1000) as f64;
        let charge = mine - get(h, "t", &up.member).unwrap_or(as_i(up.confirmed));
        let from = if up.since_ms > 0 {
            ((as_i(up.since_ms) * 1000) as f64).min(now_us)
        } else {
            now_us
        };
        let mut t = strings.get(&up.prev_ledger_key).copied().unwrap_or(0) as f64;
        held += prev_leased;
        if charge > 0 {
            t = t.max(from) + charge as f64 * tb;
        }
        tat = format!("{t:.0}").parse().unwrap_or(i64::MAX);
        ((now_us + up.tolerance_us as f64 - t.max(now_us)) / tb).floor() as i64 - held
    } else {
        cap - total - held - reserve
    };
    let free = avail - (keep - mine);
    let fair = fair_part(avail.min(spare));
    let n = (mine + need - keep).min(free).max(0);
    let f = (want - keep - n)
        .min(free - n)
        .min(fair - (keep - mine))
        .min(spare - held - (keep - mine));
    let mut ceiling = keep + n + f.max(0);
    // a fixed window filling: each member's part of what nobody has admitted, at once
    if let Some(split) = split {
        ceiling = ceiling.max(mine + split.min(avail));
    }
    let until = if want <= mine {
        now
    } else {
        as_i(up.lease_until_ms)
    };
    h.insert(format!("c:{}", up.member), ceiling);
    h.insert(format!("e:{}", up.member), until);
    h.insert(format!("d:{}", up.member), desire);
    let left = avail - (ceiling - mine);
    if up.bucket_ns > 0 {
        h.insert(format!("t:{}", up.member), mine);
        strings.insert(up.prev_ledger_key.clone(), tat);
    }
    let u = |v: i64| v.max(0) as u64;
    Answer {
        total: u(total),
        ceiling: u(ceiling),
        fair: u(fair),
        room: u(left),
        held: u(held),
        prev: u(prev),
        grant: u(grant),
        steps: std::array::from_fn(|k| steps.get(k).copied().unwrap_or_default()),
    }
}

/// A plain increment on a model of the keys (the simulation's Redis).
pub fn count_model(strings: &mut HashMap<String, i64>, c: &CountUpdate) -> u64 {
    let v = strings.entry(c.key.clone()).or_insert(0);
    *v += i64::try_from(c.delta).unwrap_or(i64::MAX);
    (*v).max(0) as u64
}

/// An update on a model of the keys: the script's twin, or a plain increment.
pub fn update_model(
    strings: &mut HashMap<String, i64>,
    hashes: &mut HashMap<String, HashMap<String, i64>>,
    u: &Update,
) -> Reply {
    match u {
        Update::Lease(l) => Reply::Lease(ledger_model(strings, hashes, l)),
        Update::Count(c) => Reply::Count(count_model(strings, c)),
    }
}
