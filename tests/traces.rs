//! OpenTelemetry traces (`tracing:`) through the real gateway, to a test OTLP/HTTP receiver that
//! decodes what arrives with the `opentelemetry-proto` types: the server span of a request and
//! its upstream attempt's child, their attributes and parent ids, the client's traceparent
//! continued and passed on to the upstream; and a collector that never answers changes
//! nothing for clients.

mod common;
use common::recording::RecordingUpstream;
use common::{eventually, one_route_config, request, Gateway};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An OTLP/HTTP receiver: every `POST /v1/traces` decoded and kept (`answer: false`: it reads
/// the request and never answers, as a collector that hangs).
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

impl Receiver {
    fn start(answer: bool) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                let g = g.clone();
                std::thread::spawn(move || serve(s, &g, answer));
            }
        });
        Receiver { addr, got }
    }

    fn spans(&self) -> Vec<(Vec<(String, String)>, Span)> {
        let got = self.got.lock().unwrap();
        let mut out = Vec::new();
        for req in got.iter() {
            for rs in &req.resource_spans {
                let resource = rs
                    .resource
                    .as_ref()
                    .map(|r| attrs(&r.attributes))
                    .unwrap_or_default();
                for ss in &rs.scope_spans {
                    for s in &ss.spans {
                        out.push((resource.clone(), s.clone()));
                    }
                }
            }
        }
        out
    }
}

fn serve(mut s: TcpStream, got: &Mutex<Vec<ExportTraceServiceRequest>>, answer: bool) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    loop {
        // a head, then Content-Length bytes (framed as a response is)
        let end = loop {
            if let Some(end) = common::response_len(&buf).filter(|&end| buf.len() >= end) {
                break end;
            }
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        let head_end = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |i| i + 4);
        let body: Vec<u8> = buf.drain(..end).skip(head_end).collect();
        match ExportTraceServiceRequest::decode(&body[..]) {
            Ok(req) => got.lock().unwrap().push(req),
            Err(e) => eprintln!("receiver: {} bytes not decoded: {e}", body.len()),
        }
        if !answer {
            // a collector that hangs: never answers
            std::thread::sleep(Duration::from_secs(3600));
            return;
        }
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn attrs(kv: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> Vec<(String, String)> {
    kv.iter()
        .map(|a| {
            let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                _ => String::new(),
            };
            (a.key.clone(), v)
        })
        .collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    attrs(&span.attributes)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A GET of tenant acme through the gateway, with this traceparent if any: answered 200.
fn get(gw: &Gateway, path: &str, traceparent: Option<&str>) {
    let mut headers = vec![("x-org-id", "acme")];
    headers.extend(traceparent.map(|t| ("traceparent", t)));
    let r = request(gw.addr, "GET", path, &headers).expect("answer");
    assert_eq!(r.status, 200, "{path}");
}

/// The first span of this kind (2: server, 3: client).
fn of_kind(spans: &[(Vec<(String, String)>, Span)], kind: i32) -> &Span {
    &spans
        .iter()
        .find(|(_, s)| s.kind == kind)
        .unwrap_or_else(|| panic!("a span of kind {kind}: {spans:?}"))
        .1
}

fn config(up: SocketAddr, otlp: SocketAddr, extra: &str) -> String {
    format!(
        "{}tenant:\n  from:\n    - header: x-org-id\n      trusted: true\nlimits:\n  - id: api\n    pathPattern: /**\n    tiers: [{{ period: 60, threshold: 100 }}]\ntracing:\n  otlp: http://{otlp}\n  sample: 1\n  service_name: gw-test\n{extra}",
        one_route_config(up, 2, "")
    )
}

/// docs/operations.md "Traces": a request's server span continues the client's trace, carries
/// the HTTP conventions' attributes, the route, the tenant and each rule's decision; its
/// upstream attempt is a child span whose context reaches the upstream as `traceparent`.
#[test]
fn a_request_is_traced_to_the_collector_and_the_trace_goes_on_upstream() {
    let up = RecordingUpstream::start();
    let otlp = Receiver::start(true);
    let gw = Gateway::start(&config(up.addr, otlp.addr, ""));
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    get(
        &gw,
        "/v1/items/7",
        Some(&format!("00-{trace_id}-{parent}-01")),
    );
    assert!(
        eventually(Duration::from_secs(10), || otlp.spans().len() >= 2),
        "spans reach the collector: {:?}; log:\n{}",
        otlp.spans(),
        gw.log()
    );
    let spans = otlp.spans();
    let server = of_kind(&spans, 2);
    let client = of_kind(&spans, 3);
    assert!(
        spans[0]
            .0
            .contains(&("service.name".into(), "gw-test".into())),
        "{:?}",
        spans[0].0
    );
    assert_eq!(
        hex(&server.trace_id),
        trace_id,
        "the client's trace goes on"
    );
    assert_eq!(hex(&server.parent_span_id), parent);
    assert_eq!(hex(&client.trace_id), trace_id);
    assert_eq!(
        client.parent_span_id, server.span_id,
        "the upstream attempt is its child"
    );
    for (k, v) in [
        ("http.request.method", "GET"),
        ("url.path", "/v1/items/7"),
        ("http.response.status_code", "200"),
        ("http.route", "/**"),
        ("tollgate.route", "all"),
        ("tollgate.tenant", "acme"),
        ("tollgate.rule.api.decision", "allowed"),
        ("tollgate.rule.api.tier", "1m"),
        ("tollgate.rule.api.remaining", "99"),
    ] {
        assert_eq!(
            attr(server, k).as_deref(),
            Some(v),
            "{k}: {:?}",
            server.attributes
        );
    }
    assert!(attr(server, "server.address").is_some());
    assert_eq!(attr(client, "tollgate.attempt").as_deref(), Some("1"));
    // the upstream saw the trace, with the upstream span as its parent
    let seen = up.requests();
    let raw = String::from_utf8_lossy(&seen[0]).to_ascii_lowercase();
    let expected = format!("traceparent: 00-{trace_id}-{}-01", hex(&client.span_id));
    assert!(raw.contains(&expected), "{raw}");
    // and the request's id, the one its span carries
    let id = attr(server, "tollgate.request_id").unwrap_or_default();
    assert_eq!(id.len(), 32, "{:?}", server.attributes);
    assert!(raw.contains(&format!("x-request-id: {id}")), "{raw}");
}

/// docs/operations.md "Shutdown": a request in flight at SIGTERM is answered, and its spans
/// reach the collector before the process exits, at once after the answer (not when the 30 s
/// grace period ends, nor at the next batch).
#[test]
fn the_spans_of_a_request_in_flight_at_sigterm_reach_the_collector_before_the_exit() {
    let up = common::Upstream::start("u");
    let otlp = Receiver::start(true);
    let cfg = config(up.addr, otlp.addr, "")
        .replace("  threads: 2\n", "  threads: 2\n  grace_period: 30s\n");
    let mut gw = Gateway::start(&cfg);
    let addr = gw.addr;
    let slow =
        std::thread::spawn(move || request(addr, "GET", "/delay/1500", &[("x-org-id", "acme")]));
    // until the request is in flight: the gateway has forwarded it to the upstream
    assert!(eventually(
        Duration::from_secs(5),
        || common::connections_to(up.addr) > 0
    ));
    assert!(!slow.is_finished(), "the request is still in flight");
    let t = std::time::Instant::now();
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(gw.child.id() as i32, libc::SIGTERM);
    }
    let r = slow
        .join()
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(r.status, 200, "{}", r.body);
    let mut status = None;
    eventually(Duration::from_secs(5), || {
        status = gw.child.try_wait().ok().flatten();
        status.is_some()
    });
    assert!(
        status.is_some_and(|s| s.success()) && t.elapsed() < Duration::from_secs(8),
        "{status:?} after {:?}; log:\n{}",
        t.elapsed(),
        gw.log()
    );
    let traced = |spans: &[(Vec<(String, String)>, Span)]| {
        spans
            .iter()
            .any(|(_, s)| s.kind == 2 && attr(s, "url.path").as_deref() == Some("/delay/1500"))
    };
    assert!(
        eventually(Duration::from_secs(2), || traced(&otlp.spans())),
        "the server span reached the collector: {:?}",
        otlp.spans()
    );
}

/// A collector that never answers costs the clients nothing: every request is answered as
/// usual while the exporter waits on it, and past 2,048 spans waiting, spans are dropped and
/// counted (`tollgate_trace_spans_dropped_total`), never requests.
#[test]
fn a_collector_that_never_answers_changes_nothing_for_clients() {
    let up = RecordingUpstream::start();
    let otlp = Receiver::start(false);
    let cfg = config(up.addr, otlp.addr, "").replace("threshold: 100 }", "threshold: 100000 }");
    let gw = Gateway::start(&cfg);
    // two spans a request: 1,500 requests make 3,000, more than one batch and the queue
    for i in 0..1500 {
        get(&gw, &format!("/x/{i}"), None);
    }
    assert_eq!(up.requests().len(), 1500);
    let dropped = common::metric_sum(&gw.metrics(), "tollgate_trace_spans_dropped_total");
    assert!(dropped > 0.0, "spans dropped and counted");
}

/// `sample: 0` traces no request of its own, but a client's sampled traceparent is always kept;
/// `tenant: hash` names the tenant by a hash, not as the client sent it.
#[test]
fn a_sampled_traceparent_is_kept_at_sample_0_and_tenants_can_be_hashed() {
    let up = RecordingUpstream::start();
    let otlp = Receiver::start(true);
    let cfg =
        config(up.addr, otlp.addr, "  tenant: hash\n").replace("  sample: 1\n", "  sample: 0\n");
    let gw = Gateway::start(&cfg);
    for _ in 0..5 {
        get(&gw, "/untraced", None);
    }
    // an unsampled traceparent is not traced, and goes on to the upstream as it came
    let unsampled = "00-11111111111111111111111111111111-2222222222222222-00";
    get(&gw, "/unsampled", Some(unsampled));
    let last =
        String::from_utf8_lossy(up.requests().last().expect("a request")).to_ascii_lowercase();
    assert!(
        last.contains(&format!("traceparent: {unsampled}")),
        "{last}"
    );
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    get(
        &gw,
        "/traced",
        Some(&format!("00-{trace_id}-b7ad6b7169203331-01")),
    );
    assert!(eventually(Duration::from_secs(10), || otlp.spans().len() >= 2));
    let spans = otlp.spans();
    assert!(
        spans.iter().all(|(_, s)| hex(&s.trace_id) == trace_id),
        "only the sampled request's trace: {spans:?}"
    );
    let server = of_kind(&spans, 2);
    assert_eq!(attr(server, "url.path").as_deref(), Some("/traced"));
    let hashed = tollgate::request::trace::tenant_hash(b"acme");
    assert_eq!(hashed.len(), 16);
    assert_eq!(attr(server, "tollgate.tenant"), Some(hashed));
}

/// An upstream that cannot be reached: each attempt is a child span marked an error, counted
/// 1, 2, ...; the request's span (a 502) is an error too. A changed `tracing` section is
/// logged as needing a restart, and spans go on as the process started.
#[test]
fn failed_attempts_and_answers_are_errors_and_a_reload_keeps_the_tracing_it_started_with() {
    let dead: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let otlp = Receiver::start(true);
    let cfg = config(dead, otlp.addr, "").replace("    servers:", "    retries: 1\n    servers:");
    let gw = Gateway::start(&cfg);
    let r = request(gw.addr, "GET", "/gone", &[("x-org-id", "acme")]).expect("answer");
    assert_eq!(r.status, 502);
    assert!(eventually(Duration::from_secs(10), || otlp.spans().len() >= 3));
    let spans = otlp.spans();
    let server = of_kind(&spans, 2);
    let error = |s: &Span| s.status.as_ref().map(|st| st.code) == Some(2);
    assert!(error(server), "{server:?}");
    assert_eq!(
        attr(server, "http.response.status_code").as_deref(),
        Some("502")
    );
    let mut attempts: Vec<String> = spans
        .iter()
        .filter(|(_, s)| s.kind == 3)
        .inspect(|(_, s)| assert!(error(s), "{s:?}"))
        .filter_map(|(_, s)| attr(s, "tollgate.attempt"))
        .collect();
    attempts.sort();
    assert_eq!(attempts, ["1", "2"], "one attempt and one retry");
    assert!(gw.reload(&cfg.replace("  sample: 1\n", "  sample: 0.5\n")));
    assert!(eventually(Duration::from_secs(5), || gw
        .log()
        .contains("a changed tracing section needs a restart")));
}

/// A collector that is down (nothing listens): requests are answered as usual.
#[test]
fn a_collector_that_is_down_changes_nothing_for_clients() {
    let up = RecordingUpstream::start();
    let nobody: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let gw = Gateway::start(&config(up.addr, nobody, ""));
    for i in 0..50 {
        get(&gw, &format!("/y/{i}"), None);
    }
    assert_eq!(up.requests().len(), 50);
}
