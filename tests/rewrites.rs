//! A route's rewrites (issue 41 item 2): `request_headers` and `response_headers` (set, add,
//! remove, with variables) and `strip_prefix`; limits still match the client's path.

mod common;

use common::*;

fn seen(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_default()
}

fn header<'a>(seen: &'a serde_json::Value, name: &str) -> Vec<&'a str> {
    seen["headers"]
        .as_array()
        .map(|hs| {
            hs.iter()
                .filter(|h| h[0] == name)
                .filter_map(|h| h[1].as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The one-route config with `routes` (a `routes:` section) instead of its catch-all route.
fn with_routes(up: &Upstream, routes: &str) -> String {
    one_route_config(up.addr, 1, "").replace(
        "routes:\n  - id: all\n    path: /**\n    upstream: app\n",
        routes,
    )
}

#[test]
fn headers_and_the_path_reach_the_upstream_as_the_route_says() {
    let up = Upstream::start("app");
    let cfg = with_routes(
        &up,
        r#"routes:
  - id: orders
    path: /api/orders/**
    upstream: app
    strip_prefix: /api
    request_headers:
      set: { host: orders.internal, x-who: "${tenant}/${plan}@${route}", x-from: "${client_ip}" }
      add: { x-trace-tag: "id-${request_id}" }
      remove: [x-debug]
    response_headers:
      set: { x-served-by: "tollgate ${route}" }
      remove: [server]
"#,
    ) + r#"tenant:
  from: [{ header: x-org-id, trusted: true }]
plans:
  gold: [acme]
limits:
  - id: orders-limit
    pathPattern: /api/orders/**
    tiers: [{ period: 1h, threshold: 2 }]
"#;
    let gw = Gateway::start(&cfg);
    let r = gw.get(
        "/api/orders/7?full=1",
        &[
            ("x-org-id", "acme"),
            ("x-debug", "1"),
            ("x-trace-tag", "client"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let s = seen(&r.body);
    assert_eq!(s["path"], "/orders/7?full=1", "{}", r.body);
    assert_eq!(header(&s, "host"), ["orders.internal"]);
    assert_eq!(header(&s, "x-who"), ["acme/gold@orders"]);
    assert_eq!(header(&s, "x-from"), ["127.0.0.1"]);
    assert!(header(&s, "x-debug").is_empty());
    let id = r.header("x-request-id").unwrap_or_default().to_string();
    assert_eq!(
        header(&s, "x-trace-tag"),
        ["client".to_string(), format!("id-{id}")]
    );
    assert_eq!(r.header("x-served-by"), Some("tollgate orders"));
    assert!(r.header("server").is_none());
    // the limit matched the client's path: the second and third requests count against it
    assert_eq!(gw.get("/api/orders/8", &[("x-org-id", "acme")]).status, 200);
    let refused = gw.get("/api/orders/9", &[("x-org-id", "acme")]);
    assert_eq!(refused.status, 429);
    // the gateway's own answers get the route's response headers too
    assert_eq!(refused.header("x-served-by"), Some("tollgate orders"));
}

/// `rewrite: { pattern, to }`: the normalized path with each match replaced, groups by
/// number or name, the query as sent; a path the pattern does not match is forwarded as sent.
#[test]
fn a_pattern_rewrites_the_upstream_path() {
    let up = Upstream::start("app");
    let cfg = with_routes(
        &up,
        r#"routes:
  - id: users
    path: /api/**
    upstream: app
    rewrite:
      pattern: "^/api/v1/users/(?P<user>[^/]+)/orders"
      to: "/orders/by-user/${user}"
  - id: versions
    path: /v/**
    upstream: app
    rewrite: { pattern: "/v([0-9]+)/", to: "/version-${1}/" }
"#,
    );
    let gw = Gateway::start(&cfg);
    let path = |p: &str| {
        let r = gw.get(p, &[]);
        assert_eq!(r.status, 200, "{p}: {}", r.body);
        seen(&r.body)["path"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    // normalized first: the doubled slash and the dot segment are gone
    assert_eq!(
        path("/api//v1/users/42/./orders/7?full=1"),
        "/orders/by-user/42/7?full=1"
    );
    assert_eq!(path("/api/v2/users/42/orders"), "/api/v2/users/42/orders");
    // every match is replaced
    assert_eq!(path("/v/v1/a/v2/b"), "/v/version-1/a/version-2/b");
}
