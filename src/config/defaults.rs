//! Every default and every bound of the configuration, in one place (docs/configuration.md,
//! "Configuration reference", lists the same values).

use std::time::Duration;

// server
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
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

// limits
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(500);
pub const MAX_TIERS: usize = 16;

// redis
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(100);
pub const DEFAULT_KEY_PREFIX: &str = "tollgate";

/// How long a request waits in a full pool's queue before 503 (`queue.timeout`).
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(2);

/// `jwt.leeway`: the clock skew allowed on a token's `exp` and `nbf`, and its most.
pub const DEFAULT_JWT_LEEWAY: Duration = Duration::from_secs(30);
pub const MAX_JWT_LEEWAY: Duration = Duration::from_secs(300);
