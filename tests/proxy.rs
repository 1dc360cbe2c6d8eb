//! The request path through the real gateway and a real upstream: routing, tenants, what
//! reaches the upstream, problem answers, and the admin listener.

mod common;
use common::{request, Edit, Gateway, Upstream};

fn config(upstream: &Upstream, tenant: &str, server_extra: &str) -> String {
    format!(
        r#"server:
  listen: ["{{LISTEN}}"]
  admin: "{{ADMIN}}"
  threads: 1
{server_extra}
upstreams:
  products:
    servers: ["{up}"]
  orders:
    servers: ["{up}"]
routes:
  - id: products
    host: api.example.com
    path: /v1/organizations/*/product/**
    methods: [GET, PUT]
    upstream: products
  - id: orders
    path: /v1/**
    upstream: orders
{tenant}
"#,
        up = upstream.addr
    )
}

const TENANTS: &str = r#"tenant:
  from:
    - api_key: { header: x-api-key, keys: { "k-7f3a": acme } }
    - path: /v1/organizations/{tenant}/**
      trusted: true
    - header: x-org-id
      trusted: true
  required: true
  forward_header: x-tenant-id
"#;

#[test]
fn proxies_and_counts_in_metrics() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    let r = gw.get("/v1/orders/7", &[("x-org-id", "acme")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["server"], "u1");
    assert_eq!(r.json()["path"], "/v1/orders/7");

    let m = gw.metrics();
    assert!(
        m.contains(r#"tollgate_requests_total{route="orders",status="200"} 1"#),
        "{m}"
    );
    let h = request(gw.admin, "GET", "/healthz", &[]).unwrap();
    assert_eq!(h.status, 200);
    let ready = request(gw.admin, "GET", "/readyz", &[]).unwrap();
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["ready"], true);
    assert_eq!(ready.json()["redis"], "not_configured");
    let missing = request(gw.admin, "GET", "/nope", &[]).unwrap();
    assert_eq!(missing.status, 404);
}

#[test]
fn no_route_is_404_problem_json() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    let r = gw.get("/elsewhere", &[("x-org-id", "acme")]);
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let j = r.json();
    assert_eq!(j["status"], 404);
    assert_eq!(j["title"], "Not Found");
    assert!(gw
        .metrics()
        .contains(r#"tollgate_requests_total{route="none",status="404"} 1"#));
}

#[test]
fn missing_tenant_is_401_when_required_else_anonymous() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    let r = gw.get("/v1/orders/7", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.json()["status"], 401);

    let optional = TENANTS.edit("required: true", "required: false");
    let gw2 = Gateway::start(&config(&up, &optional, ""));
    let r = gw2.get("/v1/orders/7", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["anonymous"]);
}

#[test]
fn tenant_sources_in_order_and_forward_header_replaces_client_copy() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    // API key wins over a spoofed header and over the path
    let r = gw.get(
        "/v1/organizations/globex/product/1",
        &[
            ("host", "api.example.com"),
            ("x-api-key", "k-7f3a"),
            ("x-org-id", "evil"),
            ("x-tenant-id", "evil"),
        ],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["acme"]);
    // no key: the path capture
    let r = gw.get(
        "/v1/organizations/globex/product/1",
        &[("host", "api.example.com"), ("x-org-id", "evil")],
    );
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["globex"]);
    // no key: the header
    let r = gw.get("/v1/orders", &[("x-org-id", "initech")]);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["initech"]);
    // an unknown key is refused: it never falls through to a claim
    let r = gw.get(
        "/v1/orders",
        &[("x-api-key", "wrong"), ("x-org-id", "initech")],
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["detail"], "the API key is not valid");
}

#[test]
fn client_ip_from_trusted_proxies_only() {
    let up = Upstream::start("u1");
    let by_ip =
        "tenant:\n  from:\n    - client_ip: {}\n  required: true\n  forward_header: x-tenant-id\n";
    // the test client (127.0.0.1) is not a trusted proxy: X-Forwarded-For is not believed
    let gw = Gateway::start(&config(&up, by_ip, ""));
    let r = gw.get("/v1/x", &[("x-forwarded-for", "6.6.6.6")]);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["127.0.0.1"]);
    assert_eq!(
        r.upstream_headers("x-forwarded-for"),
        vec!["6.6.6.6, 127.0.0.1"]
    );

    // 127.0.0.1 trusted: walk right to left past trusted entries only
    let gw = Gateway::start(&config(
        &up,
        by_ip,
        "  trusted_proxies: [\"127.0.0.0/8\", \"10.0.0.0/8\"]",
    ));
    let r = gw.get(
        "/v1/x",
        &[("x-forwarded-for", "9.9.9.9, 6.6.6.6, 10.1.2.3")],
    );
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["6.6.6.6"]);
    assert_eq!(
        r.upstream_headers("x-forwarded-for"),
        vec!["9.9.9.9, 6.6.6.6, 10.1.2.3, 6.6.6.6"]
    );
}

#[test]
fn hop_by_hop_headers_are_not_forwarded() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    let raw = format!(
        "GET /v1/x HTTP/1.1\r\nHost: {}\r\nx-org-id: acme\r\nConnection: close, x-private\r\nx-private: secret\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic Zm9v\r\nTE: trailers\r\nUpgrade: h2c\r\nx-kept: yes\r\n\r\n",
        gw.addr
    );
    let r = common::request_raw(gw.addr, raw.as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    for h in [
        "x-private",
        "keep-alive",
        "proxy-authorization",
        "te",
        "upgrade",
        "connection",
    ] {
        assert!(
            r.upstream_headers(h).is_empty(),
            "{h} was forwarded: {}",
            r.body
        );
    }
    assert_eq!(r.upstream_headers("x-kept"), vec!["yes"]);
}

#[test]
fn routes_match_host_and_method_first_match_wins() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    let path = "/v1/organizations/acme/product/1";
    let host = ("host", "API.example.com:8080");
    assert_eq!(gw.get(path, &[host]).status, 200);
    assert!(gw.metrics().contains(r#"route="products",status="200"} 1"#));
    // another host, or another method, falls through to the next route
    assert_eq!(gw.get(path, &[("host", "other.example.com")]).status, 200);
    let post = request(gw.addr, "POST", path, &[host, ("content-length", "0")]).unwrap();
    assert_eq!(post.status, 200);
    let m = gw.metrics();
    assert!(m.contains(r#"route="orders",status="200"} 2"#), "{m}");
}

#[test]
fn differently_spelled_paths_route_as_normalized_and_forward_as_sent() {
    let up = Upstream::start("u1");
    let gw = Gateway::start(&config(&up, TENANTS, ""));
    let host = ("host", "api.example.com");
    for spelling in [
        "//v1/organizations/acme/product/1",
        "/v1/organizations/acme/./product/1/",
        "/v1/organizations/acme/x/../product/1?q=1",
        "/v1/%6Frganizations/acme/product/1",
    ] {
        let r = gw.get(spelling, &[host]);
        assert_eq!(r.status, 200, "{spelling}");
        assert_eq!(
            r.json()["path"],
            spelling,
            "forwarded with its original path"
        );
        assert_eq!(
            r.upstream_headers("x-tenant-id"),
            vec!["acme"],
            "{spelling}"
        );
    }
    let m = gw.metrics();
    assert!(m.contains(r#"route="products",status="200"} 4"#), "{m}");
}
