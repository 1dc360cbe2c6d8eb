//! The admission of one request, knowing nothing of Pingora: every rule of who is asked, which
//! route, which tenant, which limits and which answer, in the order a request meets them:
//!
//! 1. what a client may send (`client_limits`: 400, 431, 413; the connection is then closed),
//! 2. the quota endpoint (`quota`: answered here, spending nothing), else the route (404),
//! 3. the client address (`incoming`, through trusted proxies), the route's access list
//!    (`allow`, `deny`: 403), and the tenant (`tenant`: 401),
//! 4. requests in flight (`concurrency`: 429 or the rule's status, spending no rate quota),
//! 5. the rate limits: check then commit on every tier of every applying rule (not those that
//!    exempt the request); `delay` and requests held for the fleet's answer wait
//!    ([`Admission::Hold`], then [`Held::wait`]),
//! 6. the action: reject (429 with the quota headers), shadowban (the rule's own reply),
//!    throttle (forwarded, its body paced), or forward, at once or when its turn in a leaky
//!    bucket comes ([`Admission::Queue`]).
//!
//! [`admit`] takes the snapshot and the request's facts; the Pingora adapter (`proxy`) only
//! reads the facts from the session, writes the [`Answer`] and keeps [`Admitted`] for the later
//! phases (headers, upstream, logging).

use crate::limits::headers;
use crate::limits::{Decision, LimitRequest, Limiter, Verdict};
use crate::matching::{normalize_path, Segments};
use crate::metrics::Metrics;
use crate::request::answer::Answer;
use crate::request::client_limits;
use crate::request::cors;
pub use crate::request::incoming::Incoming;
use crate::request::incoming::{client_ip, tenant_of, NoTenant};
use crate::request::quota;
use crate::request::routing::find_route;
use crate::snapshot::Snapshot;
use smallvec::SmallVec;
use std::net::IpAddr;
use std::ops::ControlFlow;
use std::time::Duration;
use tollgate_limits::clock::NANOS_PER_MS;
use tollgate_limits::in_flight::Slot;

/// What the later phases need of a request once admitted or answered: the route and tenant,
/// the decision (for the quota headers), the slots of `concurrency` limits (freed when it is
/// dropped), and what the access log says of it.
#[derive(Default)]
pub struct Admitted {
    /// Index into `config.routes`: the route the request matched, if any (a refused request
    /// is counted and logged under it).
    pub route: Option<usize>,
    /// Empty when the route does not look for tenants (per-tenant rules skip the request).
    pub tenant: Vec<u8>,
    /// The verified token that named the tenant: its plan, the claims the upstream is told.
    pub token: Option<std::sync::Arc<crate::tokens::Verified>>,
    /// The request waited once for its token issuer's keys to be fetched again.
    pub keys_awaited: bool,
    pub client_ip: Option<IpAddr>,
    /// The rate-limit decision, written in place by the limiter (no move); what the later
    /// phases read when a tier applied and the request went on ([`Admitted::decision`]).
    /// Boxed: the request's context is moved with Pingora's request future, and most of its
    /// size would be this.
    outcome: Option<Box<Decision>>,
    /// `outcome` is the request's decision: a tier applied, and it was not answered here.
    decided: bool,
    /// The request waited for `action: delay`.
    pub delayed: bool,
    /// A limit refused it.
    pub denied: bool,
    /// `shadowbanned` or `throttled` (the actions that do not deny).
    pub action: Option<&'static str>,
    /// `action: throttle`: the response body's pace in bytes per second (0: not paced).
    pub throttle_bps: u64,
    /// The rule that denied or held the request, and a shadow rule that would have denied it
    /// (indexes into the snapshot's limiter; with `server.access_log`).
    pub decided_by: Option<u16>,
    pub shadow_by: Option<u16>,
    pub slots: SmallVec<[Slot; 1]>,
    /// The `Origin` of a page that may call the route (`cors`): its answer says so.
    pub origin: Option<http::HeaderValue>,
}

/// A request's context gives its decision's box back for this thread's next request.
impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(b) = self.outcome.take() {
            spare::give_back(b);
        }
    }
}

/// Decisions' boxes kept for the next requests of the thread: once warm, deciding allocates
/// nothing (a box, its tier lists' room, kept; `Limiter::decide_into` clears it).
mod spare {
    use std::cell::RefCell;
    use tollgate_limits::decision::Decision;

    /// The most boxes one thread keeps (a request being decided holds one).
    const MOST: usize = 64;

    thread_local! {
        // the boxes themselves are what is kept (a request's context holds one)
        #[allow(clippy::vec_box)]
        static SPARE: RefCell<Vec<Box<Decision>>> = const { RefCell::new(Vec::new()) };
    }

    pub fn take() -> Box<Decision> {
        SPARE
            .try_with(|s| s.try_borrow_mut().ok()?.pop())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    pub fn give_back(b: Box<Decision>) {
        let _ = SPARE.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                if s.len() < MOST {
                    s.push(b);
                }
            }
        });
    }
}

impl Admitted {
    /// The rate-limit decision of a request that went on (forwarded, throttled or queued)
    /// with a tier applying: what its quota headers, late charges and trace read.
    pub fn decision(&self) -> Option<&Decision> {
        self.outcome.as_deref().filter(|_| self.decided)
    }

    pub fn decision_mut(&mut self) -> Option<&mut Decision> {
        self.outcome.as_deref_mut().filter(|_| self.decided)
    }
}

/// What to do with a request.
#[derive(Debug)]
pub enum Admission {
    /// Answer it here; nothing reaches an upstream.
    Answer(Answer),
    /// Wait (`action: delay`, or held for the fleet's next answer), then [`Held::wait`].
    Hold(Held),
    /// Proxy it to its route's pool.
    Forward,
    /// Its token names a key its issuer's keys lack, which are being fetched: wait for the
    /// fetch (at most `KEYS_WAIT`), then admit it again (it is refused if the key is still
    /// unknown).
    AwaitKeys(crate::tokens::KeyWait),
    /// Proxy it once its turn in a leaky bucket comes, this long from now; if the client
    /// leaves first, give the turn back (`Limiter::leave_queue`).
    Queue(Duration),
}

/// A request that waits before its decision is final.
#[derive(Debug)]
pub struct Held {
    decision: Box<Decision>,
}

/// Decide what happens to a request. Synchronous: a request that must wait comes back as
/// [`Admission::Hold`].
pub fn admit(
    snap: &Snapshot,
    req: &Incoming<'_>,
    metrics: &Metrics,
    admitted: &mut Admitted,
) -> Admission {
    let cfg = &snap.config;
    let head = req.head;
    let path = normalize_path(head.uri.path());
    let host = req.host();
    let segments = Segments::new(&path);
    let found = find_route(&cfg.routes, &head.method, host, &segments);
    admitted.route = found.map(|(i, _)| i);
    if let Some((status, detail)) = client_limits::refuse(head, req.raw_path, &cfg.server) {
        return Admission::Answer(Answer::problem(status, detail).closing());
    }
    if cfg.server.quota_endpoint.as_deref() == Some(&*path) && head.method == http::Method::GET {
        // answered here, by no route: counted and logged as `route="none"`
        admitted.route = None;
        let q = quota::answer(snap, req, &path, metrics);
        admitted.client_ip = Some(q.client_ip);
        (admitted.tenant, admitted.denied) = (q.tenant, q.refused);
        return Admission::Answer(q.answer);
    }
    if let Some((i, answer)) = cors::preflight(&cfg.routes, head, host, &segments) {
        // a browser's preflight: answered here, for no tenant, counted by no limit
        admitted.route = Some(i);
        return Admission::Answer(answer);
    }
    let Some((_, route)) = found else {
        return Admission::Answer(Answer::problem(404, "no route matches this request"));
    };
    admitted.origin = cors::origin_of(route, head);
    let client = client_ip(req, cfg);
    admitted.client_ip = Some(client);
    if route.access.as_ref().is_some_and(|a| !a.permits(client)) {
        return Admission::Answer(Answer::problem(
            403,
            "this client address may not use this route",
        ));
    }
    (admitted.tenant, admitted.token) = match tenant_of(snap, route.tenant, req, &path, client) {
        Ok(found) => found,
        Err(NoTenant {
            wait: Some(keys), ..
        }) if !admitted.keys_awaited => {
            admitted.keys_awaited = true;
            return Admission::AwaitKeys(keys);
        }
        Err(no) => return Admission::Answer(no.answer(metrics)),
    };
    let lreq = LimitRequest {
        method: &head.method,
        host,
        path: &segments,
        tenant: &admitted.tenant,
        plan: admitted.token.as_ref().and_then(|t| t.plan),
        client_ip: client,
        headers: &head.headers,
    };
    match limit(
        snap,
        &lreq,
        metrics,
        &mut admitted.slots,
        &mut admitted.denied,
        &mut admitted.outcome,
    ) {
        ControlFlow::Break(admission) => admission,
        ControlFlow::Continue(()) => finish(snap, admitted, false),
    }
}

/// Requests in flight, then the rate limits' first decision, written to `outcome` (boxed once
/// per request): an answer or a hold (`Break`, the decision moving with the hold), or a
/// decision to finish with (`Continue`).
fn limit(
    snap: &Snapshot,
    lreq: &LimitRequest<'_>,
    metrics: &Metrics,
    slots: &mut SmallVec<[Slot; 1]>,
    denied: &mut bool,
    outcome: &mut Option<Box<Decision>>,
) -> ControlFlow<Admission> {
    let limiter = &snap.limiter;
    if limiter.is_empty() {
        return ControlFlow::Continue(());
    }
    // a cost header over a rule's max is a bad request, whatever the quota
    if let Some(detail) = limiter.cost_refusal(lreq) {
        return ControlFlow::Break(Admission::Answer(Answer::problem(400, &detail)));
    }
    // requests in flight first: a request refused there spends no rate quota
    if !limiter.concurrency.is_empty() {
        match limiter.acquire(lreq, &snap.config.plans) {
            Ok(s) => *slots = s,
            Err(refusal) => {
                *denied = true;
                let detail = format!(
                    "too many requests in flight: concurrency limit {} is {}",
                    limiter.concurrency[refusal.rule].rule.id, refusal.max
                );
                let x_ratelimit = snap.config.headers.x_ratelimit;
                return ControlFlow::Break(Admission::Answer(
                    Answer::problem(refusal.status, &detail)
                        .retry_after(1, x_ratelimit)
                        .by_limit(),
                ));
            }
        }
    }
    let d = outcome.get_or_insert_with(spare::take);
    let took_ns = limiter.decide_into(lreq, &snap.config.plans, d);
    metrics
        .decision_duration
        .observe(Duration::from_nanos(took_ns).as_secs_f64());
    match d.verdict {
        Verdict::Hold | Verdict::Delay { .. } => {
            if d.verdict == Verdict::Hold {
                metrics.fleet_held.inc();
            }
            match outcome.take() {
                Some(decision) => ControlFlow::Break(Admission::Hold(Held { decision })),
                None => ControlFlow::Continue(()),
            }
        }
        _ => ControlFlow::Continue(()),
    }
}

impl Held {
    /// `action: delay`, and requests held for the fleet: wait while the decision says so, up
    /// to `max_delay` (then reject); a held request waits while rounds keep ending (each round
    /// that ends gives it the fleet's hold limit again, up to four in all), then
    /// `decide_after_hold` (`on_failure` if Redis did not answer meanwhile; refused if an
    /// answer could not grant it; else its part of what the last answer left). Waits on
    /// timers, never blocking a worker thread.
    pub async fn wait(
        self,
        snap: &Snapshot,
        req: &Incoming<'_>,
        metrics: &Metrics,
        admitted: &mut Admitted,
    ) -> Admission {
        let path = normalize_path(req.head.uri.path());
        let segments = Segments::new(&path);
        let lreq = LimitRequest {
            method: &req.head.method,
            host: req.host(),
            path: &segments,
            tenant: &admitted.tenant,
            plan: admitted.token.as_ref().and_then(|t| t.plan),
            client_ip: admitted.client_ip.unwrap_or(req.peer),
            headers: &req.head.headers,
        };
        let (d, delayed, held_ns) =
            hold(&snap.limiter, &lreq, &snap.config.plans, *self.decision).await;
        if let Some(ns) = held_ns {
            metrics
                .fleet_hold
                .observe(Duration::from_nanos(ns).as_secs_f64());
        }
        admitted.outcome = Some(Box::new(d));
        finish(snap, admitted, delayed)
    }
}

/// The wait of [`Held::wait`]. Returns the last decision, whether the request waited for
/// `action: delay`, and how long it was held for the fleet (from its first hold; none: never).
async fn hold(
    limiter: &Limiter,
    lreq: &LimitRequest<'_>,
    plans: &crate::config::model::Plans,
    mut d: Decision,
) -> (Decision, bool, Option<u64>) {
    let mut delayed = false;
    // every instant here is the limiter's clock (ns), and so are the waits
    let clock = limiter.core.clock();
    let start = clock.now_ns();
    let patience = limiter.fleet.hold_ms().saturating_mul(NANOS_PER_MS);
    let mut held_until = start.saturating_add(patience);
    let mut delay_until = None;
    let mut held_since = None;
    loop {
        let wake = match d.verdict {
            Verdict::Delay {
                wait_ms,
                max_delay_ms,
                status,
            } => {
                let deadline = *delay_until
                    .get_or_insert(start.saturating_add(max_delay_ms.saturating_mul(NANOS_PER_MS)));
                let wake = clock
                    .now_ns()
                    .saturating_add(wait_ms.max(1).saturating_mul(NANOS_PER_MS));
                if wake > deadline {
                    d.verdict = Verdict::Reject { status };
                    break;
                }
                delayed = true;
                wake
            }
            Verdict::Hold => {
                held_since.get_or_insert_with(|| clock.now_ns());
                held_until
            }
            _ => break,
        };
        // until room can appear: the refill time, or the end of the sync round that may
        // grant this instance more (a held request never polls the decision)
        tokio::select! {
            _ = clock.sleep_until(wake) => {}
            _ = limiter.fleet.next_round() => {
                // Redis is answering (slowly, on a busy machine): wait on
                held_until = clock
                    .now_ns()
                    .saturating_add(patience)
                    .min(start.saturating_add(patience.saturating_mul(4)));
            }
        }
        d = match d.verdict {
            Verdict::Hold if clock.now_ns() >= held_until => limiter.decide_after_hold(lreq, plans),
            Verdict::Hold => limiter.decide_again(lreq, plans),
            _ => limiter.decide(lreq, plans),
        };
    }
    let held_ns = held_since.map(|t| clock.now_ns().saturating_sub(t));
    (d, delayed, held_ns)
}

/// The final decision (`admitted.outcome`): counted, then the answer of its action.
fn finish(snap: &Snapshot, admitted: &mut Admitted, delayed: bool) -> Admission {
    let limiter = &snap.limiter;
    let cfg = &snap.config;
    admitted.delayed = delayed;
    admitted.decided = false;
    let Some(d) = admitted.outcome.as_deref() else {
        // no rule limits anything
        return Admission::Forward;
    };
    limiter.record(d, d.verdict.admits(), delayed);
    if !d.applied.is_empty() && cfg.server.access_log {
        (admitted.decided_by, admitted.shadow_by) = limiter.deciding_rules(d);
    }
    match d.verdict {
        Verdict::Reject { status } => {
            admitted.denied = true;
            let mut answer = Answer::problem_body(status, headers::denial_body(limiter, d, status));
            headers::apply(&mut answer.headers, limiter, d, cfg.headers, true);
            let answer = answer.retry_after(headers::retry_after_secs(d), cfg.headers.x_ratelimit);
            // Redis out of reach under `on_failure: deny` is no limit's refusal (UNAVAILABLE
            // to a gRPC client, not RESOURCE_EXHAUSTED)
            return Admission::Answer(if headers::limit_exceeded(d) {
                answer.by_limit()
            } else {
                answer
            });
        }
        Verdict::Shadowban { rule } => {
            // the rule's own answer, as if served: no upstream, no quota headers
            admitted.action = Some("shadowbanned");
            let reply = limiter
                .rules
                .get(usize::from(rule))
                .and_then(|cr| cr.rule.shadowban.as_ref());
            if let Some(r) = reply {
                return Admission::Answer(Answer::reply(r.status, &r.content_type, r.body.clone()));
            }
        }
        Verdict::Throttle { bytes_per_sec } => {
            admitted.action = Some("throttled");
            admitted.throttle_bps = bytes_per_sec;
        }
        _ => {}
    }
    let wait = Duration::from_nanos(d.wait_ns);
    admitted.decided = !d.tiers.is_empty();
    if wait.is_zero() {
        Admission::Forward
    } else {
        Admission::Queue(wait)
    }
}
