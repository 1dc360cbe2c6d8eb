//! What reaches an HTTP/1.1 upstream, byte for byte, when clients send request bodies in
//! HTTP/2 (h2c) and HTTP/1.1: the upstream records everything it receives and parses it as
//! strictly as h11 does, so a framing bug shows as bytes that are not a request, and a
//! desynchronised connection as an answer handed to the wrong client.

mod common;

use common::recording::{body_on_wire, RecordingUpstream};
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};

const TENANTS: &str = "tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n";

/// `curl --http2-prior-knowledge -T -` with `body` on its standard input: curl streams it
/// and ends the stream with an empty DATA frame carrying END_STREAM. Returns (status, body).
fn h2_upload(gw: &Gateway, path: &str, tenant: &str, body: &[u8]) -> (u16, String) {
    let mut child = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "--http2-prior-knowledge",
            "-T",
            "-",
        ])
        .args(["-H", &format!("x-org-id: {tenant}")])
        .args(["-w", "\n%{http_code} %{http_version}"])
        .arg(format!("http://{}{path}", gw.addr))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().expect("curl output");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (code, version) = tail.split_once(' ').unwrap_or(("0", ""));
    assert_eq!(version, "2", "curl spoke HTTP/2: {text}");
    (code.parse().unwrap_or(0), body.to_string())
}

/// cloudflare/pingora#935: an HTTP/2 body ending in an empty DATA frame reached the upstream
/// as `5\r\nhello\r\n0\r\n\r\n0\r\n\r\n`. The second terminator is a request nobody sent, and
/// its 400 went to whichever request used the pooled connection next, another tenant's too.
#[test]
fn an_http2_body_ending_in_an_empty_data_frame_reaches_the_upstream_terminated_once() {
    let up = RecordingUpstream::start();
    let cfg = one_route_config(up.addr, 1, "  h2c: true") + TENANTS;
    let gw = Gateway::start(&cfg);

    let (status, body) = h2_upload(&gw, "/upload/1", "uploader", b"hello");
    assert_eq!((status, body.as_str()), (200, "PUT /upload/1 HTTP/1.1"));
    // another tenant's plain GET, on the upstream connection the upload used (one worker
    // thread, one pooled connection), gets its own answer
    let r = gw.get("/orders/1", &[("x-org-id", "other")]);
    assert_eq!((r.status, r.body.as_str()), (200, "GET /orders/1 HTTP/1.1"));

    let requests = up.requests();
    assert_eq!(
        up.request_lines(),
        ["PUT /upload/1 HTTP/1.1", "GET /orders/1 HTTP/1.1"],
        "garbage: {:?}",
        up.garbage()
    );
    assert_eq!(
        String::from_utf8_lossy(body_on_wire(&requests[0])),
        "5\r\nhello\r\n0\r\n\r\n",
        "the body and one terminator, nothing after it"
    );
    assert!(
        up.garbage().is_empty(),
        "the upstream read bytes that were no request: {:?}",
        up.garbage()
            .iter()
            .map(|g| String::from_utf8_lossy(g).into_owned())
            .collect::<Vec<_>>()
    );
}

/// The same, interleaved: uploads over HTTP/2 and another tenant's GETs over HTTP/1.1 share
/// the pool; every GET gets the answer to its own request, never the upstream's 400.
#[test]
fn uploads_over_http2_never_hand_another_tenant_a_stray_answer() {
    let up = RecordingUpstream::start();
    let cfg = one_route_config(up.addr, 1, "  h2c: true") + TENANTS;
    let gw = Gateway::start(&cfg);
    for i in 0..20 {
        let (status, body) = h2_upload(&gw, &format!("/up/{i}"), "uploader", b"some bytes");
        assert_eq!((status, body), (200, format!("PUT /up/{i} HTTP/1.1")));
        // an empty upload: only the empty DATA frame with END_STREAM
        let (status, _) = h2_upload(&gw, &format!("/empty/{i}"), "uploader", b"");
        assert_eq!(status, 200);
        let r = gw.get(&format!("/get/{i}"), &[("x-org-id", "other")]);
        assert_eq!(
            (r.status, r.body),
            (200, format!("GET /get/{i} HTTP/1.1")),
            "GET {i}"
        );
    }
    assert!(up.garbage().is_empty(), "{:?}", up.garbage());
    assert_eq!(up.requests().len(), 60);
}

/// Requests whose framing RFC 9112 makes a 400 and Pingora's parser lets through: the
/// gateway answers them itself with problem+json, counts them under the route they matched,
/// logs them, and the upstream receives nothing of them (in particular not the request
/// hidden in the body, which is never answered).
#[test]
fn ambiguous_http1_framing_is_refused_by_the_gateway_and_never_reaches_the_upstream() {
    let up = RecordingUpstream::start();
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "  access_log: true") + TENANTS));
    let hidden = "GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n";
    let cases: Vec<(&str, String)> = vec![
        ("no Host", "GET /a HTTP/1.1\r\n\r\n".into()),
        (
            "Content-Length list",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello{hidden}"),
        ),
        (
            "Content-Length twice",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello{hidden}"),
        ),
    ];
    for (name, raw) in &cases {
        let answers = exchange(gw.addr, raw.as_bytes());
        assert_eq!(
            answers.len(),
            1,
            "{name}: one answer, then close: {answers:?}"
        );
        let (status, body) = &answers[0];
        assert_eq!(*status, 400, "{name}: {body}");
        assert!(
            body.contains("\"status\":400"),
            "{name}: problem+json {body}"
        );
    }
    assert!(
        up.requests().is_empty() && up.garbage().is_empty(),
        "nothing reaches the upstream: {:?}",
        up.request_lines()
    );
    // What Pingora's parser refuses itself, with its own empty 400 before the gateway sees
    // the request (not counted, not logged: docs/configuration.md "HTTP/1.1 framing"); nothing
    // reaches the upstream and the hidden request is never answered.
    for (name, raw) in [
        ("two Host", "GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n".to_string()),
        (
            "Content-Length not a number",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello{hidden}"),
        ),
        (
            "chunked, identity",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{hidden}"),
        ),
    ] {
        let answers = exchange(gw.addr, raw.as_bytes());
        assert_eq!(answers.len(), 1, "{name}: {answers:?}");
        assert_eq!(answers[0].0, 400, "{name}");
    }
    assert!(up.requests().is_empty(), "{:?}", up.request_lines());
    // Transfer-Encoding beside Content-Length: Pingora frames the body by the former alone,
    // drops the latter and closes the connection after the answer (RFC 9112 section 6.1), so
    // what followed the chunked body is never read as a request
    for raw in [
        format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}"),
        format!("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n{hidden}"),
    ] {
        let answers = exchange(gw.addr, raw.as_bytes());
        assert_eq!(answers, [(200, "POST /a HTTP/1.1".to_string())], "{raw:?}");
    }
    let requests = up.requests();
    assert_eq!(up.request_lines(), ["POST /a HTTP/1.1", "POST /a HTTP/1.1"]);
    for r in &requests {
        let head = String::from_utf8_lossy(r).to_ascii_lowercase();
        assert!(!head.contains("content-length"), "{head}");
    }
    assert!(up.garbage().is_empty(), "{:?}", up.garbage());
    let m = gw.metrics();
    assert_eq!(
        metric_sum(&m, "tollgate_requests_total{route=\"all\",status=\"400\"}"),
        cases.len() as f64,
        "counted under the route they matched: {m}"
    );
    let log = gw.log();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("tollgate::access") && l.contains("status=400"))
            .count(),
        cases.len(),
        "{log}"
    );
}

/// Two requests in one write on a kept-alive connection: both reach the upstream, in order,
/// and both are answered.
#[test]
fn pipelined_requests_are_each_answered() {
    let up = RecordingUpstream::start();
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + TENANTS));
    let raw = "GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let answers = exchange(gw.addr, raw.as_bytes());
    assert_eq!(
        answers,
        [
            (200, "GET /first HTTP/1.1".to_string()),
            (200, "GET /second HTTP/1.1".to_string())
        ]
    );
    assert_eq!(
        up.request_lines(),
        ["GET /first HTTP/1.1", "GET /second HTTP/1.1"]
    );
}

/// Pingora reads chunk-size lines with httparse; the stock 1.10 took an empty line as the
/// last chunk and accepted a bare LF inside an extension. The workspace patches it
/// (`vendor/httparse`, `[patch.crates-io]`); this fails the day the patch no longer applies.
#[test]
fn httparse_is_the_patched_one() {
    assert!(
        httparse::parse_chunk_size(b"\r\n").is_err(),
        "an empty chunk-size line is refused"
    );
    assert!(
        httparse::parse_chunk_size(b"5;a\nb\r\n").is_err(),
        "a bare LF inside an extension is refused"
    );
    assert_eq!(
        httparse::parse_chunk_size(b"5;a=b\r\n"),
        Ok(httparse::Status::Complete((7, 5)))
    );
    assert_eq!(
        httparse::parse_chunk_size(b"0\r\n"),
        Ok(httparse::Status::Complete((3, 0)))
    );
}

/// Malformed chunk framing ends the request: the upstream never receives a request hidden
/// after it, nothing hidden is answered, and the connection is closed.
#[test]
fn malformed_chunks_end_the_request_and_hide_nothing() {
    let up = RecordingUpstream::start();
    let gw = Gateway::start(&(one_route_config(up.addr, 1, "") + TENANTS));
    let hidden = "GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n";
    for (name, body) in [
        (
            "empty chunk-size line",
            format!("5\r\nhello\r\n\r\n\r\n{hidden}"),
        ),
        (
            "bare LF in an extension",
            format!("5;a\nb\r\nhello\r\n0\r\n\r\n{hidden}"),
        ),
    ] {
        let raw =
            format!("POST /chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
        let answers = exchange(gw.addr, raw.as_bytes());
        assert!(answers.len() <= 1, "{name}: {answers:?}");
        assert!(
            answers.iter().all(|(s, _)| *s == 400),
            "{name}: refused, if answered at all: {answers:?}"
        );
    }
    assert!(
        !up.request_lines().iter().any(|l| l.contains("/hidden")),
        "{:?}",
        up.request_lines()
    );
}
