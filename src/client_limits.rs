//! What a client may send, checked before routing (contract section 9):
//! - `server.client_header_timeout`: an HTTP/1 request header must be complete this long after
//!   the gateway starts waiting for it (at accept, or after the previous answer on a kept-alive
//!   connection), or the connection is closed without an answer, as nginx does. A slow client
//!   (slowloris) thus holds a connection for at most that long, not for pingora's 60 s per read.
//!   [`Edge`] wraps pingora's HTTP proxy in a [`HeaderDeadline`]; the proxy's first phase marks
//!   the header read. HTTP/2 requests reach the proxy with their headers complete.
//! - `server.max_request_header_bytes`: larger request headers get 431.
//! - `server.max_body_bytes`: a larger `Content-Length` gets 413 before anything is proxied;
//!   a body that grows past the limit while streaming ends the request with 413.

use crate::config::model::ServerSettings;
use crate::header_deadline::HeaderDeadline;
use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::http::RequestHeader;
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
        session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
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

    async fn http_cleanup(&self) {
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

pub const BODY_TOO_LARGE: &str = "the request body is larger than this gateway accepts";

/// The answer to a request whose header or declared body is over the limits, if it is.
pub fn refuse(req: &RequestHeader, server: &ServerSettings) -> Option<(u16, &'static str)> {
    if header_bytes(req) > server.max_request_header_bytes {
        return Some((
            431,
            "the request header is larger than this gateway accepts",
        ));
    }
    let max = server.max_body_bytes?;
    content_length(req)
        .is_some_and(|n| n > max)
        .then_some((413, BODY_TOO_LARGE))
}

/// The size of a request header as sent: the request line and every field line.
pub fn header_bytes(req: &RequestHeader) -> usize {
    let line = req.method.as_str().len() + req.raw_path().len() + 14;
    req.headers
        .iter()
        .fold(line, |n, (k, v)| n + k.as_str().len() + v.len() + 4)
}

/// The declared body size, when the request says it.
pub fn content_length(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_size_counts_every_line() {
        let mut req = RequestHeader::build("GET", b"/v1/x", None).unwrap();
        let bare = header_bytes(&req);
        assert_eq!(bare, "GET /v1/x HTTP/1.1\r\n".len() + 2);
        req.insert_header("x-org-id", "acme").unwrap();
        assert_eq!(header_bytes(&req), bare + "x-org-id: acme\r\n".len());
        req.insert_header("content-length", " 42 ").unwrap();
        assert_eq!(content_length(&req), Some(42));
    }
}
