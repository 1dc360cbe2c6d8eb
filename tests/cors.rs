//! Browsers on other origins (issue 41, `cors` per route): a real headless Chromium page on
//! another origin calls a limited route and reads its quota headers, a refusal included;
//! preflights are answered by the gateway (never counted, never sent upstream, no tenant
//! needed); the headers each answer carries, checked on the wire.

mod common;

use common::browser::Browser;
use common::*;

/// A route under `/api/` that pages of the admin listener's origin (the status page, a real
/// page on another origin than the proxy's) may call, with a limit of 3 per tenant; `/plain/`
/// has no `cors`.
fn config(up: &Upstream, period: u64) -> String {
    let mut c = one_route_config(up.addr, 1, "");
    c = c.replace(
        "routes:\n  - id: all\n    path: /**\n    upstream: app\n",
        r#"routes:
  - id: api
    path: /api/**
    upstream: app
    cors:
      origins: ["http://{ADMIN}"]
      expose_headers: [x-app-version]
      max_age: 10m
  - id: plain
    path: /plain/**
    upstream: app
"#,
    );
    c.push_str(&format!(
        r#"tenant:
  from: [{{ header: x-org-id, trusted: true }}]
  required: true
limits:
  - id: per-org
    pathPattern: /**
    tiers: [{{ period: {period}, threshold: 3 }}]
"#
    ));
    c
}

#[test]
fn a_page_on_another_origin_calls_a_limited_route_and_reads_its_quota() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&config(&up, period_with_room(600, 60)));
    // the status page: the admin listener's origin, not the proxy's
    let mut page = Browser::open(&format!("http://{}/", gw.admin));
    assert!(page.until(&format!(
        "location.origin === 'http://{}' && document.readyState === 'complete'",
        gw.admin
    )));
    // `x-org-id` is no CORS-safelisted header: each call is preflighted
    let call = format!(
        r#"fetch("http://{}/api/items", {{ headers: {{ "x-org-id": "acme" }} }})
            .then(r => r.status + " " + r.headers.get("ratelimit") + " " + r.headers.get("retry-after"),
                  e => "blocked: " + e)"#,
        gw.addr
    );
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(page.eval(&call).as_str().unwrap_or("no answer").to_string());
    }
    assert!(seen[0].starts_with("200 \"per-org/"), "{seen:?}");
    assert!(seen[0].contains(";r=2;"), "{seen:?}");
    assert!(seen[2].contains(";r=0;"), "{seen:?}");
    // the refusal is readable too, with its quota and when to come back
    assert!(seen[3].starts_with("429 \"per-org/"), "{seen:?}");
    assert!(
        !seen[3].ends_with(" null"),
        "Retry-After readable: {seen:?}"
    );
    // preflights reached neither the upstream nor the limit: 3 forwarded, the 4th refused
    assert_eq!(up.hits(), 3);
    // a page of an origin not listed (`localhost` is another host than 127.0.0.1) is refused
    // by its browser: the gateway's preflight answer says no
    let mut other = Browser::open(&format!("http://localhost:{}/", gw.admin.port()));
    assert!(other.until(&format!(
        "location.origin === 'http://localhost:{}' && document.readyState === 'complete'",
        gw.admin.port()
    )));
    let answer = other.eval(&call);
    assert!(
        answer.as_str().is_some_and(|a| a.starts_with("blocked")),
        "{answer}"
    );
    assert_eq!(up.hits(), 3, "a refused preflight goes nowhere");
}

#[test]
fn preflights_are_answered_here_and_answers_carry_the_cors_headers() {
    let up = Upstream::start("app");
    let gw = Gateway::start(&config(&up, period_with_room(600, 60)));
    let origin = format!("http://{}", gw.admin);
    let preflight = |origin: &str, method: &str, headers: &str| {
        let mut h = vec![
            ("origin", origin),
            ("access-control-request-method", method),
        ];
        if !headers.is_empty() {
            h.push(("access-control-request-headers", headers));
        }
        request(gw.addr, "OPTIONS", "/api/items", &h).expect("an answer")
    };
    // no tenant, no credentials: answered all the same
    let r = preflight(&origin, "POST", "x-org-id, content-type");
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some(origin.as_str())
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, HEAD, POST, PUT, DELETE, PATCH")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("x-org-id, content-type")
    );
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    assert!(r.header("access-control-allow-credentials").is_none());
    assert!(r.header("content-length").is_none_or(|l| l == "0"));
    // an origin not listed, a method not allowed: 403, problem+json, no allow header
    for (o, m) in [("http://evil.example", "GET"), (origin.as_str(), "TRACE")] {
        let r = preflight(o, m, "");
        assert_eq!(r.status, 403, "{o} {m}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.header("access-control-allow-origin").is_none());
    }
    // never sent upstream, never counted: the tenant still has its 3
    assert_eq!(up.hits(), 0);
    let with_origin = [("origin", origin.as_str()), ("x-org-id", "acme")];
    for remaining in ["2", "1", "0"] {
        let r = gw.get("/api/items", &with_origin);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some(origin.as_str())
        );
        assert_eq!(r.header("vary"), Some("Origin"));
        let expose = r.header("access-control-expose-headers").unwrap_or("");
        for h in [
            "x-app-version",
            "ratelimit",
            "ratelimit-policy",
            "retry-after",
        ] {
            assert!(expose.split(", ").any(|e| e == h), "{h} in {expose:?}");
        }
    }
    // the gateway's own answers say so too: a refusal by the limit, a request without tenant
    let refused = gw.get("/api/items", &with_origin);
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("access-control-allow-origin"),
        Some(origin.as_str())
    );
    assert!(refused.header("access-control-expose-headers").is_some());
    let no_tenant = gw.get("/api/items", &[("origin", origin.as_str())]);
    assert_eq!(no_tenant.status, 401);
    assert_eq!(
        no_tenant.header("access-control-allow-origin"),
        Some(origin.as_str())
    );
    // no Origin, an origin not listed, a route without `cors`: nothing is added
    for (path, o) in [
        ("/api/items", None),
        ("/api/items", Some("http://evil.example")),
        ("/plain/items", Some(origin.as_str())),
    ] {
        let mut h = vec![("x-org-id", "other")];
        if let Some(o) = o {
            h.push(("origin", o));
        }
        let r = gw.get(path, &h);
        assert_eq!(r.status, 200, "{path} {o:?}");
        assert!(
            r.header("access-control-allow-origin").is_none(),
            "{path} {o:?}"
        );
    }
    // an OPTIONS that is no preflight (no Access-Control-Request-Method) goes on as any request
    let r = request(
        gw.addr,
        "OPTIONS",
        "/api/items",
        &[("origin", origin.as_str()), ("x-org-id", "third")],
    )
    .expect("an answer");
    assert_eq!(r.status, 200);
    // a preflight for a route without `cors` is an ordinary request too (to the upstream)
    let r = request(
        gw.addr,
        "OPTIONS",
        "/plain/items",
        &[
            ("origin", origin.as_str()),
            ("access-control-request-method", "GET"),
            ("x-org-id", "fourth"),
        ],
    )
    .expect("an answer");
    assert_eq!(r.status, 200);
    assert!(r.header("access-control-allow-origin").is_none());
    assert_eq!(up.hits(), 8);
}

/// `origins: "*"` without credentials answers `*`; with a list and `credentials: true`, the
/// origin itself and `Access-Control-Allow-Credentials: true`; `headers` listed refuse others.
#[test]
fn any_origin_credentials_and_listed_headers() {
    let up = Upstream::start("app");
    let cfg = one_route_config(up.addr, 1, "")
        .replace(
            "    upstream: app\n",
            r#"    upstream: app
    cors:
      origins: "*"
      headers: [x-org-id]
      methods: [GET]
  - id: creds
    path: /creds/**
    upstream: app
    cors:
      origins: ["https://app.example.com"]
      credentials: true
"#,
        )
        .replace("path: /**", "path: /any/**");
    let gw = Gateway::start(&cfg);
    let pre = |path: &str, origin: &str, headers: &str| {
        request(
            gw.addr,
            "OPTIONS",
            path,
            &[
                ("origin", origin),
                ("access-control-request-method", "GET"),
                ("access-control-request-headers", headers),
            ],
        )
        .expect("an answer")
    };
    let r = pre("/any/x", "https://a.example", "X-Org-Id");
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-allow-headers"), Some("x-org-id"));
    assert_eq!(r.header("access-control-allow-methods"), Some("GET"));
    assert_eq!(pre("/any/x", "https://a.example", "x-secret").status, 403);
    let r = gw.get("/any/x", &[("origin", "https://b.example")]);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = pre("/creds/x", "https://APP.example.com", "");
    assert_eq!(r.status, 204, "origins compare without case");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://APP.example.com")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    let r = gw.get("/creds/x", &[("origin", "https://app.example.com")]);
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
}
