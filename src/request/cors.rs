//! Browsers on other origins, per route (`cors`): the Fetch standard's CORS protocol. A
//! preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) for a route with
//! `cors` is answered here, before any tenant, access list or limit: never counted, never sent
//! upstream. Every answer to an actual request from an allowed origin, the gateway's own
//! refusals included, tells the page so, and lets it read the quota headers.

use crate::config::model::{Cors, Route};
use crate::matching::Segments;
use crate::request::answer::Answer;
use crate::request::routing::find_route;
use bytes::Bytes;
use http::header::{
    HeaderMap, HeaderValue, ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS,
    ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN,
    VARY,
};
use http::request::Parts;
use http::Method;

const ANY: HeaderValue = HeaderValue::from_static("*");
const TRUE: HeaderValue = HeaderValue::from_static("true");
/// What a preflight's answer depends on.
const PREFLIGHT_VARY: HeaderValue = HeaderValue::from_static(
    "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
);
const ORIGIN_VARY: HeaderValue = HeaderValue::from_static("Origin");

/// The preflight of a route with `cors`: the route's index and its answer (204 with the allow
/// headers, or 403 when the origin, the method or a header asked for may not). `None`: not a
/// preflight, or one for no route with `cors` (it goes on as any request).
pub fn preflight(
    routes: &[Route],
    head: &Parts,
    host: Option<&str>,
    path: &Segments,
) -> Option<(usize, Answer)> {
    if head.method != Method::OPTIONS {
        return None;
    }
    let origin = head.headers.get(ORIGIN)?;
    let asked = head.headers.get(ACCESS_CONTROL_REQUEST_METHOD)?;
    let method = Method::from_bytes(asked.as_bytes()).ok()?;
    let (i, route) = find_route(routes, &method, host, path)?;
    let cors = route.cors.as_deref()?;
    let headers = head.headers.get(ACCESS_CONTROL_REQUEST_HEADERS);
    Some((i, preflight_answer(cors, origin, &method, headers)))
}

fn preflight_answer(
    cors: &Cors,
    origin: &HeaderValue,
    method: &Method,
    asked_headers: Option<&HeaderValue>,
) -> Answer {
    let refused = if !cors.allows_origin(origin.as_bytes()) {
        Some("pages of this origin may not call this route (its cors.origins)")
    } else if !cors.methods.contains(method) {
        Some("pages of other origins may not call this route with this method (its cors.methods)")
    } else if !headers_allowed(cors, asked_headers) {
        Some("pages of other origins may not send these headers to this route (its cors.headers)")
    } else {
        None
    };
    if let Some(detail) = refused {
        let mut a = Answer::problem(403, detail);
        a.headers.append(VARY, PREFLIGHT_VARY);
        return a;
    }
    let mut headers = HeaderMap::with_capacity(8);
    allow_origin(&mut headers, cors, origin);
    headers.insert(ACCESS_CONTROL_ALLOW_METHODS, cors.allow_methods.clone());
    match (&cors.allow_headers, asked_headers) {
        (Some(listed), _) => {
            headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, listed.clone());
        }
        // any header: those asked for
        (None, Some(asked)) if !asked.is_empty() => {
            headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        (None, _) => {}
    }
    if let Some(age) = &cors.max_age {
        headers.insert(ACCESS_CONTROL_MAX_AGE, age.clone());
    }
    headers.insert(VARY, PREFLIGHT_VARY);
    Answer {
        status: 204,
        headers,
        body: Bytes::new(),
        close: false,
        by_limit: false,
    }
}

/// Whether every header a preflight asks for (`a, b`) is in `cors.headers` (any, when it lists
/// none).
fn headers_allowed(cors: &Cors, asked: Option<&HeaderValue>) -> bool {
    let (Some(allowed), Some(asked)) = (&cors.headers, asked) else {
        return true;
    };
    let Ok(asked) = asked.to_str() else {
        return false;
    };
    asked
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .all(|h| allowed.iter().any(|a| a.as_str().eq_ignore_ascii_case(h)))
}

/// `Access-Control-Allow-Origin` (the origin, or `*` for any without credentials), with
/// `Access-Control-Allow-Credentials`.
fn allow_origin(headers: &mut HeaderMap, cors: &Cors, origin: &HeaderValue) {
    if cors.origins.is_none() && !cors.credentials {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, ANY);
    } else {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    if cors.credentials {
        headers.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE);
    }
}

/// The `Origin` of an actual request to a route with `cors`, when that origin may call it
/// (kept with the request until its answer is written).
pub fn origin_of(route: &Route, head: &Parts) -> Option<HeaderValue> {
    let cors = route.cors.as_deref()?;
    let origin = head.headers.get(ORIGIN)?;
    cors.allows_origin(origin.as_bytes())
        .then(|| origin.clone())
}

/// Tell the page of an allowed `origin` that it may read this answer (an upstream's or the
/// gateway's own), and the quota headers and `expose_headers` in it. `Vary: Origin` is added
/// to what the answer varies by.
pub fn apply(headers: &mut HeaderMap, cors: &Cors, origin: &HeaderValue) {
    allow_origin(headers, cors, origin);
    headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, cors.expose.clone());
    headers.append(VARY, ORIGIN_VARY);
}
