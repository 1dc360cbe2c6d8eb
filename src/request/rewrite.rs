//! What a route changes on the way through (`request_headers`, `response_headers`,
//! `strip_prefix`, `rewrite`): headers removed, set and added, with variables rendered per
//! request, and the upstream's path without a prefix or rewritten by a pattern. Limits and routes match the client's path, before any
//! of it.

use crate::config::model::{HeaderOps, PathRewrite, Piece, Template, Var};
use crate::matching::normalize_path;
use bytes::Bytes;
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

/// The value of `t` for this request (with variables, one allocation); `None` when it is no
/// header value (a tenant id with a control character): that header is then left out.
fn render(t: &Template, v: &Vars) -> Option<HeaderValue> {
    let pieces = match t {
        Template::Fixed(value) => return Some(value.clone()),
        Template::Pieces(pieces) => pieces,
    };
    let mut out = Vec::with_capacity(64);
    for p in pieces {
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
    HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
}

/// One change `HeaderOps` makes to a header.
pub enum Change {
    Remove,
    /// Replacing what was there.
    Set(HeaderValue),
    /// Beside what was there.
    Add(HeaderValue),
}

/// Each change of `ops` for this request, in order: removed, then set, then added (a value that
/// renders to no header value is left out).
pub fn each<E>(
    ops: &HeaderOps,
    v: &Vars,
    mut f: impl FnMut(&HeaderName, Change) -> Result<(), E>,
) -> Result<(), E> {
    for n in &ops.remove {
        f(n, Change::Remove)?;
    }
    for (n, t) in &ops.set {
        if let Some(h) = render(t, v) {
            f(n, Change::Set(h))?;
        }
    }
    for (n, t) in &ops.add {
        if let Some(h) = render(t, v) {
            f(n, Change::Add(h))?;
        }
    }
    Ok(())
}

/// Apply `ops` to a header map (an answer's).
pub fn apply(ops: &HeaderOps, v: &Vars, headers: &mut HeaderMap) {
    let _ = each(ops, v, |name, change| -> Result<(), ()> {
        match change {
            Change::Remove => {
                headers.remove(name);
            }
            Change::Set(value) => {
                headers.insert(name.clone(), value);
            }
            Change::Add(value) => {
                headers.append(name.clone(), value);
            }
        }
        Ok(())
    });
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

/// The upstream's path and query for a request to `path` by the route's `rewrite`: the
/// normalized path with each match of the pattern replaced (`/` when nothing is left), the
/// query as sent. `None`: the pattern does not match (the path is forwarded as sent).
pub fn regex(path: &str, query: Option<&str>, rw: &PathRewrite) -> Option<String> {
    let normalized = normalize_path(path);
    if !rw.pattern.is_match(&normalized) {
        return None;
    }
    let mut out = rw
        .pattern
        .replace_all(&normalized, rw.to.as_str())
        .into_owned();
    if out.is_empty() {
        out.push('/');
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md "Rewrites": variables rendered, and a value that comes out as no
    /// header value (a tenant id with a control character) left out for that request.
    #[test]
    fn values_render_their_variables_and_an_invalid_one_is_left_out() {
        let t = Template::Pieces;
        let ops = HeaderOps {
            remove: vec![HeaderName::from_static("x-gone")],
            set: vec![
                (
                    HeaderName::from_static("x-fixed"),
                    Template::Fixed(HeaderValue::from_static("made once")),
                ),
                (
                    HeaderName::from_static("x-who"),
                    t(vec![
                        Piece::Var(Var::Tenant),
                        Piece::Text("/".into()),
                        Piece::Var(Var::Plan),
                        Piece::Text("@".into()),
                        Piece::Var(Var::Route),
                        Piece::Text(" ".into()),
                        Piece::Var(Var::ClientIp),
                    ]),
                ),
            ],
            add: vec![(
                HeaderName::from_static("x-id"),
                t(vec![Piece::Var(Var::RequestId)]),
            )],
        };
        let id = HeaderValue::from_static("abc");
        let mut v = Vars {
            tenant: b"acme",
            plan: Some("gold"),
            route: "orders",
            client_ip: Some("192.0.2.7".parse().unwrap()),
            request_id: Some(&id),
        };
        let mut h = HeaderMap::new();
        h.insert("x-gone", HeaderValue::from_static("1"));
        h.insert("x-id", HeaderValue::from_static("client"));
        apply(&ops, &v, &mut h);
        assert!(!h.contains_key("x-gone"));
        assert_eq!(h["x-who"], "acme/gold@orders 192.0.2.7");
        assert_eq!(h["x-fixed"], "made once");
        assert_eq!(
            h.get_all("x-id").iter().collect::<Vec<_>>(),
            ["client", "abc"]
        );
        v.tenant = b"evil\nx-forged: 1";
        let mut h = HeaderMap::new();
        apply(&ops, &v, &mut h);
        assert!(!h.contains_key("x-who"), "left out: {h:?}");
        assert_eq!(h["x-id"], "abc");
    }

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
