//! The quota texts of a config, made once when its limiter is built: each tier's name and
//! policy (`TierText`), and a bounded cache of `RateLimit-Policy` values by the set of tiers
//! that applied (`PolicyCache`, filled by `headers`).

use crate::config::model::Tier;
use http::HeaderValue;
use parking_lot::RwLock;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt::Write;

/// The texts of one tier: `"get-product/10s"` and `"get-product/10s";q=10;w=10`.
#[derive(Debug, Clone)]
pub struct TierText {
    pub name: Box<str>,
    pub policy: Box<str>,
    pub limit: HeaderValue,
}

/// Period in seconds for `w=`: the draft makes `w` a Structured Field Integer, so a
/// sub-second period is written as 1 (and any other rounded up to a whole second).
fn write_window_secs(out: &mut String, ms: u64) {
    let _ = write!(out, "{}", ms.div_ceil(1000).max(1));
}

/// The texts of a tier list of rule `id`, whose quota counts `unit` (`None`: requests; else the
/// draft's `qu` parameter says it).
pub fn tier_texts(id: &str, tiers: &[Tier], unit: Option<&str>) -> Vec<TierText> {
    tiers
        .iter()
        .map(|t| {
            let ms = t.period.as_millis() as u64;
            let mut name = String::from("\"");
            name.push_str(id);
            name.push('/');
            name.push_str(&t.label());
            name.push('"');
            let mut policy = name.clone();
            let _ = write!(policy, ";q={}", t.threshold);
            // (a calendar window has no one length: `w` is left out, as the draft allows)
            if t.calendar.is_none() {
                policy.push_str(";w=");
                write_window_secs(&mut policy, ms);
            }
            if let Some(unit) = unit {
                let _ = write!(policy, ";qu=\"{unit}\"");
            }
            TierText {
                name: name.into(),
                policy: policy.into(),
                limit: HeaderValue::from(t.threshold),
            }
        })
        .collect()
}

/// `RateLimit-Policy` values by the tiers they list; at most `MAX` kept.
#[derive(Default)]
pub struct PolicyCache(
    pub(crate) RwLock<HashMap<SmallVec<[u32; 4]>, HeaderValue, ahash::RandomState>>,
);

impl PolicyCache {
    pub const MAX: usize = 1024;
}
