//! The rules of the request path, in-process: the Pingora-free admission (`request::admission`)
//! of a snapshot built from a config text, under a fake clock, so that every window is the
//! test's own (docs/configuration.md "Rate limiting" and "Beyond reject": tiers, check then
//! commit, plans, per, actions and their precedence, delay, concurrency, headers; and the
//! answers before them: what a client may send, the route, the tenant). Each test takes
//! milliseconds; `tests/limits.rs` and `tests/actions.rs` keep what proves the wiring through
//! a real gateway.

mod common;

use bytes::Bytes;
use common::Edit;
use http::{HeaderMap, Method};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use tollgate::config;
use tollgate::limits::{Clock, CounterRegistry, FakeClock};
use tollgate::metrics::Metrics;
use tollgate::request::admission::{admit, Admission, Admitted, Incoming};
use tollgate::services::fleet_sync::Fleet;
use tollgate::snapshot::{Runtime, Snapshot};

/// A whole hour from the epoch: every window of the tests (up to an hour) starts here.
const HOUR: u64 = 3_600_000;
const T0: u64 = 500_000 * HOUR;

/// A gateway config with `common::TENANCY` and these rules.
fn config_text(limits: &str, extra: &str) -> String {
    format!(
        r#"server:
  listen: ["127.0.0.1:1"]
upstreams:
  app:
    servers: ["127.0.0.1:2"]
routes:
  - id: all
    path: /**
    upstream: app
{tenancy}limits:
{limits}
{extra}
"#,
        tenancy = common::TENANCY
    )
}

/// A snapshot on a fake clock, as the gateway builds it.
struct Rig {
    snap: Snapshot,
    metrics: Arc<Metrics>,
    clock: Arc<FakeClock>,
}

/// What the client would get: the answer made by the admission, or the upstream's 200 with
/// the quota headers the response phase adds.
struct Out {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    forwarded: bool,
    /// A leaky bucket's turn: how long it waits before it goes on (ms).
    wait_ms: u64,
    admitted: Admitted,
}

impl Out {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

impl Rig {
    fn new(limits: &str, extra: &str) -> Rig {
        Rig::from_text(&config_text(limits, extra), Arc::new(FakeClock::at_ms(T0)))
    }

    fn from_text(text: &str, clock: Arc<FakeClock>) -> Rig {
        let cfg = config::load_str(Path::new("t.yaml"), text).expect("valid config");
        Rig::with_clock(cfg, clock)
    }

    fn with_clock(cfg: config::Config, fake: Arc<FakeClock>) -> Rig {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let rt = Runtime {
            registry: Arc::new(CounterRegistry::new(
                metrics.evictions.clone(),
                metrics.untracked.clone(),
            )),
            gates: Default::default(),
            fleet: Arc::new(Fleet::default()),
            metrics: metrics.clone(),
            clock: fake.clone(),
            probes: Default::default(),
        };
        let snap = Snapshot::build(cfg, &rt).expect("snapshot");
        Rig {
            snap,
            metrics,
            clock: fake,
        }
    }

    fn head(method: &str, path: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(path)
            .header("host", "gw.test");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    fn finish(&self, admission: Admission, admitted: Admitted) -> Out {
        match admission {
            Admission::Answer(a) => Out {
                status: a.status,
                headers: a.headers,
                body: a.body,
                forwarded: false,
                wait_ms: 0,
                admitted,
            },
            Admission::Forward | Admission::Queue(_) => {
                let wait_ms = match admission {
                    Admission::Queue(w) => w.as_millis() as u64,
                    _ => 0,
                };
                let mut headers = HeaderMap::new();
                if let Some(d) = admitted.decision() {
                    tollgate::limits::headers::apply(
                        &mut headers,
                        &self.snap.limiter,
                        d,
                        self.snap.config.headers,
                        false,
                    );
                }
                Out {
                    status: 200,
                    headers,
                    body: Bytes::new(),
                    forwarded: true,
                    wait_ms,
                    admitted,
                }
            }
            Admission::Hold(_) => panic!("held: use `send_and_wait`"),
            Admission::AwaitKeys(_) => panic!("no jwks_uri in these configs"),
        }
    }

    /// One request from 10.0.0.1 (answered at once: no delay, no fleet).
    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Out {
        self.send_from(IpAddr::from([10, 0, 0, 1]), method, path, headers)
    }

    /// One request from `peer`.
    fn send_from(&self, peer: IpAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Out {
        let head = Rig::head(method, path, headers);
        let req = Incoming {
            head: &head,
            raw_path: path.as_bytes(),
            peer,
        };
        let mut admitted = Admitted::default();
        let a = admit(&self.snap, &req, &self.metrics, &mut admitted);
        self.finish(a, admitted)
    }

    /// One request, waiting (on the limiter's clock) when the admission holds it.
    async fn send_and_wait(&self, path: &str, headers: &[(&str, &str)]) -> Out {
        let head = Rig::head("GET", path, headers);
        let req = Incoming {
            head: &head,
            raw_path: path.as_bytes(),
            peer: IpAddr::from([10, 0, 0, 1]),
        };
        let mut admitted = Admitted::default();
        let mut a = admit(&self.snap, &req, &self.metrics, &mut admitted);
        if let Admission::Hold(h) = a {
            a = h.wait(&self.snap, &req, &self.metrics, &mut admitted).await;
        }
        self.finish(a, admitted)
    }

    fn get(&self, path: &str, tenant: &str) -> Out {
        self.send("GET", path, &[("x-org-id", tenant)])
    }

    fn metrics(&self) -> String {
        String::from_utf8(self.metrics.render()).expect("text")
    }

    /// The tier `used` counts of one tenant, by rule, as `/api/tenants/<id>` shows them.
    /// The answer to a forwarded request came, with this status and these headers: its late
    /// charges are taken (`Limiter::charge_late`, as the response phase does).
    fn answer(&self, r: &Out, status: u16, headers: &HeaderMap) {
        let mut d = r.admitted.decision().cloned().expect("a rule applied");
        self.snap.limiter.charge_late(&mut d, status, headers);
    }

    fn used(&self, tenant: &str, rule: &str) -> Option<u64> {
        self.snap
            .limiter
            .inspect_tenant(tenant.as_bytes(), &self.snap.config.plans)
            .into_iter()
            .find(|r| r.rule == rule)
            .map(|r| r.tiers[0].used)
    }
}

const SEED: &str = r#"  - id: get-product
    enabled: true
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    tiers:
      - period: 10
        threshold: 5
  - id: put-product
    enabled: true
    methods: [PUT]
    pathPattern: /v1/organizations/*/product/*
    tiers:
      - period: 10
        threshold: 2"#;

#[test]
fn seed_rule_counts_down_then_429_with_retry_after() {
    let rig = Rig::new(SEED, "");
    // 3 s into a 10 s window
    rig.clock.set_ms(T0 + 3_000);
    let path = "/v1/organizations/acme/product/1";
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let r = rig.send("GET", path, &[]);
        assert!(r.forwarded);
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
        remaining.push(r.header("x-ratelimit-remaining").unwrap().to_string());
        assert_eq!(r.header("x-ratelimit-reset"), Some("7"));
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"get-product/10s\";q=5;w=10")
        );
        assert!(r
            .header("ratelimit")
            .unwrap()
            .starts_with("\"get-product/10s\";r="));
    }
    assert_eq!(remaining, ["4", "3", "2", "1", "0"]);
    let r = rig.send("GET", path, &[]);
    assert_eq!(r.status, 429);
    assert!(r.admitted.denied);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    // the window ends in 7 s
    assert_eq!(r.header("retry-after"), Some("7"));
    // the seed's header, beside it
    assert_eq!(r.header("x-ratelimit-retry-after"), Some("7"));
    let j = r.json();
    assert_eq!(
        j["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(j["title"], "Too Many Requests");
    assert_eq!(j["status"], 429);
    assert_eq!(j["detail"], "rate limit get-product exceeded: 5 per 10s");
    assert_eq!(
        j["violated-policies"],
        serde_json::json!(["get-product/10s"])
    );
    assert_eq!(j["retry_after"], 7);
    assert_eq!(r.header("ratelimit"), Some("\"get-product/10s\";r=0;t=7"));
    let m = rig.metrics();
    assert!(
        m.contains(
            r#"tollgate_ratelimit_decisions_total{decision="allowed",rule="get-product",tier="all"} 5"#
        ),
        "{m}"
    );
    assert!(
        m.contains(r#"tollgate_ratelimit_decisions_total{decision="denied",rule="get-product",tier="10s"} 1"#),
        "{m}"
    );
    // the next window admits again
    rig.clock.set_ms(T0 + 10_000);
    assert!(rig.send("GET", path, &[]).forwarded);
}

#[test]
fn tenants_are_isolated_and_get_and_put_count_apart() {
    let rig = Rig::new(SEED, "");
    let acme = "/v1/organizations/acme/product/1";
    for _ in 0..5 {
        assert!(rig.send("GET", acme, &[]).forwarded);
    }
    assert_eq!(rig.send("GET", acme, &[]).status, 429);
    // another tenant is untouched
    let r = rig.send("GET", "/v1/organizations/initech/product/1", &[]);
    assert!(r.forwarded);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
    // PUT has its own rule and counter
    let put = rig.send("PUT", acme, &[]);
    assert!(put.forwarded);
    assert_eq!(put.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(put.header("x-ratelimit-remaining"), Some("1"));
}

#[test]
fn no_rate_headers_when_no_rule_applies() {
    let rig = Rig::new(SEED, "");
    let r = rig.send("GET", "/v1/organizations/acme/orders", &[]);
    assert!(r.forwarded);
    assert!(r.admitted.decision().is_none());
    for h in ["x-ratelimit-limit", "ratelimit-policy", "ratelimit"] {
        assert!(r.header(h).is_none(), "{h} present");
    }
}

#[test]
fn every_tier_must_pass_and_a_denial_consumes_nothing() {
    let rig = Rig::new(
        "  - id: burst\n    pathPattern: /**\n    tiers:\n      - { period: 1, threshold: 2 }\n      - { period: 1h, threshold: 3 }",
        "",
    );
    let a = rig.get("/x", "t");
    assert!(a.forwarded);
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"burst/1s\";q=2;w=1, \"burst/1h\";q=3;w=3600")
    );
    assert!(rig.get("/x", "t").forwarded);
    // the 1 s tier denies; the 1 h tier (2 used of 3) must not be charged for it
    for _ in 0..3 {
        let d = rig.get("/x", "t");
        assert_eq!(d.status, 429);
        assert_eq!(
            d.json()["violated-policies"],
            serde_json::json!(["burst/1s"])
        );
    }
    assert_eq!(rig.used("t", "burst"), Some(2));
    // next second: the hour tier still has exactly one left
    rig.clock.advance_ms(1_000);
    let r = rig.get("/x", "t");
    assert!(r.forwarded);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    let d = rig.get("/x", "t");
    assert_eq!(d.status, 429);
    assert_eq!(
        d.json()["violated-policies"],
        serde_json::json!(["burst/1h"])
    );
}

#[test]
fn plans_give_their_tenants_other_tiers() {
    let rig = Rig::new(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]\n    plans:\n      premium: [{ period: 1h, threshold: 5 }]",
        "",
    );
    let r = rig.get("/x", "globex");
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
    let r = rig.get("/x", "acme");
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert!(rig.get("/x", "acme").forwarded);
    assert_eq!(rig.get("/x", "acme").status, 429);
    for _ in 0..4 {
        assert!(rig.get("/x", "globex").forwarded);
    }
    assert_eq!(rig.get("/x", "globex").status, 429);
}

#[test]
fn shadow_counts_and_reports_but_never_blocks() {
    let text = config_text(
        "  - id: trial\n    pathPattern: /**\n    action: shadow\n    tiers: [{ period: 1h, threshold: 2 }]",
        "",
    )
    .edit(
        "  listen: [\"127.0.0.1:1\"]\n",
        "  listen: [\"127.0.0.1:1\"]\n  access_log: true\n",
    );
    let rig = Rig::from_text(&text, Arc::new(FakeClock::at_ms(T0)));
    for i in 0..5 {
        let r = rig.get("/x", "t");
        assert!(r.forwarded);
        assert!(
            r.header("x-ratelimit-limit").is_none(),
            "shadow rules are not shown to clients"
        );
        // the access log names the shadow rule that would have denied it
        assert_eq!(r.admitted.shadow_by.is_some(), i >= 2);
    }
    let m = rig.metrics();
    assert!(
        m.contains(
            r#"tollgate_ratelimit_decisions_total{decision="allowed",rule="trial",tier="all"} 2"#
        ),
        "{m}"
    );
    assert!(
        m.contains(
            r#"tollgate_ratelimit_decisions_total{decision="shadow_denied",rule="trial",tier="1h"} 3"#
        ),
        "{m}"
    );
}

#[test]
fn per_ip_and_global_partitions() {
    let rig = Rig::new(
        "  - id: by-ip\n    pathPattern: /ip/**\n    per: ip\n    tiers: [{ period: 1h, threshold: 2 }]\n  - id: everyone\n    pathPattern: /global/**\n    per: global\n    tiers: [{ period: 1h, threshold: 3 }]\n  - id: by-header\n    pathPattern: /hdr/**\n    per: header:x-client\n    tiers: [{ period: 1h, threshold: 1 }]",
        "",
    );
    // per ip: different tenants from one address share the count
    assert!(rig.get("/ip/a", "t1").forwarded);
    assert!(rig.get("/ip/a", "t2").forwarded);
    assert_eq!(rig.get("/ip/a", "t3").status, 429);
    // global: everyone shares
    for t in ["a", "b", "c"] {
        assert!(rig.get("/global/x", t).forwarded);
    }
    assert_eq!(rig.get("/global/x", "d").status, 429);
    // per header: by the header's value; without the header the rule does not apply
    let h = |v: &str| rig.send("GET", "/hdr/x", &[("x-client", v)]).status;
    assert_eq!(h("one"), 200);
    assert_eq!(h("one"), 429);
    assert_eq!(h("two"), 200);
    assert!(rig.send("GET", "/hdr/x", &[]).forwarded);
    assert!(rig.send("GET", "/hdr/x", &[]).forwarded);
}

#[test]
fn differently_spelled_paths_cannot_dodge_a_rule() {
    let rig = Rig::new(
        "  - id: product\n    methods: [GET]\n    pathPattern: /v1/organizations/*/product/*\n    tiers: [{ period: 1h, threshold: 4 }]",
        "",
    );
    let spellings = [
        "/v1/organizations/acme/product/1",
        "//v1/organizations/acme/product/1/",
        "/v1/./organizations/acme/x/../product/1?q=2",
        "/v1/%6Frganizations/acme/product/%31",
    ];
    for s in spellings {
        assert!(rig.send("GET", s, &[]).forwarded, "{s}");
    }
    for s in spellings {
        assert_eq!(rig.send("GET", s, &[]).status, 429, "{s} dodged the rule");
    }
}

#[test]
fn an_api_keys_tenant_wins_over_a_spoofed_header() {
    let rig = Rig::new(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]",
        "",
    );
    let key = ("x-api-key", "k-7f3a");
    assert!(rig.send("GET", "/x", &[key]).forwarded);
    let r = rig.send("GET", "/x", &[key]);
    assert_eq!(r.admitted.tenant, b"acme");
    // acme is exhausted; claiming another tenant in a header does not help
    assert_eq!(
        rig.send("GET", "/x", &[key, ("x-org-id", "someone-else")])
            .status,
        429
    );
    assert!(
        rig.send("GET", "/x", &[("x-org-id", "someone-else")])
            .forwarded
    );
}

#[test]
fn header_families_can_be_switched_off() {
    let limits = "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1 }]";
    let rig = Rig::new(limits, "headers:\n  x_ratelimit: false\n  ietf: true");
    let r = rig.get("/x", "t");
    assert!(r.header("x-ratelimit-limit").is_none());
    assert!(r.header("ratelimit").is_some());
    let denied = rig.get("/x", "t");
    assert_eq!(denied.status, 429);
    assert!(denied.header("retry-after").is_some());
    assert!(denied.header("x-ratelimit-retry-after").is_none());
    let rig = Rig::new(limits, "headers:\n  x_ratelimit: true\n  ietf: false");
    let r = rig.get("/x", "t");
    assert!(r.header("x-ratelimit-limit").is_some());
    assert!(r.header("ratelimit-policy").is_none());
}

#[test]
fn hostile_tenant_ids_get_correct_decisions_and_never_collide() {
    let rig = Rig::new(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1 }]",
        "",
    );
    let ids = common::hostile_tenant_ids();
    for id in &ids {
        assert!(rig.get("/x", id).forwarded, "first request of {id:.20}");
    }
    for id in &ids {
        assert_eq!(rig.get("/x", id).status, 429, "second request of {id:.20}");
    }
    // CRLF (percent-encoded) in a path tenant
    assert!(
        rig.send("GET", "/v1/organizations/a%0D%0Ab/x", &[])
            .forwarded
    );
    assert_eq!(
        rig.send("GET", "/v1/organizations/a%0D%0Ab/x", &[]).status,
        429
    );
    assert!(
        rig.send("GET", "/v1/organizations/a%0d%0ac/x", &[])
            .forwarded
    );
}

impl Rig {
    /// A rig on these rules whose fake clock starts at `base_ms`: a held request's wait is a
    /// wait on the limiter's clock, which moves it (`FakeClock::sleep_until`).
    fn at_ms(limits: &str, base_ms: u64) -> Rig {
        Rig::from_text(
            &config_text(limits, ""),
            Arc::new(FakeClock::at_ms(base_ms)),
        )
    }

    /// How long since `since_ns` on the rig's clock.
    fn since(&self, since_ns: u64) -> std::time::Duration {
        std::time::Duration::from_nanos(self.clock.now_ns().saturating_sub(since_ns))
    }
}

#[tokio::test]
async fn delay_holds_a_request_until_it_fits_or_rejects_past_max_delay() {
    // 100 ms into a second
    let rig = Rig::at_ms(
        "  - id: smooth\n    pathPattern: /slow/**\n    action: delay\n    max_delay: 1500ms\n    tiers: [{ period: 1, threshold: 1 }]\n  - id: impatient\n    pathPattern: /fast/**\n    action: delay\n    max_delay: 50ms\n    status: 503\n    tiers: [{ period: 1h, threshold: 1 }]",
        T0 + 100,
    );
    let t = [("x-org-id", "t")];
    assert!(rig.send_and_wait("/slow/x", &t).await.forwarded);
    let started = rig.clock.now_ns();
    let r = rig.send_and_wait("/slow/x", &t).await;
    assert!(r.forwarded, "held, then let through");
    assert!(r.admitted.delayed);
    // held until the next second, when the tier has room: 900 ms, not a poll
    let held = rig.since(started);
    assert!(
        held >= std::time::Duration::from_millis(900)
            && held < std::time::Duration::from_millis(950),
        "{held:?}"
    );
    assert!(rig
        .metrics()
        .contains(r#"decision="delayed",rule="smooth",tier="all"} 1"#));
    // a wait longer than max_delay is rejected with the rule's status, at once
    assert!(rig.send_and_wait("/fast/x", &t).await.forwarded);
    let started = rig.clock.now_ns();
    let r = rig.send_and_wait("/fast/x", &t).await;
    assert_eq!(r.status, 503);
    assert_eq!(rig.since(started), std::time::Duration::ZERO);
    assert_eq!(r.json()["title"], "Service Unavailable");
    assert!(r.header("retry-after").is_some());
}

/// Five actions over three paths, each rule 1 per hour (`tests/actions.rs` proves the same
/// through the gateway, with the upstream's hit count).
#[test]
fn the_strictest_answer_wins_and_over_limit_answers_spend_nothing() {
    let rule = |id: &str, path: &str, action: &str| {
        let extra = match action {
            "throttle" => "\n    throttle: { rate: 100MB/s }",
            "shadowban" if id == "ban" => {
                "\n    shadowban: { status: 202, body: '{\"results\":[]}' }"
            }
            _ => "",
        };
        format!("  - id: {id}\n    pathPattern: {path}\n    tiers: [{{ period: 1h, threshold: 1 }}]\n    action: {action}{extra}\n")
    };
    let limits = format!(
        "{}{}{}{}{}  - id: cap\n    pathPattern: /c/**\n    tiers: [{{ period: 1h, threshold: 10 }}]\n",
        rule("ban", "/a/**", "shadowban"),
        rule("slow", "/a/**", "throttle"),
        rule("hard", "/b/**", "reject"),
        rule("ban2", "/b/**", "shadowban"),
        rule("slow2", "/c/**", "throttle"),
    );
    let rig = Rig::new(&limits, "");
    for path in ["/a/x", "/b/x", "/c/x"] {
        assert!(rig.get(path, "t").forwarded, "first request of {path}");
    }
    // shadowban over throttle: the made-up answer, not the upstream's, with no quota header
    let r = rig.get("/a/x", "t");
    assert!(!r.forwarded);
    assert_eq!((r.status, &r.body[..]), (202, &b"{\"results\":[]}"[..]));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.admitted.action, Some("shadowbanned"));
    assert!(r.header("x-ratelimit-limit").is_none() && r.header("ratelimit").is_none());
    // reject over shadowban
    assert_eq!(rig.get("/b/x", "t").status, 429);
    // throttled: proxied at the rule's pace, not counted in the throttle rule's window, but
    // counted in the windows of the rules it is not over (it reached the upstream)
    for _ in 0..3 {
        let r = rig.get("/c/x", "t");
        assert!(r.forwarded);
        assert_eq!(r.admitted.action, Some("throttled"));
        assert_eq!(r.admitted.throttle_bps, 100_000_000);
    }
    for rule in ["ban", "slow", "hard", "ban2", "slow2"] {
        assert_eq!(
            rig.used("t", rule),
            Some(1),
            "{rule}: only the admitted request counts"
        );
    }
    assert_eq!(
        rig.used("t", "cap"),
        Some(4),
        "cap counts the allowed and the 3 throttled requests"
    );
    let m = rig.metrics();
    for line in [
        r#"{decision="shadowbanned",rule="ban",tier="1h"} 1"#,
        r#"{decision="throttled",rule="slow2",tier="1h"} 3"#,
        r#"{decision="denied",rule="hard",tier="1h"} 1"#,
    ] {
        assert!(m.contains(line), "{line}: {m}");
    }
}

#[test]
fn concurrency_refuses_past_n_in_flight_before_any_rate_quota_is_spent() {
    let rig = Rig::new(
        "  - id: exports\n    pathPattern: /export/**\n    concurrency: 1\n    tiers: [{ period: 1h, threshold: 10 }]",
        "",
    );
    let first = rig.get("/export/x", "t");
    assert!(first.forwarded);
    assert_eq!(first.admitted.slots.len(), 1);
    // the first still in flight (its slot held): the second is refused
    let r = rig.get("/export/x", "t");
    assert_eq!(r.status, 429);
    assert!(r.admitted.denied);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-ratelimit-retry-after"), Some("1"));
    assert_eq!(
        r.json()["detail"],
        "too many requests in flight: concurrency limit exports is 1"
    );
    // another partition has its own slots
    assert!(rig.get("/export/x", "u").forwarded);
    // the refusal spent no rate quota
    assert_eq!(rig.used("t", "exports"), Some(1));
    assert!(rig
        .metrics()
        .contains(r#"{decision="denied",rule="exports",tier="concurrency"} 1"#));
    // done (the context dropped): the slot is free again
    drop(first);
    assert!(rig.get("/export/x", "t").forwarded);
}

#[test]
fn what_comes_before_the_limits_route_tenant_and_what_a_client_may_send() {
    let text = config_text(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 100 }]",
        "",
    )
    .edit(
        "  listen: [\"127.0.0.1:1\"]\n",
        "  listen: [\"127.0.0.1:1\"]\n  max_body_bytes: 10\n",
    )
    .edit("required: false", "required: true")
    .edit("    path: /**\n", "    path: /v1/**\n");
    let rig = Rig::from_text(&text, Arc::new(FakeClock::at_ms(T0)));
    let r = rig.send("GET", "/other", &[("x-org-id", "t")]);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["detail"], "no route matches this request");
    assert_eq!(r.admitted.route, None);
    let r = rig.send("GET", "/v1/x", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json()["detail"],
        "this request does not identify a tenant"
    );
    assert_eq!(r.admitted.route, Some(0));
    let r = rig.send("GET", "/v1/x", &[("x-api-key", "wrong"), ("x-org-id", "t")]);
    assert_eq!(r.status, 401, "a wrong key never becomes another tenant");
    assert_eq!(r.json()["detail"], "the API key is not valid");
    // a declared body over max_body_bytes: 413, counted under its route, connection closed
    let r = rig.send(
        "POST",
        "/v1/x",
        &[("x-org-id", "t"), ("content-length", "11")],
    );
    assert_eq!((r.status, r.admitted.route), (413, Some(0)));
    assert!(r.header("content-type") == Some("application/problem+json"));
    let head = Rig::head("GET", "/v1/x", &[("x-org-id", "t")]);
    let mut h11 = head;
    h11.headers.remove("host");
    let req = Incoming {
        head: &h11,
        raw_path: b"/v1/x",
        peer: IpAddr::from([10, 0, 0, 1]),
    };
    let mut admitted = Admitted::default();
    match admit(&rig.snap, &req, &rig.metrics, &mut admitted) {
        Admission::Answer(a) => assert_eq!((a.status, a.close), (400, true)),
        other => panic!("{other:?}"),
    }
    // none of these spent quota
    assert_eq!(rig.used("t", "api"), Some(0));
    assert!(rig.send("GET", "/v1/x", &[("x-org-id", "t")]).forwarded);
    assert_eq!(rig.used("t", "api"), Some(1));
}

/// docs/configuration.md "Access lists and exemptions": a route's `allow` and `deny` judge the
/// client address (through trusted proxies), before the tenant is looked for.
#[test]
fn a_route_admits_only_the_networks_it_allows_and_none_it_denies() {
    let text = config_text(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 100 }]",
        "",
    )
    .edit(
        "  listen: [\"127.0.0.1:1\"]\n",
        "  listen: [\"127.0.0.1:1\"]\n  trusted_proxies: [\"10.0.0.1\"]\n",
    )
    .edit(
        "    upstream: app\n",
        "    upstream: app\n    allow: [\"10.0.0.0/8\", \"2001:db8::/32\"]\n    deny: [\"10.9.0.0/16\"]\n",
    );
    let rig = Rig::from_text(&text, Arc::new(FakeClock::at_ms(T0)));
    let via_proxy = |client: &str| {
        rig.send(
            "GET",
            "/x",
            &[("x-org-id", "t"), ("x-forwarded-for", client)],
        )
    };
    assert!(via_proxy("10.1.2.3").forwarded);
    assert!(via_proxy("2001:db8::7").forwarded);
    assert!(
        via_proxy("::ffff:10.1.2.3").forwarded,
        "an IPv4-mapped address is IPv4"
    );
    for refused in ["10.9.1.1", "192.168.1.1", "2001:db9::1"] {
        let r = via_proxy(refused);
        assert_eq!(r.status, 403, "{refused}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(
            r.json()["detail"],
            "this client address may not use this route"
        );
        // counted and logged under its route, with its client address
        assert_eq!(r.admitted.route, Some(0));
        assert_eq!(r.admitted.client_ip, Some(refused.parse().unwrap()));
        assert!(r.admitted.decision().is_none());
    }
    // a client cannot claim an allowed address: only a trusted proxy's X-Forwarded-For counts
    let r = rig.send_from(
        IpAddr::from([192, 168, 1, 1]),
        "GET",
        "/x",
        &[("x-org-id", "t"), ("x-forwarded-for", "10.1.2.3")],
    );
    assert_eq!(r.status, 403);
    // refusals spent no quota: 3 admitted
    assert_eq!(rig.used("t", "api"), Some(3));
}

#[test]
fn an_exempt_request_is_neither_counted_nor_refused_and_gets_no_quota_headers() {
    let rig = Rig::new(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 1 }]\n    exempt: { ips: [\"192.168.0.0/16\"], tenants: [vip], plans: [premium] }\n  - id: exports\n    pathPattern: /export/**\n    concurrency: 1\n    exempt: { tenants: [vip] }\n  - id: audit\n    pathPattern: /audited/**\n    tiers: [{ period: 1h, threshold: 1 }]",
        "",
    );
    // vip (a tenant), globex (premium plan): never counted, never refused, no headers
    for tenant in ["vip", "globex"] {
        for _ in 0..3 {
            let r = rig.get("/x", tenant);
            assert!(r.forwarded, "{tenant}");
            assert!(r.admitted.decision().is_none(), "{tenant}");
            assert!(r.header("x-ratelimit-limit").is_none());
            assert!(r.header("ratelimit-policy").is_none());
        }
        assert_eq!(rig.used(tenant, "api"), Some(0));
    }
    // from an exempt network, any tenant
    for _ in 0..3 {
        let r = rig.send_from(
            IpAddr::from([192, 168, 7, 7]),
            "GET",
            "/x",
            &[("x-org-id", "t")],
        );
        assert!(r.forwarded);
        assert!(r.admitted.decision().is_none());
    }
    // everyone else is limited as usual
    assert!(rig.get("/x", "t").forwarded);
    assert_eq!(rig.get("/x", "t").status, 429);
    // exempt from a concurrency limit too: two in flight
    let first = rig.get("/export/x", "vip");
    let second = rig.get("/export/x", "vip");
    assert!(first.forwarded && second.forwarded);
    assert!(first.admitted.slots.is_empty());
    let held = rig.get("/export/x", "t");
    assert_eq!(held.admitted.slots.len(), 1);
    assert_eq!(rig.get("/export/x", "t").status, 429);
    // other rules still apply to an exempt tenant: `audit` does not exempt vip
    let r = rig.get("/audited/x", "vip");
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(rig.get("/audited/x", "vip").status, 429);
}

/// docs/configuration.md "The quota endpoint": what a caller has left, spending nothing.
#[test]
fn the_quota_endpoint_tells_what_is_left_and_spends_nothing() {
    let text = config_text(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 5 }, { period: 10, threshold: 3 }]\n    plans:\n      premium: [{ period: 1h, threshold: 50 }]\n  - id: orders\n    methods: [PUT]\n    pathPattern: /v1/orders/**\n    per: ip\n    tiers: [{ period: 1m, threshold: 2 }]\n    exempt: { tenants: [globex] }\n  - id: trial\n    pathPattern: /**\n    action: shadow\n    tiers: [{ period: 1h, threshold: 1 }]",
        "",
    )
    .edit(
        "  listen: [\"127.0.0.1:1\"]\n",
        "  listen: [\"127.0.0.1:1\"]\n  quota_endpoint: /quota\n",
    );
    let rig = Rig::from_text(&text, Arc::new(FakeClock::at_ms(T0 + 4_000)));
    assert!(rig.get("/x", "acme").forwarded);
    let ask = |query: &str, tenant: &str| rig.get(&format!("/quota{query}"), tenant);
    let q = ask("", "acme");
    assert_eq!(q.status, 200, "{:?}", q.body);
    assert!(!q.forwarded);
    assert_eq!(q.admitted.route, None, "answered by no route");
    assert_eq!(q.header("content-type"), Some("application/json"));
    // the answer docs/configuration.md "The quota endpoint" shows
    assert_eq!(
        std::str::from_utf8(&q.body).expect("text"),
        r#"{"plan":null,"request":null,"rules":[{"algorithm":"fixed_window","rule":"api","tiers":[{"limit":5,"period_ms":3600000,"policy":"api/1h","remaining":4,"reset":3596,"used":1},{"limit":3,"period_ms":10000,"policy":"api/10s","remaining":2,"reset":6,"used":1}]}],"tenant":"acme"}"#
    );
    let j = q.json();
    assert_eq!(j["tenant"], "acme");
    assert_eq!(j["plan"], serde_json::Value::Null);
    // every rule counting per tenant; not `orders` (per ip), not the shadow rule
    let rules = j["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "{j}");
    assert_eq!(rules[0]["rule"], "api");
    let tiers = &rules[0]["tiers"];
    assert_eq!(tiers[0]["policy"], "api/1h");
    assert_eq!(
        (
            &tiers[0]["limit"],
            &tiers[0]["used"],
            &tiers[0]["remaining"]
        ),
        (&5.into(), &1.into(), &4.into())
    );
    assert_eq!(tiers[0]["reset"], 3596);
    assert_eq!(
        (
            &tiers[1]["limit"],
            &tiers[1]["used"],
            &tiers[1]["remaining"],
            &tiers[1]["reset"]
        ),
        (&3.into(), &1.into(), &2.into(), &6.into())
    );
    // the IETF headers of that answer: the most restrictive tier, what is left now
    assert_eq!(q.header("ratelimit"), Some("\"api/10s\";r=2;t=6"));
    assert_eq!(
        q.header("ratelimit-policy"),
        Some("\"api/1h\";q=5;w=3600, \"api/10s\";q=3;w=10")
    );
    assert_eq!(q.header("x-ratelimit-remaining"), Some("2"));
    // asking spent nothing, and does not count as a request of any rule
    assert_eq!(rig.used("acme", "api"), Some(1));
    assert_eq!(ask("", "acme").json()["rules"][0]["tiers"][0]["used"], 1);
    // a plan's tenant sees its plan's tiers
    let g = ask("", "globex").json();
    assert_eq!(g["plan"], "premium");
    assert_eq!(g["rules"][0]["tiers"][0]["limit"], 50);
    assert_eq!(
        g["rules"][0]["tiers"][0]["used"], 0,
        "not served here yet: its whole quota"
    );
    // asking created no counter: nothing for the fleet sync to send to Redis
    let views = rig
        .snap
        .limiter
        .inspect_tenant(b"globex", &rig.snap.config.plans);
    assert!(views.iter().all(|v| !v.tracked), "{views:?}");
    // a probe: the rules of that request, each partitioned as that request would be
    assert_eq!(
        rig.send("PUT", "/v1/orders/7", &[("x-org-id", "acme")])
            .status,
        200
    );
    let p = ask("?method=PUT&path=%2Fv1%2Forders%2F7", "acme").json();
    assert_eq!(
        p["request"],
        serde_json::json!({ "method": "PUT", "path": "/v1/orders/7" })
    );
    let names: Vec<&str> = p["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["rule"].as_str())
        .collect();
    assert_eq!(names, ["api", "orders"]);
    // a rule that exempts the caller is left out
    let g = ask("?method=PUT&path=/v1/orders/7", "globex").json();
    assert_eq!(g["rules"].as_array().map(Vec::len), Some(1), "{g}");
    assert_eq!(g["rules"][0]["rule"], "api");
    assert_eq!(
        p["rules"][1]["tiers"][0]["used"], 1,
        "per ip: 10.0.0.1's count"
    );
    assert_eq!(
        ask("?path=/other", "acme").json()["rules"][0]["rule"],
        "api"
    );
    // without a tenant source, callers are `anonymous`, and share its ten answers a second
    let anon = |peer: [u8; 4]| rig.send_from(IpAddr::from(peer), "GET", "/quota", &[]);
    assert_eq!(anon([10, 0, 0, 7]).json()["tenant"], "anonymous");
    for i in 0..9u8 {
        assert_eq!(anon([10, 0, 1, i]).status, 200);
    }
    assert_eq!(anon([10, 0, 2, 1]).status, 429);
    // bad probes
    for bad in [
        "?method=PUT",
        "?path=v1",
        "?tenant=globex",
        "?method=G%20T&path=/x",
    ] {
        let r = ask(bad, "acme");
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
}

#[test]
fn the_quota_endpoint_asks_for_credentials_and_is_limited_per_caller() {
    let text = config_text(
        "  - id: api\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 5 }]",
        "",
    )
    .edit(
        "  listen: [\"127.0.0.1:1\"]\n",
        "  listen: [\"127.0.0.1:1\"]\n  quota_endpoint: /quota\n",
    )
    .edit("required: false", "required: true");
    let rig = Rig::from_text(&text, Arc::new(FakeClock::at_ms(T0)));
    let r = rig.send("GET", "/quota", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json()["detail"],
        "this request does not identify a tenant"
    );
    // the usual credentials: an API key's tenant, never a spoofed header's
    let r = rig.send(
        "GET",
        "/quota",
        &[("x-api-key", "k-7f3a"), ("x-org-id", "other")],
    );
    assert_eq!(r.json()["tenant"], "acme");
    // ten a second per caller (one spent above), then 429 with Retry-After
    for _ in 0..9 {
        assert_eq!(
            rig.send("GET", "/quota", &[("x-api-key", "k-7f3a")]).status,
            200
        );
    }
    let r = rig.send("GET", "/quota", &[("x-api-key", "k-7f3a")]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.admitted.denied);
    // another caller is not affected; and after a tenth of a second, one more
    assert_eq!(rig.get("/quota", "globex").status, 200);
    rig.clock.advance_ms(100);
    assert_eq!(
        rig.send("GET", "/quota", &[("x-api-key", "k-7f3a")]).status,
        200
    );
    // only GET: another method is an ordinary request of the routes
    let r = rig.send("POST", "/quota", &[("x-org-id", "acme")]);
    assert!(r.forwarded);
    assert_eq!(rig.used("acme", "api"), Some(1));
}

/// docs/configuration.md "Counting by outcome": a `count_when` rule checks before forwarding
/// and counts once the answer's status is known.
#[test]
fn a_count_when_rule_counts_only_the_answers_it_names() {
    let rig = Rig::new(
        "  - id: failed-logins\n    pathPattern: /login\n    per: ip\n    tiers: [{ period: 1h, threshold: 2 }]\n    count_when: { status: [401, 403] }\n  - id: errors\n    pathPattern: /api/**\n    tiers: [{ period: 1m, threshold: 1 }]\n    count_when: { status: [5xx] }",
        "",
    );
    let login = || rig.send("POST", "/login", &[("x-org-id", "t")]);
    let late = |r: &Out, status: u16| rig.answer(r, status, &HeaderMap::new());
    // successful logins are never counted
    for _ in 0..5 {
        let r = login();
        assert!(r.forwarded);
        late(&r, 200);
    }
    let ip_used = || {
        let r = login();
        let used = r.header("x-ratelimit-remaining").map(str::to_string);
        (r, used)
    };
    let (r, remaining) = ip_used();
    assert_eq!(
        remaining.as_deref(),
        Some("1"),
        "checked, not counted: 2 left"
    );
    // two failures are counted when their answers come
    late(&r, 401);
    let r = login();
    assert!(r.forwarded);
    late(&r, 403);
    // the quota is full: the next attempt is refused before it reaches the upstream
    let r = login();
    assert_eq!(r.status, 429);
    assert!(r.admitted.decision().is_none_or(|d| d.late.is_empty()));
    // classes: 5xx counts, 404 does not
    let api = |p: &str| rig.get(p, "t");
    let r = api("/api/x");
    late(&r, 404);
    let r = api("/api/x");
    assert!(r.forwarded, "a 404 was not counted");
    late(&r, 503);
    assert_eq!(api("/api/x").status, 429);
    // requests in flight when the quota fills are each counted at their answer (the bound)
    let a = api("/api/y");
    assert_eq!(a.status, 429);
    rig.clock.advance_ms(60_000);
    let (a, b) = (api("/api/y"), api("/api/y"));
    assert!(
        a.forwarded && b.forwarded,
        "both checked while the count is 0"
    );
    late(&a, 500);
    late(&b, 500);
    assert_eq!(
        rig.used("t", "errors"),
        Some(2),
        "one over: the one in flight"
    );
}

/// docs/configuration.md "Cost from the answer": admission checks that every tier has room,
/// and the answer's header is charged when it comes; its quota headers show the charge; an
/// answer without it costs `default`; over `max`, `max`; a second charge takes nothing.
#[test]
fn a_cost_from_the_answer_is_charged_when_the_answer_comes() {
    let rig = Rig::new(
        "  - id: tokens\n    pathPattern: /v1/**\n    cost: { response_header: x-usage-tokens, max: 800, default: 10 }\n    tiers: [{ period: 1m, threshold: 1000 }, { period: 1h, threshold: 5000 }]",
        "",
    );
    let usage = |n: &str| {
        let mut h = HeaderMap::new();
        h.insert("x-usage-tokens", n.parse().expect("a value"));
        h
    };
    let r = rig.get("/v1/chat", "t");
    assert!(r.forwarded);
    let mut d = r.admitted.decision().cloned().expect("a rule applied");
    assert_eq!(d.late.len(), 1, "owed until the answer");
    assert_eq!(rig.used("t", "tokens"), Some(0), "checked, not charged");
    // the answer's header: charged at once, and its quota headers say so
    rig.snap.limiter.charge_late(&mut d, 200, &usage("400"));
    assert!(d.late.is_empty());
    assert_eq!(rig.used("t", "tokens"), Some(400));
    rig.snap.limiter.charge_late(&mut d, 200, &usage("400"));
    assert_eq!(rig.used("t", "tokens"), Some(400), "charged once");
    let mut h = HeaderMap::new();
    tollgate::limits::headers::apply(
        &mut h,
        &rig.snap.limiter,
        &d,
        rig.snap.config.headers,
        false,
    );
    assert_eq!(h["x-ratelimit-remaining"], "600");
    rig.answer(&rig.get("/v1/chat", "t"), 200, &usage("100"));
    assert_eq!(rig.used("t", "tokens"), Some(500));
    // none: the default; a malformed value or 0: the default; over max: max
    for (value, used) in [
        (None, 510),
        (Some("lots"), 520),
        (Some("0"), 530),
        (Some("900"), 1330),
    ] {
        let r = rig.get("/v1/chat", "t");
        assert!(r.forwarded, "room for one unit at {used}");
        rig.answer(&r, 200, &value.map_or_else(HeaderMap::new, usage));
        assert_eq!(rig.used("t", "tokens"), Some(used));
    }
    // past the minute's threshold by the request that was in flight: refused until it rolls
    let r = rig.get("/v1/chat", "t");
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some());
    rig.clock.advance_ms(60_000);
    assert!(rig.get("/v1/chat", "t").forwarded);
    // without `max`, one answer is charged at most the smallest threshold
    let rig = Rig::new(
        "  - id: tokens\n    pathPattern: /v1/**\n    cost: { response_header: x-usage-tokens }\n    tiers: [{ period: 1m, threshold: 1000 }, { period: 1h, threshold: 5000 }]",
        "",
    );
    rig.answer(&rig.get("/v1/chat", "t"), 200, &usage("4000"));
    assert_eq!(rig.used("t", "tokens"), Some(1000));
}

/// docs/configuration.md "Counting by outcome": `count_when` and a `cost` together charge
/// the cost of the answers it names only.
#[test]
fn count_when_charges_the_rules_cost() {
    let rig = Rig::new(
        "  - id: errors\n    pathPattern: /**\n    cost: 5\n    count_when: { status: [5xx] }\n    tiers: [{ period: 1m, threshold: 12 }]",
        "",
    );
    let send = |status: u16, remaining: &str| {
        let r = rig.get("/x", "t");
        // checked as if counted
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
        rig.answer(&r, status, &HeaderMap::new());
    };
    send(200, "7");
    assert_eq!(rig.used("t", "errors"), Some(0));
    send(502, "7");
    assert_eq!(rig.used("t", "errors"), Some(5));
    send(500, "2");
    assert_eq!(rig.used("t", "errors"), Some(10));
    // 2 units left: a request that costs 5 does not fit
    assert_eq!(rig.get("/x", "t").status, 429);
}

/// ms since the epoch of a UTC instant written out (`date -u -d 2026-10-31T22:59:58Z +%s`).
const OCT_31_2026_22_59_58_UTC: u64 = 1_793_487_598_000;
const NOV_01_2026_12_00_UTC: u64 = 1_793_534_400_000;
const NOV_29_2026_13_29_59_UTC: u64 = 1_795_958_999_000;

/// docs/configuration.md "Calendar windows": a month from the 1st's local midnight, a day of
/// 25 hours at the end of daylight saving time, an ISO week from Monday in a zone half an hour
/// off the hour; the quota headers and Retry-After give the seconds to the real reset.
#[test]
fn calendar_windows_reset_at_local_midnight_monday_and_the_first() {
    let limits = "  - id: monthly\n    pathPattern: /m/**\n    calendar: { tz: Europe/Berlin }\n    tiers: [{ period: 1mo, threshold: 2 }]\n  - id: daily\n    pathPattern: /d/**\n    calendar: { tz: America/New_York }\n    tiers: [{ period: 1d, threshold: 1 }]\n  - id: weekly\n    pathPattern: /w/**\n    calendar: { tz: Australia/Adelaide }\n    tiers: [{ period: 1w, threshold: 1 }]";
    let rig = |at: u64| Rig::from_text(&config_text(limits, ""), Arc::new(FakeClock::at_ms(at)));
    // 23:59:58 on 31 October in Berlin (UTC+1): the month ends in 2 s
    let r = rig(OCT_31_2026_22_59_58_UTC);
    let a = r.get("/m/x", "t");
    assert_eq!(a.header("x-ratelimit-reset"), Some("2"));
    assert_eq!(a.header("ratelimit"), Some("\"monthly/1mo\";r=1;t=2"));
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"monthly/1mo\";q=2"),
        "no one window length"
    );
    assert!(r.get("/m/x", "t").forwarded);
    let refused = r.get("/m/x", "t");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("2"));
    // 1 November, 00:00 in Berlin: a new month, 30 days long
    r.clock.advance_ms(2_000);
    let a = r.get("/m/x", "t");
    assert!(a.forwarded);
    assert_eq!(a.header("x-ratelimit-reset"), Some("2592000"));
    // 1 November in New York has 25 hours: at 12:00 UTC (07:00 EST) it ends in 17 hours
    let r = rig(NOV_01_2026_12_00_UTC);
    let a = r.get("/d/x", "t");
    assert_eq!(a.header("x-ratelimit-reset"), Some("61200"));
    r.clock.advance_ms(61_200_000 - 1_000);
    let refused = r.get("/d/x", "t");
    assert_eq!(
        refused.status, 429,
        "one second before midnight: the same day"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    r.clock.advance_ms(1_000);
    assert!(r.get("/d/x", "t").forwarded, "2 November");
    // Sunday 29 November, 23:59:59 in Adelaide (UTC+10:30): the week ends in a second
    let r = rig(NOV_29_2026_13_29_59_UTC);
    let a = r.get("/w/x", "t");
    assert_eq!(a.header("x-ratelimit-reset"), Some("1"));
    assert_eq!(r.get("/w/x", "t").status, 429);
    r.clock.advance_ms(1_000);
    let a = r.get("/w/x", "t");
    assert!(a.forwarded, "Monday");
    assert_eq!(a.header("x-ratelimit-reset"), Some("604800"));
}

/// docs/configuration.md "Cost per request": one request takes `cost` units from every tier of
/// its rule; one that does not fit is refused whole and takes nothing.
#[test]
fn a_request_takes_its_cost_from_every_tier_or_nothing() {
    let rig = Rig::new(
        "  - id: exports\n    pathPattern: /export/**\n    cost: 50\n    tiers: [{ period: 1m, threshold: 120 }, { period: 1h, threshold: 200 }]\n  - id: search\n    pathPattern: /search/**\n    cost: { header: x-cost, max: 100, default: 5 }\n    tiers: [{ period: 1m, threshold: 100 }]",
        "",
    );
    let r = rig.get("/export/a", "t");
    assert!(r.forwarded);
    // the most restrictive tier, in units: 120 - 50 left in the minute
    assert_eq!(r.header("x-ratelimit-remaining"), Some("70"));
    assert_eq!(r.header("ratelimit"), Some("\"exports/1m\";r=70;t=60"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("120"));
    assert!(rig.get("/export/a", "t").forwarded);
    // a third would take 150 of the minute's 120: refused whole
    let d = rig.get("/export/a", "t");
    assert_eq!(d.status, 429);
    assert_eq!(
        rig.used("t", "exports"),
        Some(100),
        "the refusal took nothing"
    );
    // a request header's cost, up to max; missing or malformed: the default
    let search = |cost: Option<&str>| {
        let mut h = vec![("x-org-id", "t")];
        if let Some(c) = cost {
            h.push(("x-cost", c));
        }
        rig.send("GET", "/search/q", &h)
    };
    let r = search(Some("30"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("70"));
    let r = search(None);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("65"), "default 5");
    let r = search(Some("ten"));
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("60"),
        "malformed: default 5"
    );
    let r = search(Some("0"));
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("55"),
        "0 is no cost: default 5"
    );
    // over max: 400, nothing counted
    let r = search(Some("101"));
    assert_eq!(r.status, 400);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        r.json()["detail"],
        "x-cost is 101, over the most a request may cost here (100)"
    );
    assert_eq!(rig.used("t", "search"), Some(45));
    // what is left fits exactly; one unit more does not
    assert!(search(Some("55")).forwarded);
    assert_eq!(search(Some("1")).status, 429);
}

/// docs/configuration.md "Sliding log": exact. A unit leaves the span one period after it was
/// admitted, to the millisecond, wherever the windows fall; the quota headers count to the
/// moment the oldest leaves. A sliding window, at the same edge, lets more through.
#[test]
fn a_sliding_log_holds_no_span_over_its_threshold_where_a_sliding_window_lets_more_through() {
    let rule = |id: &str, algo: &str| {
        format!("  - id: {id}\n    pathPattern: /{id}\n    algorithm: {algo}\n    tiers: [{{ period: 10, threshold: 3 }}]\n")
    };
    let rig = Rig::new(
        &(rule("log", "sliding_log") + &rule("win", "sliding_window")),
        "",
    );
    // three at the end of a window, 9.9 s in
    rig.clock.set_ms(T0 + 9_900);
    for path in ["/log", "/win"] {
        for left in ["2", "1", "0"] {
            let r = rig.get(path, "acme");
            assert!(r.forwarded, "{path}");
            assert_eq!(r.header("x-ratelimit-remaining"), Some(left));
        }
    }
    let r = rig.get("/log", "acme");
    assert_eq!(r.status, 429);
    assert_eq!(
        r.header("retry-after"),
        Some("10"),
        "they leave at T0 + 19.9 s"
    );
    // half-way into the next window the sliding window weighs the previous three as 1.5
    rig.clock.set_ms(T0 + 15_000);
    assert!(
        rig.get("/win", "acme").forwarded,
        "the estimate lets one more in"
    );
    let r = rig.get("/log", "acme");
    assert_eq!(r.status, 429, "the log knows all three are in the span");
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("5"));
    // they leave together 10 s after they came, to the millisecond
    rig.clock.set_ms(T0 + 19_899);
    assert_eq!(rig.get("/log", "acme").status, 429);
    rig.clock.set_ms(T0 + 19_900);
    let r = rig.get("/log", "acme");
    assert!(r.forwarded);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some("10"),
        "it is the oldest now"
    );
}

/// docs/configuration.md "Leaky bucket": a burst waits its turns, `period / threshold` apart
/// and in arrival order; past the queue it is refused with Retry-After; a request whose client
/// leaves before its turn gives the turn back.
#[test]
fn a_leaky_bucket_queues_a_burst_and_refuses_past_its_queue() {
    let rig = Rig::new(
        "  - id: steady\n    pathPattern: /**\n    algorithm: leaky_bucket\n    queue: 3\n    tiers: [{ period: 1, threshold: 5 }]",
        "",
    );
    rig.clock.set_ms(T0 + 100);
    let burst: Vec<Out> = (0..4).map(|_| rig.get("/a", "acme")).collect();
    let waits: Vec<u64> = burst.iter().map(|r| r.wait_ms).collect();
    assert_eq!(
        waits,
        [0, 200, 400, 600],
        "one leaves now, three wait their turns"
    );
    assert!(burst.iter().all(|r| r.forwarded));
    let remaining: Vec<&str> = burst
        .iter()
        .map(|r| r.header("x-ratelimit-remaining").unwrap())
        .collect();
    assert_eq!(remaining, ["3", "2", "1", "0"], "places left in the queue");
    // the queue is empty again 800 ms after the last took its turn: in whole seconds, 1
    assert_eq!(burst[3].header("x-ratelimit-reset"), Some("1"));
    let r = rig.get("/a", "acme");
    assert_eq!(r.status, 429, "a fourth would wait past the queue");
    assert_eq!(
        r.header("retry-after"),
        Some("1"),
        "200 ms, in whole seconds"
    );
    // the last one leaves before its turn: its turn is free again
    let mut last = burst.into_iter().next_back().unwrap();
    let d = last.admitted.decision_mut().unwrap();
    rig.snap.limiter.leave_queue(d);
    assert_eq!(rig.get("/a", "acme").wait_ms, 600, "the freed turn");
    // as time passes the queue drains: 1 s later it is empty
    rig.clock.set_ms(T0 + 1_100);
    assert_eq!(rig.get("/a", "acme").wait_ms, 0);
    // another tenant has its own bucket
    rig.clock.set_ms(T0 + 1_100);
    assert_eq!(rig.get("/a", "globex").wait_ms, 0);
}

/// A leaky bucket's queue defaults to the threshold, and `queue: 0` admits only on its turn.
#[test]
fn a_leaky_buckets_queue_defaults_to_its_threshold_and_zero_means_no_waiting() {
    let rig = Rig::new(
        "  - id: deflt\n    pathPattern: /d\n    algorithm: leaky_bucket\n    tiers: [{ period: 1, threshold: 4 }]\n  - id: strict\n    pathPattern: /s\n    algorithm: leaky_bucket\n    queue: 0\n    tiers: [{ period: 1, threshold: 4 }]",
        "",
    );
    rig.clock.set_ms(T0);
    let waits: Vec<u64> = (0..6).map(|_| rig.get("/d", "acme").wait_ms).collect();
    assert_eq!(
        waits,
        [0, 250, 500, 750, 1000, 0],
        "four wait, the sixth is refused"
    );
    assert_eq!(rig.get("/d", "acme").status, 429);
    assert!(rig.get("/s", "acme").forwarded);
    assert_eq!(rig.get("/s", "acme").status, 429);
    rig.clock.set_ms(T0 + 250);
    let r = rig.get("/s", "acme");
    assert!(r.forwarded);
    assert_eq!(r.wait_ms, 0);
}

/// docs/configuration.md "Sliding log": every tier, action, `cost` and `count_when` works with
/// it: two tiers must both pass, a request takes its cost from each, and `count_when` counts
/// only the answers it names (`action: delay`: the next test).
#[test]
fn a_sliding_log_takes_tiers_costs_and_counted_answers() {
    let rig = Rig::new(
        "  - id: log\n    pathPattern: /c/**\n    algorithm: sliding_log\n    cost: { header: x-cost, max: 5 }\n    tiers: [{ period: 1, threshold: 5 }, { period: 10, threshold: 8 }]\n  - id: fails\n    pathPattern: /f/**\n    algorithm: sliding_log\n    count_when: { status: [5xx] }\n    tiers: [{ period: 10, threshold: 1 }]",
        "",
    );
    rig.clock.set_ms(T0 + 100);
    let cost = |n: &str| rig.send("GET", "/c/x", &[("x-org-id", "acme"), ("x-cost", n)]);
    assert!(cost("4").forwarded, "4 of 5 and of 8");
    assert_eq!(cost("2").status, 429, "6 > 5 in the second");
    assert!(cost("1").forwarded, "5 of 5");
    rig.clock.set_ms(T0 + 1_100);
    assert!(
        cost("3").forwarded,
        "the second is empty again: 3 of 5, 8 of 8"
    );
    assert_eq!(cost("1").status, 429, "the ten seconds are full");
    rig.clock.set_ms(T0 + 10_099);
    assert_eq!(cost("1").status, 429);
    rig.clock.set_ms(T0 + 10_100);
    assert!(
        cost("4").forwarded,
        "the first 5 units left the ten seconds"
    );
    // count_when: a 200 is not counted, a 503 is
    rig.clock.set_ms(T0 + 30_000);
    let r = rig.get("/f/x", "acme");
    rig.answer(&r, 200, &HeaderMap::new());
    let r = rig.get("/f/x", "acme");
    assert!(r.forwarded, "the 200 was not counted");
    rig.answer(&r, 503, &HeaderMap::new());
    assert_eq!(rig.get("/f/x", "acme").status, 429, "the 503 was");
}

/// A sliding log under `action: delay`: an over-limit request waits until enough of the span
/// has left for it, no longer.
#[tokio::test]
async fn a_sliding_log_delay_waits_until_the_oldest_leaves() {
    let rig = Rig::at_ms(
        "  - id: slow\n    pathPattern: /d/**\n    algorithm: sliding_log\n    action: delay\n    max_delay: 2s\n    tiers: [{ period: 1, threshold: 2 }]",
        T0 + 100,
    );
    let t = [("x-org-id", "acme")];
    assert!(rig.send_and_wait("/d/x", &t).await.forwarded);
    rig.clock.advance_ms(400);
    assert!(rig.send_and_wait("/d/x", &t).await.forwarded);
    let started = rig.clock.now_ns();
    let r = rig.send_and_wait("/d/x", &t).await;
    assert!(r.forwarded && r.admitted.delayed, "delayed, then admitted");
    let held = rig.since(started);
    assert!(
        held >= std::time::Duration::from_millis(600)
            && held < std::time::Duration::from_millis(620),
        "until the first left, 600 ms later: {held:?}"
    );
}

/// The quota endpoint of a sliding log tells its span: what the last period admitted, wherever
/// the window boundary fell, and until when the oldest stays in it.
#[test]
fn the_quota_endpoint_tells_a_sliding_logs_span() {
    let text = config_text(
        "  - id: log\n    pathPattern: /**\n    algorithm: sliding_log\n    tiers: [{ period: 10, threshold: 3 }]",
        "",
    )
    .edit(
        "  listen: [\"127.0.0.1:1\"]\n",
        "  listen: [\"127.0.0.1:1\"]\n  quota_endpoint: /quota\n",
    );
    let rig = Rig::from_text(&text, Arc::new(FakeClock::at_ms(T0 + 9_000)));
    assert!(rig.get("/x", "acme").forwarded);
    assert!(rig.get("/x", "acme").forwarded);
    // the next window: both are still in the span, for 4 s more
    rig.clock.set_ms(T0 + 15_000);
    let j = rig.get("/quota", "acme").json();
    let tier = &j["rules"][0]["tiers"][0];
    assert_eq!(
        (&tier["used"], &tier["remaining"]),
        (&2.into(), &1.into()),
        "{j}"
    );
    assert_eq!(tier["reset"], 4, "{j}");
    rig.clock.set_ms(T0 + 19_000);
    let j = rig.get("/quota", "acme").json();
    assert_eq!(j["rules"][0]["tiers"][0]["remaining"], 3, "{j}");
}

/// The new algorithms under the other actions: a `shadow` sliding log or leaky bucket never
/// refuses nor makes a request wait (it reports what it would have done), and `shadowban` and
/// `throttle` apply to what they would refuse.
#[test]
fn sliding_logs_and_leaky_buckets_take_every_action() {
    let rule = |id: &str, algo: &str, action: &str| {
        format!("  - id: {id}\n    pathPattern: /{id}\n    algorithm: {algo}\n    action: {action}\n    tiers: [{{ period: 10, threshold: 1 }}]\n")
    };
    let rig = Rig::new(
        &[
            rule("log-shadow", "sliding_log", "shadow"),
            // (queue 0: the second would be refused, not queued)
            rule("leaky-shadow", "leaky_bucket", "shadow\n    queue: 0"),
            rule("log-ban", "sliding_log", "shadowban"),
            rule(
                "leaky-throttle",
                "leaky_bucket",
                "throttle\n    throttle: { rate: 1KiB/s }\n    queue: 0",
            ),
        ]
        .concat(),
        "",
    );
    rig.clock.set_ms(T0 + 1_000);
    for path in ["/log-shadow", "/leaky-shadow"] {
        for _ in 0..3 {
            let r = rig.get(path, "acme");
            assert!(r.forwarded, "{path}: a shadow rule never refuses");
            assert_eq!(r.wait_ms, 0, "{path}: nor makes a request wait");
        }
    }
    let m = rig.metrics();
    for rule in ["log-shadow", "leaky-shadow"] {
        assert!(
            m.contains(&format!(
                r#"decision="shadow_denied",rule="{rule}",tier="10s"}} 2"#
            )),
            "{rule}: {m}"
        );
    }
    assert!(rig.get("/log-ban", "acme").forwarded);
    let r = rig.get("/log-ban", "acme");
    assert_eq!(r.admitted.action, Some("shadowbanned"));
    assert!(rig.get("/leaky-throttle", "acme").forwarded);
    let r = rig.get("/leaky-throttle", "acme");
    assert!(r.forwarded);
    assert_eq!(r.admitted.action, Some("throttled"));
    assert_eq!(r.admitted.throttle_bps, 1024);
}
