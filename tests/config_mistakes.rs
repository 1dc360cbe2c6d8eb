//! Every config mistake points at its fix (issue 45): a corpus of realistic mistakes, each an
//! edit of one valid config, through `tollgate -t`. Each must give exit status 1 (or, for a
//! warning, 0) and `FILE:LINE:COLUMN: message` at the place of the mistake, the message naming
//! the bad value, what is accepted and, for a near miss, `did you mean`. No message shows
//! serde's internals (untagged enums, Rust type names).

mod common;
use common::{run_tollgate, Edit, TempDir};

/// A valid config touching every section; each case edits it.
const BASE: &str = r#"server:
  listen: ["127.0.0.1:8080"]
  admin: "127.0.0.1:9090"
  log_format: json
  client_header_timeout: 10s
  max_body_bytes: 1048576
  access_log: true
dns:
  timeout: 2s
tracing:
  otlp: http://127.0.0.1:4318
  sample: 0.5
redis:
  url: redis://127.0.0.1:1
  on_failure: local
  sync_interval: 100ms
upstreams:
  products:
    servers: ["127.0.0.1:9001"]
    balance: round_robin
    connect_timeout: 2s
    max_in_flight: 100
    health_check: { interval: 1s, http: { path: /health } }
  grpc:
    servers: ["127.0.0.1:9002"]
    protocol: h2c
routes:
  - id: products
    path: /v1/**
    upstream: products
    methods: [GET, PUT]
    cors:
      origins: ["https://app.example.com"]
      max_age: 10m
    timeouts: { connect: 1s, read: 5s, total: 10s }
  - id: grpc
    path: /pkg.Service/*
    upstream: grpc
tenant:
  from:
    - header: x-org-id
      trusted: true
  required: true
plans:
  premium: [acme]
  basic: { tenants: [initech], priority: 1 }
limits:
  - id: get-product
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    algorithm: sliding_window
    per: tenant
    action: reject
    tiers:
      - { period: 1s, threshold: 10 }
      - { period: 1h, threshold: 1000 }
    plans:
      premium: [{ period: 1s, threshold: 100 }]
  - id: by-ip
    pathPattern: /v1/**
    per: ip
    action: delay
    max_delay: 200ms
    tiers: [{ period: 10, threshold: 50 }]
    exempt: { plans: [basic] }
"#;

/// One mistake: `from` (which must occur once in BASE) written as `to`; the message expected
/// at `line:col`, and what it must contain.
struct Mistake {
    from: &'static str,
    to: &'static str,
    line: usize,
    col: usize,
    needles: &'static [&'static str],
}

const fn m(
    from: &'static str,
    to: &'static str,
    line: usize,
    col: usize,
    needles: &'static [&'static str],
) -> Mistake {
    Mistake {
        from,
        to,
        line,
        col,
        needles,
    }
}

/// What no message may show: serde's and Rust's words, not the file's.
const INTERNALS: &[&str] = &[
    "untagged enum",
    "data did not match",
    "expected struct",
    "expected enum",
    "expected usize",
    "expected u16",
    "expected u32",
    "expected u64",
    "expected i64",
    "expected f64",
    "expected a sequence",
    "invalid type: map",
    "invalid type: sequence",
    "unknown variant",
    "YAML tag",
    "expected unit",
    "expected option",
    "panicked",
    "backtrace",
];

/// Misspelt keys, at every level: the key, where it stands, and the key meant.
const KEYS: &[Mistake] = &[
    m(
        "  admin: \"127",
        "  admn: \"127",
        3,
        3,
        &["server: unknown field `admn`", "did you mean `admin`?"],
    ),
    m(
        "  log_format: json",
        "  logformat: json",
        4,
        3,
        &["unknown field `logformat`", "did you mean `log_format`?"],
    ),
    m(
        "  max_body_bytes: 1048576",
        "  max_body_size: 1048576",
        6,
        3,
        &[
            "unknown field `max_body_size`",
            "did you mean `max_body_bytes`?",
        ],
    ),
    m(
        "dns:\n",
        "dsn:\n",
        8,
        1,
        &["unknown field `dsn`", "did you mean `dns`?"],
    ),
    m(
        "  timeout: 2s",
        "  timout: 2s",
        9,
        3,
        &["dns: unknown field `timout`", "did you mean `timeout`?"],
    ),
    m(
        "  sample: 0.5",
        "  sampel: 0.5",
        12,
        3,
        &["tracing: unknown field `sampel`", "did you mean `sample`?"],
    ),
    m(
        "  on_failure: local",
        "  onfailure: local",
        15,
        3,
        &[
            "redis: unknown field `onfailure`",
            "did you mean `on_failure`?",
        ],
    ),
    m(
        "  sync_interval: 100ms",
        "  sync-interval: 100ms",
        16,
        3,
        &[
            "unknown field `sync-interval`",
            "did you mean `sync_interval`?",
        ],
    ),
    m(
        "    servers: [\"127.0.0.1:9001\"]",
        "    server: [\"127.0.0.1:9001\"]",
        19,
        5,
        &[
            "upstreams.products: unknown field `server`",
            "did you mean `servers`?",
        ],
    ),
    m(
        "    connect_timeout: 2s",
        "    connection_timeout: 2s",
        21,
        5,
        &[
            "unknown field `connection_timeout`",
            "did you mean `connect_timeout`?",
        ],
    ),
    m(
        "{ interval: 1s,",
        "{ intervall: 1s,",
        23,
        21,
        &[
            "health_check: unknown field `intervall`",
            "did you mean `interval`?",
        ],
    ),
    m(
        "http: { path: /health }",
        "http: { paht: /health }",
        23,
        43,
        &["http: unknown field `paht`", "did you mean `path`?"],
    ),
    m(
        "    upstream: products",
        "    upstrem: products",
        30,
        5,
        &[
            "routes[0]: unknown field `upstrem`",
            "did you mean `upstream`?",
        ],
    ),
    m(
        "    methods: [GET, PUT]",
        "    method: [GET, PUT]",
        31,
        5,
        &[
            "routes[0]: unknown field `method`",
            "did you mean `methods`?",
        ],
    ),
    m(
        "      origins: [",
        "      origin: [",
        33,
        7,
        &["cors: unknown field `origin`", "did you mean `origins`?"],
    ),
    m(
        "      max_age: 10m",
        "      maxage: 10m",
        34,
        7,
        &["cors: unknown field `maxage`", "did you mean `max_age`?"],
    ),
    m(
        "read: 5s",
        "read_timeout: 5s",
        35,
        30,
        &[
            "timeouts: unknown field `read_timeout`",
            "did you mean `read`?",
        ],
    ),
    m(
        "    path: /pkg.Service/*",
        "    paths: /pkg.Service/*",
        37,
        5,
        &["routes[1]: unknown field `paths`", "did you mean `path`?"],
    ),
    m(
        "  required: true",
        "  require: true",
        43,
        3,
        &[
            "tenant: unknown field `require`",
            "did you mean `required`?",
        ],
    ),
    m(
        "    - header: x-org-id",
        "    - headers: x-org-id",
        41,
        7,
        &["unknown field `headers`", "did you mean `header`?"],
    ),
    m(
        "      trusted: true",
        "      trust: true",
        42,
        7,
        &["unknown field `trust`", "did you mean `trusted`?"],
    ),
    m(
        "{ tenants: [initech]",
        "{ tenant: [initech]",
        46,
        12,
        &[
            "plans.basic: unknown field `tenant`",
            "did you mean `tenants`?",
        ],
    ),
    m(
        "    pathPattern: /v1/**",
        "    path_pattern: /v1/**",
        60,
        5,
        &[
            "limits[1]: unknown field `path_pattern`",
            "did you mean `pathPattern`?",
        ],
    ),
    m(
        "    pathPattern: /v1/organizations",
        "    path: /v1/organizations",
        50,
        5,
        &[
            "limits[0]: unknown field `path`",
            "did you mean `pathPattern`?",
        ],
    ),
    m(
        "    tiers:\n",
        "    tier:\n",
        54,
        5,
        &["limits[0]: unknown field `tier`", "did you mean `tiers`?"],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1s, limit: 10 }",
        55,
        23,
        &[
            "tiers[0]: unknown field `limit`",
            "did you mean `threshold`?",
        ],
    ),
    m(
        "{ period: 1h, threshold: 1000 }",
        "{ window: 1h, threshold: 1000 }",
        56,
        11,
        &["tiers[1]: unknown field `window`", "did you mean `period`?"],
    ),
    m(
        "[{ period: 1s, threshold: 100 }]",
        "[{ period: 1s, treshold: 100 }]",
        58,
        31,
        &[
            "plans.premium[0]: unknown field `treshold`",
            "did you mean `threshold`?",
        ],
    ),
    m(
        "    max_delay: 200ms",
        "    max-delay: 200ms",
        63,
        5,
        &[
            "limits[1]: unknown field `max-delay`",
            "did you mean `max_delay`?",
        ],
    ),
    m(
        "{ plans: [basic] }",
        "{ plan: [basic] }",
        65,
        15,
        &["exempt: unknown field `plan`", "did you mean `plans`?"],
    ),
    m(
        "limits:\n",
        "limit:\n",
        47,
        1,
        &["unknown field `limit`", "did you mean `limits`?"],
    ),
    m(
        "upstreams:\n",
        "upstream:\n",
        17,
        1,
        &["unknown field `upstream`", "did you mean `upstreams`?"],
    ),
];

/// Misspelt values of a fixed set: the value, and the one meant or the ones accepted.
const VALUES: &[Mistake] = &[
    m("    per: ip", "    per: ips", 61, 10, &["invalid value \"ips\"", "did you mean `ip`?"]),
    m("    algorithm: sliding_window", "    algorithm: slidingwindow", 51, 16, &["limits[0].algorithm", "unknown value `slidingwindow`", "fixed_window", "did you mean `sliding_window`?"]),
    m("    algorithm: sliding_window", "    algorithm: token-bucket", 51, 16, &["unknown value `token-bucket`", "did you mean `token_bucket`?"]),
    m("    algorithm: sliding_window", "    algorithm: gcra", 51, 16, &["unknown value `gcra`", "expected one of `fixed_window`, `sliding_window`, `token_bucket`, `sliding_log`, `leaky_bucket`"]),
    m("    per: tenant", "    per: tenants", 52, 10, &["limits[0].per", "invalid value \"tenants\"", "expected tenant, ip, global or header:<name>", "did you mean `tenant`?"]),
    m("    per: ip", "    per: IP", 61, 10, &["limits[1].per", "invalid value \"IP\"", "did you mean `ip`?"]),
    m("    per: ip", "    per: header x-user", 61, 10, &["invalid value \"header x-user\"", "did you mean `header:x-user`?"]),
    m("    action: reject", "    action: rejected", 53, 13, &["limits[0].action", "unknown value `rejected`", "did you mean `reject`?"]),
    m("    action: delay", "    action: deny", 62, 13, &["unknown value `deny`", "expected one of `reject`, `delay`, `shadow`, `shadowban`, `throttle`"]),
    m("  on_failure: local", "  on_failure: localshare", 15, 15, &["redis.on_failure", "unknown value `localshare`", "did you mean `local_share`?"]),
    m("  on_failure: local", "  on_failure: fail-open", 15, 15, &["unknown value `fail-open`", "`local_share`, `local`, `allow`, `deny`"]),
    m("  log_format: json", "  log_format: JSON", 4, 15, &["server.log_format", "unknown value `JSON`", "did you mean `json`?"]),
    m("  log_format: json", "  log_format: logfmt", 4, 15, &["unknown value `logfmt`", "expected `text` or `json`"]),
    m("    balance: round_robin", "    balance: round-robin", 20, 14, &["upstreams.products.balance", "unknown value `round-robin`", "did you mean `round_robin`?"]),
    m("    balance: round_robin", "    balance: least_conn", 20, 14, &["unknown value `least_conn`", "`round_robin`, `random`, `consistent_hash`"]),
    m("    protocol: h2c", "    protocol: http2", 26, 15, &["upstreams.grpc.protocol", "unknown protocol \"http2\"", "expected http1, h2 or h2c"]),
    m("    protocol: h2c", "    protocol: H2C", 26, 15, &["unknown protocol \"H2C\"", "did you mean `h2c`?"]),
    m("    upstream: grpc", "    upstream: grcp", 38, 15, &["routes[1].upstream", "unknown upstream \"grcp\"", "(grpc, products)", "did you mean `grpc`?"]),
    m("    upstream: grpc\n", "    upstream: grpc\n    tenant: optinal\n", 39, 13, &["routes[1].tenant", "unknown value `optinal`", "did you mean `optional`?"]),
    m("    methods: [GET, PUT]", "    methods: [GET, PUTT]", 31, 20, &["routes[0].methods[1]", "unknown method \"PUTT\"", "GET, HEAD, POST", "did you mean `PUT`?"]),
    m("      premium: [{", "      premum: [{", 58, 7, &["limits[0].plans.premum", "unknown plan \"premum\"", "(basic, premium)", "did you mean `premium`?"]),
    m("{ plans: [basic] }", "{ plans: [basci] }", 65, 23, &["limits[1].exempt.plans[0]", "unknown plan \"basci\"", "did you mean `basic`?"]),
    m("  sample: 0.5\n", "  sample: 0.5\n  tenant: hashed\n", 13, 11, &["tracing.tenant", "invalid value \"hashed\"", "expected plain or hash", "did you mean `hash`?"]),
];

/// Durations and units.
const DURATIONS: &[Mistake] = &[
    m(
        "    connect_timeout: 2s",
        "    connect_timeout: 0",
        21,
        22,
        &[
            "upstreams.products.connect_timeout",
            "must be greater than 0",
            "\"100ms\"",
        ],
    ),
    m(
        "{ interval: 1s,",
        "{ interval: 0ms,",
        23,
        31,
        &["health_check.interval", "must be greater than 0"],
    ),
    m(
        "read: 5s",
        "read: 0",
        35,
        36,
        &[
            "routes[0].timeouts.read",
            "must be greater than 0",
            "omit the key for the pool's",
        ],
    ),
    m(
        "  client_header_timeout: 10s",
        "  client_header_timeout: 10 sec",
        5,
        26,
        &[
            "server.client_header_timeout",
            "invalid duration unit \"sec\"",
            "ms, s, m, h",
            "did you mean \"10s\"?",
        ],
    ),
    m(
        "      max_age: 10m",
        "      max_age: 5mins",
        34,
        16,
        &["cors.max_age", "did you mean \"5m\"?"],
    ),
    m(
        "  sync_interval: 100ms",
        "  sync_interval: 100 millis",
        16,
        18,
        &["redis.sync_interval", "did you mean \"100ms\"?"],
    ),
    m(
        "{ period: 1h, threshold: 1000 }",
        "{ period: 1 hour, threshold: 1000 }",
        56,
        19,
        &["tiers[1].period", "did you mean \"1h\"?"],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1day, threshold: 10 }",
        55,
        19,
        &[
            "tiers[0].period",
            "did you mean \"24h\"",
            "\"1d\" (a calendar day)",
        ],
    ),
    m(
        "  client_header_timeout: 10s",
        "  client_header_timeout: 10S",
        5,
        26,
        &["invalid duration unit \"S\"", "did you mean \"10s\"?"],
    ),
    m(
        "{ interval: 1s,",
        "{ interval: -1s,",
        23,
        31,
        &[
            "health_check.interval",
            "invalid duration \"-1s\"",
            "must not be negative",
        ],
    ),
    m(
        "    connect_timeout: 2s",
        "    connect_timeout: -2",
        21,
        22,
        &[
            "upstreams.products.connect_timeout",
            "invalid duration -2",
            "must not be negative",
        ],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 0, threshold: 10 }",
        55,
        19,
        &["limits[0].tiers[0].period", "period must be greater than 0"],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1.5s, threshold: 10 }",
        55,
        19,
        &[
            "invalid duration \"1.5s\"",
            "fractions are not accepted",
            "\"1500ms\"",
        ],
    ),
    m(
        "    max_delay: 200ms",
        "    max_delay: 0.2",
        63,
        16,
        &["limits[1].max_delay", "invalid duration 0.2", "\"200ms\""],
    ),
    m(
        "      max_age: 10m",
        "      max_age: 1m30s",
        34,
        16,
        &[
            "cors.max_age",
            "invalid duration unit \"m30s\"",
            "did you mean \"90s\"?",
        ],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1mo, threshold: 10 }",
        55,
        19,
        &[
            "tiers[0].period",
            "a calendar period (1mo) needs algorithm fixed_window",
        ],
    ),
    m(
        "  timeout: 2s",
        "  timeout: 2 seconds",
        9,
        12,
        &["dns.timeout", "did you mean \"2s\"?"],
    ),
    m(
        "    timeouts: { connect: 1s, read: 5s, total: 10s }",
        "    timeouts: { connect: 1s, read: 5s, total: s }",
        35,
        47,
        &[
            "timeouts.total",
            "invalid duration \"s\"",
            "\"500ms\", \"10s\"",
        ],
    ),
];

/// Values of the wrong kind.
const TYPES: &[Mistake] = &[
    m(
        "  max_body_bytes: 1048576",
        "  max_body_bytes: 1MB",
        6,
        19,
        &[
            "server.max_body_bytes",
            "\"1MB\"",
            "expected a whole number",
        ],
    ),
    m(
        "  access_log: true",
        "  access_log: yes",
        7,
        15,
        &["server.access_log", "\"yes\"", "expected true or false"],
    ),
    m(
        "  sample: 0.5",
        "  sample: 50%",
        12,
        11,
        &["tracing.sample", "\"50%\"", "expected a number such as 0.5"],
    ),
    m(
        "  sample: 0.5",
        "  sample: 1.5",
        12,
        11,
        &["tracing.sample", "0 to 1, got 1.5"],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1s, threshold: \"10\" }",
        55,
        34,
        &["tiers[0].threshold", "\"10\" is quoted", "write 10"],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1s, threshold: 10/s }",
        55,
        34,
        &[
            "tiers[0].threshold",
            "\"10/s\"",
            "a whole number of requests",
        ],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1s, threshold: 2.5 }",
        55,
        34,
        &["threshold must be a whole number of requests, got 2.5"],
    ),
    m(
        "{ period: 1s, threshold: 10 }",
        "{ period: 1s, threshold: 0 }",
        55,
        34,
        &[
            "tiers[0].threshold",
            "threshold must be a positive integer, got 0",
        ],
    ),
    m(
        "    servers: [\"127.0.0.1:9001\"]",
        "    servers: \"127.0.0.1:9001\"",
        19,
        14,
        &[
            "upstreams.products.servers",
            "\"127.0.0.1:9001\"",
            "expected a list",
        ],
    ),
    m(
        "    methods: [GET]",
        "    methods: GET",
        49,
        14,
        &["limits[0].methods", "\"GET\"", "expected a list"],
    ),
    m(
        "    tiers: [{ period: 10, threshold: 50 }]",
        "    tiers: { period: 10, threshold: 50 }",
        64,
        12,
        &[
            "limits[1].tiers",
            "a mapping",
            "expected a list, such as [{ period: 10, threshold: 100 }]",
        ],
    ),
    m(
        "  from:\n    - header: x-org-id\n      trusted: true",
        "  from:\n    header: x-org-id\n    trusted: true",
        41,
        5,
        &["tenant.from", "a mapping", "expected a list"],
    ),
    m(
        "{ interval: 1s, http: { path: /health } }",
        "1s",
        23,
        19,
        &[
            "upstreams.products.health_check",
            "\"1s\"",
            "expected a mapping",
        ],
    ),
    m(
        "    max_in_flight: 100",
        "    max_in_flight: lots",
        22,
        20,
        &["max_in_flight", "\"lots\"", "expected a whole number"],
    ),
    m(
        "{ plans: [basic] }",
        "{ plans: basic }",
        65,
        22,
        &[
            "exempt.plans",
            "\"basic\"",
            "expected a list, such as [premium]",
        ],
    ),
    m(
        "    algorithm: sliding_window",
        "    algorithm: [sliding_window]",
        51,
        16,
        &[
            "limits[0].algorithm",
            "a list",
            "expected one of `fixed_window`, `sliding_window`",
        ],
    ),
    m(
        "  premium: [acme]",
        "  premium: acme",
        45,
        12,
        &["plans.premium", "\"acme\"", "a list of tenant ids"],
    ),
    m(
        "    upstream: products",
        "    upstream: [products]",
        30,
        15,
        &[
            "routes[0].upstream",
            "a list",
            "expected a string",
            "several pools are written `upstreams: [{ pool, weight }]`",
        ],
    ),
    m(
        "  listen: [\"127.0.0.1:8080\"]",
        "  listen: 8080",
        2,
        11,
        &[
            "server.listen",
            "8080",
            "an address such as \"0.0.0.0:8080\"",
        ],
    ),
];

/// Indentation, tabs and YAML structure.
const LAYOUT: &[Mistake] = &[
    m(
        "    per: ip",
        "\tper: ip",
        61,
        1,
        &["a tab at line 61, column 1", "spaces only"],
    ),
    m(
        "  sample: 0.5",
        "  sample:\t0.5\n\tservice_name: x",
        13,
        1,
        &["a tab at line 13, column 1", "spaces only"],
    ),
    m(
        "    path: /pkg.Service/*",
        "   path: /pkg.Service/*",
        36,
        5,
        &[
            "routes[1]: missing field `path`",
            "`path:` stands at line 37, column 4",
            "keys start at column 5",
        ],
    ),
    m(
        "    algorithm: sliding_window",
        "   algorithm: sliding_window",
        51,
        4,
        &["check the indentation of line 51 (column 4, where line 50 starts at column 5)"],
    ),
    m(
        "      - { period: 1h, threshold: 1000 }",
        "        - { period: 1h, threshold: 1000 }",
        56,
        9,
        &["check the indentation of line 56 (column 9, where line 55 starts at column 7)"],
    ),
    m(
        "    upstream: grpc\n",
        "  upstream: grpc\n",
        38,
        3,
        &[
            "did not find expected '-' indicator",
            "check the indentation of line 38 (column 3, where line 37 starts at column 5)",
            "routes[1].path, line 37",
        ],
    ),
    m(
        "  admin: \"127.0.0.1:9090\"",
        "  admin:\"127.0.0.1:9090\"",
        4,
        3,
        &["`admin:\"127.0.0.1:9090\"`", "a space after the colon"],
    ),
];

/// Names given twice, references to nothing, settings that do not fit together.
const MEANING: &[Mistake] = &[
    m(
        "  - id: grpc",
        "  - id: products",
        36,
        9,
        &["routes[1].id", "duplicate route id \"products\""],
    ),
    m(
        "  - id: by-ip",
        "  - id: get-product",
        59,
        9,
        &["limits[1].id", "duplicate rule id \"get-product\""],
    ),
    m(
        "    upstream: grpc\n",
        "    upstream: grpc\n    upstream: products\n",
        39,
        5,
        &[
            "duplicate key \"upstream\" in routes[1]",
            "given first at line 38, column 5",
        ],
    ),
    m(
        "  premium: [acme]",
        "  premium: [acme, initech]",
        45,
        19,
        &[
            "plans.premium[1]",
            "tenant \"initech\" is already in plan \"basic\"",
            "a tenant belongs to one plan",
        ],
    ),
    m(
        "    per: ip",
        "    per: ip\n    plans:\n      premium: [{ period: 10, threshold: 99 }]",
        62,
        5,
        &["limits[1].plans", "only to rules with `per: tenant`"],
    ),
    m(
        "      premium: [{ period: 1s, threshold: 100 }]",
        "      premium: []",
        58,
        16,
        &[
            "limits[0].plans.premium",
            "at least one tier",
            "remove `premium`",
        ],
    ),
    m(
        "    tiers: [{ period: 10, threshold: 50 }]",
        "    tiers: []",
        64,
        12,
        &[
            "limits[1].tiers",
            "at least one tier such as { period: 10, threshold: 100 }",
        ],
    ),
    m(
        "    max_delay: 200ms\n",
        "    max_delay: 200ms\n    status: 500\n",
        64,
        13,
        &["limits[1].status", "500", "429 or 503"],
    ),
    m(
        "      - { period: 1h, threshold: 1000 }",
        "      - { period: 1s, threshold: 1000 }",
        56,
        19,
        &["tiers[1].period", "two tiers have the period 1s"],
    ),
    m(
        "    action: delay",
        "    action: throttle",
        62,
        13,
        &[
            "limits[1].action",
            "action throttle needs `throttle: { rate: 64KiB/s }`",
        ],
    ),
];

/// Check one case: exit 1, the message at its place with every needle, nothing internal.
fn check(text: &str, line: usize, col: usize, needles: &[&str]) -> Result<(), String> {
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", text).display().to_string();
    let (code, _out, err) = run_tollgate(&["-t", "-c", &p]);
    if code != 1 {
        return Err(format!("exit status {code}, not 1; stderr: {err}"));
    }
    if let Some(bad) = INTERNALS.iter().find(|w| err.contains(*w)) {
        return Err(format!("{bad:?} shown: {err}"));
    }
    // nor a type of the program (`RuleFile`, `AlgorithmName`)
    let rust_type = err.split(|c: char| !c.is_ascii_alphanumeric()).find(|w| {
        w.len() > 4
            && w.starts_with(|c: char| c.is_ascii_uppercase())
            && ["File", "Name", "Map"].iter().any(|s| w.ends_with(s))
    });
    if let Some(t) = rust_type {
        return Err(format!("the type {t} shown: {err}"));
    }
    let prefix = format!("{p}:{line}:{col}: ");
    let Some(found) = err.lines().find(|l| l.starts_with(&prefix)) else {
        return Err(format!("no error at {line}:{col}: {err}"));
    };
    match needles.iter().find(|n| !found.contains(*n)) {
        Some(n) => Err(format!("{n:?} missing in {found:?}")),
        None => Ok(()),
    }
}

/// Run a table; report every case that fails, not only the first.
fn run(table: &[Mistake]) {
    let failures: Vec<String> = table
        .iter()
        .filter_map(|c| {
            assert_eq!(
                BASE.matches(c.from).count(),
                1,
                "{:?} must occur once in BASE",
                c.from
            );
            let text = BASE.edit(c.from, c.to);
            check(&text, c.line, c.col, c.needles)
                .err()
                .map(|e| format!("{:?} -> {:?}: {e}", c.from, c.to))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_base_config_is_valid() {
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", BASE).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("is valid"), "{out}");
    // a plan only exempted is used; every rule is reached
    assert!(!err.contains("names no tier"), "{err}");
    assert!(!err.contains("matches no route"), "{err}");
}

#[test]
fn the_corpus_has_at_least_60_distinct_mistakes() {
    let all: Vec<&Mistake> = [KEYS, VALUES, DURATIONS, TYPES, LAYOUT, MEANING]
        .iter()
        .flat_map(|t| t.iter())
        .collect();
    let mut edits: Vec<(&str, &str)> = all.iter().map(|c| (c.from, c.to)).collect();
    edits.sort();
    edits.dedup();
    assert_eq!(edits.len(), all.len(), "a mistake is listed twice");
    assert!(all.len() >= 60, "{} mistakes", all.len());
}

#[test]
fn misspelt_keys_name_the_key_meant() {
    run(KEYS);
}

#[test]
fn misspelt_values_name_the_value_meant_or_those_accepted() {
    run(VALUES);
}

#[test]
fn durations_name_their_unit() {
    run(DURATIONS);
}

#[test]
fn values_of_the_wrong_kind_say_what_is_expected() {
    run(TYPES);
}

#[test]
fn indentation_and_tabs_name_the_line_to_fix() {
    run(LAYOUT);
}

#[test]
fn names_and_references_are_checked() {
    run(MEANING);
}

/// A mistake that leaves the config valid but surely not as meant: a warning at its place,
/// exit 0.
fn assert_warning(text: &str, line: usize, col: usize, needles: &[&str]) {
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", text).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    let all = format!("{out}{err}");
    let prefix = format!("{p}:{line}:{col}: warning: ");
    let found = all
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no warning at {line}:{col}: {all}"));
    for n in needles {
        assert!(found.contains(n), "{n:?} missing in {found:?}");
    }
}

#[test]
fn rules_no_route_reaches_are_warnings() {
    // a path no route serves
    assert_warning(
        &BASE.edit("    pathPattern: /v1/**", "    pathPattern: /v2/**"),
        60,
        18,
        &[
            "limits[1].pathPattern",
            "rule \"by-ip\"",
            "matches no route",
        ],
    );
    // a method no route takes
    assert_warning(
        &BASE.edit("    methods: [GET]\n", "    methods: [DELETE]\n"),
        50,
        18,
        &[
            "limits[0].pathPattern",
            "rule \"get-product\"",
            "matches no route",
        ],
    );
}

#[test]
fn plans_naming_no_tier_are_warnings() {
    // a plan no rule gives tiers, exempts or routes by: its tenants get the rules' `tiers`
    assert_warning(
        &BASE.edit(
            "  premium: [acme]\n",
            "  premium: [acme]\n  gold: [hooli]\n",
        ),
        46,
        9,
        &[
            "plans.gold",
            "plan \"gold\" names no tier",
            "gets each rule's default `tiers`",
        ],
    );
}

#[test]
fn a_rule_may_leave_its_tiers_to_its_plans() {
    let text = BASE.edit(
        "    tiers:\n      - { period: 1s, threshold: 10 }\n      - { period: 1h, threshold: 1000 }\n",
        "",
    );
    assert_warning(
        &text,
        54,
        5,
        &[
            "limits[0].plans",
            "rule \"get-product\" has no `tiers` of its own",
            "requests of tenants in no plan and of plan basic are not limited by it",
        ],
    );
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (_, out, _) = run_tollgate(&["-t", "-c", &p]);
    assert!(
        out.contains("exempt: plans [basic], tenants in no plan"),
        "{out}"
    );
    // without plans either, a rule needs its tiers
    let text = text.edit(
        "    plans:\n      premium: [{ period: 1s, threshold: 100 }]\n",
        "",
    );
    let dir = TempDir::new();
    let p = dir.write("gateway.yaml", &text).display().to_string();
    let (code, _, err) = run_tollgate(&["-t", "-c", &p]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "{p}:48:5: limits[0].tiers: must list at least one tier such as {{ period: 10, threshold: 100 }} (or, to limit only some plans' tenants, give tiers per plan under `plans`"
        )),
        "{err}"
    );
}

/// In an included file, the same messages, at their place in that file.
#[test]
fn mistakes_in_an_included_limits_file_name_the_fix_there() {
    let dir = TempDir::new();
    let main =
        BASE[..BASE.find("limits:\n").expect("limits")].to_string() + "limits: limits.yaml\n";
    let p = dir.write("gateway.yaml", &main);
    let limits = dir.write(
        "limits.yaml",
        "- id: a\n  pathPattern: /v1/**\n  tiers: [{ period: 1s, treshold: 5 }]\n",
    );
    let (code, _, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
    assert_eq!(code, 1, "{err}");
    let want = format!(
        "{}:3:25: limits[0].tiers[0]: unknown field `treshold`, expected `period` or `threshold`; did you mean `threshold`?",
        limits.display()
    );
    assert!(err.contains(&want), "{want} not in {err}");
    // a list of tiers written as one
    dir.write(
        "limits.yaml",
        "- id: a\n  pathPattern: /v1/**\n  tiers: { period: 1s, threshold: 5 }\n",
    );
    let (code, _, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("limits.yaml:3:10: limits[0].tiers: invalid type: a mapping, expected a list, such as [{ period: 10, threshold: 100 }]"),
        "{err}"
    );
}

/// With `concurrency` and no `tiers`, a rule's plans' tiers are not counted (as before plans
/// alone could stand for tiers): a warning.
#[test]
fn plan_tiers_beside_concurrency_alone_are_a_warning() {
    let text = BASE.edit(
        "    tiers:\n      - { period: 1s, threshold: 10 }\n      - { period: 1h, threshold: 1000 }\n",
        "    concurrency: 5\n",
    );
    assert_warning(
        &text,
        55,
        5,
        &[
            "limits[0].plans",
            "rule \"get-product\" has `concurrency` and no `tiers`",
            "its plans' tiers are not counted",
        ],
    );
}
