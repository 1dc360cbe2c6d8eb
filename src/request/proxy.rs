//! The request path, phase by phase (pingora's `ProxyHttp`):
//!
//! 1. `request_filter`: load the config snapshot, normalize the path, match the route (404),
//!    find the client address and the tenant (401), and take the rate-limit decision (429/503,
//!    or a delay).
//! 2. `upstream_peer`: pick a server of the route's pool.
//! 3. `upstream_request_filter`: strip hop-by-hop headers, set the tenant header, append
//!    X-Forwarded-For.
//! 4. `response_filter`: the quota headers.
//! 5. `fail_to_proxy`: problem+json for upstream failures (502, 504) and bad requests.
//! 6. `logging`: metrics.

use crate::limits::headers;
use crate::limits::{Decision, LimitRequest, Verdict};
use crate::matching::{normalize_path, Segments};
use crate::metrics::Metrics;
use crate::problem;
use crate::request::client_addr::{client_ip, X_FORWARDED_FOR};
use crate::request::client_limits;
use crate::request::header_deadline;
use crate::request::routing::find_route;
use crate::request::tenant::{self, RequestFacts, Resolved};
use crate::snapshot::{SharedSnapshot, Snapshot};
use async_trait::async_trait;
use http::header::{self, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Per-request state carried across phases.
pub struct RequestCtx {
    snapshot: Option<Arc<Snapshot>>,
    route: Option<usize>,
    tenant: Vec<u8>,
    client_ip: Option<IpAddr>,
    /// The rate-limit decision when a rule applied, for the response headers (boxed: the
    /// context is moved with pingora's request future, and most of its size would be this).
    decision: Option<Box<Decision>>,
    /// For the access log.
    started: Instant,
    upstream: Option<std::net::SocketAddr>,
    delayed: bool,
    denied: bool,
    /// For the access log: `shadowbanned` or `throttled` (the actions that do not deny).
    action: Option<&'static str>,
    /// `action: throttle`: the response body's pace, bytes per second (0: not paced), and the
    /// wait owed but not yet taken.
    throttle_bps: u64,
    throttle_owed: Duration,
    /// Failed attempts to reach an upstream for this request (retries stop at the pool's
    /// `retries`).
    failures: usize,
    /// Request body bytes seen so far (counted only with `server.max_body_bytes`).
    body_bytes: u64,
    /// For the access log: the rule that denied or held the request, and a shadow rule that
    /// would have denied it (indexes into the snapshot's limiter).
    decided_by: Option<u16>,
    shadow_by: Option<u16>,
    /// Slots of `concurrency` limits, freed when the request is done (the context dropped).
    slots: smallvec::SmallVec<[crate::limits::in_flight::Slot; 1]>,
    /// The place in a shaped pool, handed to the next waiter when the request is done.
    gate: Option<crate::upstream::shaping::GateSlot>,
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

/// `action: delay`, and requests held for the fleet: wait while the decision says so, up to
/// `max_delay` (then reject); a held request waits while rounds keep ending (each round that
/// ends gives it the fleet's hold limit again, up to four in all), then `decide_after_hold`
/// (`on_failure` if Redis did not answer meanwhile; refused if an answer could not grant it;
/// else its part of what the last answer left). Returns the last decision
/// and whether the request waited for `action: delay`.
async fn hold(
    limiter: &crate::limits::Limiter,
    lreq: &LimitRequest<'_>,
    plans: &crate::config::model::Plans,
    mut d: Decision,
) -> (Decision, bool) {
    let mut delayed = false;
    let start = Instant::now();
    let patience = Duration::from_millis(limiter.fleet.hold_ms());
    let mut held_until = start + patience;
    let mut delay_until = None;
    loop {
        let wake = match d.verdict {
            Verdict::Delay {
                wait_ms,
                max_delay_ms,
                status,
            } => {
                let deadline =
                    *delay_until.get_or_insert(start + Duration::from_millis(max_delay_ms));
                let wake = Instant::now() + Duration::from_millis(wait_ms.max(1));
                if wake > deadline {
                    d.verdict = Verdict::Reject { status };
                    break;
                }
                delayed = true;
                wake
            }
            Verdict::Hold => held_until,
            _ => break,
        };
        // until room can appear: the refill time, or the end of the sync round that may
        // grant this instance more (a held request never polls the decision)
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = limiter.fleet.next_round() => {
                // Redis is answering (slowly, on a busy machine): wait on
                held_until = (Instant::now() + patience).min(start + 4 * patience);
            }
        }
        d = match d.verdict {
            Verdict::Hold if Instant::now() >= held_until => limiter.decide_after_hold(lreq, plans),
            Verdict::Hold => limiter.decide_again(lreq, plans),
            _ => limiter.decide(lreq, plans),
        };
    }
    (d, delayed)
}

/// Get into a shaped pool (`max_in_flight`): the slot goes into `ctx` (freed when the request is
/// done). Returns whether the request is refused (a full queue, or it waited too long).
async fn enter_gate(
    metrics: &Metrics,
    snap: &Snapshot,
    pool: usize,
    gate: &Arc<crate::upstream::shaping::Gate>,
    ctx: &mut RequestCtx,
) -> Result<bool> {
    let tenant = &ctx.tenant[..];
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
            ctx.gate = Some(slot);
            if waited {
                let plan_name = plan
                    .and_then(|p| plans.names.get(p))
                    .map_or("none", String::as_str);
                metrics
                    .queue_waits
                    .with_label_values(&[name, plan_name])
                    .inc();
            }
            Ok(false)
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
            Ok(true)
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

/// `Retry-After` of a denial, and the seed's `X-Ratelimit-Retry-After` beside it (with the
/// `x_ratelimit` header family).
fn retry_after(
    resp: &mut ResponseHeader,
    secs: u64,
    families: crate::config::model::HeaderSettings,
) -> Result<()> {
    resp.insert_header("retry-after", HeaderValue::from(secs))?;
    if families.x_ratelimit {
        resp.insert_header("x-ratelimit-retry-after", HeaderValue::from(secs))?;
    }
    Ok(())
}

/// Send a whole answer made here (a denial).
async fn send(session: &mut Session, resp: ResponseHeader, body: bytes::Bytes) -> Result<()> {
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
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
) {
    let req = session.req_header();
    let decision = match (ctx.denied, ctx.delayed, ctx.decision.is_none()) {
        _ if ctx.action.is_some() => ctx.action.unwrap_or("none"),
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
    let mut line = access_line(
        route,
        &ctx.tenant,
        req.method.as_str(),
        req.uri.path(),
        status.as_u16(),
        decision,
        &upstream,
        took.as_secs_f64() * 1000.0,
    );
    // the rule that denied or held it, and a shadow rule that would have denied this tenant
    if ctx.decided_by.is_some() {
        line.push_str(" rule=");
        line.push_str(rule_id(ctx.decided_by));
    }
    if ctx.shadow_by.is_some() {
        line.push_str(" shadow_denied_by=");
        line.push_str(rule_id(ctx.shadow_by));
    }
    log::info!(target: "tollgate::access", "{line}");
}

/// One access log line. The tenant and the path are quoted with every control character,
/// quote and backslash escaped (`\n`, `\"`), so that no client can end a line or forge one.
#[allow(clippy::too_many_arguments)]
fn access_line(
    route: &str,
    tenant: &[u8],
    method: &str,
    path: &str,
    status: u16,
    decision: &str,
    upstream: &str,
    latency_ms: f64,
) -> String {
    format!(
        "route={route} tenant=\"{}\" method={} path=\"{}\" status={status} decision={decision} upstream={upstream} latency_ms={latency_ms:.3}",
        String::from_utf8_lossy(tenant).escape_debug(),
        method.escape_debug(),
        path.escape_debug(),
    )
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            snapshot: None,
            route: None,
            tenant: Vec::new(),
            client_ip: None,
            decision: None,
            failures: 0,
            body_bytes: 0,
            decided_by: None,
            shadow_by: None,
            started: Instant::now(),
            upstream: None,
            delayed: false,
            denied: false,
            action: None,
            throttle_bps: 0,
            throttle_owed: Duration::ZERO,
            slots: smallvec::SmallVec::new(),
            gate: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        header_deadline::header_read();
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            session.set_keepalive(None);
        }
        let snap = self.shared.load_full();
        let cfg = &snap.config;
        let req = session.req_header();
        let path = normalize_path(req.uri.path());
        let host = req
            .headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| req.uri.host());

        let segments = Segments::new(&path);
        let found = find_route(&cfg.routes, &req.method, host, &segments);
        // a refused request is counted and logged under the route it matched, if any
        if let Some((status, detail)) = client_limits::refuse(req, &cfg.server) {
            ctx.route = found.map(|(i, _)| i);
            drop(segments);
            drop(path);
            ctx.snapshot = Some(snap);
            session.set_keepalive(None);
            Box::pin(problem::respond(session, status, detail)).await?;
            return Ok(true);
        }
        let Some((route_idx, route)) = found else {
            ctx.snapshot = Some(snap);
            Box::pin(problem::respond(
                session,
                404,
                "no route matches this request",
            ))
            .await?;
            return Ok(true);
        };

        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let client = client_ip(
            peer,
            req.headers
                .get_all(X_FORWARDED_FOR)
                .iter()
                .map(|v| v.as_bytes()),
            &cfg.server.trusted_proxies,
        );
        let facts = RequestFacts {
            headers: &req.headers,
            normalized_path: &path,
            client_ip: client,
            from_trusted_proxy: crate::request::client_addr::trusted(
                peer,
                &cfg.server.trusted_proxies,
            ),
        };
        let resolved = tenant::resolve(&cfg.tenant, route.tenant, &facts);
        ctx.route = Some(route_idx);
        ctx.client_ip = Some(client);
        let tenant = match resolved {
            Resolved::Tenant(t) => t,
            // no tenant: per-tenant rules skip the request (an empty id is never a tenant)
            Resolved::NotAsked => Vec::new(),
            Resolved::UnknownKey | Resolved::Missing => {
                drop(segments);
                drop(path);
                ctx.snapshot = Some(snap);
                let detail = if resolved == Resolved::UnknownKey {
                    "the API key is not valid"
                } else {
                    "this request does not identify a tenant"
                };
                Box::pin(problem::respond(session, 401, detail)).await?;
                return Ok(true);
            }
        };

        // The rate-limit decision; `delay` waits on a timer, never blocking a worker thread.
        let limiter = &snap.limiter;
        let mut delayed = false;
        let decision = if limiter.is_empty() {
            Decision::none()
        } else {
            let lreq = LimitRequest {
                method: &req.method,
                host,
                path: &segments,
                tenant: &tenant,
                client_ip: client,
                headers: &req.headers,
            };
            // requests in flight first: a request refused there spends no rate quota
            if !limiter.concurrency.is_empty() {
                match limiter.acquire(&lreq) {
                    Ok(slots) => ctx.slots = slots,
                    Err(refusal) => {
                        drop(segments);
                        drop(path);
                        ctx.tenant = tenant;
                        ctx.denied = true;
                        let detail = format!(
                            "too many requests in flight: concurrency limit {} is {}",
                            limiter.concurrency[refusal.rule].rule.id, refusal.max
                        );
                        let body = problem::plain(refusal.status, &detail);
                        let mut resp = problem::header(refusal.status, body.len())?;
                        retry_after(&mut resp, 1, cfg.headers)?;
                        ctx.snapshot = Some(snap);
                        Box::pin(send(session, resp, body)).await?;
                        return Ok(true);
                    }
                }
            }
            let t0 = Instant::now();
            let d = limiter.decide(&lreq, &cfg.plans);
            self.metrics
                .decision_duration
                .observe(t0.elapsed().as_secs_f64());
            if d.verdict == Verdict::Hold {
                self.metrics.fleet_held.inc();
            }
            if let Verdict::Delay { .. } | Verdict::Hold = d.verdict {
                // rare: boxed, so that the request's future stays small for the common case
                let held;
                (held, delayed) = Box::pin(hold(limiter, &lreq, &cfg.plans, d)).await;
                held
            } else {
                d
            }
        };
        drop(segments);
        drop(path);
        ctx.tenant = tenant;
        ctx.delayed = delayed;
        let admitted = decision.verdict.admits();
        limiter.record(&decision, admitted, delayed);
        if !decision.applied.is_empty() && cfg.server.access_log {
            (ctx.decided_by, ctx.shadow_by) = decision.deciding_rules(limiter);
        }
        if let Verdict::Reject { status } = decision.verdict {
            ctx.denied = true;
            let body = headers::denial_body(limiter, &decision, status);
            let mut resp = problem::header(status, body.len())?;
            headers::apply(&mut resp, limiter, &decision, cfg.headers, true)?;
            retry_after(&mut resp, headers::retry_after_secs(&decision), cfg.headers)?;
            ctx.snapshot = Some(snap);
            Box::pin(send(session, resp, body)).await?;
            return Ok(true);
        }
        if let Verdict::Shadowban { rule } = decision.verdict {
            // the rule's own answer, as if served: no upstream, no quota headers
            ctx.action = Some("shadowbanned");
            let reply = limiter
                .rules
                .get(usize::from(rule))
                .and_then(|cr| cr.rule.shadowban.clone());
            if let Some(reply) = reply {
                ctx.snapshot = Some(snap);
                let mut resp = ResponseHeader::build(reply.status, Some(2))?;
                resp.insert_header(header::CONTENT_TYPE, reply.content_type.as_str())?;
                resp.insert_header(header::CONTENT_LENGTH, reply.body.len())?;
                Box::pin(send(session, resp, reply.body.clone())).await?;
                return Ok(true);
            }
        }
        if let Verdict::Throttle { bytes_per_sec } = decision.verdict {
            ctx.action = Some("throttled");
            ctx.throttle_bps = bytes_per_sec;
        }
        if !decision.tiers.is_empty() {
            ctx.decision = Some(Box::new(decision));
        }
        // a shaped pool: wait for a place, by the tenant's plan priority
        let pool = route.upstream;
        if let Some(gate) = snap.gates.get(pool).and_then(Option::clone) {
            if Box::pin(enter_gate(&self.metrics, &snap, pool, &gate, ctx)).await? {
                ctx.snapshot = Some(snap);
                Box::pin(problem::respond_retry(
                    session,
                    503,
                    "the upstream is busy: its queue is full or the wait timed out",
                    crate::upstream::shaping::RETRY_AFTER.as_secs(),
                ))
                .await?;
                return Ok(true);
            }
        }
        ctx.snapshot = Some(snap);
        Ok(false)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(snap) = &ctx.snapshot {
            if let Some(decision) = &ctx.decision {
                headers::apply(
                    upstream_response,
                    &snap.limiter,
                    decision,
                    snap.config.headers,
                    false,
                )?;
            }
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let (Some(snap), Some(route)) = (&ctx.snapshot, ctx.route) else {
            return Error::e_explain(ErrorType::InternalError, "no route selected");
        };
        let pool = &snap.pools[snap.config.routes[route].upstream];
        match pool.select(&ctx.tenant) {
            Some(backend) => {
                ctx.upstream = backend.addr.as_inet().copied();
                Ok(Box::new(pool.peer(backend)))
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
        if let (Some(snap), Some(route)) = (&ctx.snapshot, ctx.route) {
            let pool = &snap.pools[snap.config.routes[route].upstream];
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
        let retries = match (&ctx.snapshot, ctx.route) {
            (Some(snap), Some(route)) => {
                snap.pools[snap.config.routes[route].upstream].spec.retries
            }
            _ => 0,
        };
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
        if let Some(snap) = &ctx.snapshot {
            let t = &snap.config.tenant;
            // API keys stay here (`api_key.hide`)
            for h in &t.hidden {
                upstream_request.remove_header(h);
            }
            // inserting replaces whatever the client sent under that name
            match &t.forward_header {
                Some(name) if ctx.tenant.is_empty() => {
                    // `tenant: none`: no tenant to forward, and no client copy either
                    upstream_request.remove_header(name);
                }
                Some(name) => match HeaderValue::from_bytes(&ctx.tenant) {
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
        }
        if let Some(ip) = ctx.client_ip {
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
        Ok(())
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
                return Error::e_explain(
                    ErrorType::HTTPStatus(413),
                    "request body larger than server.max_body_bytes",
                );
            }
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
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
                ErrorSource::Downstream => match etype {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        if code > 0 {
            let detail = match code {
                502 => "the upstream service could not be reached",
                504 => "the upstream service did not answer in time",
                400 => "the request could not be read",
                413 => client_limits::BODY_TOO_LARGE,
                _ => "the gateway could not handle this request",
            };
            if let Err(err) = problem::respond(session, code, detail).await {
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
        Ok(match (ctx.throttle_bps, body) {
            (0, _) | (_, None) => None,
            (bps, Some(b)) => pace(&mut ctx.throttle_owed, b.len(), bps),
        })
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map_or(CLIENT_GONE, |r| r.status);
        let took = ctx.started.elapsed();
        let route = match (&ctx.snapshot, ctx.route) {
            (Some(s), Some(r)) => s.config.routes[r].id.as_str(),
            _ => "none",
        };
        match &ctx.snapshot {
            Some(s) => s.requests.done(ctx.route, status, took),
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
        if ctx
            .snapshot
            .as_ref()
            .is_some_and(|s| s.config.server.access_log)
        {
            access_log(session, ctx, route, status, took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pace, write_ip};
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
            "all",
            b"acme\n[2026] INFO tollgate::access route=all tenant=\"x\\",
            "GET",
            "/a\r\nb\u{7}",
            200,
            "allowed",
            "-",
            1.5,
        );
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
