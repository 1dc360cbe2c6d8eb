//! The edge: what happens to a client connection around Pingora's HTTP proxy, from the moment it
//! is accepted. Pingora's own connection loop is replaced here (its knobs cover neither a
//! preface timeout nor HTTP/2 stream budgets), so every limit a hostile client meets first is in
//! this file:
//!
//! - each connection is counted against its listener's `max_connections` (and
//!   `max_connections_per_ip`; TLS listeners count before the handshake: `connections`);
//! - with `h2c`, the HTTP/2 preface must arrive within `client_header_timeout`, and so must the
//!   HTTP/2 handshake on any listener;
//! - HTTP/1: pipelining kept on, the client header deadline around each request
//!   ([`HeaderDeadline`]), `keepalive_timeout` between requests;
//! - HTTP/2: at most `max_concurrent_streams` streams; streams started past
//!   `max_streams_per_second` are refused (REFUSED_STREAM); a client that resets more than
//!   `max_premature_resets` streams before their answer, within [`PREMATURE`] of their start,
//!   and at least half of its streams so, gets GOAWAY (ENHANCE_YOUR_CALM) and the connection
//!   closes, ending the work of its streams still in flight; a connection with no stream open for
//!   `keepalive_timeout` is closed;
//! - at shutdown, kept-alive connections drain ([`DRAIN_WINDOW`]).
//!
//! `send_timeout` (a write to the client that makes no progress) is set per request by the
//! proxy's first phase, which also reports each stream's end here ([`stream_ended`]).

use crate::metrics::{ClientError, Metrics};
use crate::request::connections::{self, Connections};
use crate::request::header_deadline::HeaderDeadline;
use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::http::v2::server::{self as h2server, H2Accept, HttpSession};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Digest, Stream, ALPN};
use pingora::proxy::{HttpProxy, ProxyHttp};
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// https://datatracker.ietf.org/doc/html/rfc9113#section-3.4
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A stream the client resets sooner than this after its start, before its answer was complete,
/// is a premature reset (Envoy's `premature_reset_min_stream_lifetime_seconds`).
pub const PREMATURE: Duration = Duration::from_secs(1);

/// Streams refused while they were accepted (malformed: a forbidden byte in the path, a bad
/// `content-length`, an ambiguous authority) before the connection is closed: Pingora's own
/// budget, kept across the loop here.
const MAX_MALFORMED_STREAMS: u32 = 32;

/// How much of an answer HTTP/2 buffers per stream beyond what the client's window takes.
const H2_SEND_BUFFER: usize = 64 * 1024;

/// How long a GOAWAY is given to reach a client that is being closed, the connection kept open
/// meanwhile (see [`close`]).
const GOAWAY_FLUSH: Duration = Duration::from_secs(1);

/// How long kept-alive connections are still served, each answer closing its connection,
/// after the listeners stop accepting.
pub const DRAIN_WINDOW: Duration = Duration::from_secs(1);

/// Pingora's HTTP proxy behind the connection limits of this module.
pub struct Edge<SV: ProxyHttp> {
    pub proxy: Arc<HttpProxy<SV>>,
    pub shared: SharedSnapshot,
    /// `server.h2c` as the process started (a change needs a restart, like the listeners).
    pub h2c: bool,
    pub connections: Arc<Connections>,
    pub metrics: Arc<Metrics>,
}

/// What one HTTP/2 connection's streams report to its accept loop.
#[derive(Default)]
struct H2Conn {
    /// Streams being served (the gateway's work, which goes on after a client's reset until the
    /// stream's task sees it).
    active: AtomicUsize,
    idle: Notify,
    premature_resets: AtomicU32,
}

tokio::task_local! {
    /// The connection of the HTTP/2 stream a task serves.
    static STREAM_OF: Arc<H2Conn>;
}

/// Called by the proxy's last phase: the stream served by this task ended; `premature`: the
/// client reset it before its answer was complete, within [`PREMATURE`] of its start. Nothing
/// happens outside an HTTP/2 stream's task.
pub fn stream_ended(premature: bool) {
    if premature {
        let _ = STREAM_OF.try_with(|c| c.premature_resets.fetch_add(1, Ordering::Relaxed));
    }
}

/// A stream being served; its drop tells the connection.
struct Serving(Arc<H2Conn>);

impl Drop for Serving {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_one();
        }
    }
}

impl H2Conn {
    fn serve(self: &Arc<Self>) -> Serving {
        self.active.fetch_add(1, Ordering::AcqRel);
        Serving(Arc::clone(self))
    }

    /// Returns once no stream has been served for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let notified = self.idle.notified();
            if self.active.load(Ordering::Acquire) == 0 {
                break;
            }
            notified.await;
        }
        tokio::time::sleep(idle).await;
    }
}

/// The streams a connection may start: `rate` a second, and as many at once after a quiet
/// second; a pure function of the instants it is given.
#[derive(Debug, Clone, Copy)]
pub struct StreamBudget {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl StreamBudget {
    pub fn new(rate: u32, now: Instant) -> Self {
        StreamBudget {
            rate: f64::from(rate),
            tokens: f64::from(rate),
            at: now,
        }
    }

    /// Take one stream's share; false when none is left.
    pub fn take(&mut self, now: Instant) -> bool {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + gained).min(self.rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Whether a connection whose client reset `premature` of the `started` streams is to be
/// closed: more than `max` of them, and at least half of its streams (Envoy's rule, so that a
/// long-lived connection whose client cancels now and then is kept).
pub fn too_many_resets(premature: u32, started: u64, max: u32) -> bool {
    premature > max && u64::from(premature) * 2 >= started
}

/// The settings one connection is served with, read once when it is accepted.
struct Limits {
    h2c: bool,
    header_timeout: Duration,
    keepalive: Duration,
    http2: crate::config::model::Http2Limits,
}

#[async_trait]
impl<SV> ServerApp for Edge<SV>
where
    SV: ProxyHttp + Send + Sync + 'static,
    SV::CTX: Send + Sync,
{
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let tls = stream.get_ssl_digest().is_some();
        let (local, peer) = connections::addresses(&*stream);
        // a TLS connection was counted before its handshake (`connections::BeforeTls`)
        let _held = if tls {
            None
        } else {
            match self.connections.open(local, peer) {
                Ok(held) => held,
                Err(why) => {
                    log::debug!("connection from {peer:?} refused: {why:?}");
                    return None;
                }
            }
        };
        let limits = {
            let snap = self.shared.load();
            let s = &snap.config.server;
            Limits {
                h2c: self.h2c,
                header_timeout: s.client_header_timeout,
                keepalive: s.keepalive_timeout,
                http2: s.http2,
            }
        };
        let mut h2 = tls && matches!(stream.selected_alpn_proto(), Some(ALPN::H2));
        if !tls && limits.h2c {
            let mut preface = [0u8; H2_PREFACE.len()];
            match tokio::time::timeout(limits.header_timeout, stream.try_peek(&mut preface)).await {
                Ok(Ok(peeked)) => h2 = peeked && preface == *H2_PREFACE,
                // gone before 24 bytes: nothing to answer
                Ok(Err(_)) => return None,
                Err(_) => {
                    self.metrics.client_error(ClientError::Timeout);
                    return None;
                }
            }
        }
        if h2 {
            self.serve_h2(stream, peer, shutdown, &limits).await;
        } else {
            self.serve_h1(stream, shutdown, &limits).await;
        }
        None
    }

    /// Called once the listeners stop accepting (SIGTERM, or SIGQUIT in an upgrade). Pingora's
    /// own cleanup drops every kept-alive connection waiting for its next request at once; a
    /// client that had just sent one then loses it (wrk counted read errors). So the drop
    /// waits `DRAIN_WINDOW` (at most half the grace period): meanwhile each request still
    /// arriving on a kept-alive connection is served and answered with `Connection: close`
    /// (`Gateway::draining`), and its client reconnects to whoever listens now.
    async fn cleanup(&self) {
        use pingora::apps::HttpServerApp;
        let grace = self.shared.load().config.server.grace_period;
        tokio::time::sleep(DRAIN_WINDOW.min(grace / 2)).await;
        self.proxy.http_cleanup().await
    }
}

impl<SV> Edge<SV>
where
    SV: ProxyHttp + Send + Sync + 'static,
    SV::CTX: Send + Sync,
{
    /// HTTP/1: requests one after another (pipelined ones in order, RFC 9112 section 9.3.2:
    /// Pingora drops them unless asked not to), each within the header deadline.
    async fn serve_h1(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch, l: &Limits) {
        use pingora::apps::HttpServerApp;
        let mut session = ServerSession::new_http1(stream);
        if *shutdown.borrow() {
            // stop downstream from reusing if this service is shutting down soon
            session.set_keepalive(None);
        } else {
            session.set_keepalive(Some(l.keepalive.as_secs().max(1)));
        }
        session.set_pipelining_enabled(true);
        let mut result = HeaderDeadline::new(
            self.proxy.process_new_http(session, shutdown),
            l.header_timeout,
        )
        .await;
        while let Some((stream, persistent)) = result.map(|r| r.consume()) {
            let mut session = ServerSession::new_http1(stream);
            if let Some(p) = persistent {
                p.apply_to_session(&mut session);
            }
            result = HeaderDeadline::new(
                self.proxy.process_new_http(session, shutdown),
                l.header_timeout,
            )
            .await;
        }
    }

    /// Serve one stream of a connection on a task of its own.
    fn spawn_stream(
        self: &Arc<Self>,
        state: &Arc<H2Conn>,
        session: HttpSession,
        shutdown: &ShutdownWatch,
    ) {
        let serving = state.serve();
        let app = Arc::clone(self);
        let shutdown = shutdown.clone();
        tokio::spawn(STREAM_OF.scope(Arc::clone(state), async move {
            use pingora::apps::HttpServerApp;
            let _serving = serving;
            app.proxy
                .process_new_http(ServerSession::new_http2(session), &shutdown)
                .await;
        }));
    }

    /// The HTTP/2 handshake, within the header timeout; the connection and its digest.
    async fn h2_handshake(
        &self,
        stream: Stream,
        peer: Option<std::net::IpAddr>,
        l: &Limits,
    ) -> Option<(h2::server::Connection<Stream, bytes::Bytes>, Arc<Digest>)> {
        let digest = Arc::new(Digest {
            ssl_digest: stream.get_ssl_digest(),
            timing_digest: stream.get_timing_digest(),
            proxy_digest: stream.get_proxy_digest(),
            socket_digest: stream.get_socket_digest(),
        });
        let mut options = h2server::default_h2_options();
        options
            .max_concurrent_streams(l.http2.max_concurrent_streams)
            .max_send_buffer_size(H2_SEND_BUFFER);
        let conn = match tokio::time::timeout(
            l.header_timeout,
            h2server::handshake(stream, Some(options)),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                log::debug!("HTTP/2 handshake with {peer:?} failed: {e}");
                self.metrics.client_error(ClientError::Protocol);
                return None;
            }
            Err(_) => {
                self.metrics.client_error(ClientError::Timeout);
                return None;
            }
        };
        Some((conn, digest))
    }

    /// Whether the connection reset too many streams before their answer (a rapid-reset
    /// attack): counted and logged, then the caller closes it with ENHANCE_YOUR_CALM.
    fn rapid_reset(
        &self,
        state: &H2Conn,
        started: u64,
        peer: Option<std::net::IpAddr>,
        l: &Limits,
    ) -> bool {
        let premature = state.premature_resets.load(Ordering::Relaxed);
        if !too_many_resets(premature, started, l.http2.max_premature_resets) {
            return false;
        }
        self.metrics.client_error(ClientError::Goaway);
        // a warning: at most a few a second however many connections do it (log_limit)
        log::warn!(
            "HTTP/2 connection of {peer:?} closed (GOAWAY ENHANCE_YOUR_CALM): {premature} of its {started} streams reset before their answer (server.http2.max_premature_resets: {})",
            l.http2.max_premature_resets
        );
        true
    }

    /// HTTP/2: accept streams within the connection's budgets, each served on a task of its own.
    async fn serve_h2(
        self: &Arc<Self>,
        stream: Stream,
        peer: Option<std::net::IpAddr>,
        shutdown: &ShutdownWatch,
        l: &Limits,
    ) {
        let Some((mut conn, digest)) = self.h2_handshake(stream, peer, l).await else {
            return;
        };
        let state = Arc::new(H2Conn::default());
        let mut budget = StreamBudget::new(l.http2.max_streams_per_second, Instant::now());
        let mut started: u64 = 0;
        let mut malformed: u32 = 0;
        let mut shutdown_rx = shutdown.clone();
        let mut draining = *shutdown_rx.borrow();
        if draining {
            conn.graceful_shutdown();
        }
        let mut watching = true;
        loop {
            let next = if draining {
                HttpSession::from_h2_conn(&mut conn, digest.clone()).await
            } else {
                tokio::select! {
                    biased;
                    changed = shutdown_rx.changed(), if watching => {
                        // the watch also says "changed" for its first value (false), and fails
                        // for good once the server is gone
                        if changed.is_err() {
                            watching = false;
                        } else if *shutdown_rx.borrow() {
                            conn.graceful_shutdown();
                            draining = true;
                        }
                        continue;
                    }
                    next = HttpSession::from_h2_conn(&mut conn, digest.clone()) => next,
                    _ = state.idle_for(l.keepalive) => {
                        log::debug!("HTTP/2 connection of {peer:?} idle for {:?}: closed", l.keepalive);
                        return;
                    }
                }
            };
            let mut session = match next {
                Err(e) => {
                    // a client that closes without GOAWAY is common: not logged
                    log::debug!("HTTP/2 connection of {peer:?} ended: {e}");
                    return;
                }
                Ok(None) => return,
                Ok(Some(H2Accept::Rejected)) => {
                    self.metrics.client_error(ClientError::Protocol);
                    malformed += 1;
                    if malformed > MAX_MALFORMED_STREAMS {
                        close(&mut conn, h2::Reason::PROTOCOL_ERROR).await;
                        return;
                    }
                    continue;
                }
                Ok(Some(H2Accept::Session(s))) => s,
            };
            if self.rapid_reset(&state, started, peer, l) {
                session.shutdown_with_reason(h2::Reason::REFUSED_STREAM);
                drop(session);
                close(&mut conn, h2::Reason::ENHANCE_YOUR_CALM).await;
                return;
            }
            if !budget.take(Instant::now()) {
                self.metrics.client_error(ClientError::Refused);
                session.shutdown_with_reason(h2::Reason::REFUSED_STREAM);
                continue;
            }
            started += 1;
            self.spawn_stream(&state, session, shutdown);
        }
    }
}

/// Send GOAWAY with `reason` and close, giving the frame [`GOAWAY_FLUSH`] to leave. Streams
/// still in flight on the connection end with it. The socket stays open until then even once
/// the frame is sent (a lingering close, as nginx's): closed with frames of a client still
/// writing unread, the kernel answers them with a reset, and a client's next write then fails,
/// which may end its connection before it reads the GOAWAY (`tests/abuse.rs`' delayed resets
/// once saw the connection end without its reason in `make test`).
async fn close<T>(conn: &mut h2::server::Connection<T, bytes::Bytes>, reason: h2::Reason)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let until = tokio::time::Instant::now() + GOAWAY_FLUSH;
    conn.abrupt_shutdown(reason);
    let _ = tokio::time::timeout_at(until, std::future::poll_fn(|cx| conn.poll_closed(cx))).await;
    tokio::time::sleep_until(until).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server connection over an in-memory pipe of `buffer` bytes, served for `serve` after
    /// its handshake, then closed with GOAWAY (ENHANCE_YOUR_CALM); answers how long `close`
    /// held it, in tokio's paused time. The client half is handed to `client`.
    async fn closed_after<F, Fut>(buffer: usize, serve: Duration, client: F) -> Duration
    where
        F: FnOnce(tokio::io::DuplexStream) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (client_io, server_io) = tokio::io::duplex(buffer);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.ok()?;
            let served = std::future::poll_fn(|cx| conn.poll_closed(cx));
            let _ = tokio::time::timeout(serve, served).await;
            let t0 = tokio::time::Instant::now();
            close(&mut conn, h2::Reason::ENHANCE_YOUR_CALM).await;
            Some(t0.elapsed())
        });
        let c = tokio::spawn(client(client_io));
        // (paused time: waiting for this timeout costs nothing; without the cap a close that
        // never returned would fail the test rather than hang it)
        let took = tokio::time::timeout(Duration::from_secs(60), server).await;
        c.abort();
        took.ok()
            .and_then(|t| t.ok().flatten())
            .unwrap_or(Duration::MAX)
    }

    #[tokio::test(start_paused = true)]
    async fn a_goaway_reaches_a_client_still_writing_and_the_close_lingers_for_the_flush_only() {
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        let took = closed_after(1 << 16, Duration::ZERO, |io| async move {
            let Ok((mut send, conn)) = h2::client::handshake(io).await else {
                return;
            };
            let driver = tokio::spawn(conn);
            // keeps opening streams while the server goes away
            let writer = tokio::spawn(async move {
                for _ in 0..1000 {
                    let Ok(ready) = send.clone().ready().await else {
                        return;
                    };
                    send = ready;
                    let req = http::Request::get("http://x/").body(()).unwrap_or_default();
                    if send.send_request(req, true).is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            let ended = driver.await;
            writer.abort();
            let reason = match ended {
                Ok(Err(e)) => e.reason(),
                _ => None,
            };
            let _ = seen_tx.send(reason);
        })
        .await;
        assert_eq!(took, GOAWAY_FLUSH, "held exactly the flush");
        assert_eq!(
            seen_rx.await.ok().flatten(),
            Some(h2::Reason::ENHANCE_YOUR_CALM),
            "the client's connection ended with the GOAWAY's reason"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_reads_holds_the_close_no_longer_than_the_flush() {
        use tokio::io::AsyncWriteExt;
        // the preface, empty SETTINGS, then PINGs whose answers, served for 100 ms, fill a
        // pipe of 256 bytes the client never reads: the GOAWAY cannot be written
        let took = closed_after(256, Duration::from_millis(100), |mut io| async move {
            let mut frames = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            frames.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
            for i in 0..100u8 {
                frames.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0, i, 0, 0, 0, 0, 0, 0, 0]);
            }
            let _ = io.write_all(&frames).await;
            std::future::pending::<()>().await;
        })
        .await;
        assert_eq!(took, GOAWAY_FLUSH, "bounded by the flush");
    }

    #[test]
    fn streams_past_the_rate_are_refused_until_time_gives_more() {
        let t0 = Instant::now();
        let mut b = StreamBudget::new(100, t0);
        assert_eq!(
            (0..150).filter(|_| b.take(t0)).count(),
            100,
            "a second's worth at once"
        );
        let later = t0 + Duration::from_millis(100);
        assert_eq!(
            (0..50).filter(|_| b.take(later)).count(),
            10,
            "10 in 100 ms"
        );
        let much_later = t0 + Duration::from_secs(60);
        assert_eq!(
            (0..500).filter(|_| b.take(much_later)).count(),
            100,
            "a quiet minute gives no more than a second's worth"
        );
    }

    #[test]
    fn a_connection_is_closed_for_resets_past_the_budget_that_are_half_its_streams() {
        assert!(
            !too_many_resets(100, 100, 100),
            "the budget itself is allowed"
        );
        assert!(too_many_resets(101, 101, 100));
        assert!(too_many_resets(101, 202, 100), "half");
        assert!(
            !too_many_resets(101, 203, 100),
            "a long-lived connection whose client cancels now and then"
        );
        assert!(too_many_resets(1, 1, 0), "0: every premature reset closes");
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_once_no_stream_is_served() {
        let c = Arc::new(H2Conn::default());
        let s = c.serve();
        let idle = tokio::time::timeout(Duration::from_millis(200), c.idle_for(Duration::ZERO));
        assert!(idle.await.is_err(), "a stream is served");
        drop(s);
        let idle = tokio::time::timeout(Duration::from_secs(5), c.idle_for(Duration::ZERO));
        assert!(idle.await.is_ok());
    }
}
