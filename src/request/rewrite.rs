//! What a route changes on the way through (`request_headers`, `response_headers`,
//! `strip_prefix`): headers removed, set and added, with variables rendered per request, and
//! the upstream's path without a prefix. Limits and routes match the client's path, before any
//! of it.

use crate::config::model::{HeaderOps, Piece, Template, Var};
use crate::matching::normalize_path;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::io::Write;
use std::net::IpAddr;

/// What the variables of a request are.
pub struct Vars<'a> {
    pub tenant: &'a [u8],
    pub plan: Option<&'a str>,
    pub route: &'a str,
    pub client_ip: Option<IpAddr>,
    pub request_id: Option<&'a HeaderValue>,
}

/// The value of `t` for this request; `None` when it is no header value (a tenant id with a
/// control character): that header is then left out.
fn render(t: &Template, v: &Vars) -> Option<HeaderValue> {
    let mut out = Vec::with_capacity(64);
    for p in &t.0 {
        match p {
            Piece::Text(s) => out.extend_from_slice(s.as_bytes()),
            Piece::Var(Var::Tenant) => out.extend_from_slice(v.tenant),
            Piece::Var(Var::Plan) => out.extend_from_slice(v.plan.unwrap_or("").as_bytes()),
            Piece::Var(Var::Route) => out.extend_from_slice(v.route.as_bytes()),
            Piece::Var(Var::ClientIp) => {
                if let Some(ip) = v.client_ip {
                    let _ = write!(out, "{ip}");
                }
            }
            Piece::Var(Var::RequestId) => {
                out.extend_from_slice(v.request_id.map_or(&b""[..], |h| h.as_bytes()))
            }
        }
    }
    HeaderValue::from_bytes(&out).ok()
}

/// What `ops` does, in order: each header removed (`None`), set, or added (`true`).
pub fn changes<'o>(
    ops: &'o HeaderOps,
    v: &Vars,
) -> impl Iterator<Item = (&'o HeaderName, Option<(HeaderValue, bool)>)> + 'o {
    let removed = ops.remove.iter().map(|n| (n, None));
    let set = ops
        .set
        .iter()
        .map(|(n, t)| (n, render(t, v).map(|h| (h, false))));
    let added = ops
        .add
        .iter()
        .filter_map(|(n, t)| render(t, v).map(|h| (n, Some((h, true)))));
    // (collected: the values are rendered while `v` is borrowed)
    removed
        .chain(set)
        .chain(added)
        .collect::<Vec<_>>()
        .into_iter()
}

/// Apply `ops` to a header map (an answer's).
pub fn apply(ops: &HeaderOps, v: &Vars, headers: &mut HeaderMap) {
    for (name, change) in changes(ops, v) {
        match change {
            None => {
                headers.remove(name);
            }
            Some((value, false)) => {
                headers.insert(name.clone(), value);
            }
            Some((value, true)) => {
                headers.append(name.clone(), value);
            }
        }
    }
}

/// The upstream's path and query for a request to `path_and_query` without `prefix`: the
/// normalized path less the prefix (`/` when nothing is left), the query as sent. `None`:
/// the path does not begin with the prefix at a segment's start (it is forwarded as sent).
pub fn strip(path: &str, query: Option<&str>, prefix: &str) -> Option<String> {
    let normalized = normalize_path(path);
    let rest = normalized.strip_prefix(prefix)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let rest = if rest.is_empty() { "/" } else { rest };
    Some(match query {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_goes_at_a_segment_s_start_only() {
        assert_eq!(
            strip("/api/v1/x", Some("a=1"), "/api").as_deref(),
            Some("/v1/x?a=1")
        );
        assert_eq!(strip("/api", None, "/api").as_deref(), Some("/"));
        assert_eq!(strip("//api/./v1/", None, "/api").as_deref(), Some("/v1"));
        assert_eq!(strip("/apiv1/x", None, "/api"), None);
        assert_eq!(strip("/other", None, "/api"), None);
    }
}
