//! Every default and every bound of the configuration, in one place (docs/configuration.md,
//! "Configuration reference", lists the same values).

use jsonwebtoken::Algorithm;
use std::time::Duration;

// server
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
/// `server.admin_token`: at least this many printable characters.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;
pub const DEFAULT_MAX_COUNTERS_PER_RULE: usize = 200_000;
pub const DEFAULT_MAX_REQUEST_HEADER_BYTES: usize = 64 * 1024;
/// Pingora's own limit on a request header.
pub const MAX_REQUEST_HEADER_BYTES: usize = 1_048_575;
pub const DEFAULT_CLIENT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Client connections per listener, at most (and less where the descriptor limit is lower).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Descriptors kept out of the client connections' share: upstream pools, Redis, logs, admin.
pub const RESERVED_DESCRIPTORS: u64 = 1024;
pub const DEFAULT_H2_MAX_CONCURRENT_STREAMS: u32 = 100;
pub const MAX_H2_MAX_CONCURRENT_STREAMS: u32 = 10_000;
pub const DEFAULT_H2_MAX_STREAMS_PER_SECOND: u32 = 5_000;
pub const DEFAULT_H2_MAX_PREMATURE_RESETS: u32 = 100;
pub const DEFAULT_PID_FILE: &str = "/tmp/tollgate.pid";
pub const DEFAULT_UPGRADE_SOCK: &str = "/tmp/tollgate_upgrade.sock";
pub const MAX_THREADS: usize = 1024;

// upstreams
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_HEALTH_HOST: &str = "localhost";
pub const DEFAULT_RETRIES: usize = 2;
pub const MAX_RETRIES: usize = 16;
/// HTTP/2 pools: streams on one upstream connection (Pingora's own default is one).
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: usize = 100;
pub const MAX_STREAMS_PER_CONNECTION: usize = 10_000;

// dns (upstream servers given by name)
/// The shortest time an answer is kept, whatever its TTL; also the wait after a failed lookup.
pub const DEFAULT_DNS_MIN_TTL: Duration = Duration::from_secs(1);
/// The longest time an answer is kept, whatever its TTL.
pub const DEFAULT_DNS_MAX_TTL: Duration = Duration::from_secs(300);
/// A lookup without an answer by then fails.
pub const DEFAULT_DNS_TIMEOUT: Duration = Duration::from_secs(2);

// tenant
/// `tenant.forward_header`: the header the tenant goes to the upstream in.
pub const DEFAULT_TENANT_HEADER: &str = "x-tenant-id";

// limits
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(500);
pub const MAX_TIERS: usize = 16;
/// The largest threshold: a Structured Field integer has at most 15 digits (RFC 9651), and
/// `q=` of `RateLimit-Policy` is one.
pub const MAX_THRESHOLD: i64 = 999_999_999_999_999;
/// The largest threshold of a `sliding_log` tier: the log keeps one instant (8 bytes) per
/// unit admitted in the last period, so a partition's tier holds at most 80 KB.
pub const MAX_LOG_THRESHOLD: i64 = 10_000;
/// The largest `queue` of a `leaky_bucket`.
pub const MAX_QUEUE: i64 = 1_000_000;
/// The most requests in flight a `concurrency` limit may allow.
pub const MAX_CONCURRENCY: i64 = 1_000_000;
/// A shadowban rule's reply when its `shadowban` does not say.
pub const DEFAULT_SHADOWBAN_STATUS: u16 = 200;
pub const DEFAULT_SHADOWBAN_CONTENT_TYPE: &str = "application/json";
pub const DEFAULT_SHADOWBAN_BODY: &str = "{}";

// redis
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(100);
pub const DEFAULT_KEY_PREFIX: &str = "tollgate";

/// How long a request waits in a full pool's queue before 503 (`queue.timeout`).
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(2);

/// Algorithms taken when `algorithms` is not given: every asymmetric one (HMAC only when
/// named, with a `secret_file`).
pub const DEFAULT_JWT_ALGORITHMS: [Algorithm; 7] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// `jwt.leeway`: the clock skew allowed on a token's `exp` and `nbf`, and its most.
pub const DEFAULT_JWT_LEEWAY: Duration = Duration::from_secs(30);
pub const MAX_JWT_LEEWAY: Duration = Duration::from_secs(300);
