//! Every class of configuration error, through `tollgate -t`: exit status 1, no panic, and
//! `FILE:LINE:COLUMN: message` naming the field and what would be accepted.

mod common;
use common::{run_tollgate, Edit, TempDir};

/// A valid config; each case below replaces one line of it.
const BASE: &str = r#"server:
  listen: ["127.0.0.1:8080"]
  admin: "127.0.0.1:9090"
upstreams:
  products:
    servers: ["127.0.0.1:9001"]
    health_check: { interval: 1s }
routes:
  - id: products
    path: /v1/**
    upstream: products
tenant:
  from:
    - header: x-org-id
  required: true
plans:
  premium: [acme]
limits:
  - id: get-product
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    tiers:
      - { period: 1, threshold: 10 }
"#;

/// Replace `from` (which must occur once) in BASE.
fn with(from: &str, to: &str) -> String {
    assert_eq!(
        BASE.matches(from).count(),
        1,
        "{from:?} must occur once in BASE"
    );
    BASE.edit(from, to)
}

/// Check the config fails with an error at `line:col` whose message contains every `needles`.
fn assert_error(text: &str, line: usize, col: usize, needles: &[&str]) {
    let dir = TempDir::new();
    let path = dir.write("gateway.yaml", text);
    let p = path.display().to_string();
    let (code, _out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 1, "exit status; stderr: {err}");
    let prefix = format!("{p}:{line}:{col}: ");
    let line_found = err
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no error at {line}:{col}; stderr: {err}"));
    for n in needles {
        assert!(line_found.contains(n), "{n:?} missing in {line_found:?}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");
}

#[test]
fn base_config_is_valid() {
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", BASE).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("is valid"));
}

#[test]
fn yaml_syntax_error() {
    assert_error(
        &with(
            "  listen: [\"127.0.0.1:8080\"]",
            "  listen: [\"127.0.0.1:8080\"",
        ),
        3,
        3,
        &["did not find expected"],
    );
}

#[test]
fn unknown_key_is_a_typo() {
    assert_error(
        &with("    upstream: products", "    uptream: products"),
        11,
        5,
        &["routes[0]", "unknown field `uptream`", "`upstream`"],
    );
    assert_error(
        &with("    methods: [GET]", "    method: [GET]"),
        20,
        5,
        &["limits[0]", "unknown field `method`", "`methods`"],
    );
}

#[test]
fn wrong_type() {
    assert_error(
        &with(
            "  admin: \"127.0.0.1:9090\"",
            "  admin: \"127.0.0.1:9090\"\n  threads: two",
        ),
        4,
        12,
        &["server.threads", "invalid type", "expected a whole number"],
    );
}

#[test]
fn bad_duration() {
    assert_error(
        &with("{ interval: 1s }", "{ interval: 1y }"),
        7,
        31,
        &["health_check.interval", "unit \"y\"", "ms, s, m, h"],
    );
    assert_error(
        &with("{ interval: 1s }", "{ interval: -3 }"),
        7,
        31,
        &["health_check.interval", "negative"],
    );
}

#[test]
fn unknown_upstream_in_route() {
    assert_error(
        &with("    upstream: products", "    upstream: prodcts"),
        11,
        15,
        &[
            "routes[0].upstream",
            "unknown upstream \"prodcts\"",
            "products",
        ],
    );
}

#[test]
fn duplicate_route_and_rule_ids() {
    let routes = with(
        "    upstream: products\n",
        "    upstream: products\n  - id: products\n    path: /x\n    upstream: products\n",
    );
    assert_error(
        &routes,
        12,
        9,
        &["routes[1].id", "duplicate route id \"products\""],
    );
    let rules = format!("{BASE}  - id: get-product\n    pathPattern: /x\n    tiers: [{{ period: 1, threshold: 1 }}]\n");
    assert_error(
        &rules,
        24,
        9,
        &["limits[1].id", "duplicate rule id \"get-product\""],
    );
}

#[test]
fn bad_glob() {
    assert_error(
        &with("    path: /v1/**", "    path: /v1/a*b"),
        10,
        11,
        &["routes[0].path", "whole segments"],
    );
    assert_error(
        &with(
            "    pathPattern: /v1/organizations/*/product/*",
            "    pathPattern: v1/x",
        ),
        21,
        18,
        &["limits[0].pathPattern", "must start with '/'"],
    );
}

#[test]
fn period_or_threshold_zero_or_negative() {
    assert_error(
        &with(
            "{ period: 1, threshold: 10 }",
            "{ period: 0, threshold: 10 }",
        ),
        23,
        19,
        &["limits[0].tiers[0].period", "greater than 0"],
    );
    assert_error(
        &with(
            "{ period: 1, threshold: 10 }",
            "{ period: 1, threshold: -4 }",
        ),
        23,
        33,
        &["limits[0].tiers[0].threshold", "positive integer"],
    );
    assert_error(
        &with(
            "{ period: 1, threshold: 10 }",
            "{ period: 1, threshold: 0 }",
        ),
        23,
        33,
        &["threshold", "positive integer"],
    );
    // q= in RateLimit-Policy is a Structured Field integer: at most 15 digits
    assert_error(
        &with(
            "{ period: 1, threshold: 10 }",
            "{ period: 1, threshold: 10000000000000000 }",
        ),
        23,
        33,
        &["threshold 10000000000000000 is too large", "15 digits"],
    );
    let max = with(
        "{ period: 1, threshold: 10 }",
        "{ period: 1, threshold: 999999999999999 }",
    );
    let dir = TempDir::new();
    let path = dir.write("gateway.yaml", &max);
    let (code, _, err) = run_tollgate(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(code, 0, "15 digits are fine: {err}");
}

#[test]
fn empty_server_list() {
    assert_error(
        &with("    servers: [\"127.0.0.1:9001\"]", "    servers: []"),
        6,
        14,
        &["upstreams.products.servers", "at least one server"],
    );
}

#[test]
fn bad_server_and_listen_addresses() {
    assert_error(
        &with(
            "    servers: [\"127.0.0.1:9001\"]",
            "    servers: [\"nowhere\"]",
        ),
        6,
        15,
        &["servers[0]", "HOST:PORT"],
    );
    assert_error(
        &with("  listen: [\"127.0.0.1:8080\"]", "  listen: [\"8080\"]"),
        2,
        12,
        &["server.listen[0]", "IP:PORT"],
    );
}

#[test]
fn bad_dns_section_and_server_names() {
    assert_error(
        &with(
            "upstreams:\n",
            "dns:\n  servers: [\"ns1.example\"]\nupstreams:\n",
        ),
        5,
        13,
        &["dns.servers[0]", "invalid nameserver", "IP:PORT"],
    );
    assert_error(
        &with(
            "upstreams:\n",
            "dns:\n  min_ttl: 10s\n  max_ttl: 5s\nupstreams:\n",
        ),
        6,
        12,
        &["dns.max_ttl", "must be at least min_ttl"],
    );
    assert_error(
        &with("upstreams:\n", "dns:\n  min_ttl: 0\nupstreams:\n"),
        5,
        12,
        &["dns.min_ttl", "greater than 0"],
    );
    assert_error(
        &with("upstreams:\n", "dns:\n  nameservers: []\nupstreams:\n"),
        5,
        3,
        &["unknown field `nameservers`", "servers"],
    );
    assert_error(
        &with(
            "    servers: [\"127.0.0.1:9001\"]",
            "    servers: [\"api_v1.internal:80\"]",
        ),
        6,
        15,
        &["servers[0]", "invalid host", "HOST:PORT"],
    );
    assert_error(
        &with(
            "    servers: [\"127.0.0.1:9001\"]",
            "    servers: [\"api.internal:0\"]",
        ),
        6,
        15,
        &["servers[0]", "invalid port"],
    );
}

#[test]
fn unknown_plan() {
    assert_error(
        &with("      - { period: 1, threshold: 10 }\n", "      - { period: 1, threshold: 10 }\n    plans:\n      gold: [{ period: 1, threshold: 99 }]\n"),
        25, 7, &["limits[0].plans.gold", "unknown plan \"gold\"", "premium"],
    );
}

#[test]
fn plans_only_with_per_tenant() {
    assert_error(
        &with(
            "      - { period: 1, threshold: 10 }\n",
            "      - { period: 1, threshold: 10 }\n    per: ip\n    plans:\n      premium: [{ period: 1, threshold: 99 }]\n",
        ),
        25, 5, &["limits[0].plans", "only to rules with `per: tenant`"],
    );
}

#[test]
fn bad_enum_value_lists_accepted_values() {
    assert_error(
        &with(
            "    methods: [GET]",
            "    methods: [GET]\n    algorithm: leaky",
        ),
        21,
        16,
        &[
            "limits[0].algorithm",
            "unknown value `leaky`",
            "fixed_window",
        ],
    );
    assert_error(
        &with("    methods: [GET]", "    methods: [GETS]"),
        20,
        15,
        &[
            "limits[0].methods[0]",
            "unknown method \"GETS\"",
            "did you mean `GET`?",
        ],
    );
}

#[test]
fn tenant_source_with_unknown_kind() {
    assert_error(
        &with("    - header: x-org-id", "    - heder: x-org-id"),
        14,
        7,
        &["tenant.from[0]", "unknown field `heder`", "`header`"],
    );
}

#[test]
fn error_inside_included_limits_file_names_that_file() {
    let dir = TempDir::new();
    dir.write(
        "limits.yaml",
        "- id: a\n  pathPattern: /a\n  tiers:\n    - period: 10\n      threshold: 0\n",
    );
    let main = BASE.split("limits:").next().unwrap().to_string() + "limits: limits.yaml\n";
    let p = dir.write("gateway.yaml", &main);
    let (code, _, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
    assert_eq!(code, 1);
    let inc = dir.0.join("limits.yaml").display().to_string();
    assert!(
        err.starts_with(&format!("{inc}:5:18: limits[0].tiers[0].threshold")),
        "{err}"
    );
    // a typo inside the included file too
    dir.write("limits.yaml", "- id: a\n  pathPatern: /a\n  tiers: []\n");
    let (code, _, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!("{inc}:2:3: limits[0]: unknown field `pathPatern`")),
        "{err}"
    );
    // a missing include names the key that includes it
    std::fs::remove_file(dir.0.join("limits.yaml")).unwrap();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
    assert_eq!(code, 1);
    assert!(err.contains(":18:9: limits: cannot read"), "{err}");
}

#[test]
fn missing_file_and_several_errors_at_once() {
    let (code, _, err) = run_tollgate(&["-t", "-c", "/nonexistent/gateway.yaml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("/nonexistent/gateway.yaml:1:1: cannot read config file"),
        "{err}"
    );
    let text =
        with("    upstream: products", "    upstream: nope").edit("threshold: 10", "threshold: 0");
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 2, "both errors reported: {err}");
}

#[test]
fn at_most_16_tiers() {
    let tiers = |n: usize| {
        (1..=n)
            .map(|i| format!("      - {{ period: {i}, threshold: 10 }}\n"))
            .collect::<String>()
    };
    let sixteen = with("      - { period: 1, threshold: 10 }\n", &tiers(16));
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", &sixteen).display().to_string();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "16 tiers are fine: {err}");
    let seventeen = with("      - { period: 1, threshold: 10 }\n", &tiers(17));
    assert_error(
        &seventeen,
        39,
        9,
        &["limits[0].tiers[16]", "at most 16 tiers", "has 17"],
    );
}

#[test]
fn a_redis_url_the_client_refuses_is_refused_by_dash_t() {
    let text = with(
        "plans:\n",
        "redis:\n  url: \"redis://bad host name:notaport/x\"\nplans:\n",
    );
    assert_error(&text, 17, 8, &["redis.url", "invalid Redis URL"]);
    let text = with(
        "plans:\n",
        "redis:\n  cluster: [\"redis://127.0.0.1:7000\", \"redis://h:port/\"]\nplans:\n",
    );
    assert_error(&text, 17, 39, &["redis.cluster[1]", "invalid Redis URL"]);
}

#[test]
fn plain_increments_are_for_one_endpoint_only() {
    let text = with(
        "plans:\n",
        "redis:\n  cluster: [\"redis://127.0.0.1:7000\"]\n  plain_increments: true\nplans:\n",
    );
    assert_error(
        &text,
        18,
        21,
        &[
            "redis.plain_increments",
            "only with url",
            "every record leases",
        ],
    );
    let off = with(
        "plans:\n",
        "redis:\n  url: redis://127.0.0.1:6379\n  plain_increments: false\nplans:\n",
    );
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", &off).display().to_string();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_sentinel_endpoint_is_checked_by_dash_t() {
    let sentinel = |body: &str| with("plans:\n", &format!("redis:\n  sentinel: {body}\nplans:\n"));
    let text = sentinel("{ master: \"my master\", nodes: [\"redis://127.0.0.1:26379\"] }");
    assert_error(
        &text,
        17,
        23,
        &["redis.sentinel.master", "invalid master name"],
    );
    let text = sentinel("{ master: m, nodes: [] }");
    assert_error(
        &text,
        17,
        33,
        &["redis.sentinel.nodes", "at least one sentinel"],
    );
    let text = sentinel("{ master: m, nodes: [\"redis://a:1\", \"unix:///tmp/s\"] }");
    assert_error(&text, 17, 49, &["redis.sentinel.nodes[1]", "over TCP"]);
    let text = sentinel("{ master: m, nodes: [\"redis://a:1\", \"rediss://b:2\"] }");
    assert_error(
        &text,
        17,
        33,
        &["redis.sentinel.nodes", "mixes redis:// and rediss://"],
    );
    let text = sentinel("{ master: m, nodes: [\"redis://a:1\"], role: replica }");
    assert_error(
        &text,
        17,
        50,
        &["unknown field `role`", "expected `master` or `nodes`"],
    );
    // one endpoint only
    let text = with(
        "plans:\n",
        "redis:\n  url: redis://127.0.0.1:6379\n  sentinel: { master: m, nodes: [\"redis://a:1\"] }\nplans:\n",
    );
    assert_error(&text, 17, 6, &["exactly one of `url`", "`sentinel`"]);
    // a valid one is summed up by -t
    let dir = TempDir::new();
    let ok = sentinel("{ master: mymaster, nodes: [\"redis://:pw@127.0.0.1:26379\", \"redis://127.0.0.1:26380\"] }");
    let p = dir.write("gateway.yaml", &ok).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "redis: sentinel mymaster [redis://***@127.0.0.1:26379, redis://127.0.0.1:26380]"
        ),
        "{out}"
    );
}

#[test]
fn duplicate_keys_are_errors_with_both_positions() {
    // an API key given twice: the second would silently win
    let text = with(
        "    - header: x-org-id\n",
        "    - api_key: { keys: { \"k1\": acme, \"k1\": globex } }\n",
    );
    assert_error(
        &text,
        14,
        38,
        &[
            "duplicate key \"k1\"",
            "tenant.from[0].api_key.keys",
            "line 14, column 26",
        ],
    );
    // a second pool of the same name
    let text = with(
        "routes:\n",
        "  products:\n    servers: [\"127.0.0.1:9009\"]\nroutes:\n",
    );
    assert_error(
        &text,
        8,
        3,
        &[
            "duplicate key \"products\"",
            "in upstreams",
            "line 5, column 3",
        ],
    );
    // plans, and the top level
    assert_error(
        &with(
            "  premium: [acme]\n",
            "  premium: [acme]\n  premium: [globex]\n",
        ),
        18,
        3,
        &["duplicate key \"premium\"", "in plans"],
    );
    let text = format!("{BASE}tenant:\n  from: []\n");
    assert_error(
        &text,
        24,
        1,
        &[
            "duplicate key \"tenant\"",
            "the top level",
            "line 12, column 1",
        ],
    );
}

#[test]
fn duplicate_keys_in_a_keys_file() {
    let dir = TempDir::new();
    dir.write("keys.yaml", "k1: acme\nk2: globex\nk1: initech\n");
    let text = with(
        "    - header: x-org-id\n",
        "    - api_key: { keys_file: keys.yaml }\n",
    );
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("keys.yaml:3:1: duplicate key \"k1\""), "{err}");
    assert!(err.contains("line 1, column 1"), "{err}");
}

#[test]
fn a_key_at_the_wrong_indentation_is_named_where_it_stands() {
    // indented one column short: it is not a key of the rule
    let text = with(
        "    pathPattern: /v1/organizations/*/product/*\n",
        "   pathPattern: /v1/organizations/*/product/*\n",
    );
    assert_error(
        &text,
        19,
        5,
        &[
            "missing field `pathPattern`",
            "stands at line 21, column 4",
            "column 5",
            "indentation",
        ],
    );
    // or at the level of the list
    let text = with(
        "    pathPattern: /v1/organizations/*/product/*\n    tiers:\n      - { period: 1, threshold: 10 }\n",
        "    tiers:\n      - { period: 1, threshold: 10 }\n  pathPattern: /v1/organizations/*/product/*\n",
    );
    assert_error(&text, 19, 5, &["stands at line 23, column 3"]);
}

#[test]
fn a_structure_error_says_which_line_to_check() {
    let text = with("routes:\n", " routes:\n");
    assert_error(
        &text,
        8,
        2,
        &[
            "check the indentation of line 8",
            "upstreams.products.health_check",
        ],
    );
}

#[test]
fn a_fractional_threshold_is_named_as_such() {
    assert_error(
        &with(
            "{ period: 1, threshold: 10 }",
            "{ period: 1, threshold: 5.5 }",
        ),
        23,
        33,
        &[
            "limits[0].tiers[0].threshold",
            "whole number of requests, got 5.5",
        ],
    );
}

#[test]
fn one_listen_address_may_stand_alone() {
    let dir = TempDir::new();
    let text = with(
        "  listen: [\"127.0.0.1:8080\"]",
        "  listen: \"127.0.0.1:8080\"",
    );
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("listeners: 127.0.0.1:8080 "), "{out}");
    assert_error(
        &with("  listen: [\"127.0.0.1:8080\"]", "  listen: \"localhost\""),
        2,
        11,
        &["server.listen", "invalid address \"localhost\""],
    );
}

/// The rule's tier line, for cases that add keys after it.
const TIER: &str = "      - { period: 1, threshold: 10 }\n";

#[test]
fn actions_beyond_reject_are_checked() {
    let rule = |extra: &str| with(TIER, &format!("{TIER}{extra}"));
    assert_error(
        &rule("    action: throttle\n    throttle: { rate: fast }\n"),
        25,
        23,
        &[
            "limits[0].throttle.rate",
            "invalid rate \"fast\"",
            "64KiB/s",
        ],
    );
    assert_error(
        &rule("    action: throttle\n"),
        24,
        13,
        &["limits[0].action", "throttle: { rate: 64KiB/s }"],
    );
    assert_error(
        &rule("    shadowban: { status: 200 }\n"),
        24,
        5,
        &["limits[0].shadowban", "only to action: shadowban"],
    );
    assert_error(
        &rule("    action: shadowban\n    shadowban: { status: 100 }\n"),
        25,
        26,
        &["limits[0].shadowban.status", "200 to 599"],
    );
    assert_error(
        &rule("    concurrency: 0\n"),
        24,
        18,
        &["limits[0].concurrency", "1 to 1000000"],
    );
}

#[test]
fn shaping_settings_are_checked() {
    let hc = "    health_check: { interval: 1s }\n";
    assert_error(
        &with(hc, &format!("{hc}    queue: {{ max: 5 }}\n")),
        8,
        5,
        &["upstreams.products.queue", "max_in_flight"],
    );
    assert_error(
        &with(hc, &format!("{hc}    max_in_flight: 0\n")),
        8,
        20,
        &["upstreams.products.max_in_flight", "1 to 1000000"],
    );
    assert_error(
        &with(
            "  premium: [acme]\n",
            "  premium: { tenants: [acme], priority: high }\n",
        ),
        17,
        41,
        &[
            "plans.premium.priority",
            "\"high\"",
            "expected a whole number",
        ],
    );
    // the most negative i64 has no absolute value: refused, not a panic nor a wrap
    for p in ["-9223372036854775808", "1000001"] {
        assert_error(
            &with(
                "  premium: [acme]\n",
                &format!("  premium: {{ tenants: [acme], priority: {p} }}\n"),
            ),
            17,
            41,
            &["plans.premium.priority", "-1000000 to 1000000"],
        );
    }
}

/// Like `assert_error`, with `files` (name, text) written beside the config.
fn assert_error_with(
    text: &str,
    files: &[(&str, &str)],
    line: usize,
    col: usize,
    needles: &[&str],
) {
    let dir = TempDir::new();
    for (name, body) in files {
        dir.write(name, body);
    }
    let path = dir.write("gateway.yaml", text);
    let p = path.display().to_string();
    let (code, _out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 1, "exit status; stderr: {err}");
    let prefix = format!("{p}:{line}:{col}: ");
    let found = err
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no error at {line}:{col}; stderr: {err}"));
    for n in needles {
        assert!(found.contains(n), "{n:?} missing in {found:?}");
    }
}

#[test]
fn redis_credentials_and_tls_files_are_checked_by_dash_t() {
    let redis = |body: &str| with("plans:\n", &format!("redis:\n{body}plans:\n"));
    // a password file that is not there
    let text = redis("  url: \"redis://127.0.0.1:6379\"\n  password_file: nope.pass\n");
    assert_error(
        &text,
        18,
        18,
        &["redis.password_file", "cannot read", "nope.pass"],
    );
    // a password in the URL and in a file
    let text = redis("  url: \"redis://:a@127.0.0.1:6379\"\n  password_file: p\n");
    assert_error_with(
        &text,
        &[("p", "b\n")],
        18,
        18,
        &["password too", "one place"],
    );
    // an empty password file
    let text = redis("  url: \"redis://127.0.0.1:6379\"\n  password_file: p\n");
    assert_error_with(&text, &[("p", "\n")], 18, 18, &["password on one line"]);
    // a user in the URL and in `username`
    let text = redis("  url: \"redis://u:a@127.0.0.1:6379\"\n  username: v\n");
    assert_error(&text, 18, 13, &["redis.username", "names a user too"]);
    // TLS files for a plain URL
    let text = redis("  url: \"redis://127.0.0.1:6379\"\n  tls: { ca: ca.pem }\n");
    assert_error(&text, 18, 8, &["redis.tls", "rediss:// URLs only"]);
    // a CA file that holds no PEM, a certificate without its key
    let text = redis("  url: \"rediss://localhost:6380\"\n  tls: { ca: ca.pem, cert: c.pem }\n");
    assert_error_with(
        &text,
        &[("ca.pem", "not pem"), ("c.pem", "x")],
        18,
        14,
        &["redis.tls.ca", "no PEM"],
    );
    assert_error_with(
        &text,
        &[("ca.pem", "not pem"), ("c.pem", "x")],
        18,
        8,
        &["redis.tls", "needs its `key`"],
    );
}

#[test]
fn a_rediss_url_is_accepted_with_its_tls_files() {
    let dir = TempDir::new();
    dir.write("p", "secret\n");
    dir.write(
        "ca.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let text = with(
        "plans:\n",
        "redis:\n  url: \"rediss://localhost:6380\"\n  username: gw\n  password_file: p\nplans:\n",
    );
    let path = dir.write("gateway.yaml", &text);
    let (code, _out, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !err.contains("secret"),
        "the password is never printed: {err}"
    );
}

#[test]
fn access_lists_and_exemptions_are_checked() {
    // line 11 is `    upstream: products` of the route; the new keys follow it
    let route = |extra: &str| {
        with(
            "    upstream: products\n",
            &format!("    upstream: products\n{extra}"),
        )
    };
    assert_error(
        &route("    allow: [\"10.0.0.0/8\", \"10.0.0.0/33\"]\n"),
        12,
        27,
        &[
            "routes[0].allow[1]",
            "invalid network \"10.0.0.0/33\"",
            "CIDR",
        ],
    );
    assert_error(
        &route("    deny: [\"not an address\"]\n"),
        12,
        12,
        &["routes[0].deny[0]", "invalid network"],
    );
    assert_error(
        &route("    allow: []\n"),
        12,
        12,
        &["routes[0].allow", "refuses every client"],
    );
    // the rule ends at line 23; exempt follows
    let exempt = |e: &str| format!("{BASE}    exempt: {e}\n");
    assert_error(
        &exempt("{ plans: [gold] }"),
        24,
        23,
        &[
            "limits[0].exempt.plans[0]",
            "unknown plan \"gold\"",
            "premium",
        ],
    );
    assert_error(
        &exempt("{ ips: [\"300.1.1.1\"] }"),
        24,
        21,
        &["limits[0].exempt.ips[0]", "invalid network"],
    );
    assert_error(
        &exempt("{ networks: [\"10.0.0.0/8\"] }"),
        24,
        15,
        &["networks"],
    );
    // all of them valid: -t accepts and shows them
    let dir = TempDir::new();
    let text = route("    allow: [\"10.0.0.0/8\"]\n    deny: [\"10.9.0.0/16\"]\n")
        + "    exempt: { ips: [\"192.168.0.0/16\"], tenants: [acme], plans: [premium] }\n";
    let path = dir.write("gateway.yaml", &text);
    let (code, out, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("allow [10.0.0.0/8] deny [10.9.0.0/16]"),
        "{out}"
    );
    assert!(
        out.contains("exempt: ips [192.168.0.0/16], tenants [acme], plans [premium]"),
        "{out}"
    );
}

#[test]
fn the_quota_endpoint_is_one_literal_path() {
    for bad in ["quota", "/quota/*", "/quota?x=1"] {
        assert_error(
            &with(
                "  admin: \"127.0.0.1:9090\"\n",
                &format!("  admin: \"127.0.0.1:9090\"\n  quota_endpoint: \"{bad}\"\n"),
            ),
            4,
            19,
            &["server.quota_endpoint", "is not a path", "/quota"],
        );
    }
}

#[test]
fn count_when_is_checked() {
    let rule = |e: &str| format!("{BASE}    count_when: {e}\n");
    assert_error(
        &rule("{ status: [401, 700] }"),
        24,
        33,
        &[
            "limits[0].count_when.status[1]",
            "700 is not a status",
            "5xx",
        ],
    );
    assert_error(
        &rule("{ status: [\"6xx\"] }"),
        24,
        28,
        &["limits[0].count_when.status[0]", "\"6xx\" is not a status"],
    );
    assert_error(
        &rule("{ status: [] }"),
        24,
        19,
        &["limits[0].count_when.status", "at least one status"],
    );
    assert_error(
        &rule("{ grpc_status: [UNAVAILABLE, 17] }"),
        24,
        46,
        &[
            "limits[0].count_when.grpc_status[1]",
            "17 is not a gRPC status",
            "0 to 16",
        ],
    );
    assert_error(
        &rule("{ grpc_status: [UNAVAILABEL] }"),
        24,
        33,
        &[
            "limits[0].count_when.grpc_status[0]",
            "\"UNAVAILABEL\" is not a gRPC status",
        ],
    );
    assert_error(
        &rule("{ grpc_status: [] }"),
        24,
        17,
        &["limits[0].count_when.status", "grpc_status"],
    );
    assert_error(
        &format!("{BASE}    action: delay\n    count_when: {{ status: [401] }}\n"),
        25,
        17,
        &["limits[0].count_when", "action delay"],
    );
    // fleet-wide too, a token bucket included: accepted with `redis`
    let dir = TempDir::new();
    let text = format!(
        "{}    algorithm: token_bucket\nredis:\n  url: redis://127.0.0.1:6379\n",
        rule("{ status: [401, 5xx] }")
    );
    let path = dir.write("gateway.yaml", &text);
    let (code, _, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn cost_is_checked() {
    let rule = |c: &str| format!("{BASE}    cost: {c}\n");
    assert_error(
        &rule("0"),
        24,
        11,
        &[
            "limits[0].cost",
            "must be 1 to 10",
            "smallest threshold",
            "got 0",
        ],
    );
    assert_error(&rule("11"), 24, 11, &["limits[0].cost", "got 11"]);
    assert_error(
        &rule("{ header: x-cost, max: 50 }"),
        24,
        34,
        &["limits[0].cost.max", "1 to 10", "got 50"],
    );
    assert_error(
        &rule("{ header: x-cost, max: 10, default: 11 }"),
        24,
        47,
        &["limits[0].cost.default", "1 to max (10)"],
    );
    assert_error(
        &rule("{ header: x-cost }"),
        24,
        11,
        &["limits[0].cost", "needs `max`", "400"],
    );
    assert_error(
        &rule("{ header: x-cost, response_header: x-usage, max: 5 }"),
        24,
        11,
        &["limits[0].cost", "exactly one"],
    );
    assert_error(
        &rule("{ max: 5 }"),
        24,
        11,
        &[
            "limits[0].cost",
            "one of a request `header`, a `response_header` or a `response_trailer`",
        ],
    );
    assert_error(
        &rule("{ response_header: x-usage, response_trailer: x-usage }"),
        24,
        11,
        &["limits[0].cost", "exactly one"],
    );
    assert_error(
        &rule("{ response_trailer: \"bad name\" }"),
        24,
        31,
        &["limits[0].cost.response_trailer"],
    );
    assert_error(
        &rule("{ response_header: x-usage, max: 11 }"),
        24,
        44,
        &[
            "limits[0].cost.max",
            "1 to 10",
            "one answer fills a window",
            "got 11",
        ],
    );
    assert_error(
        &rule("{ response_header: \"x usage\" }"),
        24,
        30,
        &["limits[0].cost.response_header"],
    );
    assert_error(
        &format!("{BASE}    action: delay\n    cost: {{ response_header: x-usage }}\n"),
        25,
        11,
        &["limits[0].cost", "action delay"],
    );
    assert_error(
        &format!("{BASE}    unit: Tokens\n"),
        24,
        11,
        &["limits[0].unit", "\"Tokens\" is not a unit", "lowercase"],
    );
    // with count_when, and fleet-wide too: accepted with `redis`
    let dir = TempDir::new();
    let text = format!(
        "{}    count_when: {{ status: [429] }}\n  - id: llm\n    pathPattern: /v1/**\n    tiers: [{{ period: 1m, threshold: 1000 }}]\n    cost: {{ response_header: x-usage-tokens }}\nredis:\n  url: redis://127.0.0.1:6379\n",
        rule("{ header: x-cost, max: 10 }")
    );
    let path = dir.write("gateway.yaml", &text);
    let (code, _, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn calendar_periods_are_checked() {
    let rule = |period: &str, extra: &str| {
        with(
            "      - { period: 1, threshold: 10 }\n",
            &format!("      - {{ period: {period}, threshold: 10 }}\n{extra}"),
        )
    };
    // a calendar period counts in fixed windows only
    assert_error(
        &rule("1mo", "    algorithm: sliding_window\n"),
        23,
        19,
        &[
            "limits[0].tiers[0].period",
            "calendar period (1mo) needs algorithm fixed_window",
            "24h",
        ],
    );
    // an IANA zone, from the system's zoneinfo
    assert_error(
        &rule("1d", "    calendar: { tz: Europe/Berln }\n"),
        24,
        21,
        &[
            "limits[0].calendar.tz",
            "unknown time zone \"Europe/Berln\"",
            "Europe/Berlin",
        ],
    );
    // a calendar needs a calendar tier
    assert_error(
        &rule("10", "    calendar: { tz: Europe/Berlin }\n"),
        24,
        5,
        &["limits[0].calendar", "1d, 1w or 1mo", "has none"],
    );
    // only one day, week or month
    assert_error(
        &rule("2d", ""),
        23,
        19,
        &["one calendar day, week or month (1d, 1w, 1mo)", "48h"],
    );
    let dir = TempDir::new();
    let path = dir.write(
        "gateway.yaml",
        &rule("1w", "    calendar: { tz: Asia/Kolkata }\n"),
    );
    let (code, out, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("10/1 week in Asia/Kolkata"), "{out}");
}

/// docs/configuration.md "Sliding log" and "Leaky bucket": a sliding log's threshold has a
/// maximum (the alternative is named); `queue` belongs to leaky buckets and has a range.
#[test]
fn sliding_log_thresholds_and_leaky_bucket_queues_are_checked() {
    let rule = |algo: &str, threshold: u64, extra: &str| {
        with(
            "      - { period: 1, threshold: 10 }\n",
            &format!(
                "      - {{ period: 60, threshold: {threshold} }}\n    algorithm: {algo}\n{extra}"
            ),
        )
    };
    assert_error(
        &rule("sliding_log", 10_001, ""),
        23,
        34,
        &[
            "limits[0].tiers[0].threshold",
            "too large for sliding_log",
            "at most 10000",
            "use sliding_window",
        ],
    );
    assert_error(
        &rule("token_bucket", 10, "    queue: 5\n"),
        25,
        12,
        &[
            "limits[0].queue",
            "only to algorithm: leaky_bucket",
            "token_bucket",
        ],
    );
    assert_error(
        &rule("leaky_bucket", 10, "    queue: -1\n"),
        25,
        12,
        &["limits[0].queue", "0 to 1000000", "got -1"],
    );
    let dir = TempDir::new();
    for text in [
        rule("sliding_log", 10_000, ""),
        rule("leaky_bucket", 10, "    queue: 0\n"),
        rule("leaky_bucket", 10, ""),
    ] {
        let path = dir.write("gateway.yaml", &text);
        let (code, _, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
        assert_eq!(code, 0, "{text}\n{err}");
    }
}

/// docs/configuration.md "`tracing`": the collector's URL, the share of requests traced and
/// how spans name the tenant are checked.
#[test]
fn tracing_settings_are_checked() {
    let with_tracing = |lines: &str| format!("{BASE}tracing:\n{lines}");
    assert_error(
        &with_tracing("  otlp: 127.0.0.1:4318\n"),
        25,
        9,
        &[
            "tracing.otlp",
            "not an OTLP/HTTP endpoint",
            "http://127.0.0.1:4318",
        ],
    );
    assert_error(
        &with_tracing("  otlp: http://127.0.0.1:4318\n  sample: 1.5\n"),
        26,
        11,
        &["tracing.sample", "0 to 1", "1.5"],
    );
    assert_error(
        &with_tracing("  otlp: http://127.0.0.1:4318\n  tenant: maybe\n"),
        26,
        11,
        &["tracing.tenant", "plain or hash"],
    );
    let dir = TempDir::new();
    let path = dir.write(
        "gateway.yaml",
        &with_tracing("  otlp: http://127.0.0.1:4318\n  sample: 0.01\n  tenant: hash\n"),
    );
    let (code, _, err) = run_tollgate(&["-t", "-c", &path.display().to_string()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_pool_protocol_must_fit_its_transport() {
    let pool = "    servers: [\"127.0.0.1:9001\"]\n    health_check: { interval: 1s }";
    // line 8 is the pool's `protocol`, column 15 its value
    let t = with(pool, &format!("{pool}\n    protocol: h2"));
    assert_error(&t, 8, 15, &["upstreams.products.protocol", "tls", "h2c"]);
    let t = with(pool, &format!("{pool}\n    protocol: http3"));
    assert_error(&t, 8, 15, &["unknown protocol", "http1, h2 or h2c"]);
    let t = with(
        pool,
        &format!("{pool}\n    protocol: h2c\n    tls: {{ sni: api.internal }}"),
    );
    assert_error(&t, 8, 15, &["h2c is HTTP/2 over plain TCP", "use h2"]);
    let t = with(
        pool,
        &format!("{pool}\n    protocol: h2c\n    max_streams_per_connection: 0"),
    );
    assert_error(&t, 9, 33, &["max_streams_per_connection", "between 1 and"]);
}

#[test]
fn a_grpc_health_check_needs_an_http2_pool_and_is_not_an_http_check() {
    let pool = "    servers: [\"127.0.0.1:9001\"]\n    health_check: { interval: 1s }";
    let check = |hc: &str, extra: &str| {
        with(
            pool,
            &format!("    servers: [\"127.0.0.1:9001\"]\n    health_check: {{ interval: 1s, {hc} }}{extra}"),
        )
    };
    // line 7 is the health check; column 35 its `grpc` key
    let over_http1 = [
        "",
        "\n    protocol: http1",
        "\n    protocol: http1\n    tls: { sni: api.internal }",
    ];
    for extra in over_http1 {
        let t = check("grpc: { service: \"\" }", extra);
        assert_error(
            &t,
            7,
            35,
            &[
                "upstreams.products.health_check.grpc",
                "HTTP/2",
                "protocol: h2c",
                "protocol: h2",
            ],
        );
    }
    // one kind of check, as Envoy's grpc_health_check and http_health_check
    let t = check("http: { path: /healthz }, grpc: {}", "\n    protocol: h2c");
    assert_error(&t, 7, 61, &["health_check.grpc", "http or grpc, not both"]);
    // `service` is the one key
    let t = check("grpc: { path: /healthz }", "\n    protocol: h2c");
    assert_error(&t, 7, 43, &["unknown field `path`", "service"]);
    // on an HTTP/2 pool it is valid, with or without a service
    for (hc, extra) in [
        ("grpc: {}", "\n    protocol: h2c"),
        (
            "grpc: { service: billing.v1.Billing }",
            "\n    protocol: h2c",
        ),
        (
            "grpc: { service: \"\" }",
            "\n    protocol: h2\n    tls: { sni: api.internal }",
        ),
    ] {
        let dir = TempDir::new();
        let p = dir
            .write("gateway.yaml", &check(hc, extra))
            .display()
            .to_string();
        let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
        assert_eq!(code, 0, "{hc} {extra}: {err}");
    }
}

/// A route's `cors` (issue 41): origins that are not origins, credentials with any origin, a
/// method or header name that is none, a typo.
#[test]
fn bad_cors() {
    let route = "    upstream: products\n";
    let cors = |body: &str| with(route, &format!("{route}    cors:\n{body}"));
    assert_error(
        &cors("      origins: [\"https://app.example.com/\"]\n"),
        13,
        17,
        &[
            "routes[0].cors.origins[0]",
            "not an origin",
            "scheme://host[:port]",
        ],
    );
    assert_error(
        &cors("      origins: any\n"),
        13,
        16,
        &["routes[0].cors.origins", "expected \"*\""],
    );
    assert_error(
        &cors("      origins: \"*\"\n      credentials: true\n"),
        14,
        20,
        &["routes[0].cors.credentials", "list of origins"],
    );
    assert_error(
        &cors("      origins: [\"https://a.example\"]\n      methods: [FETCH]\n"),
        14,
        17,
        &["routes[0].cors.methods[0]", "unknown method \"FETCH\""],
    );
    assert_error(
        &cors("      origins: [\"https://a.example\"]\n      expose_headers: [\"bad header\"]\n"),
        14,
        24,
        &["routes[0].cors.expose_headers[0]", "not a header name"],
    );
    assert_error(
        &cors("      origins: [\"https://a.example\"]\n      max_ages: 10m\n"),
        14,
        7,
        &["routes[0].cors", "unknown field `max_ages`", "`max_age`"],
    );
}

/// A route's `timeouts` (issue 41): 0 is an error, a typo is named.
#[test]
fn bad_route_timeouts() {
    let route = "    upstream: products\n";
    let t = |body: &str| with(route, &format!("{route}    timeouts: {body}\n"));
    assert_error(
        &t("{ read: 0 }"),
        12,
        23,
        &["routes[0].timeouts.read", "greater than 0"],
    );
    assert_error(
        &t("{ totl: 1s }"),
        12,
        17,
        &["routes[0].timeouts", "unknown field `totl`", "`total`"],
    );
}

/// A route's `total` shorter than its `read` is accepted, with a warning at its place.
#[test]
fn a_total_shorter_than_read_is_a_warning() {
    let dir = TempDir::new();
    let text = with(
        "    upstream: products\n",
        "    upstream: products\n    timeouts: { read: 5s, total: 1s }\n",
    );
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains(&format!("{p}:12:"))
            && all.contains("warning: routes[0].timeouts.total: 1s is shorter than read (5s)"),
        "{all}"
    );
}

/// A route's rewrites (issue 41): an unknown variable, a framing header, a prefix that is
/// no path.
#[test]
fn bad_rewrites() {
    let route = "    upstream: products\n";
    let with_route = |extra: &str| with(route, &format!("{route}{extra}"));
    assert_error(
        &with_route("    request_headers: { set: { x-a: \"${tenant_id}\" } }\n"),
        12,
        36,
        &[
            "routes[0].request_headers.set.x-a",
            "unknown variable ${tenant_id}",
            "${tenant}",
        ],
    );
    assert_error(
        &with_route("    response_headers: { remove: [content-length] }\n"),
        12,
        34,
        &["routes[0].response_headers.remove[0]", "framing"],
    );
    assert_error(
        &with_route("    strip_prefix: api/\n"),
        12,
        19,
        &["routes[0].strip_prefix", "\"/api\""],
    );
}

/// A route's `upstreams` (issue 41): not beside `upstream`, neither of them, an unknown pool
/// or plan, an empty `when`, no share left for the requests no `when` takes.
#[test]
fn bad_traffic_splits() {
    let route = "    upstream: products\n";
    let split = |body: &str| with(route, &format!("    upstreams:\n{body}"));
    assert_error(
        &with(
            route,
            "    upstream: products\n    upstreams: [{ pool: products }]\n",
        ),
        12,
        16,
        &["routes[0].upstreams", "`upstream` or `upstreams`, not both"],
    );
    assert_error(
        &with(route, ""),
        9,
        7,
        &["routes[0]", "needs `upstream`", "`upstreams`"],
    );
    assert_error(
        &split("      - { pool: products, weight: 9 }\n      - { pool: orders, weight: 1 }\n"),
        13,
        17,
        &[
            "routes[0].upstreams[1].pool",
            "unknown upstream \"orders\"",
            "products",
        ],
    );
    assert_error(
        &split("      - { pool: products, when: { plan: gold } }\n      - { pool: products }\n"),
        12,
        41,
        &[
            "routes[0].upstreams[0].when.plan",
            "unknown plan \"gold\"",
            "premium",
        ],
    );
    assert_error(
        &split("      - { pool: products, when: {} }\n      - { pool: products }\n"),
        12,
        33,
        &["routes[0].upstreams[0].when", "always holds"],
    );
    assert_error(
        &split("      - { pool: products, weight: 0 }\n"),
        12,
        7,
        &["routes[0].upstreams", "weight above 0"],
    );
    assert_error(
        &with(route, "    upstream: products\n    sticky: tenant\n"),
        12,
        13,
        &["routes[0].sticky", "several pools"],
    );
}

/// A route's `rewrite` (issue 41): a pattern that is none, a `to` that is no path or names a
/// group the pattern lacks, beside `strip_prefix`.
#[test]
fn bad_path_rewrites() {
    let route = "    upstream: products\n";
    let rw = |body: &str| with(route, &format!("{route}    rewrite: {body}\n"));
    assert_error(
        &rw(r#"{ pattern: "^/v1/(", to: "/x" }"#),
        12,
        25,
        &[
            "routes[0].rewrite.pattern",
            "not a regular expression",
            "unclosed group",
        ],
    );
    assert_error(
        &rw(r#"{ pattern: "^/v1/(.*)", to: "v2/$1" }"#),
        12,
        42,
        &["routes[0].rewrite.to", "expected a path"],
    );
    assert_error(
        &rw(r#"{ pattern: "^/v1/(.*)", to: "/v2/${2}" }"#),
        12,
        42,
        &["routes[0].rewrite.to", "${2}", "no such group"],
    );
    assert_error(
        &with(
            route,
            "    upstream: products\n    strip_prefix: /v1\n    rewrite: { pattern: x, to: /y }\n",
        ),
        13,
        14,
        &["routes[0].rewrite", "not both"],
    );
}

/// `redis.url_file` (issue 42: the URL from a Kubernetes Secret): read at load, never shown
/// (`-t` prints it with its password hidden; a bad one is named by its file); not beside `url`.
#[test]
fn the_redis_url_from_a_file() {
    let dir = TempDir::new();
    dir.write("redis-url", "redis://:s3cret@127.0.0.1:6379\n");
    let text = format!("{BASE}redis:\n  url_file: redis-url\n");
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "--offline", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("redis://***@127.0.0.1:6379") && !out.contains("s3cret"),
        "{out}"
    );
    dir.write("redis-url", "http://:s3cret@127.0.0.1:6379\n");
    let (code, _, err) = run_tollgate(&["-t", "--offline", "-c", &p]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("redis.url_file: invalid Redis URL in ") && !err.contains("s3cret"),
        "{err}"
    );
    assert_error(
        &format!("{BASE}redis:\n  url: redis://127.0.0.1:6379\n  url_file: redis-url\n"),
        26,
        13,
        &["redis.url_file", "not both"],
    );
}

/// Mistakes that once got a message pointing elsewhere (issue 45): a unit spelt out, a tab,
/// a misspelt key or name, a cost or status of the wrong kind. Each names the fix.
#[test]
fn near_misses_are_named_with_the_fix() {
    let tier = "      - { period: 1, threshold: 10 }\n";
    let cases: [(String, usize, usize, &[&str]); 9] = [
        (
            with(tier, "      - { period: 1day, threshold: 10 }\n"),
            23,
            19,
            &[
                "invalid duration unit \"day\"",
                "did you mean \"24h\"",
                "\"1d\" (a calendar day)",
            ],
        ),
        (
            with(tier, "      - { period: 30secs, threshold: 10 }\n"),
            23,
            19,
            &["did you mean \"30s\""],
        ),
        (
            with(tier, "      - { period: 1month, threshold: 10 }\n"),
            23,
            19,
            &["a month has no fixed length", "\"1mo\""],
        ),
        (
            with(
                "  listen: [\"127.0.0.1:8080\"]\n",
                "\tlisten: [\"127.0.0.1:8080\"]\n",
            ),
            2,
            1,
            &["a tab at line 2, column 1", "spaces only"],
        ),
        (
            with(tier, "      - { period: 1, thresold: 10 }\n"),
            23,
            22,
            &["unknown field `thresold`", "did you mean `threshold`?"],
        ),
        (
            with(tier, &format!("{tier}    algorithm: sliding-window\n")),
            24,
            16,
            &[
                "unknown value `sliding-window`",
                "did you mean `sliding_window`?",
            ],
        ),
        (
            with(
                tier,
                &format!("{tier}    cost: {{ response-header: x-cost }}\n"),
            ),
            24,
            13,
            &[
                "limits[0].cost: unknown field `response-header`",
                "did you mean `response_header`?",
            ],
        ),
        (
            with(tier, &format!("{tier}    cost: heavy\n")),
            24,
            11,
            &[
                "limits[0].cost: invalid type",
                "a whole number of units",
                "{ header: NAME }",
            ],
        ),
        (
            with(
                tier,
                &format!("{tier}    count_when: {{ status: [[429]] }}\n"),
            ),
            24,
            28,
            &["count_when.status[0]", "a status such as 429", "\"5xx\""],
        ),
    ];
    for (text, line, col, needles) in &cases {
        assert_error(text, *line, *col, needles);
    }
}

/// A rule no route can reach is a warning at its pattern (issue 45).
#[test]
fn a_rule_no_route_reaches_is_a_warning() {
    let dir = TempDir::new();
    let text = with(
        "    pathPattern: /v1/organizations/*/product/*\n",
        "    pathPattern: /v2/organizations/*/product/*\n",
    );
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains(&format!(
            "{p}:21:18: warning: limits[0].pathPattern: rule \"get-product\""
        )) && all.contains("matches no route"),
        "{all}"
    );
}
