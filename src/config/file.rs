//! The configuration file model: exactly what the YAML says, typed but not yet checked for
//! meaning. `validate` turns it into the running model. Unknown keys are errors everywhere, so
//! a typo never silently disables a limit.

use super::duration::{ConfDuration, PeriodFile};
use super::model::{Action, Algorithm, Balance, OnFailure};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerFile,
    pub upstreams: BTreeMap<String, UpstreamFile>,
    pub routes: Vec<RouteFile>,
    #[serde(default)]
    pub tenant: Option<TenantFile>,
    #[serde(default)]
    pub plans: Option<PlansFile>,
    #[serde(default)]
    pub limits: Option<LimitsFile>,
    #[serde(default)]
    pub redis: Option<RedisFile>,
    #[serde(default)]
    pub headers: Option<HeadersFile>,
    /// OpenTelemetry traces of the requests.
    #[serde(default)]
    pub tracing: Option<TracingFile>,
    /// How upstream servers given by name are looked up.
    #[serde(default)]
    pub dns: Option<DnsFile>,
}

/// `dns`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsFile {
    /// Nameservers, `IP:PORT`; without them, those of /etc/resolv.conf.
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub min_ttl: Option<ConfDuration>,
    #[serde(default)]
    pub max_ttl: Option<ConfDuration>,
    #[serde(default)]
    pub timeout: Option<ConfDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingFile {
    /// The collector's OTLP/HTTP endpoint, such as `http://127.0.0.1:4318`.
    pub otlp: String,
    /// The share of requests traced (0 to 1); a client's sampled traceparent is always kept.
    #[serde(default)]
    pub sample: Option<f64>,
    #[serde(default)]
    pub service_name: Option<String>,
    /// `plain` (default) or `hash`: how spans name the tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    pub listen: ListenList,
    /// Plain listeners also take HTTP/2 with prior knowledge.
    #[serde(default)]
    pub h2c: bool,
    /// Certificates chosen by SNI on TLS listeners.
    #[serde(default)]
    pub certificates: Vec<CertificateFile>,
    /// Larger request headers get 431 (default 64 KiB).
    #[serde(default)]
    pub max_request_header_bytes: Option<usize>,
    /// Larger request bodies get 413 (default: no limit).
    #[serde(default)]
    pub max_body_bytes: Option<u64>,
    /// A client that has not sent its whole request header by then is disconnected (10s).
    #[serde(default)]
    pub client_header_timeout: Option<ConfDuration>,
    /// A write to a client that makes no progress for this long ends the request (60s).
    #[serde(default)]
    pub send_timeout: Option<ConfDuration>,
    /// A connection with no request in progress is closed after this long (60s).
    #[serde(default)]
    pub keepalive_timeout: Option<ConfDuration>,
    /// Client connections open at once on each listener (default from the descriptor limit).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Client connections open at once from one address (default: no limit).
    #[serde(default)]
    pub max_connections_per_ip: Option<usize>,
    /// HTTP/2 limits per client connection.
    #[serde(default)]
    pub http2: Option<Http2File>,
    #[serde(default)]
    pub admin: Option<String>,
    /// With it, `/api/*` and the status page ask for `Authorization: Bearer <token>`.
    #[serde(default)]
    pub admin_token: Option<String>,
    #[serde(default)]
    pub threads: Option<usize>,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// How long SIGTERM waits for in-flight requests (default 5s).
    #[serde(default)]
    pub grace_period: Option<ConfDuration>,
    /// Cap on the counters each rate-limit rule tracks (memory bound under hostile input).
    #[serde(default)]
    pub max_counters_per_rule: Option<usize>,
    /// One log line per request (target `tollgate::access`); off by default.
    #[serde(default)]
    pub access_log: bool,
    /// A path where a client asks what quota it has left (off without it).
    #[serde(default)]
    pub quota_endpoint: Option<String>,
    /// With `-d`: where the log goes (otherwise the inherited stderr is kept).
    #[serde(default)]
    pub error_log: Option<String>,
    #[serde(default)]
    pub pid_file: Option<String>,
    #[serde(default)]
    pub upgrade_sock: Option<String>,
    /// Reload when the file, or a file it includes, changes on disk.
    #[serde(default)]
    pub watch_config: bool,
    /// `text` (the default) or `json`: one object a line.
    #[serde(default)]
    pub log_format: LogFormatFile,
    /// Make (or keep from a trusted proxy) an `x-request-id` for every request (default true).
    #[serde(default = "default_true")]
    pub request_id: bool,
}

/// `server.log_format`.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormatFile {
    #[default]
    Text,
    Json,
}

/// `server.http2`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Http2File {
    #[serde(default)]
    pub max_concurrent_streams: Option<u32>,
    #[serde(default)]
    pub max_streams_per_second: Option<u32>,
    #[serde(default)]
    pub max_premature_resets: Option<u32>,
}

/// One entry of `server.listen`: `"0.0.0.0:8080"`, or `{ addr: ..., tls: { cert, key } }`.
#[derive(Debug)]
pub enum ListenFile {
    Addr(String),
    Map(ListenMap),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenMap {
    pub addr: String,
    #[serde(default)]
    pub tls: Option<TlsFile>,
}

/// A certificate chain and its private key, PEM files (relative to the config file).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateFile {
    pub hosts: Vec<String>,
    pub cert: String,
    pub key: String,
}

impl ListenFile {
    pub fn addr(&self) -> &str {
        match self {
            ListenFile::Addr(a) => a,
            ListenFile::Map(m) => &m.addr,
        }
    }
    pub fn tls(&self) -> Option<&TlsFile> {
        match self {
            ListenFile::Addr(_) => None,
            ListenFile::Map(m) => m.tls.as_ref(),
        }
    }
}

/// `server.listen`: a list, or one entry alone (`listen: "0.0.0.0:8080"`, as nginx users write).
#[derive(Debug)]
pub struct ListenList(pub Vec<ListenFile>);

impl<'de> Deserialize<'de> for ListenList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ListenList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address such as \"0.0.0.0:8080\", or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ListenList, E> {
                Ok(ListenList(vec![ListenFile::Addr(v.to_string())]))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ListenList, A::Error> {
                ListenMap::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|m| ListenList(vec![ListenFile::Map(m)]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ListenList, A::Error> {
                Vec::<ListenFile>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(ListenList)
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ListenFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListenVisitor;
        impl<'de> Visitor<'de> for ListenVisitor {
            type Value = ListenFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address such as \"0.0.0.0:8080\" or { addr: ..., tls: { cert: ..., key: ... } }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ListenFile, E> {
                Ok(ListenFile::Addr(v.to_string()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ListenFile, A::Error> {
                ListenMap::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ListenFile::Map)
            }
        }
        deserializer.deserialize_any(ListenVisitor)
    }
}

/// `Display` writes an enum value as it is spelled in the config file.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub servers: Vec<String>,
    #[serde(default, with = "BalanceName")]
    pub balance: Balance,
    #[serde(default)]
    pub health_check: Option<HealthCheckFile>,
    #[serde(default)]
    pub connect_timeout: Option<ConfDuration>,
    #[serde(default)]
    pub read_timeout: Option<ConfDuration>,
    /// Connect failures retried on the next server (default 2).
    #[serde(default)]
    pub retries: Option<usize>,
    #[serde(default)]
    pub tls: Option<UpstreamTlsFile>,
    /// At most this many requests in flight to the pool (all its servers, this instance).
    #[serde(default)]
    pub max_in_flight: Option<i64>,
    /// Where requests wait while the pool is full, by plan priority.
    #[serde(default)]
    pub queue: Option<QueueFile>,
    /// `http1` (default), `h2` (over `tls`, by ALPN) or `h2c` (HTTP/2 with prior knowledge).
    #[serde(default)]
    pub protocol: Option<String>,
    /// HTTP/2 pools: requests multiplexed on one connection at most (default 100).
    #[serde(default)]
    pub max_streams_per_connection: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueFile {
    pub max: i64,
    #[serde(default)]
    pub timeout: Option<ConfDuration>,
}

/// TLS to the servers of a pool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsFile {
    /// The name sent in SNI and checked against the server's certificate.
    pub sni: String,
    /// PEM file of the CA certificates to verify against (default: the system's roots).
    #[serde(default)]
    pub ca: Option<String>,
    #[serde(default = "default_true")]
    pub verify: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    /// How often each server is checked (1s by default).
    #[serde(default)]
    pub interval: Option<ConfDuration>,
    #[serde(default)]
    pub http: Option<HttpCheckFile>,
    /// A gRPC check (`grpc.health.v1.Health/Check`), for HTTP/2 pools; not with `http`.
    #[serde(default)]
    pub grpc: Option<GrpcCheckFile>,
    #[serde(default)]
    pub timeout: Option<ConfDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcCheckFile {
    /// The service asked about; empty (the default): the server as a whole.
    #[serde(default)]
    pub service: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpCheckFile {
    pub path: String,
    #[serde(default)]
    pub host: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub id: String,
    #[serde(default)]
    pub host: Option<String>,
    pub path: String,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// The route's pool (or `upstreams`).
    #[serde(default)]
    pub upstream: Option<String>,
    /// Several pools, by weight and condition.
    #[serde(default)]
    pub upstreams: Option<Vec<SplitEntryFile>>,
    /// `tenant`: a tenant's requests stay on one of `upstreams`.
    #[serde(default)]
    pub sticky: Option<StickyFile>,
    /// Overrides `tenant.required` on this route.
    #[serde(default)]
    pub tenant: Option<TenantModeFile>,
    /// Only these client networks (addresses or CIDRs) may use the route.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// These client networks may not.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Browsers on other origins may call the route.
    #[serde(default)]
    pub cors: Option<CorsFile>,
    /// The route's timeouts, over its pool's.
    #[serde(default)]
    pub timeouts: Option<RouteTimeoutsFile>,
    /// Headers set, added or removed on the way to the upstream.
    #[serde(default)]
    pub request_headers: Option<HeaderOpsFile>,
    /// Headers set, added or removed on the way back to the client.
    #[serde(default)]
    pub response_headers: Option<HeaderOpsFile>,
    /// A leading part of the path the upstream does not see (`/api`).
    #[serde(default)]
    pub strip_prefix: Option<String>,
    /// The upstream's path, from the client's by a regular expression.
    #[serde(default)]
    pub rewrite: Option<PathRewriteFile>,
}

/// A route's `rewrite`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathRewriteFile {
    pub pattern: String,
    pub to: String,
}

/// One of a route's `upstreams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitEntryFile {
    pub pool: String,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub when: Option<WhenFile>,
}

/// What an entry of `upstreams` asks of a request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhenFile {
    #[serde(default)]
    pub plan: Option<OneOrMany>,
    #[serde(default)]
    pub tenant: Option<OneOrMany>,
    #[serde(default)]
    pub header: BTreeMap<String, String>,
}

/// A name, or a list of them.
#[derive(Debug)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A text or a list of texts, read as they come (not as an untagged enum, whose error says
/// only that no variant matched): `expecting` is what the error then says was expected.
macro_rules! text_or_list {
    ($ty:ident, $one:ident, $many:ident, $expecting:literal) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$ty, E> {
                        Ok($ty::$one(v.to_string()))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<$ty, A::Error> {
                        Vec::deserialize(de::value::SeqAccessDeserializer::new(seq)).map($ty::$many)
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

text_or_list!(OneOrMany, One, Many, "a name, or a list of names");
text_or_list!(
    OriginsFile,
    Any,
    List,
    "\"*\" or a list of origins such as [\"https://app.example.com\"]"
);

impl OneOrMany {
    pub fn list(&self) -> &[String] {
        match self {
            OneOrMany::One(s) => std::slice::from_ref(s),
            OneOrMany::Many(v) => v,
        }
    }
}

/// A route's `sticky`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StickyFile {
    Tenant,
}

/// A route's `request_headers` or `response_headers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderOpsFile {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A route's `timeouts`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTimeoutsFile {
    #[serde(default)]
    pub connect: Option<ConfDuration>,
    #[serde(default)]
    pub read: Option<ConfDuration>,
    #[serde(default)]
    pub total: Option<ConfDuration>,
}

/// A route's `cors`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsFile {
    /// `"*"` or a list of origins (`https://app.example.com`).
    pub origins: OriginsFile,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub headers: Option<Vec<String>>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    #[serde(default)]
    pub credentials: bool,
    #[serde(default)]
    pub max_age: Option<ConfDuration>,
}

/// `cors.origins`: `"*"`, or a list.
#[derive(Debug)]
pub enum OriginsFile {
    Any(String),
    List(Vec<String>),
}

/// A route's `tenant`: whether its requests must, may or do not identify a tenant.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TenantModeFile {
    Required,
    Optional,
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    #[serde(default)]
    pub from: Vec<TenantSourceFile>,
    #[serde(default)]
    pub required: bool,
    /// A plan member that no API key maps to is an error, not a warning.
    #[serde(default)]
    pub strict: bool,
    /// The header that carries the tenant to the upstream (default `x-tenant-id`), or
    /// `false` for none.
    #[serde(default)]
    pub forward_header: Option<ForwardHeaderFile>,
}

/// `tenant.forward_header`: a header name, or `false`.
#[derive(Debug)]
pub enum ForwardHeaderFile {
    Name(String),
    Off,
}

impl<'de> Deserialize<'de> for ForwardHeaderFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ForwardHeaderFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a header name such as x-tenant-id, or false")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ForwardHeaderFile, E> {
                Ok(ForwardHeaderFile::Name(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<ForwardHeaderFile, E> {
                if v {
                    Err(E::custom(
                        "forward_header is a header name (default x-tenant-id) or false",
                    ))
                } else {
                    Ok(ForwardHeaderFile::Off)
                }
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// One entry of `tenant.from`: a map with exactly one of the keys below.
#[derive(Debug, Deserialize)]
#[serde(try_from = "TenantSourceMap")]
pub enum TenantSourceFile {
    ApiKey(ApiKeyFile),
    Jwt(JwtFile),
    /// The pattern, and whether any client may claim a tenant with it (`trusted: true`).
    Path(String, bool),
    Header(String, bool),
    ClientIp(EmptyFile),
}

/// How a tenant source is written (serde_yaml 0.9 reads enums only from YAML tags, so the
/// single-key map is read as a struct and checked in `try_from`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSourceMap {
    #[serde(default)]
    api_key: Option<ApiKeyFile>,
    #[serde(default)]
    jwt: Option<JwtFile>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    client_ip: Option<EmptyFile>,
    /// For `header` and `path`: believe it from any client, not only from trusted proxies.
    #[serde(default)]
    trusted: Option<bool>,
}

impl TryFrom<TenantSourceMap> for TenantSourceFile {
    type Error = String;
    fn try_from(m: TenantSourceMap) -> Result<Self, String> {
        let mut found = Vec::new();
        let trusted = m.trusted.unwrap_or(false);
        if let Some(k) = m.api_key {
            found.push(TenantSourceFile::ApiKey(k));
        }
        if let Some(j) = m.jwt {
            found.push(TenantSourceFile::Jwt(j));
        }
        if let Some(p) = m.path {
            found.push(TenantSourceFile::Path(p, trusted));
        }
        if let Some(h) = m.header {
            found.push(TenantSourceFile::Header(h, trusted));
        }
        if let Some(c) = m.client_ip {
            found.push(TenantSourceFile::ClientIp(c));
        }
        match (found.pop(), found.is_empty()) {
            (
                Some(
                    TenantSourceFile::ApiKey(_)
                    | TenantSourceFile::Jwt(_)
                    | TenantSourceFile::ClientIp(_),
                ),
                true,
            ) if m.trusted.is_some() => Err(
                "`trusted` applies to header and path sources; api_key, jwt and client_ip are always trusted"
                    .to_string(),
            ),
            (Some(one), true) => Ok(one),
            _ => Err("each tenant source has exactly one of api_key: {...}, jwt: {...}, path: PATTERN, header: NAME or client_ip: {} (and, for header and path, trusted: true|false)".to_string()),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyFile {
    #[serde(default = "default_api_key_header")]
    pub header: String,
    #[serde(default)]
    pub keys: Option<BTreeMap<String, KeyFile>>,
    #[serde(default)]
    pub keys_file: Option<String>,
    /// Remove the key's header before the upstream (default true), as Kong's
    /// `hide_credentials`.
    #[serde(default)]
    pub hide: Option<bool>,
}

/// `jwt`: tenants from signed tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    pub issuers: Vec<JwtIssuerFile>,
    #[serde(default)]
    pub tenant_claim: Option<String>,
    #[serde(default)]
    pub plan_claim: Option<String>,
    #[serde(default)]
    pub algorithms: Option<Vec<String>>,
    #[serde(default)]
    pub leeway: Option<ConfDuration>,
    #[serde(default)]
    pub header: Option<String>,
    /// claim path -> header name
    #[serde(default)]
    pub forward_claims: BTreeMap<String, String>,
    /// Remove the token's header before the upstream (default true).
    #[serde(default)]
    pub hide: Option<bool>,
}

/// One issuer of a `jwt` source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtIssuerFile {
    pub issuer: String,
    #[serde(default)]
    pub audiences: Vec<String>,
    #[serde(default)]
    pub jwks_uri: Option<String>,
    #[serde(default)]
    pub jwks_file: Option<String>,
    #[serde(default)]
    pub ca: Option<String>,
    /// The HMAC secret (HS256/384/512), a file of its own.
    #[serde(default)]
    pub secret_file: Option<String>,
}

/// What an API key maps to: a tenant, or `{ tenant, plan }`.
#[derive(Debug, Clone)]
pub struct KeyFile {
    pub tenant: String,
    pub plan: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyMap {
    tenant: String,
    #[serde(default)]
    plan: Option<String>,
}

impl<'de> Deserialize<'de> for KeyFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tenant id, or { tenant: ID, plan: NAME }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyFile, E> {
                Ok(KeyFile {
                    tenant: v.to_string(),
                    plan: None,
                })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyFile, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyFile, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<KeyFile, A::Error> {
                let m = KeyMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(KeyFile {
                    tenant: m.tenant,
                    plan: m.plan,
                })
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `plans:` is either the map of plan name to tenants or the path of a YAML file holding it.
#[derive(Debug)]
pub enum PlansFile {
    Inline(BTreeMap<String, PlanFile>),
    Include(String),
}

/// One plan: its tenants, or `{ tenants: [...], priority: N }`.
#[derive(Debug, Clone, Default)]
pub struct PlanFile {
    pub tenants: Vec<String>,
    /// Higher is served first from a full pool's queue (default 0).
    pub priority: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanMap {
    #[serde(default)]
    tenants: Vec<String>,
    #[serde(default)]
    priority: i64,
}

impl<'de> Deserialize<'de> for PlanFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PlanFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of tenant ids, or { tenants: [...], priority: N }")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PlanFile, A::Error> {
                Vec::<String>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(
                    |tenants| PlanFile {
                        tenants,
                        priority: 0,
                    },
                )
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<PlanFile, A::Error> {
                let m = PlanMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(PlanFile {
                    tenants: m.tenants,
                    priority: m.priority,
                })
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for PlansFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PlansFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a map of plan name to tenant ids, or the path of a YAML file holding that map",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PlansFile, E> {
                Ok(PlansFile::Include(v.to_string()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<PlansFile, A::Error> {
                BTreeMap::<String, PlanFile>::deserialize(de::value::MapAccessDeserializer::new(
                    map,
                ))
                .map(PlansFile::Inline)
            }
        }
        deserializer.deserialize_any(V)
    }
}

fn default_api_key_header() -> String {
    "x-api-key".to_string()
}

/// `client_ip: {}`: a source with no settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmptyFile {}

/// `limits:` is either the list of rules or the path of a YAML file holding that list.
#[derive(Debug)]
pub enum LimitsFile {
    Inline(Vec<RuleFile>),
    Include(String),
}

impl<'de> Deserialize<'de> for LimitsFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LimitsVisitor;
        impl<'de> Visitor<'de> for LimitsVisitor {
            type Value = LimitsFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of rules or the path of a YAML file holding that list")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LimitsFile, E> {
                Ok(LimitsFile::Include(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<LimitsFile, A::Error> {
                Vec::<RuleFile>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(LimitsFile::Inline)
            }
        }
        deserializer.deserialize_any(LimitsVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub id: String,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(rename = "pathPattern")]
    pub path_pattern: String,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub per: Option<String>,
    #[serde(default, with = "AlgorithmName")]
    pub algorithm: Algorithm,
    /// Required unless `concurrency` is set.
    #[serde(default)]
    pub tiers: Vec<TierFile>,
    #[serde(default)]
    pub plans: BTreeMap<String, Vec<TierFile>>,
    #[serde(default, with = "ActionName")]
    pub action: Action,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub max_delay: Option<ConfDuration>,
    /// `leaky_bucket`: how many requests may wait their turn (default: the tier's threshold).
    #[serde(default)]
    pub queue: Option<i64>,
    /// The answer of `action: shadowban`.
    #[serde(default)]
    pub shadowban: Option<ShadowbanFile>,
    /// The pace of `action: throttle`.
    #[serde(default)]
    pub throttle: Option<ThrottleFile>,
    /// At most this many requests of one partition in flight on this instance.
    #[serde(default)]
    pub concurrency: Option<i64>,
    /// Requests the rule neither counts nor refuses.
    #[serde(default)]
    pub exempt: Option<ExemptFile>,
    /// Count a request only when its answer's status is one of these.
    #[serde(default)]
    pub count_when: Option<CountWhenFile>,
    /// Units a request takes from every tier: a number, `{ header, max, default }`, or
    /// `{ response_header, max, default }`.
    #[serde(default)]
    pub cost: Option<CostFile>,
    /// What the quota counts (`request` by default; say `tokens` for a cost in tokens): the
    /// IETF `RateLimit-Policy`'s `qu`.
    #[serde(default)]
    pub unit: Option<String>,
    /// The time zone of the calendar tiers (`1d`, `1w`, `1mo`): UTC by default.
    #[serde(default)]
    pub calendar: Option<CalendarFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarFile {
    /// An IANA time zone, such as Europe/Berlin.
    pub tz: String,
}

/// A rule's `cost` as written.
#[derive(Debug)]
pub enum CostFile {
    Units(i64),
    Header(CostHeaderFile),
}

/// A number, or a map read as `CostHeaderFile` where it stands (an unknown key is named at
/// its place, with the keys accepted).
impl<'de> Deserialize<'de> for CostFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CostFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of units, or where the cost is read: { header: NAME }, { response_header: NAME } or { response_trailer: NAME }")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<CostFile, E> {
                Ok(CostFile::Units(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<CostFile, E> {
                i64::try_from(v)
                    .map(CostFile::Units)
                    .map_err(|_| E::custom(format!("cost {v} is too large")))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<CostFile, A::Error> {
                CostHeaderFile::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(CostFile::Header)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostHeaderFile {
    /// The request header that carries the cost, set by a trusted source.
    #[serde(default)]
    pub header: Option<String>,
    /// Or the response header of the upstream's answer that carries it: the cost is charged
    /// once the answer is known.
    #[serde(default)]
    pub response_header: Option<String>,
    /// Or its trailer (gRPC's `x-usage-tokens`, say): charged once the answer has ended.
    #[serde(default)]
    pub response_trailer: Option<String>,
    /// A larger request cost is a bad request (400); a larger response cost is charged `max`.
    #[serde(default)]
    pub max: Option<i64>,
    /// The cost of a request without the header, or with a malformed value (1 by default).
    #[serde(default)]
    pub default: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountWhenFile {
    /// Statuses (`401`) and classes (`5xx`).
    #[serde(default)]
    pub status: Vec<StatusFile>,
    /// gRPC statuses, by name (`UNAVAILABLE`) or number (`14`), read from the answer's
    /// `grpc-status` (its trailers, or a trailers-only answer's headers).
    #[serde(default)]
    pub grpc_status: Vec<StatusFile>,
}

/// A status as written: a number, or a class such as `"5xx"`.
#[derive(Debug, Clone)]
pub enum StatusFile {
    Code(i64),
    Class(String),
}

impl<'de> Deserialize<'de> for StatusFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = StatusFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status such as 429, a class such as \"5xx\", or (gRPC) a status name such as RESOURCE_EXHAUSTED")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusFile, E> {
                Ok(StatusFile::Code(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusFile, E> {
                Ok(StatusFile::Code(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatusFile, E> {
                Ok(StatusFile::Class(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptFile {
    /// Client networks (addresses or CIDRs).
    #[serde(default)]
    pub ips: Vec<String>,
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Plan names.
    #[serde(default)]
    pub plans: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowbanFile {
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleFile {
    /// Bytes per second: `64KiB/s`, `1MB/s`, `500000`.
    pub rate: RateFile,
}

/// A rate as written: a string with a unit, or a number of bytes per second.
#[derive(Debug, Clone)]
pub struct RateFile(pub String);

impl<'de> Deserialize<'de> for RateFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RateFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate such as \"64KiB/s\" or a number of bytes per second")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RateFile, E> {
                Ok(RateFile(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RateFile, E> {
                Ok(RateFile(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RateFile, E> {
                Ok(RateFile(v.to_string()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierFile {
    pub period: PeriodFile,
    pub threshold: Threshold,
}

/// A tier's threshold as written: an integer (its sign is checked in validation).
#[derive(Debug, Clone, Copy)]
pub struct Threshold(pub i64);

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Threshold;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of requests such as 100")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Threshold, E> {
                Ok(Threshold(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Threshold, E> {
                i64::try_from(v)
                    .map(Threshold)
                    .map_err(|_| E::custom(format!("threshold {v} is too large")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Threshold, E> {
                Err(E::custom(format!(
                    "threshold must be a whole number of requests, got {v}"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Threshold, E> {
                Err(E::custom(match v.trim().parse::<i64>() {
                    Ok(n) => format!("threshold {v:?} is quoted: write {n}, a number, without quotes"),
                    Err(_) => format!("invalid threshold {v:?}: expected a whole number of requests such as 100 (the time is the tier's `period`)"),
                }))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisFile {
    #[serde(default)]
    pub url: Option<String>,
    /// A file holding the URL (a Kubernetes Secret), read at load and each reload.
    #[serde(default)]
    pub url_file: Option<String>,
    #[serde(default)]
    pub cluster: Option<Vec<String>>,
    #[serde(default)]
    pub sentinel: Option<RedisSentinelFile>,
    #[serde(default)]
    pub sync_interval: Option<ConfDuration>,
    #[serde(default)]
    pub timeout: Option<ConfDuration>,
    #[serde(default)]
    pub key_prefix: Option<String>,
    #[serde(default, with = "OnFailureName")]
    pub on_failure: OnFailure,
    /// The ACL user (instead of one in the URL).
    #[serde(default)]
    pub username: Option<String>,
    /// A file holding the password (instead of one in the URL), read at load and each reload.
    #[serde(default)]
    pub password_file: Option<String>,
    /// `rediss://` only: the CA to verify the server against, and a client certificate.
    #[serde(default)]
    pub tls: Option<RedisTlsFile>,
    /// `url` only: records far from their limit report plain increments (default true);
    /// false: every record leases, as behind a cluster or Sentinel.
    #[serde(default)]
    pub plain_increments: Option<bool>,
}

/// `redis.sentinel`: the primary that Redis Sentinel names for `master`, asked of `nodes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSentinelFile {
    pub master: String,
    pub nodes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsFile {
    /// PEM file of the CA certificates to verify the server against (default: the system's).
    #[serde(default)]
    pub ca: Option<String>,
    /// PEM files of a client certificate and its key (mutual TLS), both or neither.
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadersFile {
    #[serde(default = "default_true")]
    pub x_ratelimit: bool,
    #[serde(default = "default_true")]
    pub ietf: bool,
}

/// The running model's enums, read from their names in the file (`serde(remote)`: the model
/// owns them and knows nothing of serde).
#[derive(Deserialize)]
#[serde(remote = "Balance", rename_all = "snake_case")]
enum BalanceName {
    RoundRobin,
    Random,
    ConsistentHash,
}

#[derive(Deserialize)]
#[serde(remote = "Algorithm", rename_all = "snake_case")]
enum AlgorithmName {
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    SlidingLog,
    LeakyBucket,
}

#[derive(Deserialize)]
#[serde(remote = "Action", rename_all = "snake_case")]
enum ActionName {
    Reject,
    Delay,
    Shadow,
    Shadowban,
    Throttle,
}

#[derive(Deserialize)]
#[serde(remote = "OnFailure", rename_all = "snake_case")]
enum OnFailureName {
    LocalShare,
    Local,
    Allow,
    Deny,
}
