//! The gRPC health check of a pool (`health_check.grpc`): `grpc.health.v1.Health/Check` over
//! HTTP/2 (h2c with prior knowledge, or TLS with ALPN h2 and the pool's `tls` settings), one
//! connection a check. A server is healthy when it answers `SERVING` with `grpc-status: 0`;
//! anything else (another status, a non-OK `grpc-status`, a malformed answer, no answer within
//! the check's timeout, no connection) is a failed check, and the reason is what Pingora logs
//! (`upstream NAME: ADDR becomes unhealthy, ...`, through `Named`).
//!
//! The messages are tiny, so they are encoded and decoded here: the request is
//! `HealthCheckRequest { string service = 1; }`, the answer
//! `HealthCheckResponse { ServingStatus status = 1; }`, each in gRPC's 5-byte framing.

use super::tls::tls_options;
use crate::config::model::{HealthCheckSpec, UpstreamSpec, UpstreamTls};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use pingora::connectors::TransportConnector;
use pingora::lb::health_check::HealthCheck;
use pingora::lb::Backend;
use pingora::prelude::HttpPeer;
use pingora::protocols::ALPN;
use pingora::{Error, ErrorType};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;

/// The method the check calls.
pub const METHOD: &str = "/grpc.health.v1.Health/Check";
/// `HealthCheckResponse.ServingStatus.SERVING`, the one healthy answer.
pub const SERVING: u64 = 1;
/// An answer is a few bytes; a longer body is not a health answer.
const MAX_ANSWER: usize = 16 * 1024;
/// The longest header list accepted from a server.
const MAX_HEADER_LIST: u32 = 64 * 1024;
/// The most of a server's `grpc-message` quoted in the log.
const MAX_QUOTED: usize = 200;

/// A pool's gRPC health check.
pub struct GrpcHealthCheck {
    /// The framed `HealthCheckRequest`, the same for every check.
    request: Bytes,
    tls: Option<UpstreamTls>,
    timeout: Duration,
    connector: TransportConnector,
}

impl GrpcHealthCheck {
    /// The check of `service` for the pool `spec` (an h2 or h2c pool: the config refuses a
    /// gRPC check of an HTTP/1.1 one).
    pub fn new(spec: &UpstreamSpec, hc: &HealthCheckSpec, service: &str) -> Self {
        GrpcHealthCheck {
            request: encode_request(service),
            tls: spec.tls.clone(),
            timeout: hc.timeout,
            connector: TransportConnector::new(None),
        }
    }

    /// One check of `target`: `Ok` when it answers SERVING, otherwise why not.
    async fn probe(&self, target: &Backend) -> Result<(), String> {
        let deadline = Instant::now() + self.timeout;
        let timed_out = || format!("no answer within {:?}", self.timeout);
        let (verdict, connection) = tokio::time::timeout_at(deadline, self.ask(target))
            .await
            .map_err(|_| timed_out())??;
        if let Some(connection) = connection {
            // the answer is in: a clean GOAWAY and close, for what is left of the time
            let _ = tokio::time::timeout_at(deadline, connection).await;
        }
        verdict
    }

    /// Connect, ask, and read the answer: the verdict, and the connection if it is still to
    /// close.
    async fn ask(
        &self,
        target: &Backend,
    ) -> Result<(Result<(), String>, Option<Connection>), String> {
        let mut peer = match &self.tls {
            None => HttpPeer::new(target.clone(), false, String::new()),
            Some(tls) => {
                let mut peer = HttpPeer::new(target.clone(), true, tls.sni.clone());
                tls_options(&mut peer.options, tls);
                peer
            }
        };
        peer.options.set_http_version(2, 2);
        peer.options.connection_timeout = Some(self.timeout);
        peer.options.total_connection_timeout = Some(self.timeout);
        let stream = self
            .connector
            .new_stream(&peer)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        if self.tls.is_some() && stream.selected_alpn_proto() != Some(ALPN::H2) {
            return Err("the server did not choose HTTP/2 (ALPN h2)".to_string());
        }
        let (send, connection) = h2::client::Builder::new()
            .enable_push(false)
            .max_header_list_size(MAX_HEADER_LIST)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        let mut connection: Connection = Box::pin(async move { connection.await.err() });
        let authority = match &self.tls {
            Some(tls) => tls.sni.clone(),
            None => target.addr.to_string(),
        };
        let exchange = exchange(send, &authority, self.tls.is_some(), self.request.clone());
        tokio::pin!(exchange);
        tokio::select! {
            verdict = &mut exchange => Ok((verdict, Some(connection))),
            error = &mut connection => {
                // the connection ended (and is not polled again); what the stream received
                // before still counts
                let verdict = match (exchange.await, error) {
                    (Ok(()), _) => Ok(()),
                    (Err(_), Some(e)) => Err(format!("HTTP/2: {e}")),
                    (Err(e), None) => Err(e),
                };
                Ok((verdict, None))
            }
        }
    }
}

/// The HTTP/2 connection of one check, driven until it closes; its error if it failed.
type Connection = Pin<Box<dyn Future<Output = Option<h2::Error>> + Send>>;

/// The call on an open connection: `Ok` for SERVING, otherwise why not.
async fn exchange(
    send: h2::client::SendRequest<Bytes>,
    authority: &str,
    tls: bool,
    request: Bytes,
) -> Result<(), String> {
    let scheme = if tls { "https" } else { "http" };
    let req = http::Request::post(format!("{scheme}://{authority}{METHOD}"))
        .version(http::Version::HTTP_2)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, "tollgate-health-check")
        .body(())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let mut send = send.ready().await.map_err(|e| format!("HTTP/2: {e}"))?;
    let (response, mut body_out) = send
        .send_request(req, false)
        .map_err(|e| format!("HTTP/2: {e}"))?;
    body_out
        .send_data(request, true)
        .map_err(|e| format!("HTTP/2: {e}"))?;
    let response = response.await.map_err(|e| format!("HTTP/2: {e}"))?;
    let (head, mut body) = response.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("HTTP status {} (not a gRPC answer)", head.status));
    }
    // a "Trailers-Only" answer: the status in the headers, no message
    if let Some(status) = head.headers.get("grpc-status") {
        grpc_status(Some(status), head.headers.get("grpc-message"))?;
        return Err("grpc-status 0 without an answer message".to_string());
    }
    let mut message = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("HTTP/2: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if message.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("an answer longer than {MAX_ANSWER} bytes"));
        }
        message.extend_from_slice(&chunk);
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| format!("HTTP/2: {e}"))?
        .unwrap_or_default();
    grpc_status(trailers.get("grpc-status"), trailers.get("grpc-message"))?;
    match decode_answer(&message)? {
        SERVING => Ok(()),
        status => Err(format!("status {}", serving_status_name(status))),
    }
}

/// `Ok` for `grpc-status: 0`; otherwise the status, its name and the server's message.
fn grpc_status(
    status: Option<&http::HeaderValue>,
    message: Option<&http::HeaderValue>,
) -> Result<(), String> {
    let Some(status) = status else {
        return Err("no grpc-status (not a gRPC answer)".to_string());
    };
    let text = quoted(status.as_bytes());
    match text.parse::<u32>() {
        Ok(0) => Ok(()),
        Ok(code) => {
            let mut reason = format!("grpc-status {code} ({})", grpc_code_name(code));
            if let Some(m) = message.filter(|m| !m.is_empty()) {
                reason.push_str(&format!(": {}", quoted(m.as_bytes())));
            }
            Err(reason)
        }
        Err(_) => Err(format!("invalid grpc-status {text:?}")),
    }
}

/// `bytes` as text for the log: printable ASCII, at most `MAX_QUOTED` characters.
fn quoted(bytes: &[u8]) -> String {
    let mut s: String = bytes
        .iter()
        .take(MAX_QUOTED)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > MAX_QUOTED {
        s.push_str("...");
    }
    s
}

/// The name of a gRPC status code.
fn grpc_code_name(code: u32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "unknown code",
    }
}

/// The name of a `HealthCheckResponse.ServingStatus`.
pub fn serving_status_name(status: u64) -> String {
    match status {
        0 => "UNKNOWN".to_string(),
        1 => "SERVING".to_string(),
        2 => "NOT_SERVING".to_string(),
        3 => "SERVICE_UNKNOWN".to_string(),
        n => format!("{n} (not a ServingStatus)"),
    }
}

/// The framed `HealthCheckRequest { service }`: uncompressed, length, then field 1 (omitted
/// when empty, as protobuf does with a default value).
pub fn encode_request(service: &str) -> Bytes {
    let mut message = Vec::with_capacity(service.len() + 11);
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0); // not compressed
                    // a service name is a config string, far below 4 GiB
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The varint at the start of `bytes` and the bytes after it.
fn take_varint(bytes: &[u8]) -> Result<(u64, &[u8]), String> {
    let mut n: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        let bits = u64::from(b & 0x7f);
        if i == 9 && bits > 1 {
            return Err("malformed answer: a varint overflows".to_string());
        }
        n |= bits << (7 * i);
        if b & 0x80 == 0 {
            return Ok((n, &bytes[i + 1..]));
        }
    }
    Err("malformed answer: a truncated varint".to_string())
}

/// The status of a framed `HealthCheckResponse`: exactly one uncompressed message, whose
/// field 1 (the last one, as protobuf reads it) is the status; absent, it is 0 (UNKNOWN).
pub fn decode_answer(body: &[u8]) -> Result<u64, String> {
    let Some((head, rest)) = body.split_first_chunk::<5>() else {
        return Err(if body.is_empty() {
            "no answer message".to_string()
        } else {
            "malformed answer: a truncated gRPC frame".to_string()
        });
    };
    match head[0] {
        0 => {}
        1 => return Err("a compressed answer (none was asked for)".to_string()),
        f => return Err(format!("malformed answer: gRPC frame flags {f:#04x}")),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if rest.len() < len {
        return Err("malformed answer: a truncated gRPC frame".to_string());
    }
    if rest.len() > len {
        return Err("malformed answer: more than one message".to_string());
    }
    decode_status(rest)
}

/// Field 1 (a varint) of a protobuf message, skipping the other fields.
pub fn decode_status(mut message: &[u8]) -> Result<u64, String> {
    let mut status = 0;
    while !message.is_empty() {
        let (tag, rest) = take_varint(message)?;
        let (field, wire) = (tag >> 3, tag & 7);
        if field == 0 {
            return Err("malformed answer: field number 0".to_string());
        }
        message = match wire {
            0 => {
                let (value, rest) = take_varint(rest)?;
                if field == 1 {
                    status = value;
                }
                rest
            }
            1 | 5 => {
                let size = if wire == 1 { 8 } else { 4 };
                rest.get(size..)
                    .ok_or_else(|| "malformed answer: a truncated field".to_string())?
            }
            2 => {
                let (len, rest) = take_varint(rest)?;
                usize::try_from(len)
                    .ok()
                    .and_then(|len| rest.get(len..))
                    .ok_or_else(|| "malformed answer: a truncated field".to_string())?
            }
            w => return Err(format!("malformed answer: wire type {w}")),
        };
        if field == 1 && wire != 0 {
            return Err("malformed answer: status is not a varint".to_string());
        }
    }
    Ok(status)
}

#[async_trait]
impl HealthCheck for GrpcHealthCheck {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        self.probe(target)
            .await
            .map_err(|reason| Error::explain(ErrorType::Custom("gRPC health check"), reason))
    }

    fn health_threshold(&self, _success: bool) -> usize {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&(message.len() as u32).to_be_bytes());
        v.extend_from_slice(message);
        v
    }

    #[test]
    fn the_request_is_a_framed_health_check_request() {
        assert_eq!(&encode_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &encode_request("billing")[..],
            b"\x00\x00\x00\x00\x09\x0a\x07billing"
        );
        // a name of 200 bytes: a two-byte length
        let long = "s".repeat(200);
        let r = encode_request(&long);
        assert_eq!(&r[..8], &[0, 0, 0, 0, 203, 0x0a, 0xc8, 0x01]);
        assert_eq!(r.len(), 5 + 203);
    }

    #[test]
    fn the_answer_status_is_field_one() {
        assert_eq!(decode_answer(&framed(&[0x08, 1])), Ok(SERVING));
        assert_eq!(decode_answer(&framed(&[0x08, 2])), Ok(2));
        assert_eq!(decode_answer(&framed(&[0x08, 3])), Ok(3));
        // the default, UNKNOWN, is sent as nothing
        assert_eq!(decode_answer(&framed(&[])), Ok(0));
        // other fields are skipped; the last field 1 wins
        let m = [
            0x10, 0x05, // field 2 varint
            0x1a, 0x02, b'h', b'i', // field 3 bytes
            0x25, 1, 2, 3, 4, // field 4 fixed32
            0x29, 1, 2, 3, 4, 5, 6, 7, 8, // field 5 fixed64
            0x08, 2, 0x08, 1,
        ];
        assert_eq!(decode_answer(&framed(&m)), Ok(SERVING));
        // a status as a multi-byte varint
        assert_eq!(decode_status(&[0x08, 0x81, 0x01]), Ok(129));
    }

    #[test]
    fn malformed_answers_are_errors() {
        let bad: &[&[u8]] = &[
            b"",
            b"\x00\x00\x00",
            b"\x00\x00\x00\x00\x02\x08",     // shorter than its length
            b"\x00\x00\x00\x00\x01\x08\x01", // longer: a second message
            b"\x01\x00\x00\x00\x02\x08\x01", // compressed
            b"\x02\x00\x00\x00\x02\x08\x01", // unknown flags
            b"\x00\x00\x00\x00\x01\x08",     // no value
            b"\x00\x00\x00\x00\x02\x08\x80", // truncated varint
            b"\x00\x00\x00\x00\x02\x0a\x05", // field 1 as bytes, truncated
            b"\x00\x00\x00\x00\x03\x0a\x01\x01", // field 1 not a varint
            b"\x00\x00\x00\x00\x02\x0b\x01", // a group
            b"\x00\x00\x00\x00\x02\x00\x01", // field 0
            b"\x00\x00\x00\x00\x03\x25\x01\x02", // truncated fixed32
        ];
        for b in bad {
            assert!(decode_answer(b).is_err(), "{b:?} decoded");
        }
        let overflow = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        assert!(decode_status(&overflow).is_err());
        let eleven = [
            0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
        ];
        assert!(decode_status(&eleven).is_err());
        // the largest varint there is
        let max = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(decode_status(&max), Ok(u64::MAX));
        assert_eq!(
            serving_status_name(u64::MAX),
            format!("{} (not a ServingStatus)", u64::MAX)
        );
    }

    #[test]
    fn grpc_status_names_the_code_and_quotes_the_message() {
        let v = |s: &str| http::HeaderValue::from_str(s).ok();
        assert_eq!(grpc_status(v("0").as_ref(), None), Ok(()));
        assert_eq!(
            grpc_status(v("5").as_ref(), v("unknown service").as_ref()),
            Err("grpc-status 5 (NOT_FOUND): unknown service".to_string())
        );
        assert_eq!(
            grpc_status(v("99").as_ref(), None),
            Err("grpc-status 99 (unknown code)".to_string())
        );
        assert!(grpc_status(v("x").as_ref(), None).is_err());
        assert!(grpc_status(None, None).is_err());
        let long = "m".repeat(500);
        let Err(e) = grpc_status(v("13").as_ref(), v(&long).as_ref()) else {
            panic!("13 is not OK")
        };
        assert!(e.len() < 260 && e.ends_with("..."), "{e}");
        // a header value may hold bytes above ASCII; the log gets none of them
        assert_eq!(quoted(b"a\x7fb\xffc\td"), "a?b?c?d");
    }
}
