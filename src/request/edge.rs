//! The edge around Pingora's HTTP proxy: HTTP/1.1 pipelining kept on, the client header
//! deadline (`server.client_header_timeout`) around each HTTP/1 session ([`HeaderDeadline`]:
//! the proxy's first phase marks the header read; HTTP/2 requests reach the proxy with their
//! headers complete), and the drain of kept-alive connections at shutdown.

use crate::request::header_deadline::HeaderDeadline;
use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::proxy::{HttpProxy, ProxyHttp};
use pingora::server::ShutdownWatch;
use std::sync::Arc;

/// Pingora's HTTP proxy, with the client header deadline around each HTTP/1 session.
pub struct Edge<SV: ProxyHttp> {
    pub proxy: Arc<HttpProxy<SV>>,
    pub shared: SharedSnapshot,
}

#[async_trait]
impl<SV> HttpServerApp for Edge<SV>
where
    SV: ProxyHttp + Send + Sync + 'static,
    SV::CTX: Send + Sync,
{
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        // HTTP/1.1 pipelining (RFC 9112 section 9.3.2): a request sent before the previous
        // answer is served after it, in order. Pingora drops it and closes the connection
        // unless asked not to; the setting is kept across the connection's later requests.
        session.set_pipelining_enabled(true);
        if session.is_http2() {
            return self.proxy.process_new_http(session, shutdown).await;
        }
        let timeout = self.shared.load().config.server.client_header_timeout;
        HeaderDeadline::new(self.proxy.process_new_http(session, shutdown), timeout).await
    }

    fn h2_options(&self) -> Option<pingora::protocols::http::v2::server::H2Options> {
        self.proxy.h2_options()
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.proxy.server_options()
    }

    /// Called once the listeners stop accepting (SIGTERM, or SIGQUIT in an upgrade). Pingora's
    /// own cleanup drops every kept-alive connection waiting for its next request at once; a
    /// client that had just sent one then loses it (wrk counted read errors). So the drop
    /// waits `DRAIN_WINDOW` (at most half the grace period): meanwhile each request still
    /// arriving on a kept-alive connection is served and answered with `Connection: close`
    /// (`Gateway::draining`), and its client reconnects to whoever listens now.
    async fn http_cleanup(&self) {
        let grace = self.shared.load().config.server.grace_period;
        tokio::time::sleep(DRAIN_WINDOW.min(grace / 2)).await;
        self.proxy.http_cleanup().await
    }

    async fn process_custom_session(
        self: Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.proxy
            .clone()
            .process_custom_session(stream, shutdown)
            .await
    }
}

/// How long kept-alive connections are still served, each answer closing its connection,
/// after the listeners stop accepting.
pub const DRAIN_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
