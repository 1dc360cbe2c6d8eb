//! The validated configuration: what the gateway runs on. Built only by `validate`, so every
//! value here has been checked; nothing on the request path needs to re-check or unwrap.

use crate::config::defaults::DEFAULT_TENANT_HEADER;
use crate::matching::normalize::hex_value;
use crate::matching::{MethodSet, PathPattern, RequestMatch};
use http::header::{HeaderName, HeaderValue};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
pub use tollgate_limits::fleet::OnFailure;
/// The limits core's own types, part of the running model (`crates/limits`).
pub use tollgate_limits::{Algorithm, PartitionBy};

#[derive(Debug)]
pub struct Config {
    /// The main file, and every file it includes (limits, API keys), for reload and `-t`.
    pub file: PathBuf,
    pub includes: Vec<PathBuf>,
    pub server: ServerSettings,
    pub upstreams: Vec<UpstreamSpec>,
    pub routes: Vec<Route>,
    pub tenant: TenantSettings,
    pub plans: Plans,
    pub rules: Vec<Arc<Rule>>,
    pub redis: Option<RedisSettings>,
    pub headers: HeaderSettings,
    /// OpenTelemetry traces (`tracing`); none without the section.
    pub tracing: Option<TracingSettings>,
    /// How upstream servers given by name are looked up (`dns`; defaults without the section).
    pub dns: DnsSettings,
    /// Certificates of the TLS listeners and of `server.certificates`, read and checked.
    pub tls: crate::config::certificates::Certificates,
    /// `FILE:LINE:COL: warning: ...`: accepted, but probably not meant.
    pub warnings: Vec<super::error::ConfigError>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    /// Parallel to `listen`: does that listener terminate TLS?
    pub listen_tls: Vec<bool>,
    pub h2c: bool,
    pub max_request_header_bytes: usize,
    pub max_body_bytes: Option<u64>,
    pub client_header_timeout: Duration,
    /// A write to a client that makes no progress for this long ends the request.
    pub send_timeout: Duration,
    /// HTTP/1 between requests and HTTP/2 with no stream open: closed after this long.
    pub keepalive_timeout: Duration,
    /// Client connections per listener; `None`: the default, fitted to the descriptor limit
    /// at start.
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub http2: Http2Limits,
    pub admin: Option<SocketAddr>,
    pub admin_token: Option<String>,
    pub threads: usize,
    pub trusted_proxies: Vec<IpNet>,
    pub grace_period: Duration,
    pub max_counters_per_rule: usize,
    pub access_log: bool,
    /// `server.quota_endpoint`, normalized: a `GET` there answers the caller's quota.
    pub quota_endpoint: Option<String>,
    pub error_log: Option<String>,
    pub pid_file: String,
    pub upgrade_sock: String,
    /// `watch_config`: reload when the file or an included one changes on disk.
    pub watch_config: bool,
    /// `log_format: json`: the access log and the gateway's own lines as JSON objects.
    pub log_json: bool,
    /// `request_id`: every request gets an `x-request-id` (made, or kept from a trusted proxy);
    /// off, the gateway neither makes one nor touches the client's.
    pub request_id: bool,
}

/// `server.http2`: what one client connection may ask of the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    pub max_concurrent_streams: u32,
    /// Streams a connection may start per second (and at once, after a quiet second); those
    /// beyond are refused with REFUSED_STREAM.
    pub max_streams_per_second: u32,
    /// Streams the client may reset before their answer is complete; one more closes the
    /// connection with GOAWAY (ENHANCE_YOUR_CALM).
    pub max_premature_resets: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSpec {
    pub name: String,
    /// The servers given as `IP:PORT`.
    pub servers: Vec<SocketAddr>,
    /// The servers given by name (`HOST:PORT`), with their addresses at load; the pool
    /// re-resolves them while it runs (`upstream::dns`).
    pub names: Vec<ServerName>,
    pub balance: Balance,
    pub health_check: Option<HealthCheckSpec>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Connect failures retried on another server of the pool.
    pub retries: usize,
    pub tls: Option<UpstreamTls>,
    /// Priority shaping: at most this many requests in flight, the others queued.
    pub shaping: Option<Shaping>,
    /// What the gateway speaks to the pool's servers.
    pub protocol: UpstreamProtocol,
    /// HTTP/2 pools: streams multiplexed on one connection at most.
    pub max_streams_per_connection: usize,
}

/// An upstream server given by name, as looked up when the config was loaded.
#[derive(Debug, Clone)]
pub struct ServerName {
    pub host: String,
    pub port: u16,
    /// Every address of the name (A and AAAA), each a server of the pool.
    pub addrs: Vec<IpAddr>,
    /// How long the answer holds: its TTL within `dns.min_ttl` and `dns.max_ttl`.
    pub ttl: Duration,
}

/// What the file says (the host and port), not what a lookup answered: a reload's diff names
/// the pools whose config changed, not those whose name resolved anew.
impl PartialEq for ServerName {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host && self.port == other.port
    }
}

/// `dns`: how upstream servers given by name are looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// The nameservers asked; empty: those of /etc/resolv.conf.
    pub servers: Vec<SocketAddr>,
    /// The TTL of an answer is kept within these bounds.
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// A lookup that has no answer by then fails.
    pub timeout: Duration,
}

impl Default for DnsSettings {
    fn default() -> Self {
        use crate::config::defaults::{
            DEFAULT_DNS_MAX_TTL, DEFAULT_DNS_MIN_TTL, DEFAULT_DNS_TIMEOUT,
        };
        DnsSettings {
            servers: Vec::new(),
            min_ttl: DEFAULT_DNS_MIN_TTL,
            max_ttl: DEFAULT_DNS_MAX_TTL,
            timeout: DEFAULT_DNS_TIMEOUT,
        }
    }
}

/// `upstreams.NAME.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    Http1,
    /// HTTP/2 over TLS, chosen by ALPN.
    H2,
    /// HTTP/2 over plain TCP with prior knowledge.
    H2c,
}

impl UpstreamProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::H2 => "h2",
            UpstreamProtocol::H2c => "h2c",
        }
    }
}

/// A pool's `max_in_flight` and `queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shaping {
    pub max_in_flight: usize,
    /// Requests that may wait (0: none; a full pool refuses at once).
    pub queue_max: usize,
    pub queue_timeout: Duration,
}

/// TLS to a pool's servers.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTls {
    pub sni: String,
    /// CA certificates to verify against; `None`: the system's roots.
    pub ca: Option<Arc<Box<[crate::config::certificates::X509]>>>,
    pub verify: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheckSpec {
    pub interval: Duration,
    pub timeout: Duration,
    pub probe: HealthProbe,
}

/// What a health check asks of each server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthProbe {
    /// A connection (with a TLS pool, its handshake too).
    Tcp,
    /// `GET path` with `Host: host`: a 2xx answer is healthy.
    Http { path: String, host: String },
    /// `grpc.health.v1.Health/Check` of `service` (empty: the server) over HTTP/2: SERVING is
    /// healthy.
    Grpc { service: String },
}

#[derive(Debug)]
pub struct Route {
    pub id: String,
    pub matcher: RequestMatch,
    /// Index into `Config::upstreams`: the route's pool (with `upstreams`, the first listed
    /// without `when`).
    pub upstream: usize,
    /// `upstreams`: several pools, by weight and condition; `None`: `upstream` alone.
    pub split: Option<Box<Split>>,
    /// Whether its requests must, may or do not identify a tenant (`tenant.required` when the
    /// route does not say).
    pub tenant: TenantMode,
    /// `allow` and `deny`: which client addresses may use the route (403 for the others).
    pub access: Option<AccessList>,
    /// `cors`: browsers on other origins may call the route (preflights answered here).
    pub cors: Option<Box<Cors>>,
    /// `timeouts`: the route's own, over its pool's.
    pub timeouts: RouteTimeouts,
    /// `request_headers`: what the upstream is told besides (or instead of) the client's.
    pub request_headers: Option<Box<HeaderOps>>,
    /// `response_headers`: the same on every answer to the client.
    pub response_headers: Option<Box<HeaderOps>>,
    /// `strip_prefix` (`/api`: no trailing slash): the upstream gets the normalized path
    /// without it.
    pub strip_prefix: Option<String>,
    /// `rewrite`: the upstream gets the normalized path with each match of the pattern
    /// replaced.
    pub rewrite: Option<Box<PathRewrite>>,
}

/// A route's `rewrite: { pattern, to }`.
#[derive(Debug, Clone)]
pub struct PathRewrite {
    pub pattern: regex::Regex,
    /// What each match becomes: `$1`, `${name}` name the pattern's groups; it begins with `/`.
    pub to: String,
}

impl Route {
    /// Its pool, or its pools with their weights and conditions (`-t`, the status page):
    /// `orders-v1 95, orders-v2 5` or `orders-v2 1 when plan beta, orders-v1 1`.
    pub fn pools_text(&self, ups: &[UpstreamSpec]) -> String {
        let name = |i: usize| ups.get(i).map_or("?", |u| u.name.as_str());
        let Some(split) = &self.split else {
            return name(self.upstream).to_string();
        };
        let mut parts: Vec<String> = split
            .entries
            .iter()
            .map(|e| {
                let mut t = format!("{} {}", name(e.pool), e.weight);
                if let Some(w) = &e.when {
                    let mut conds = Vec::new();
                    if !w.plans.is_empty() {
                        conds.push(format!("plan {}", w.plans.join("|")));
                    }
                    if !w.tenants.is_empty() {
                        let t: Vec<_> = w
                            .tenants
                            .iter()
                            .map(|t| String::from_utf8_lossy(t))
                            .collect();
                        conds.push(format!("tenant {}", t.join("|")));
                    }
                    for (n, v) in &w.headers {
                        conds.push(format!("{n}: {}", String::from_utf8_lossy(v.as_bytes())));
                    }
                    t.push_str(" when ");
                    t.push_str(&conds.join(" and "));
                }
                t
            })
            .collect();
        if split.sticky {
            parts.push("sticky by tenant".to_string());
        }
        parts.join(", ")
    }
}

/// A route's `upstreams`: which pool each request goes to. The entries with a `when` that
/// holds share the request by weight; when none holds, the entries without `when` do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub entries: Vec<SplitEntry>,
    /// `sticky: tenant`: a tenant's requests go to one pool (a hash of its id picks, the same
    /// on every instance), while the weights stay; requests without a tenant are spread.
    pub sticky: bool,
}

/// One of a route's `upstreams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitEntry {
    /// Index into `Config::upstreams`.
    pub pool: usize,
    /// Its share among the entries taken (0: none).
    pub weight: u32,
    pub when: Option<When>,
}

/// An entry's `when`: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct When {
    /// The tenant's plan is one of these (empty: any).
    pub plans: Vec<String>,
    /// The tenant is one of these (empty: any).
    pub tenants: Vec<Box<[u8]>>,
    /// Each header has this value (exactly, as sent).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// A route's `request_headers` or `response_headers`: removed, then set, then added.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeaderOps {
    pub remove: Vec<HeaderName>,
    pub set: Vec<(HeaderName, Template)>,
    pub add: Vec<(HeaderName, Template)>,
}

/// A header value, parsed at load: without variables, made once; with variables
/// (`${tenant}`, ...), rendered per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Template {
    Fixed(http::HeaderValue),
    Pieces(Vec<Piece>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Var(Var),
}

/// What a header value may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// The tenant (empty when none).
    Tenant,
    /// The tenant's plan (empty when none).
    Plan,
    /// The route's id.
    Route,
    /// The client's address (through trusted proxies).
    ClientIp,
    /// The request's id (`x-request-id`).
    RequestId,
}

impl Var {
    pub const NAMES: [(&'static str, Var); 5] = [
        ("tenant", Var::Tenant),
        ("plan", Var::Plan),
        ("route", Var::Route),
        ("client_ip", Var::ClientIp),
        ("request_id", Var::RequestId),
    ];
}

/// A route's `timeouts` (`None`: the pool's, or none for `total`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RouteTimeouts {
    /// Connecting to a server (each attempt), instead of the pool's `connect_timeout`.
    pub connect: Option<Duration>,
    /// Each read from (and write to) the server, instead of the pool's `read_timeout`.
    pub read: Option<Duration>,
    /// The whole request, from its arrival until its answer begins: holds, queues, every
    /// attempt and retry.
    pub total: Option<Duration>,
}

/// A route's `cors`: the Fetch standard's CORS protocol, spoken by the gateway. Header values
/// are made once, at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// The origins that may call the route (serialized: `scheme://host[:port]`, lower case);
    /// `None`: any origin (`"*"`).
    pub origins: Option<Vec<String>>,
    /// The methods a preflight may ask for.
    pub methods: MethodSet,
    /// `Access-Control-Allow-Methods`.
    pub allow_methods: HeaderValue,
    /// The request headers a preflight may ask for (lower case); `None`: any.
    pub headers: Option<Vec<HeaderName>>,
    /// `Access-Control-Allow-Headers` of a listed `headers`.
    pub allow_headers: Option<HeaderValue>,
    /// `Access-Control-Expose-Headers`: `expose_headers` and the quota headers.
    pub expose: HeaderValue,
    /// `Access-Control-Allow-Credentials: true` (cookies and HTTP authentication).
    pub credentials: bool,
    /// `Access-Control-Max-Age`: how long a browser may keep a preflight's answer.
    pub max_age: Option<HeaderValue>,
}

impl Cors {
    /// Whether a page of `origin` (the request's `Origin`) may call the route.
    pub fn allows_origin(&self, origin: &[u8]) -> bool {
        self.origins.as_ref().is_none_or(|list| {
            list.iter()
                .any(|o| o.as_bytes().eq_ignore_ascii_case(origin))
        })
    }
}

/// A route's `allow` and `deny` lists of client networks (the client address as the tenant
/// section defines it, through trusted proxies).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AccessList {
    /// `None`: every address that is not denied.
    pub allow: Option<Vec<IpNet>>,
    pub deny: Vec<IpNet>,
}

impl AccessList {
    /// May a client at `ip` use the route? Not when a `deny` network holds it, nor, with an
    /// `allow` list, when none of its networks does.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        !self.deny.iter().any(|n| n.contains(&ip))
            && self
                .allow
                .as_ref()
                .is_none_or(|allow| allow.iter().any(|n| n.contains(&ip)))
    }
}

/// A rule's `exempt`: requests it neither counts nor refuses, and gives no quota header.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Exempt {
    pub ips: Vec<IpNet>,
    pub tenants: Vec<Box<[u8]>>,
    /// Indexes into `Plans::names`.
    pub plans: Vec<usize>,
    /// Requests of no plan (no tenant, or a tenant in no plan): those of a rule with no
    /// `tiers` of its own, whose plans' tiers are all it has.
    pub unplanned: bool,
}

impl Exempt {
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty() && self.tenants.is_empty() && self.plans.is_empty() && !self.unplanned
    }

    /// Is a request from `ip`, of `tenant` (empty: none) in `plan`, exempt?
    pub fn covers(&self, ip: IpAddr, tenant: &[u8], plan: Option<usize>) -> bool {
        let ip = ip.to_canonical();
        self.ips.iter().any(|n| n.contains(&ip))
            || (!tenant.is_empty() && self.tenants.iter().any(|t| **t == *tenant))
            || plan.is_some_and(|p| self.plans.contains(&p))
            || (self.unplanned && plan.is_none())
    }
}

/// What a route asks of its requests' tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantMode {
    /// No tenant: 401.
    Required,
    /// No tenant: the shared tenant `anonymous`.
    Optional,
    /// Tenants are not looked for: per-tenant rules do not count these requests, and no
    /// tenant header is forwarded.
    None,
}

#[derive(Debug)]
pub struct TenantSettings {
    pub sources: Vec<TenantSource>,
    pub required: bool,
    /// API key headers removed before the upstream (`api_key.hide`, default true).
    pub hidden: Vec<HeaderName>,
    /// Set to the tenant on the way to the upstream (`None`: `forward_header: false`).
    pub forward_header: Option<HeaderName>,
    /// The forward header's name as sent, made once (pingora's `insert_header` would make a
    /// copy of a `HeaderName` on every request).
    pub forward_name: bytes::Bytes,
    /// Removed from every request before the upstream, so that a client's own copy never
    /// reaches it: the forward header, or `x-tenant-id` when nothing is forwarded.
    pub strip_header: HeaderName,
    /// The JWKS the `jwt` sources fetch.
    pub jwks: Vec<JwksFetch>,
}

pub fn default_tenant_header() -> HeaderName {
    HeaderName::from_static(DEFAULT_TENANT_HEADER)
}

impl Default for TenantSettings {
    fn default() -> Self {
        TenantSettings {
            sources: Vec::new(),
            required: false,
            hidden: Vec::new(),
            forward_header: Some(default_tenant_header()),
            forward_name: bytes::Bytes::from_static(DEFAULT_TENANT_HEADER.as_bytes()),
            strip_header: default_tenant_header(),
            jwks: Vec::new(),
        }
    }
}

impl TenantSource {
    /// The headers a `jwt` source sets from its tokens' claims.
    pub fn claim_headers(&self) -> impl Iterator<Item = &HeaderName> {
        let forward = match self {
            TenantSource::Jwt(j) => &j.settings.forward[..],
            _ => &[],
        };
        forward.iter().map(|(_, h)| h)
    }
}

/// A JWKS the gateway fetches (`jwt.issuers[].jwks_uri`), for its issuer's keys.
#[derive(Debug, Clone)]
pub struct JwksFetch {
    pub uri: http::Uri,
    pub issuer: String,
    /// Verifies the provider's certificate (`ca`; else the system's roots).
    pub ca: Option<Arc<Box<[crate::config::certificates::X509]>>>,
    pub keys: Arc<crate::tokens::IssuerKeys>,
}

impl TenantSettings {
    /// Some source reads signed tokens.
    pub fn has_tokens(&self) -> bool {
        self.sources
            .iter()
            .any(|s| matches!(s, TenantSource::Jwt(_)))
    }
}

/// Where a tenant comes from. `api_key` and `client_ip` are trusted (a client cannot choose
/// them); `path` and `header` only when `trusted`, or for requests from `trusted_proxies`.
#[derive(Debug)]
pub enum TenantSource {
    ApiKey {
        header: HeaderName,
        keys: ApiKeys,
    },
    /// Signed tokens (JWT).
    Jwt(Arc<crate::tokens::JwtSource>),
    Path {
        pattern: PathPattern,
        trusted: bool,
    },
    Header {
        name: HeaderName,
        trusted: bool,
    },
    ClientIp,
}

/// The keys of an `api_key` source, each mapped to its tenant: written as the key itself, or
/// as `sha256:<hex>`, the SHA-256 digest of the key (`tollgate hash-key` prints one), so that
/// the file does not hand out the keys it names.
#[derive(Debug, Default)]
pub struct ApiKeys {
    /// key -> tenant
    pub plain: HashMap<String, String>,
    /// SHA-256 of the key -> tenant
    pub hashed: HashMap<[u8; 32], String>,
}

/// How a key's digest is written in a keys file.
pub const KEY_DIGEST_PREFIX: &str = "sha256:";

impl ApiKeys {
    /// The tenant of a presented key. A digest is computed only when some key is stored as one.
    pub fn tenant_of(&self, key: &str) -> Option<&str> {
        if let Some(t) = self.plain.get(key) {
            return Some(t);
        }
        if self.hashed.is_empty() {
            return None;
        }
        self.hashed.get(&key_digest(key)).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.plain.len() + self.hashed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every tenant a key maps to.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.plain
            .values()
            .chain(self.hashed.values())
            .map(String::as_str)
    }
}

/// The SHA-256 digest of a key.
pub fn key_digest(key: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).into()
}

/// A key as a keys file stores it: `sha256:` and the digest's 64 lowercase hex digits.
pub fn key_digest_text(key: &str) -> String {
    let mut out = String::with_capacity(KEY_DIGEST_PREFIX.len() + 64);
    out.push_str(KEY_DIGEST_PREFIX);
    for b in key_digest(key) {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}

/// A digest written as 64 hex digits (either case); `None` for anything else.
pub fn parse_key_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = hex_value(pair[0])? << 4 | hex_value(pair[1])?;
    }
    Some(out)
}

/// Named groups of tenants with their own tiers.
#[derive(Debug, Default)]
pub struct Plans {
    pub names: Vec<String>,
    /// Per plan (like `names`): its place in a full pool's queue, higher first.
    pub priority: Vec<i64>,
    /// tenant id -> index into `names`
    pub by_tenant: HashMap<Box<[u8]>, usize>,
}

impl Plans {
    pub fn plan_of(&self, tenant: &[u8]) -> Option<usize> {
        self.by_tenant.get(tenant).copied()
    }

    /// The plan of a request's tenant: its verified token's (`token_plan`), else the plans'
    /// lists; none without a tenant.
    pub fn plan_for(&self, tenant: &[u8], token_plan: Option<usize>) -> Option<usize> {
        if tenant.is_empty() {
            return None;
        }
        token_plan.or_else(|| self.plan_of(tenant))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tier {
    /// A calendar tier's usual length (`CalendarUnit::nominal_ms`).
    pub period: Duration,
    pub threshold: u64,
    /// `1d`, `1w`, `1mo`: windows of the calendar, in the rule's time zone.
    pub calendar: Option<tollgate_limits::calendar::Calendar>,
    /// `leaky_bucket`: how many requests may wait their turn (None for other algorithms).
    pub queue: Option<u64>,
}

impl Tier {
    /// The periods of a tier list, with their calendars: what the identity of a rule's
    /// counters keeps of it (`store::RuleIdentity`).
    pub fn periods(tiers: &[Tier]) -> tollgate_limits::store::Periods {
        tiers.iter().map(|t| (t.period, t.calendar)).collect()
    }

    /// The period's name: `10s`, `1h`, `1mo`.
    pub fn label(&self) -> String {
        let mut out = String::new();
        super::duration::write_period(
            &mut out,
            self.period.as_millis() as u64,
            self.calendar.map(|c| c.unit),
        );
        out
    }
}

#[derive(Debug)]
pub struct Rule {
    pub id: String,
    pub enabled: bool,
    pub matcher: RequestMatch,
    pub per: PartitionBy,
    pub algorithm: Algorithm,
    pub tiers: Vec<Tier>,
    /// Per plan (indexed like `Plans::names`): tiers replacing `tiers` for that plan's tenants.
    pub plan_tiers: Vec<Option<Vec<Tier>>>,
    pub action: Action,
    pub status: u16,
    pub max_delay: Duration,
    /// `action: shadowban`: the answer an over-limit request gets instead of the upstream's.
    pub shadowban: Option<Arc<ShadowbanReply>>,
    /// `action: throttle`: the pace of an over-limit request's response body, bytes/s.
    pub throttle_bps: u64,
    /// At most this many requests of one partition in flight on this instance.
    pub concurrency: Option<u32>,
    /// Requests this rule neither counts nor refuses.
    pub exempt: Exempt,
    /// `count_when`: the rule counts a request only when its answer has one of these statuses
    /// (checked before forwarding, counted once the status is known).
    pub count_when: Option<CountWhen>,
    /// The units a request takes from every tier.
    pub cost: Cost,
    /// What the quota counts, when not requests (`RateLimit-Policy`'s `qu`).
    pub unit: Option<Box<str>>,
}

impl Rule {
    /// The rule counts rates: its own `tiers`, or (with none, and no `concurrency`) only its
    /// plans' own, for their tenants alone (`Exempt::unplanned`).
    pub fn counts_rates(&self) -> bool {
        !self.tiers.is_empty() || self.exempt.unplanned
    }

    /// The rule charges a request once its answer is known (`count_when`, or a cost the
    /// answer carries), not at admission.
    pub fn charges_late(&self) -> bool {
        self.count_when.is_some() || matches!(self.cost, Cost::Response { .. })
    }

    /// The rule's late charge needs the end of the answer: a gRPC status (`count_when`'s
    /// `grpc_status`) or a cost in the trailers (`response_trailer`).
    pub fn waits_for_trailers(&self) -> bool {
        self.count_when.is_some_and(|c| c.grpc != 0)
            || matches!(self.cost, Cost::Response { trailer: true, .. })
    }
}

/// The answers a `count_when` rule counts: HTTP statuses, and gRPC statuses (bit `n`: code
/// `n`) read from the answer's `grpc-status`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CountWhen {
    pub status: StatusSet,
    pub grpc: u32,
}

impl CountWhen {
    /// An answer with HTTP status `status` and gRPC status `grpc` (if it is a gRPC answer) is
    /// counted: either is listed.
    pub fn counts(&self, status: u16, grpc: Option<u8>) -> bool {
        self.status.contains(status) || grpc.is_some_and(|g| g < 32 && self.grpc & (1 << g) != 0)
    }
}

/// A rule's `cost`: the units one request takes from each of its tiers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Cost {
    /// One unit: a request.
    #[default]
    One,
    Units(u64),
    /// From a request header (trusted to be set by the caller's platform): a value over `max`
    /// is a bad request; a missing or malformed one costs `default`.
    Header {
        name: HeaderName,
        max: u64,
        default: u64,
    },
    /// From the upstream's answer: its response header (`response_header`), or its trailer
    /// (`response_trailer`: the trailers of an HTTP/2 answer, or the headers of a gRPC
    /// trailers-only one). Admission checks that the tiers have room for one unit; the cost is
    /// charged when the answer brings it (over `max`: `max`; missing or malformed: `default`).
    Response {
        name: HeaderName,
        max: u64,
        default: u64,
        trailer: bool,
    },
}

/// What a request's header says its cost is, for a rule with `Cost::Header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderCost {
    Units(u64),
    /// Over the rule's `max`: the value given.
    TooHigh(u64),
}

impl Cost {
    /// The units of a request with these headers (a cost taken from the answer: the one unit
    /// admission checks room for).
    pub fn of(&self, headers: &http::HeaderMap) -> HeaderCost {
        match self {
            Cost::One | Cost::Response { .. } => HeaderCost::Units(1),
            Cost::Units(n) => HeaderCost::Units(*n),
            Cost::Header { name, max, default } => match units_in(headers, name) {
                None | Some(0) => HeaderCost::Units(*default),
                Some(v) if v > *max => HeaderCost::TooHigh(v),
                Some(v) => HeaderCost::Units(v),
            },
        }
    }

    /// `Cost::Response`: what an answer with these headers (or trailers) is charged, `None`
    /// when they do not carry the cost.
    pub fn of_answer(&self, headers: &http::HeaderMap) -> Option<u64> {
        match self {
            Cost::Response {
                name, max, default, ..
            } => {
                headers.get(name)?;
                Some(match units_in(headers, name) {
                    None | Some(0) => *default,
                    Some(v) => v.min(*max),
                })
            }
            _ => None,
        }
    }
}

/// A header's value as a count of units (`u64::MAX` past it); `None`: missing or not digits.
fn units_in(headers: &http::HeaderMap, name: &HeaderName) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .map(|v| v.parse::<u64>().unwrap_or(u64::MAX))
}

/// A set of HTTP statuses, 100 to 599.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatusSet([u64; 8]);

impl StatusSet {
    pub fn insert(&mut self, status: u16) {
        if let Some(i) = status.checked_sub(100).filter(|i| *i < 500) {
            self.0[usize::from(i / 64)] |= 1 << (i % 64);
        }
    }

    pub fn contains(&self, status: u16) -> bool {
        status
            .checked_sub(100)
            .filter(|i| *i < 500)
            .is_some_and(|i| self.0[usize::from(i / 64)] & (1 << (i % 64)) != 0)
    }
}

/// What a shadowbanned request is answered.
#[derive(Debug, PartialEq, Eq)]
pub struct ShadowbanReply {
    pub status: u16,
    pub content_type: String,
    pub body: bytes::Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisEndpoint {
    Single(String),
    Cluster(Vec<String>),
    /// The primary Redis Sentinel names for `master`, asked of the sentinels at `nodes` (URLs).
    Sentinel {
        master: String,
        nodes: Vec<String>,
    },
}

impl RedisEndpoint {
    /// The URLs the config names: the server, the cluster's seeds, or the sentinels.
    pub fn urls(&self) -> Vec<&String> {
        match self {
            RedisEndpoint::Single(u) => vec![u],
            RedisEndpoint::Cluster(nodes) | RedisEndpoint::Sentinel { nodes, .. } => {
                nodes.iter().collect()
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub endpoint: RedisEndpoint,
    pub sync_interval: Duration,
    pub timeout: Duration,
    pub key_prefix: String,
    pub on_failure: OnFailure,
    /// Credentials and TLS files, as read at load (applied to every URL of the endpoint).
    pub access: RedisAccess,
    /// Records far from their limit may report plain increments (`url` only, unless
    /// `plain_increments: false`): cheap, not idempotent, so each round's are marked
    /// (`fleet_sync::backend::journal`).
    pub plain_increments: bool,
}

/// How to log in to Redis beyond what the URL says: read from files at load, so that a
/// reload re-reads them (and reconnects when they changed).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RedisAccess {
    pub username: Option<String>,
    pub password: Option<String>,
    /// PEM: CA certificates, and a client certificate with its key.
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisAccess {
    // never prints the password or the key
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisAccess")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "(set)"))
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("client", &self.client.as_ref().map(|_| "(set)"))
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderSettings {
    pub x_ratelimit: bool,
    pub ietf: bool,
}

impl Default for HeaderSettings {
    fn default() -> Self {
        HeaderSettings {
            x_ratelimit: true,
            ietf: true,
        }
    }
}

/// `tracing`: where spans go and how many requests are traced.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP base URL (spans go to `<otlp>/v1/traces`).
    pub otlp: String,
    /// The share of requests traced that came without a sampled traceparent.
    pub sample: f64,
    pub service_name: String,
    /// Spans carry a hash of the tenant instead of the tenant.
    pub hash_tenant: bool,
}

// The enums the file names by their names (config::file reads them, serde(remote)); the
// algorithms' names are the limits core's (`tollgate_limits::Algorithm`'s `Display`).

macro_rules! config_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $($ty::$variant => $name),+ })
            }
        }
    };
}

config_names!(Balance { RoundRobin => "round_robin", Random => "random", ConsistentHash => "consistent_hash" });
config_names!(Action { Reject => "reject", Delay => "delay", Shadow => "shadow", Shadowban => "shadowban", Throttle => "throttle" });

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    Random,
    ConsistentHash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Action {
    #[default]
    Reject,
    Delay,
    Shadow,
    Shadowban,
    Throttle,
}
