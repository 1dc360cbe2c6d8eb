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
        .args(["-sS", "--max-time", "10", "--http2-prior-knowledge", "-T", "-"])
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
