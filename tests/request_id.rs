//! Request ids (issue 41 item 6): every request has an `x-request-id`, made here unless a
//! trusted proxy sent a well-formed one; the upstream gets it, the client gets it back (on the
//! gateway's own answers too), and the access log carries it. (Traces: tests/traces.rs.)

mod common;

use common::*;

fn upstream_saw(body: &str) -> Option<String> {
    let seen: serde_json::Value = serde_json::from_str(body).ok()?;
    seen["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == "x-request-id")
        .and_then(|h| h[1].as_str().map(str::to_string))
}

#[test]
fn each_request_gets_an_id_that_reaches_the_upstream_the_client_and_the_log() {
    let up = Upstream::start("app");
    // a global limit of 2 per hour: the third request is refused
    let cfg = one_route_config(up.addr, 1, "  access_log: true")
        .replace("    path: /**\n", "    path: /app/**\n")
        + "limits:\n  - id: two\n    pathPattern: /app/**\n    per: global\n    tiers: [{ period: 1h, threshold: 2 }]\n";
    let gw = Gateway::start(&cfg);
    let a = gw.get("/app/a", &[]);
    let b = gw.get("/app/b", &[("x-request-id", "from-the-client")]);
    let mut ids = Vec::new();
    for r in [&a, &b] {
        assert_eq!(r.status, 200);
        let id = r.header("x-request-id").expect("an id").to_string();
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
        // a client that is no trusted proxy does not choose it
        assert_eq!(
            upstream_saw(&r.body).as_deref(),
            Some(id.as_str()),
            "{}",
            r.body
        );
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1]);
    // the gateway's own answers carry one too: a 404, a 429
    let none = gw.get("/elsewhere", &[]);
    assert_eq!(none.status, 404);
    let id404 = none.header("x-request-id").expect("an id").to_string();
    let refused = gw.get("/app/c", &[]);
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.header("x-request-id").map(str::len), Some(32));
    for id in ids.iter().chain([&id404]) {
        let tag = format!(" request_id={id}");
        assert!(
            eventually(std::time::Duration::from_secs(5), || gw
                .log()
                .contains(&tag)),
            "{id} in the access log: {}",
            gw.log()
        );
        // right after the latency (docs/operations.md, "Access log")
        let log = gw.log();
        let line = log.lines().find(|l| l.contains(&tag)).unwrap_or_default();
        let before = line.split(&tag).next().unwrap_or_default();
        assert!(
            before
                .rsplit(' ')
                .next()
                .is_some_and(|w| w.starts_with("latency_ms=")),
            "{line}"
        );
    }
}

#[test]
fn a_trusted_proxy_s_well_formed_id_is_kept() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&one_route_config(
        up.addr,
        1,
        "  trusted_proxies: [\"127.0.0.1/32\"]",
    ));
    let uuid = "3f0c5a1e-8d2b-4c6f-9a7e-1b2c3d4e5f60";
    let r = gw.get("/x", &[("x-request-id", uuid)]);
    assert_eq!(r.header("x-request-id"), Some(uuid));
    assert_eq!(upstream_saw(&r.body).as_deref(), Some(uuid));
    // one that could forge a log line or a header is replaced
    let r = gw.get("/x", &[("x-request-id", "a\"b request_id=forged")]);
    let id = r.header("x-request-id").unwrap_or_default();
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(upstream_saw(&r.body).as_deref(), Some(id));
}

/// `server.request_id: false`: no id is made, returned or logged, and a client's
/// `x-request-id` reaches the upstream as any other header would; a route's header value that
/// names `${request_id}` is then a config error at its place.
#[test]
fn request_ids_can_be_turned_off() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&one_route_config(
        up.addr,
        1,
        "  access_log: true\n  request_id: false",
    ));
    let plain = gw.get("/a", &[]);
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("x-request-id"), None);
    assert_eq!(upstream_saw(&plain.body), None, "{}", plain.body);
    let own = gw.get("/b", &[("x-request-id", "from-the-client")]);
    assert_eq!(own.header("x-request-id"), None);
    assert_eq!(upstream_saw(&own.body).as_deref(), Some("from-the-client"));
    assert!(
        eventually(std::time::Duration::from_secs(5), || gw
            .log()
            .lines()
            .filter(|l| l.contains("tollgate::access"))
            .count()
            >= 2),
        "{}",
        gw.log()
    );
    assert!(!gw.log().contains("request_id="), "{}", gw.log());
    // a reload turns them on (and the config with them off is rejected when it names one)
    assert!(gw.reload(&one_route_config(up.addr, 1, "  access_log: true")));
    let on = gw.get("/c", &[("x-request-id", "from-the-client")]);
    let id = on.header("x-request-id").expect("an id after the reload");
    assert_eq!(upstream_saw(&on.body).as_deref(), Some(id));

    let dir = TempDir::new();
    let cfg = one_route_config(up.addr, 1, "  request_id: false").replace(
        "    upstream: app\n",
        "    upstream: app\n    request_headers:\n      set: { x-trace: \"id-${request_id}\" }\n",
    );
    let path = dir.write("tollgate.yaml", &cfg);
    let (code, _, text) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 1, "{text}");
    let line = cfg
        .lines()
        .position(|l| l.contains("x-trace"))
        .expect("the line")
        + 1;
    assert!(
        text.contains(&format!("tollgate.yaml:{line}:"))
            && text.contains("names ${request_id}, but server.request_id is false"),
        "{text}"
    );
}
