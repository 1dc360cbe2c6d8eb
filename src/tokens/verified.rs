//! What a verified token says: the tenant, its plan and the claims the upstream is told.

use http::{HeaderName, HeaderValue};

/// What a verified token says, kept in the cache until it expires.
#[derive(Debug, PartialEq, Eq)]
pub struct Verified {
    pub tenant: Box<[u8]>,
    /// Index into the config's plans, when `plan_claim` names a known plan.
    pub plan: Option<usize>,
    pub forward: Vec<(HeaderName, HeaderValue)>,
    /// Unix seconds after which the token is no longer taken (`exp` + leeway).
    pub until_s: u64,
}
