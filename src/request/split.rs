//! Which of a route's pools a request goes to (`upstreams`). The entries whose `when` holds
//! share the request by weight; when none holds, the entries without `when` do. The share is
//! drawn at random per request, or, with `sticky: tenant`, from a hash of the tenant, so that a
//! tenant stays on one pool on every instance for as long as the weights stay.

use crate::config::model::{Split, SplitEntry, When};
use crate::request::tenant::ANONYMOUS;
use http::HeaderMap;

/// What a request shows the conditions of `when`.
pub struct Asked<'a> {
    pub headers: &'a HeaderMap,
    pub tenant: &'a [u8],
    pub plan: Option<&'a str>,
}

impl When {
    fn holds(&self, r: &Asked) -> bool {
        (self.plans.is_empty() || r.plan.is_some_and(|p| self.plans.iter().any(|x| x == p)))
            && (self.tenants.is_empty()
                || (!r.tenant.is_empty() && self.tenants.iter().any(|t| **t == *r.tenant)))
            && self
                .headers
                .iter()
                .all(|(name, value)| r.headers.get(name) == Some(value))
    }
}

/// The index (into `split.entries`) of the entry the request goes to.
pub fn pick(split: &Split, r: &Asked) -> usize {
    let conditional = |e: &SplitEntry| e.when.as_ref().is_some_and(|w| w.holds(r));
    let default = |e: &SplitEntry| e.when.is_none();
    let share = |take: &dyn Fn(&SplitEntry) -> bool| -> u64 {
        split
            .entries
            .iter()
            .filter(|e| take(e))
            .map(|e| u64::from(e.weight))
            .sum()
    };
    let mut total = share(&conditional);
    let take: &dyn Fn(&SplitEntry) -> bool = if total > 0 {
        &conditional
    } else {
        total = share(&default);
        &default
    };
    let mut point = draw(total, split.sticky.then_some(r.tenant));
    for (i, e) in split.entries.iter().enumerate().filter(|(_, e)| take(e)) {
        let w = u64::from(e.weight);
        if point < w {
            return i;
        }
        point -= w;
    }
    // weights of 0 only (the config refuses that for the entries without `when`)
    split.entries.iter().position(default).unwrap_or(0)
}

/// A point in `0..total`: from the tenant's hash when sticky (and there is a tenant: the
/// anonymous requests of an optional tenant are many clients, spread), else at random.
fn draw(total: u64, sticky: Option<&[u8]>) -> u64 {
    if total == 0 {
        return 0;
    }
    match sticky.filter(|t| !t.is_empty() && *t != ANONYMOUS) {
        // the hash's high bits, scaled: every share gets its part of the hash's range
        Some(tenant) => {
            let h = xxhash_rust::xxh3::xxh3_64(tenant);
            ((u128::from(h) * u128::from(total)) >> 64) as u64
        }
        None => fastrand::u64(..total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn entry(pool: usize, weight: u32, when: Option<When>) -> SplitEntry {
        SplitEntry { pool, weight, when }
    }

    fn asked<'a>(headers: &'a HeaderMap, tenant: &'a str, plan: Option<&'a str>) -> Asked<'a> {
        Asked {
            headers,
            tenant: tenant.as_bytes(),
            plan,
        }
    }

    #[test]
    fn weights_share_the_requests() {
        let split = Split {
            entries: vec![entry(0, 95, None), entry(1, 5, None)],
            sticky: false,
        };
        let h = HeaderMap::new();
        let n = 20_000;
        let canary = (0..n)
            .filter(|_| pick(&split, &asked(&h, "", None)) == 1)
            .count();
        // 5% of 20,000: 1,000, sd 30.8; 5 sd either way
        assert!((846..=1154).contains(&canary), "{canary} of {n}");
    }

    #[test]
    fn a_weight_of_zero_takes_nothing() {
        let split = Split {
            entries: vec![entry(0, 0, None), entry(1, 3, None)],
            sticky: false,
        };
        let h = HeaderMap::new();
        assert!((0..1000).all(|_| pick(&split, &asked(&h, "", None)) == 1));
    }

    #[test]
    fn a_when_that_holds_wins_over_the_weights_and_one_that_does_not_is_passed_over() {
        let beta = When {
            plans: vec!["beta".into()],
            ..When::default()
        };
        let canary = When {
            headers: vec![(
                HeaderName::from_static("x-canary"),
                HeaderValue::from_static("1"),
            )],
            ..When::default()
        };
        let acme = When {
            tenants: vec![b"acme".to_vec().into_boxed_slice()],
            ..When::default()
        };
        let split = Split {
            entries: vec![
                entry(1, 1, Some(beta)),
                entry(2, 1, Some(canary)),
                entry(3, 1, Some(acme)),
                entry(0, 1, None),
            ],
            sticky: false,
        };
        let none = HeaderMap::new();
        let mut flagged = HeaderMap::new();
        flagged.insert("x-canary", HeaderValue::from_static("1"));
        let mut other = HeaderMap::new();
        other.insert("x-canary", HeaderValue::from_static("0"));
        for _ in 0..100 {
            assert_eq!(pick(&split, &asked(&none, "t1", Some("beta"))), 0);
            assert_eq!(pick(&split, &asked(&none, "t1", Some("free"))), 3);
            assert_eq!(pick(&split, &asked(&flagged, "", None)), 1);
            assert_eq!(pick(&split, &asked(&other, "", None)), 3);
            assert_eq!(pick(&split, &asked(&none, "acme", None)), 2);
            assert_eq!(pick(&split, &asked(&none, "acmex", None)), 3);
        }
        // two that hold share the request
        let both = (0..2000)
            .map(|_| pick(&split, &asked(&flagged, "t1", Some("beta"))))
            .filter(|&i| i == 1)
            .count();
        assert!((800..=1200).contains(&both), "{both}");
    }

    #[test]
    fn sticky_keeps_a_tenant_on_one_pool_and_still_splits_the_tenants() {
        let split = Split {
            entries: vec![entry(0, 90, None), entry(1, 10, None)],
            sticky: true,
        };
        let h = HeaderMap::new();
        let mut second = 0;
        for t in 0..5000 {
            let tenant = format!("tenant-{t}");
            let first = pick(&split, &asked(&h, &tenant, None));
            assert!((0..5).all(|_| pick(&split, &asked(&h, &tenant, None)) == first));
            second += usize::from(first == 1);
        }
        // 10% of 5,000: 500, sd 21.2
        assert!((394..=606).contains(&second), "{second}");
        // the hash is XXH3-64, fixed: this tenant goes where it went before
        assert_eq!(pick(&split, &asked(&h, "acme", None)), 0);
        // anonymous requests (no tenant named) are spread
        let anonymous: std::collections::HashSet<_> = (0..200)
            .map(|_| pick(&split, &asked(&h, "anonymous", None)))
            .collect();
        assert_eq!(anonymous.len(), 2);
    }
}
