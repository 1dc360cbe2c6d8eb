//! The Pingora adapter of the request path (pingora's `ProxyHttp`), each phase a few lines
//! around the Pingora-free `admission`:
//!
//! 1. `request_filter`: read the request's facts, `admission::admit` (and wait when it says
//!    hold), write its answer if it has one.
//! 2. `proxy_upstream_filter`: the shaping gate of a pool with `max_in_flight` (Pingora's phase
//!    for deferred checks like rate limiting): wait for a place by plan priority, or 503.
//! 3. `upstream_peer`: pick a server of the route's pool.
//! 4. `upstream_request_filter`: strip hop-by-hop headers, set the tenant header, append
//!    X-Forwarded-For.
//! 5. `response_filter`: the quota headers.
//! 6. `fail_to_proxy`: problem+json for upstream failures (502, 504) and bad requests.
//! 7. `logging`: metrics and the access log.
//!
//! Every answer the gateway makes itself goes out through `write_answer`.

use crate::config::model::{Cors, Route, RouteTimeouts, TenantSource, UpstreamProtocol};
use crate::grpc;
use crate::limits::headers;
use crate::log_format;
use crate::metrics::{ClientError, Metrics};
use crate::request::admission::{self, Admission, Admitted, Incoming};
use crate::request::answer::Answer;
use crate::request::client_addr::X_FORWARDED_FOR;
use crate::request::client_limits;
use crate::request::cors;
use crate::request::header_deadline;
use crate::request::request_id;
use crate::request::rewrite::{self, Change};
use crate::request::split;
use crate::request::trace;
use crate::snapshot::{SharedSnapshot, Snapshot};
use crate::upstream::Pool;
use async_trait::async_trait;
use http::header::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::protocols::http::HttpTask;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_limits::decision::Answered;

/// Per-request state carried across phases.
pub struct RequestCtx {
    snapshot: Option<Arc<Snapshot>>,
    /// What the admission decided and the later phases need.
    admitted: Admitted,
    /// For the access log.
    started: Instant,
    upstream: Option<std::net::SocketAddr>,
    /// `action: throttle`: the wait owed but not yet taken.
    throttle_owed: Duration,
    /// Failed attempts to reach an upstream for this request (retries stop at the pool's
    /// `retries`).
    failures: usize,
    /// Request body bytes seen so far (counted only with `server.max_body_bytes`).
    body_bytes: u64,
    /// The place in a shaped pool, handed to the next waiter when the request is done.
    gate: Option<crate::upstream::shaping::GateSlot>,
    /// With `tracing`: the request's span, and its current upstream attempt's.
    trace: Option<Box<TraceSpans>>,
    /// A gRPC call (`content-type: application/grpc*`).
    grpc: bool,
    /// Its deadline, counted from its arrival: a gRPC call's `grpc-timeout`, the route's
    /// `timeouts.total`, whichever comes first.
    deadline: Option<Instant>,
    /// The upstream answer's HTTP status (its gRPC status comes later, in its trailers).
    answer_status: u16,
    /// The gRPC status of the upstream's answer (trailers, or a trailers-only head).
    grpc_status: Option<u8>,
    /// `x-request-id`: the upstream is told it, and so is the client.
    request_id: Option<HeaderValue>,
    /// The pool the request goes to (index into the config's `upstreams`), once chosen.
    pool: Option<usize>,
}

/// The spans of a traced request (boxed: most requests carry none).
struct TraceSpans {
    request: opentelemetry::Context,
    upstream: Option<opentelemetry::Context>,
    attempts: u32,
}

pub struct Gateway {
    pub shared: SharedSnapshot,
    pub metrics: Arc<Metrics>,
    /// Set by SIGTERM and SIGQUIT: every answer from then on closes its connection, so a
    /// kept-alive client reconnects (to the new process, in an upgrade) instead of sending its
    /// next request to a process that is going away.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

/// The status logged and counted for a request that got no answer at all (the client went
/// away first), as nginx logs it; never sent.
const CLIENT_GONE: http::StatusCode = match http::StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
};

const DEADLINE_BEFORE_TURN: &str =
    "the request's deadline (grpc-timeout, or the route's timeouts.total) passes before its turn in the leaky bucket";
const DEADLINE_IN_HOLD: &str =
    "the request's deadline (grpc-timeout, or the route's timeouts.total) passed while a delay held it";
const DEADLINE_IN_QUEUE: &str =
    "the request's deadline (grpc-timeout, or the route's timeouts.total) passed while it waited for the pool";
const DEADLINE_PASSED: &str =
    "the request's deadline (grpc-timeout, or the route's timeouts.total) passed at the gateway";
const GRPC_TO_HTTP1: &str =
    "this route's pool speaks HTTP/1.1, which cannot carry gRPC: its protocol must be h2 or h2c";
const TRAILERS: HeaderValue = HeaderValue::from_static("trailers");

/// Get into a shaped pool (`max_in_flight`), by the plan priority of `tenant`: the place, freed
/// when the request is done, or `None` when the request is refused (a full queue, or it waited
/// too long).
async fn enter_gate(
    metrics: &Metrics,
    snap: &Snapshot,
    pool: usize,
    gate: &Arc<crate::upstream::shaping::Gate>,
    tenant: &[u8],
) -> Option<crate::upstream::shaping::GateSlot> {
    let plans = &snap.config.plans;
    let plan = if tenant.is_empty() {
        None
    } else {
        plans.plan_of(tenant)
    };
    let priority = plan
        .and_then(|p| plans.priority.get(p))
        .copied()
        .unwrap_or(0);
    let name = snap
        .config
        .upstreams
        .get(pool)
        .map_or("", |u| u.name.as_str());
    match gate.enter(priority).await {
        Ok((slot, waited)) => {
            if waited {
                let plan_name = plan
                    .and_then(|p| plans.names.get(p))
                    .map_or("none", String::as_str);
                metrics
                    .queue_waits
                    .with_label_values(&[name, plan_name])
                    .inc();
            }
            Some(slot)
        }
        Err(why) => {
            let reason = match why {
                crate::upstream::shaping::Refused::Full => "full",
                crate::upstream::shaping::Refused::Timeout => "timeout",
            };
            metrics
                .queue_refused
                .with_label_values(&[name, reason])
                .inc();
            None
        }
    }
}

/// The wait before sending a chunk of `bytes` at `bytes_per_sec`. The timer's tick is 1 ms:
/// shorter waits are owed until they add up to one, so that small chunks are neither
/// over-paced (each sleep rounded up to a tick) nor each a timer trip.
fn pace(owed: &mut Duration, bytes: usize, bytes_per_sec: u64) -> Option<Duration> {
    *owed += Duration::from_secs_f64(bytes as f64 / bytes_per_sec.max(1) as f64);
    (*owed >= Duration::from_millis(1)).then(|| std::mem::take(owed))
}

/// Write an answer made here (a refusal, a denial, a shadowban's reply), whole; to a gRPC
/// call (`grpc`), as a trailers-only gRPC answer (`Answer::to_grpc`).
async fn write_answer(session: &mut Session, mut answer: Answer, ctx: &RequestCtx) -> Result<()> {
    if let Some((cors, origin)) = cors_of(ctx) {
        cors::apply(&mut answer.headers, cors, origin);
    }
    if let Some(id) = &ctx.request_id {
        answer.headers.insert(request_id::X_REQUEST_ID, id.clone());
    }
    route_response_changes(&mut answer.headers, ctx);
    if ctx.grpc {
        answer = answer.to_grpc(!session.as_downstream().is_http2());
    }
    let end_in_head = answer.body.is_empty();
    if answer.close {
        session.set_keepalive(None);
    }
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = http::StatusCode::from_u16(answer.status)
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    parts.headers = answer.headers;
    let mut resp = Box::new(ResponseHeader::from(parts));
    if end_in_head && session.as_downstream().is_http2() {
        // A head that ends the stream (a gRPC trailers-only answer) must carry END_STREAM:
        // pingora-core 0.9's `HttpSession::write_response_header` passes `end = false` to an
        // HTTP/2 session whatever it is told, and ends the stream with an empty DATA frame,
        // which a gRPC client reads as an answer without a status (tests/grpc.rs). The
        // session's own task writer keeps the flag.
        session
            .downstream_modules_ctx
            .response_header_filter(&mut resp, true)
            .await?;
        session
            .as_downstream_mut()
            .response_duplex_vec(vec![HttpTask::Header(resp, true)])
            .await?;
        return Ok(());
    }
    session.write_response_header(resp, false).await?;
    session.write_response_body(Some(answer.body), true).await
}

/// What the upstream is told of the tenant: API keys and tokens hidden, a verified token's
/// claims (never a client's copy), the tenant header (replacing whatever the client sent).
fn tenant_headers(
    upstream_request: &mut RequestHeader,
    t: &crate::config::model::TenantSettings,
    admitted: &Admitted,
) -> Result<()> {
    // API keys and tokens stay here (`hide`)
    for h in &t.hidden {
        upstream_request.remove_header(h);
    }
    // the claims of a verified token (`jwt.forward_claims`), never a client's copy
    if t.has_tokens() {
        for name in t.sources.iter().flat_map(TenantSource::claim_headers) {
            upstream_request.remove_header(name);
        }
        if let Some(token) = &admitted.token {
            for (name, value) in &token.forward {
                upstream_request.insert_header(name.clone(), value.clone())?;
            }
        }
    }
    // inserting replaces whatever the client sent under that name
    match &t.forward_header {
        Some(name) if admitted.tenant.is_empty() => {
            // `tenant: none`: no tenant to forward, and no client copy either
            upstream_request.remove_header(name);
        }
        Some(name) => match HeaderValue::from_bytes(&admitted.tenant) {
            Ok(v) => upstream_request.insert_header(t.forward_name.clone(), v)?,
            Err(_) => {
                upstream_request.remove_header(name);
                log::warn!("tenant id is not a valid header value; {name} not set");
            }
        },
        None => {
            upstream_request.remove_header(&t.strip_header);
        }
    }
    Ok(())
}

/// The route's timeouts over the pool's, each cut at what is left before the request's
/// deadline (a gRPC call's, the route's `total`). `false`: the deadline has passed.
fn timeouts(peer: &mut HttpPeer, t: RouteTimeouts, deadline: Option<Instant>) -> bool {
    let o = &mut peer.options;
    if let Some(c) = t.connect {
        o.connection_timeout = Some(c);
        o.total_connection_timeout = Some(c);
    }
    if let Some(r) = t.read {
        o.read_timeout = Some(r);
        o.write_timeout = Some(r);
    }
    let Some(deadline) = deadline else {
        return true;
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return false;
    }
    for timeout in [
        &mut o.read_timeout,
        &mut o.write_timeout,
        &mut o.connection_timeout,
        &mut o.total_connection_timeout,
    ] {
        *timeout = Some(timeout.map_or(left, |r| r.min(left)));
    }
    true
}

/// The variables of a request's header values (`rewrite::Vars`).
fn vars<'a>(ctx: &'a RequestCtx, snap: &'a Snapshot, route: &'a Route) -> rewrite::Vars<'a> {
    let a = &ctx.admitted;
    let plans = &snap.config.plans;
    let plan = plans.plan_for(&a.tenant, a.token.as_ref().and_then(|t| t.plan));
    rewrite::Vars {
        tenant: &a.tenant,
        plan: plan.and_then(|i| plans.names.get(i)).map(String::as_str),
        route: &route.id,
        client_ip: a.client_ip,
        request_id: ctx.request_id.as_ref(),
    }
}

/// The route's `request_headers` and `strip_prefix` or `rewrite`, last: what the route says wins over the
/// client's headers and the gateway's own (a `host` set there is the upstream's `Host`).
fn route_request_changes(upstream_request: &mut RequestHeader, ctx: &RequestCtx) -> Result<()> {
    let Some((snap, route)) = route_of(ctx) else {
        return Ok(());
    };
    if let Some(ops) = &route.request_headers {
        rewrite::each(ops, &vars(ctx, snap, route), |name, change| match change {
            Change::Remove => {
                upstream_request.remove_header(name);
                Ok(())
            }
            Change::Set(value) => upstream_request.insert_header(name.clone(), value),
            Change::Add(value) => upstream_request
                .append_header(name.clone(), value)
                .map(drop),
        })?;
    }
    let uri = &upstream_request.uri;
    let to = match (&route.strip_prefix, &route.rewrite) {
        (Some(prefix), _) => rewrite::strip(uri.path(), uri.query(), prefix),
        (None, Some(rw)) => rewrite::regex(uri.path(), uri.query(), rw),
        (None, None) => None,
    };
    if let Some(to) = to {
        match to.parse::<http::Uri>() {
            Ok(u) if u.path().starts_with('/') => upstream_request.set_uri(u),
            _ => {
                return Error::e_explain(
                    ErrorType::HTTPStatus(400),
                    "the path cannot be forwarded as the route rewrites it",
                )
            }
        }
    }
    Ok(())
}

/// The route's `response_headers` on an answer to the client.
fn route_response_changes(headers: &mut http::HeaderMap, ctx: &RequestCtx) {
    if let Some((snap, route)) = route_of(ctx) {
        if let Some(ops) = &route.response_headers {
            rewrite::apply(ops, &vars(ctx, snap, route), headers);
        }
    }
}

/// The pool of the request's route it goes to (`upstreams`: by weight and condition), counted
/// in `tollgate_upstream_requests_total`; `None` without a route.
fn choose_pool(req: &RequestHeader, ctx: &RequestCtx) -> Option<usize> {
    let (snap, route) = route_of(ctx)?;
    let i = ctx.admitted.route?;
    let (entry, pool) = match &route.split {
        None => (0, route.upstream),
        Some(split) => {
            let vars = vars(ctx, snap, route);
            let asked = split::Asked {
                headers: &req.headers,
                tenant: vars.tenant,
                plan: vars.plan,
            };
            let entry = split::pick(split, &asked);
            let pool = split.entries.get(entry).map_or(route.upstream, |e| e.pool);
            (entry, pool)
        }
    };
    if let Some(c) = snap.pool_requests.get(i).and_then(|r| r.get(entry)) {
        c.inc();
    }
    Some(pool)
}

/// The pool chosen for the request (`choose_pool`).
fn pool_of(ctx: &RequestCtx) -> Option<&Pool> {
    ctx.snapshot.as_deref()?.pools.get(ctx.pool?).map(|p| &**p)
}

/// The snapshot the request is handled under and the route it matched, if any.
fn route_of(ctx: &RequestCtx) -> Option<(&Snapshot, &Route)> {
    let snap = ctx.snapshot.as_deref()?;
    Some((snap, snap.config.routes.get(ctx.admitted.route?)?))
}

/// The route's `cors` and the request's allowed `Origin`, when its answer must say so.
fn cors_of(ctx: &RequestCtx) -> Option<(&Cors, &HeaderValue)> {
    let origin = ctx.admitted.origin.as_ref()?;
    Some((route_of(ctx)?.1.cors.as_deref()?, origin))
}

/// Edit a response's header map directly, with names made once. `ResponseHeader::insert_header`
/// parses the name again on every call, allocates it twice and keeps a second map of the names'
/// original case, growing both maps (issue 9 measured 9.3K instructions for the five quota
/// headers). Here the header leaves its case map behind: names are then sent in their canonical
/// case (`Content-Type` for the standard ones, lower case for the others), as HTTP/2 sends all
/// of them. A reason phrase other than the standard one is kept.
pub fn with_header_map(
    resp: &mut ResponseHeader,
    edit: impl FnOnce(&mut http::HeaderMap),
) -> pingora::Result<()> {
    let custom_reason = resp
        .get_reason_phrase()
        .filter(|r| Some(*r) != resp.status.canonical_reason())
        .map(str::to_owned);
    let empty = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let mut parts: http::response::Parts = std::mem::replace(resp, empty).into();
    edit(&mut parts.headers);
    *resp = ResponseHeader::from(parts);
    if custom_reason.is_some() {
        resp.set_reason_phrase(custom_reason.as_deref())?;
    }
    Ok(())
}

/// Append an address in its usual text form (IPv4 without the formatting machinery).
fn write_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write;
            let _ = write!(out, "{v6}");
        }
    }
}

/// One access log line (target `tollgate::access`). The tenant and path are escaped, so a
/// hostile id cannot forge log lines.
fn access_log(
    session: &Session,
    ctx: &RequestCtx,
    route: &str,
    status: http::StatusCode,
    took: Duration,
    grpc_status: Option<&str>,
) {
    let req = session.req_header();
    let decision = match (
        ctx.admitted.denied,
        ctx.admitted.delayed,
        ctx.admitted.decision().is_none(),
    ) {
        _ if ctx.admitted.action.is_some() => ctx.admitted.action.unwrap_or("none"),
        (true, _, _) => "denied",
        (false, true, _) => "delayed",
        (false, false, true) => "none",
        (false, false, false) => "allowed",
    };
    let upstream = ctx
        .upstream
        .map_or_else(|| "-".to_string(), |a| a.to_string());
    let rule_id = |i: Option<u16>| {
        i.and_then(|i| {
            let snap = ctx.snapshot.as_ref()?;
            Some(snap.limiter.rules.get(usize::from(i))?.rule.id.as_str())
        })
        .unwrap_or("-")
    };
    let tenant = &ctx.admitted.tenant;
    // `tracing.tenant: hash`: the log names tenants as the spans do
    let hashed = ctx
        .snapshot
        .as_ref()
        .and_then(|s| s.config.tracing.as_ref())
        .is_some_and(|t| t.hash_tenant && !tenant.is_empty());
    let mut line = access_line(
        log_format::json(),
        route,
        &if hashed {
            std::borrow::Cow::Owned(trace::tenant_hash(tenant))
        } else {
            String::from_utf8_lossy(tenant)
        },
        req.method.as_str(),
        req.uri.path(),
        status.as_u16(),
        decision,
        &upstream,
        took.as_secs_f64() * 1000.0,
    );
    // (well formed: letters, digits and `-_.:/+=` only)
    if let Some(id) = ctx.request_id.as_ref().and_then(|v| v.to_str().ok()) {
        line.word("request_id", id);
    }
    // the rule that denied or held it, and a shadow rule that would have denied this tenant
    if ctx.admitted.decided_by.is_some() {
        line.word("rule", rule_id(ctx.admitted.decided_by));
    }
    if ctx.admitted.shadow_by.is_some() {
        line.word("shadow_denied_by", rule_id(ctx.admitted.shadow_by));
    }
    if let Some(code) = grpc_status {
        line.word("grpc_status", code);
    }
    log::info!(target: log_format::ACCESS, "{}", line.finish());
}

/// One access log line's first fields. The tenant and the path are quoted with every control
/// character, quote and backslash escaped (`\n`, `\"`), so that no client can end a line or
/// forge one (in JSON, as JSON strings).
#[allow(clippy::too_many_arguments)]
fn access_line(
    json: bool,
    route: &str,
    tenant: &str,
    method: &str,
    path: &str,
    status: u16,
    decision: &str,
    upstream: &str,
    latency_ms: f64,
) -> log_format::Line {
    let mut l = log_format::Line::new(json);
    l.word("route", route);
    l.quoted("tenant", tenant);
    // (a method is a token: no space, quote or control character)
    l.word("method", method);
    l.quoted("path", path);
    l.number("status", status);
    l.word("decision", decision);
    l.word("upstream", upstream);
    l.number("latency_ms", format_args!("{latency_ms:.3}"));
    l
}

/// What a request is, before its admission: a gRPC call (and its deadline), a traced one.
fn begin(req: &RequestHeader, id: Option<&HeaderValue>, ctx: &mut RequestCtx) {
    if grpc::is_grpc(&req.headers) {
        ctx.grpc = true;
        // (99999999H is a client's to send: no deadline past what an instant can hold)
        ctx.deadline = grpc::timeout(&req.headers).and_then(|t| ctx.started.checked_add(t));
    }
    if let Some(t) = trace::traces().filter(|t| t.wanted(&req.headers)) {
        ctx.trace = Some(Box::new(TraceSpans {
            request: t.server_span(req.method.as_str(), &req.headers, id),
            upstream: None,
            attempts: 0,
        }));
    }
}

impl Gateway {
    /// The admission, with its rare waits: for a token issuer's keys (then admitted again),
    /// and a hold (`delay`, the fleet's answer), a gRPC call's no longer than its deadline.
    async fn admit(
        &self,
        snap: &Snapshot,
        incoming: &Incoming<'_>,
        ctx: &mut RequestCtx,
    ) -> Admission {
        let mut admission = admission::admit(snap, incoming, &self.metrics, &mut ctx.admitted);
        // the route's `timeouts.total` bounds every wait from here on
        let total = ctx
            .admitted
            .route
            .and_then(|r| snap.config.routes.get(r))
            .and_then(|r| r.timeouts.total)
            .and_then(|t| ctx.started.checked_add(t));
        if let Some(d) = total {
            ctx.deadline = Some(ctx.deadline.map_or(d, |g| g.min(d)));
        }
        if let Admission::AwaitKeys(wait) = admission {
            // rare: a token signed with a key its issuer has just added
            Box::pin(wait.until_fetched(ctx.deadline)).await;
            admission = admission::admit(snap, incoming, &self.metrics, &mut ctx.admitted);
        }
        if let Admission::Hold(held) = admission {
            // rare: boxed, so that the request's future stays small for the common case
            let deadline = ctx.deadline;
            let wait = Box::pin(held.wait(snap, incoming, &self.metrics, &mut ctx.admitted));
            admission = match deadline {
                // a request is held no longer than its deadline (nothing is counted for it
                // until the hold ends)
                Some(d) => tokio::time::timeout_at(d, wait)
                    .await
                    .unwrap_or_else(|_| Admission::Answer(Answer::problem(504, DEADLINE_IN_HOLD))),
                None => wait.await,
            };
        }
        admission
    }

    /// A request that waits for its turn in a leaky bucket (`Admission::Queue`): forwarded
    /// when it comes; the turn goes back when the client leaves first, or when a gRPC call's
    /// deadline would pass before it (504).
    async fn take_turn(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        wait: Duration,
    ) -> Result<bool> {
        let leave = |ctx: &mut RequestCtx| {
            if let (Some(snap), Some(d)) = (&ctx.snapshot, ctx.admitted.decision_mut()) {
                snap.limiter.leave_queue(d);
            }
        };
        if ctx.deadline.is_some_and(|d| Instant::now() + wait > d) {
            leave(ctx);
            let answer = Answer::problem(504, DEADLINE_BEFORE_TURN);
            Box::pin(write_answer(session, answer, ctx)).await?;
            return Ok(true);
        }
        self.metrics.queue_waited.inc();
        if Box::pin(wait_turn(session, wait)).await {
            return Ok(false);
        }
        self.metrics.queue_left.inc();
        leave(ctx);
        Error::e_explain(
            ErrorType::ConnectionClosed,
            "the client left while it waited for its turn",
        )
    }

    /// Count a request that ended: its route, status and time, and a gRPC call's code (a call
    /// that ended with no status: the client cancelled it, or it never got one). Returns the
    /// code's name.
    fn count_done(
        &self,
        ctx: &RequestCtx,
        (route, status, took): (&str, http::StatusCode, Duration),
        (grpc_status, cancelled): (Option<u8>, bool),
    ) -> Option<&'static str> {
        match &ctx.snapshot {
            Some(s) => s.requests.done(ctx.admitted.route, status, took),
            None => {
                self.metrics
                    .requests
                    .with_label_values(&[route, status.as_str()])
                    .inc();
                self.metrics
                    .request_duration
                    .with_label_values(&[route])
                    .observe(took.as_secs_f64());
            }
        }
        let grpc_code = ctx.grpc.then(|| match grpc_status {
            Some(code) if usize::from(code) < grpc::NAMES.len() => code,
            None if cancelled => grpc::CANCELLED,
            _ => grpc::UNKNOWN,
        });
        match (&ctx.snapshot, grpc_code) {
            (Some(s), Some(code)) => s.requests.grpc_done(ctx.admitted.route, code),
            (None, Some(code)) => self
                .metrics
                .grpc_requests
                .with_label_values(&[route, grpc::NAMES[usize::from(code)]])
                .inc(),
            (_, None) => {}
        }
        grpc_code.map(|c| grpc::NAMES[usize::from(c)])
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            snapshot: None,
            admitted: Admitted::default(),
            started: Instant::now(),
            upstream: None,
            throttle_owed: Duration::ZERO,
            failures: 0,
            body_bytes: 0,
            gate: None,
            trace: None,
            grpc: false,
            deadline: None,
            answer_status: 0,
            grpc_status: None,
            request_id: None,
            pool: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        header_deadline::header_read();
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            session.set_keepalive(None);
        }
        let snap = self.shared.load_full();
        // nginx's send_timeout: a client that stops reading ends its request
        session
            .as_downstream_mut()
            .set_write_timeout(Some(snap.config.server.send_timeout));
        let req = session.req_header();
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
        // (`server.request_id: false`: none, and the client's passes as any header)
        let id = snap
            .config
            .server
            .request_id
            .then(|| request_id::of(&req.headers, peer, &snap.config.server.trusted_proxies));
        begin(req, id.as_ref(), ctx);
        ctx.request_id = id;
        let incoming = Incoming {
            head: req,
            raw_path: req.raw_path(),
            peer,
        };
        let admission = self.admit(&snap, &incoming, ctx).await;
        ctx.snapshot = Some(snap);
        let answer = match admission {
            Admission::Answer(answer) => answer,
            Admission::Queue(wait) => return self.take_turn(session, ctx, wait).await,
            // (admitted again after its one wait: never a second one, but never forwarded)
            Admission::AwaitKeys(_) => Answer::problem(401, "the bearer token is not valid"),
            Admission::Hold(_) | Admission::Forward => return Ok(false),
        };
        Box::pin(write_answer(session, answer, ctx)).await?;
        Ok(true)
    }

    /// The route's pool (of its `upstreams`, by weight and condition), then, for a shaped pool
    /// (`max_in_flight`), a place in it, by the tenant's plan priority, or a 503.
    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        let Some(pool) = choose_pool(session.req_header(), ctx) else {
            return Ok(true);
        };
        ctx.pool = Some(pool);
        let Some(snap) = &ctx.snapshot else {
            return Ok(true);
        };
        if ctx.grpc
            && snap
                .config
                .upstreams
                .get(pool)
                .is_some_and(|u| u.protocol == UpstreamProtocol::Http1)
        {
            // HTTP/1.1 cannot carry gRPC (trailers): said at once, never a hang
            Box::pin(write_answer(
                session,
                Answer::problem(500, GRPC_TO_HTTP1),
                ctx,
            ))
            .await?;
            return Ok(false);
        }
        let Some(gate) = snap.gates.get(pool).and_then(Option::as_ref) else {
            return Ok(true);
        };
        let deadline = ctx.deadline;
        let entered = enter_gate(&self.metrics, snap, pool, gate, &ctx.admitted.tenant);
        let entered = async move {
            match deadline {
                // a request waits no longer than its deadline
                Some(d) => tokio::time::timeout_at(d, entered).await.ok(),
                None => Some(entered.await),
            }
        };
        // a client that leaves while its request waits takes it out of the queue: it never
        // reaches the upstream
        let Some(entered) = Box::pin(unless_client_leaves(session, entered)).await else {
            return Error::e_explain(
                ErrorType::ConnectionClosed,
                "the client left while its request waited for the pool",
            );
        };
        let Some(entered) = entered else {
            let answer = Answer::problem(504, DEADLINE_IN_QUEUE);
            Box::pin(write_answer(session, answer, ctx)).await?;
            return Ok(false);
        };
        ctx.gate = entered;
        if ctx.gate.is_none() {
            let answer = Answer::problem(
                503,
                "the upstream is busy: its queue is full or the wait timed out",
            )
            .retry_after(crate::upstream::shaping::RETRY_AFTER.as_secs(), false);
            Box::pin(write_answer(session, answer, ctx)).await?;
            return Ok(false);
        }
        Ok(true)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.answer_status = upstream_response.status.as_u16();
        if ctx.grpc {
            // a trailers-only answer says its status in its head
            ctx.grpc_status = grpc::status_in(&upstream_response.headers);
        }
        if let Some(snap) = &ctx.snapshot {
            if let Some(decision) = ctx.admitted.decision_mut() {
                // rules that charge once the answer is known: its status, a cost its headers
                // carry (the quota headers below show the charge); those waiting for its
                // trailers (a gRPC status, `response_trailer`) are charged in
                // `upstream_response_trailer_filter`, or at its end. (An HTTP/1.1 upstream's
                // trailers: Pingora 0.9 does not pass them on.)
                snap.limiter.charge_answer(
                    decision,
                    &Answered {
                        status: ctx.answer_status,
                        grpc: ctx.grpc_status,
                        fields: &upstream_response.headers,
                        ended: ctx.grpc_status.is_some(),
                    },
                );
            }
        }
        let quota = ctx.snapshot.as_ref().zip(ctx.admitted.decision());
        // one edit of the map for all the gateway adds; with quota headers, grown once for
        // them, the request id and the `date` Pingora adds as it writes the head (a map grown
        // twice moves its entries twice)
        with_header_map(upstream_response, |h| {
            if let Some((snap, decision)) = quota {
                h.reserve(headers::QUOTA_HEADERS + 2);
                headers::apply(h, &snap.limiter, decision, snap.config.headers, false);
            }
            if let Some((cors, origin)) = cors_of(ctx) {
                cors::apply(h, cors, origin);
            }
            if let Some(id) = &ctx.request_id {
                h.insert(request_id::X_REQUEST_ID, id.clone());
            }
            route_response_changes(h, ctx);
        })?;
        Ok(())
    }

    /// The upstream's trailers (an HTTP/2 upstream's): a gRPC answer's status, and what the
    /// rules waiting for them are charged (`count_when.grpc_status`, `response_trailer`).
    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if ctx.grpc {
            ctx.grpc_status = grpc::status_in(trailers).or(ctx.grpc_status);
        }
        if let (Some(snap), Some(d)) = (&ctx.snapshot, ctx.admitted.decision_mut()) {
            snap.limiter.charge_answer(
                d,
                &Answered {
                    status: ctx.answer_status,
                    grpc: ctx.grpc_status,
                    fields: trailers,
                    ended: true,
                },
            );
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let (Some(snap), Some(route)) = (&ctx.snapshot, ctx.admitted.route) else {
            return Error::e_explain(ErrorType::InternalError, "no route selected");
        };
        let Some(pool) = snap
            .pools
            .get(ctx.pool.unwrap_or(snap.config.routes[route].upstream))
        else {
            return Error::e_explain(ErrorType::InternalError, "no pool selected");
        };
        match pool.select(&ctx.admitted.tenant) {
            Some(backend) => {
                ctx.upstream = backend.addr.as_inet().copied();
                let traced = ctx
                    .trace
                    .as_deref_mut()
                    .filter(|s| trace::recording(&s.request));
                if let (Some(t), Some(spans)) = (trace::traces(), traced) {
                    // a retry: the attempt before failed
                    if let Some(before) = spans.upstream.take() {
                        trace::end(&before, Some("the attempt failed".into()));
                    }
                    spans.attempts += 1;
                    let server = backend.addr.to_string();
                    spans.upstream = Some(t.upstream_span(&spans.request, &server, spans.attempts));
                }
                let mut peer = pool.peer(backend);
                if !timeouts(&mut peer, snap.config.routes[route].timeouts, ctx.deadline) {
                    return Error::e_explain(ErrorType::HTTPStatus(504), DEADLINE_PASSED);
                }
                Ok(Box::new(peer))
            }
            None => {
                let mut e = Error::new_up(ErrorType::ConnectNoRoute);
                e.context = Some("no healthy server in the pool".into());
                Err(e)
            }
        }
    }

    /// A connection that failed (refused, or not made within `connect_timeout`) sent nothing:
    /// the server is skipped for a while and the request goes to the next one, up to the
    /// pool's `retries`.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        ctx.failures += 1;
        let mut retries = 0;
        if let Some(pool) = pool_of(ctx) {
            if let Some(addr) = ctx.upstream {
                pool.mark_failed(addr);
            }
            retries = pool.spec.retries;
        }
        e.set_retry(ctx.failures <= retries);
        e
    }

    /// Pingora's policy after a connection was made: a request is retried only when a reused
    /// idle connection turned out closed before anything was answered, the method is
    /// idempotent and its body is still buffered. That retry counts against the pool's
    /// `retries` too.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        if !session.req_header().method.is_idempotent() || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        ctx.failures += 1;
        let retries = pool_of(ctx).map_or(0, |p| p.spec.retries);
        if ctx.failures > retries {
            e.set_retry(false);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // Hop-by-hop fields (RFC 9110 section 7.6.1, and those named in Connection) are gone
        // already: pingora's standard upstream request policy strips them and forwards a
        // WebSocket handshake's Upgrade, normalized.
        // (the client's own, unless it came through a trusted proxy: see `request_id`)
        if let Some(id) = &ctx.request_id {
            // (a static name: pingora keeps it as the header's case without copying it)
            upstream_request.insert_header("x-request-id", id.clone())?;
        }
        if let Some(snap) = &ctx.snapshot {
            tenant_headers(upstream_request, &snap.config.tenant, &ctx.admitted)?;
        }
        if ctx.grpc {
            // the deadline goes on, less the time spent here; `te: trailers` (gRPC servers
            // require it), also when an HTTP/1.1 client's was stripped as hop-by-hop
            if let Some(deadline) = ctx.deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                upstream_request.insert_header(grpc::GRPC_TIMEOUT, grpc::timeout_value(left))?;
            }
            upstream_request.insert_header(http::header::TE, TRAILERS)?;
        }
        // the trace goes on to the upstream (what the client sent is replaced)
        if let (Some(t), Some(spans)) = (trace::traces(), ctx.trace.as_deref()) {
            let cx = spans.upstream.as_ref().unwrap_or(&spans.request);
            t.inject(cx, &mut |name, value| {
                let _ = upstream_request.insert_header(name, value);
            });
        }
        if let Some(ip) = ctx.admitted.client_ip {
            // one allocation for the common case: no list yet, or a short one
            let mut xff = String::with_capacity(64);
            for v in upstream_request.headers.get_all(X_FORWARDED_FOR) {
                if let Ok(s) = v.to_str() {
                    if !xff.is_empty() {
                        xff.push_str(", ");
                    }
                    xff.push_str(s.trim());
                }
            }
            if !xff.is_empty() {
                xff.push_str(", ");
            }
            write_ip(&mut xff, ip);
            upstream_request.insert_header("x-forwarded-for", xff)?;
        }
        route_request_changes(upstream_request, ctx)
    }

    /// A body that grows past `server.max_body_bytes` ends the request with 413. The bytes of a
    /// tunnel after its `101` (WebSocket messages) are not a request body and are not counted.
    ///
    /// An empty last piece of a body (an HTTP/2 client ending it with an empty DATA frame
    /// carrying END_STREAM, as `curl -T -` does) is turned into "no data": Pingora 0.9 would
    /// write it to an HTTP/1.1 upstream as a chunk of size 0, which *is* the chunked
    /// terminator, and then write the terminator again, so the upstream reads a second request
    /// and its answer goes to whoever reuses the connection next (cloudflare/pingora#935, fixed
    /// upstream by PR #936, not released in 0.9).
    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if end_of_stream && body.as_ref().is_some_and(|b| b.is_empty()) {
            *body = None;
        }
        let max = ctx
            .snapshot
            .as_ref()
            .and_then(|s| s.config.server.max_body_bytes);
        if let (Some(max), Some(chunk), false) = (max, body.as_ref(), session.was_upgraded()) {
            ctx.body_bytes += chunk.len() as u64;
            if ctx.body_bytes > max {
                // the client's doing: Pingora stops the upstream request at once (an error of
                // no side would leave an HTTP/2 upstream's stream waiting for its answer, a
                // gRPC stream until the read timeout)
                return Err(Error::explain(
                    ErrorType::HTTPStatus(413),
                    "request body larger than server.max_body_bytes",
                )
                .into_down());
            }
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            etype => match e.esource() {
                ErrorSource::Upstream => match etype {
                    ErrorType::ConnectTimedout
                    | ErrorType::ReadTimedout
                    | ErrorType::WriteTimedout => 504,
                    _ => 502,
                },
                // a client gone, or too slow to read its answer (send_timeout): nothing to send
                ErrorSource::Downstream => match etype {
                    ErrorType::WriteError
                    | ErrorType::ReadError
                    | ErrorType::ConnectionClosed
                    | ErrorType::WriteTimedout
                    | ErrorType::H2Error => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        // an answer already begun cannot be replaced by another; a gRPC call's (over
        // HTTP/2) still gets its status, in trailers that end it
        if code > 0 && session.response_written().is_some() && ctx.grpc {
            if session.as_downstream().is_http2() {
                let mut trailers = http::HeaderMap::with_capacity(2);
                let status = grpc::status_for(code, false);
                ctx.grpc_status = Some(status);
                trailers.insert(grpc::GRPC_STATUS, HeaderValue::from(u16::from(status)));
                trailers.insert(grpc::GRPC_MESSAGE, grpc::message(failure_detail(code)));
                let end = vec![HttpTask::Trailer(Some(Box::new(trailers)))];
                if let Err(err) = session.as_downstream_mut().response_duplex_vec(end).await {
                    log::debug!("could not end the call with its status: {err}");
                }
            }
        } else if code > 0 && session.response_written().is_none() {
            let detail = failure_detail(code);
            if let Err(err) = write_answer(session, Answer::problem(code, detail), ctx).await {
                log::debug!("could not send the error answer: {err}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// `action: throttle`: each chunk of the response body waits its share of the pace (a
    /// timer; no worker thread is blocked).
    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        Ok(match (ctx.admitted.throttle_bps, body) {
            (0, _) | (_, None) => None,
            (bps, Some(b)) => pace(&mut ctx.throttle_owed, b.len(), bps),
        })
    }

    /// Errors a client causes are counted (`tollgate_client_errors_total`) and logged at debug
    /// level, never one error line each: a client could otherwise write the log at its will.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, error: &Error) -> bool {
        client_error(error).is_some()
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map_or(CLIENT_GONE, |r| r.status);
        let by_client = e.and_then(client_error);
        if let (Some(kind), Some(e)) = (by_client, e) {
            self.metrics.client_error(kind);
            log::debug!("request ended by its client ({}): {e}", kind.label());
        }
        if session.as_downstream().is_http2() {
            crate::request::edge::stream_ended(
                matches!(by_client, Some(ClientError::Reset | ClientError::Closed))
                    && ctx.started.elapsed() < crate::request::edge::PREMATURE,
            );
        }
        // a gRPC call's status: the upstream's, or that of the answer made here
        let grpc_status = if ctx.grpc {
            ctx.grpc_status.or_else(|| {
                session
                    .response_written()
                    .and_then(|r| grpc::status_in(&r.headers))
            })
        } else {
            None
        };
        // what is still owed to rules that charge after the answer (an answer the gateway
        // made itself, say a 502, or one whose trailers never came: a cost from the answer is
        // the rule's default)
        if let (Some(snap), Some(d)) = (&ctx.snapshot, ctx.admitted.decision_mut()) {
            snap.limiter.charge_answer(
                d,
                &Answered {
                    status: status.as_u16(),
                    grpc: grpc_status,
                    fields: &http::HeaderMap::new(),
                    ended: true,
                },
            );
        }
        let took = ctx.started.elapsed();
        let route = match (&ctx.snapshot, ctx.admitted.route) {
            (Some(s), Some(r)) => s.config.routes[r].id.as_str(),
            _ => "none",
        };
        let cancelled = by_client.is_some() || status == CLIENT_GONE;
        let grpc_name = self.count_done(ctx, (route, status, took), (grpc_status, cancelled));
        if ctx
            .snapshot
            .as_ref()
            .is_some_and(|s| s.config.server.access_log)
        {
            access_log(session, ctx, route, status, took, grpc_name);
        }
        if let Some(spans) = ctx.trace.take() {
            end_trace(session, ctx, *spans, route, status);
        }
    }
}

/// What an answer of `fail_to_proxy` says went wrong.
fn failure_detail(code: u16) -> &'static str {
    match code {
        502 => "the upstream service could not be reached",
        504 => "the upstream service did not answer in time",
        400 => "the request could not be read",
        413 => client_limits::BODY_TOO_LARGE,
        _ => "the gateway could not handle this request",
    }
}

/// What the client did wrong, if the error is its doing.
fn client_error(e: &Error) -> Option<ClientError> {
    if e.esource() != &ErrorSource::Downstream {
        return None;
    }
    Some(match e.etype() {
        ErrorType::HTTPStatus(_) => return None,
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => ClientError::Timeout,
        ErrorType::H2Error => ClientError::Reset,
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError => {
            ClientError::Closed
        }
        _ => ClientError::Protocol,
    })
}

/// A trace's attributes of each rule that applied: its decision, and the tier that decided
/// (the first that refused, else the first) with what it had left.
fn rule_attributes(
    a: &mut Vec<opentelemetry::KeyValue>,
    limiter: &crate::limits::Limiter,
    d: &crate::limits::Decision,
) {
    use opentelemetry::KeyValue;
    for &(rule, violated) in &d.applied {
        let Some(cr) = limiter.rules.get(usize::from(rule)) else {
            continue;
        };
        let id = &cr.rule.id;
        let tiers = || d.tiers.iter().filter(|t| t.rule == rule);
        let decided = tiers()
            .find(|t| !t.verdict.allowed)
            .or_else(|| tiers().next());
        let decision = match (violated, cr.rule.action) {
            (false, _) => "allowed",
            (true, crate::config::model::Action::Shadow) => "shadow_denied",
            (true, _) => "denied",
        };
        a.push(KeyValue::new(
            format!("tollgate.rule.{id}.decision"),
            decision,
        ));
        if let Some(t) = decided {
            let mut tier = String::new();
            crate::config::duration::write_period(&mut tier, t.period_ms, t.calendar);
            a.push(KeyValue::new(format!("tollgate.rule.{id}.tier"), tier));
            a.push(KeyValue::new(
                format!("tollgate.rule.{id}.remaining"),
                i64::try_from(t.verdict.remaining).unwrap_or(i64::MAX),
            ));
        }
    }
}

/// End a traced request's spans: the HTTP semantic conventions' attributes, the route, the
/// tenant (or its hash) and each applying rule's decision.
fn end_trace(
    session: &Session,
    ctx: &RequestCtx,
    spans: TraceSpans,
    route: &str,
    status: http::StatusCode,
) {
    use opentelemetry::KeyValue;
    let failed = status.is_server_error() || status == CLIENT_GONE;
    if let Some(up) = &spans.upstream {
        trace::end(up, failed.then(|| format!("answered {}", status.as_u16())));
    }
    if !trace::recording(&spans.request) {
        // not sampled: nothing is exported, nothing worth describing
        trace::end(&spans.request, None);
        return;
    }
    let req = session.req_header();
    let mut a = vec![
        KeyValue::new("http.request.method", req.method.as_str().to_string()),
        KeyValue::new("url.path", req.uri.path().to_string()),
        KeyValue::new("http.response.status_code", i64::from(status.as_u16())),
        KeyValue::new("tollgate.route", route.to_string()),
    ];
    if let Some(host) = req
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
    {
        a.push(KeyValue::new("server.address", host.to_string()));
    }
    if let (Some(snap), Some(r)) = (&ctx.snapshot, ctx.admitted.route) {
        a.push(KeyValue::new(
            "http.route",
            snap.config.routes[r].matcher.path.as_str().to_string(),
        ));
    }
    if !ctx.admitted.tenant.is_empty() {
        let tenant = String::from_utf8_lossy(&ctx.admitted.tenant);
        let hash = trace::traces().is_some_and(|t| t.hash_tenant);
        a.push(KeyValue::new(
            "tollgate.tenant",
            if hash {
                trace::tenant_hash(&ctx.admitted.tenant)
            } else {
                tenant.into_owned()
            },
        ));
    }
    if let (Some(snap), Some(d)) = (&ctx.snapshot, ctx.admitted.decision()) {
        rule_attributes(&mut a, &snap.limiter, d);
    }
    trace::set(&spans.request, a);
    trace::end(
        &spans.request,
        failed.then(|| format!("answered {}", status.as_u16())),
    );
}

/// Wait for a turn in a leaky bucket on a timer. Returns false when the client left first.
async fn wait_turn(session: &mut Session, wait: Duration) -> bool {
    unless_client_leaves(session, tokio::time::sleep(wait))
        .await
        .is_some()
}

/// `work`'s outcome, or `None` when the client left first: an HTTP/2 stream reset, or an
/// HTTP/1 connection closed (watched only when the request has no body, which must stay unread
/// for the upstream).
async fn unless_client_leaves<T>(
    session: &mut Session,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(work);
    if let Some(reset) = session.as_downstream_mut().watch_h2_stream_close() {
        return tokio::select! {
            done = &mut work => Some(done),
            _ = reset => None,
        };
    }
    if session.as_downstream_mut().is_body_empty() {
        tokio::select! {
            done = &mut work => return Some(done),
            read = session.as_downstream_mut().read_body_or_idle(true) => {
                if read.is_err() {
                    return None;
                }
            }
        }
    }
    Some(work.await)
}

#[cfg(test)]
mod tests {
    use super::{pace, with_header_map, write_ip};
    use http::HeaderValue;
    use pingora::http::ResponseHeader;

    #[test]
    fn editing_the_map_keeps_the_upstream_answer() {
        let mut r = ResponseHeader::build(299, Some(2)).unwrap();
        r.set_reason_phrase(Some("Fine Indeed")).unwrap();
        r.append_header("X-Upstream-Thing", "a").unwrap();
        r.append_header("Set-Cookie", "one=1").unwrap();
        r.append_header("Set-Cookie", "two=2").unwrap();
        with_header_map(&mut r, |h| {
            h.insert("x-ratelimit-limit", HeaderValue::from_static("10"));
        })
        .unwrap();
        assert_eq!(r.status, 299);
        assert_eq!(r.get_reason_phrase(), Some("Fine Indeed"));
        assert_eq!(r.headers["x-upstream-thing"], "a");
        assert_eq!(r.headers.get_all("set-cookie").iter().count(), 2);
        assert_eq!(r.headers["x-ratelimit-limit"], "10");
        let mut wire = Vec::new();
        r.header_to_h1_wire(&mut wire);
        let wire = String::from_utf8(wire).unwrap();
        assert!(wire.contains("Set-Cookie: one=1\r\n"), "{wire}");
        assert!(wire.contains("x-ratelimit-limit: 10\r\n"), "{wire}");
    }

    use std::time::Duration;

    #[test]
    fn small_chunks_are_paced_in_whole_ticks_and_nothing_is_lost() {
        // 1 KiB chunks at 10 MiB/s: ~98 us each, owed until a tick's worth
        let mut owed = Duration::ZERO;
        let waits: Vec<Option<Duration>> =
            (0..30).map(|_| pace(&mut owed, 1024, 10 << 20)).collect();
        let taken: Duration = waits.iter().flatten().sum();
        assert_eq!(waits.iter().flatten().count(), 2, "{waits:?}");
        assert!(waits
            .iter()
            .flatten()
            .all(|w| *w >= Duration::from_millis(1)));
        let total = Duration::from_secs_f64(30.0 * 1024.0 / f64::from(10 << 20));
        assert!((taken + owed).abs_diff(total) < Duration::from_micros(1));
        // a large chunk waits at once
        let mut owed = Duration::ZERO;
        assert_eq!(
            pace(&mut owed, 64 << 10, 64 << 10),
            Some(Duration::from_secs(1))
        );
    }
    use std::net::IpAddr;

    #[test]
    fn an_access_line_cannot_be_broken_or_forged() {
        let line = super::access_line(
            false,
            "all",
            "acme\n[2026] INFO tollgate::access route=all tenant=\"x\\",
            "GET",
            "/a\r\nb\u{7}",
            200,
            "allowed",
            "-",
            1.5,
        )
        .finish();
        assert!(!line.contains('\n') && !line.contains('\r'), "{line}");
        assert!(
            line.contains(r#"tenant="acme\n[2026] INFO tollgate::access route=all tenant=\"x\\""#),
            "{line}"
        );
        assert!(line.contains(r#"path="/a\r\nb\u{7}""#), "{line}");
        assert_eq!(line.matches("tenant=\"").count(), 1, "{line}");
    }

    #[test]
    fn addresses_are_written_as_std_writes_them() {
        for a in [
            "0.0.0.0",
            "10.1.20.255",
            "127.0.0.1",
            "192.168.100.9",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = a.parse().unwrap();
            let mut s = String::from("x");
            write_ip(&mut s, ip);
            assert_eq!(s, format!("x{ip}"));
        }
    }
}
