//! Command line (contract section 1) and process start-up.

use crate::config;
use crate::limits::fleet::Fleet;
use crate::limits::{CounterRegistry, SystemClock};
use crate::metrics::Metrics;
use crate::request::connections::{self, Connections};
use crate::request::edge::Edge;
use crate::request::proxy::Gateway;
use crate::request::tls::SniCertificates;
use crate::services::admin::api::{sample_interval, DecisionRates, OpsSampler};
use crate::services::admin::install_drain_signals;
use crate::services::admin::{Admin, ReadinessProbe};
use crate::services::departure::{Departure, Leaving};
use crate::services::fleet_sync::{Accounts, SyncService};
use crate::services::reload::{install_sighup, ReloadStatus, Reloader};
use crate::services::sweeper::Sweeper;
use crate::services::upgrade::{install_sigusr2, Successor, Upgrader, OFFLINE_CHECK_ENV};
use crate::snapshot::{Runtime, SharedSnapshot, Snapshot};
use crate::upstream::HealthChecker;
use arc_swap::ArcSwap;
use clap::Parser;
use parking_lot::Mutex;
use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::prelude::{background_service, Opt, Server};
use pingora::proxy::HttpProxy;
use pingora::server::configuration::ServerConf;
use pingora::services::listening::Service;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The key exchange groups a TLS listener offers (Mozilla intermediate, 5.7).
pub const TLS_GROUPS: &str = "X25519:P-256:P-384";

#[derive(Parser, Debug)]
#[command(
    name = "tollgate",
    version,
    about = "Edge API gateway with tenant-aware, fleet-wide rate limiting",
    after_help = "Signals: SIGHUP reloads the config, SIGUSR2 starts this binary's file anew with -u and hands it the listeners (upgrade in place), SIGQUIT hands the listeners to a process started with -u, SIGTERM drains and exits, SIGINT exits at once.",
    subcommand_negates_reqs = true
)]
pub struct Args {
    /// The configuration file (YAML)
    #[arg(short = 'c', long = "conf", value_name = "FILE", required = true)]
    pub conf: Option<PathBuf>,
    /// Validate the configuration, print a summary and exit (0 valid, 1 invalid); with a
    /// `redis` section, also ask Redis whether the ACL user may run every command the gateway
    /// sends (1 when Redis answers that it may not; a Redis that does not answer is only a
    /// warning)
    #[arg(short = 't', long = "test")]
    pub test: bool,
    /// With -t: check the files only, without asking Redis (what the systemd unit runs before
    /// a start or a reload, which a Redis ACL to fix must not prevent)
    #[arg(long = "offline", requires = "test")]
    pub offline: bool,
    /// Run in the background (pingora daemon mode)
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Take over the listeners of a running instance (graceful upgrade, with SIGQUIT to the old one)
    #[arg(short = 'u', long = "upgrade")]
    pub upgrade: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Args {
    /// The configuration file (required unless a subcommand is given).
    pub fn conf(&self) -> &std::path::Path {
        self.conf.as_deref().unwrap_or(std::path::Path::new(""))
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print the line that stores an API key as its digest in a keys file
    /// (`sha256:<hex>`, the key's SHA-256). The key is read from standard input (one line;
    /// so that it stays out of the shell's history), or given as the argument.
    HashKey {
        /// The key (default: read from standard input)
        key: Option<String>,
    },
}

/// `tollgate hash-key`: the digest of a key, for a keys file.
fn hash_key(key: Option<String>) -> i32 {
    let key = match key {
        Some(k) => k,
        None => {
            let mut line = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut line) {
                eprintln!("cannot read the key from standard input: {e}");
                return 1;
            }
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    let key = key.trim();
    if key.is_empty() {
        eprintln!("the key is empty: give it as the argument or on standard input");
        return 1;
    }
    println!("{}", config::model::key_digest_text(key));
    0
}

/// Run the command line; returns the exit status.
pub fn main() -> i32 {
    let args = Args::parse();
    if let Some(Command::HashKey { key }) = &args.command {
        return hash_key(key.clone());
    }
    let conf = args.conf().to_path_buf();
    // before anything could replace the file (a package upgrade): what SIGUSR2 starts
    let exe = Successor::this_binary();
    let cfg = match config::load(&conf) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return 1;
        }
    };
    if args.test {
        for w in &cfg.warnings {
            eprintln!("{w}");
        }
        print!("{}", config::summary::summary(&cfg));
        let offline = args.offline || std::env::var_os(OFFLINE_CHECK_ENV).is_some();
        return match &cfg.redis {
            Some(redis) if !offline => check_redis_access(redis, &cfg),
            _ => 0,
        };
    }
    init_logging(cfg.server.log_json);
    for w in &cfg.warnings {
        log::warn!("{w}");
    }
    let metrics = match Metrics::new() {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("cannot set up metrics: {e}");
            return 1;
        }
    };
    let fleet = Arc::new(Fleet::default());
    let rt = Runtime {
        registry: Arc::new(CounterRegistry::new(
            metrics.evictions.clone(),
            metrics.untracked.clone(),
        )),
        gates: Default::default(),
        fleet,
        metrics,
        clock: Arc::new(SystemClock),
        probes: Default::default(),
    };
    let snapshot = match Snapshot::build(cfg, &rt) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "{}:1:1: cannot build upstream pools: {e}",
                args.conf().display()
            );
            return 1;
        }
    };
    run(&args, snapshot, rt, exe)
}

/// `-t` with a `redis` section: may the ACL user run every command the config needs? Exit 1
/// when Redis answers that it may not (`redis: user "gateway" may not run HINCRBY (NOPERM):
/// add +hincrby to its ACL ...`); a Redis that does not answer, or cannot tell (older than
/// 7.0), is a warning only, since it may come up after the check.
fn check_redis_access(redis: &config::model::RedisSettings, cfg: &config::model::Config) -> i32 {
    use crate::services::fleet_sync::backend::access;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warning: redis: the ACL was not checked ({e})");
            return 0;
        }
    };
    let wait = redis.timeout.max(std::time::Duration::from_secs(1));
    let found = runtime.block_on(access::check(redis, wait));
    let algorithms: Vec<_> = cfg.rules.iter().map(|r| r.algorithm).collect();
    let report = access::report(redis, &algorithms, &found);
    report.info.iter().for_each(|l| println!("{l}"));
    report
        .warnings
        .iter()
        .for_each(|l| eprintln!("warning: {l}"));
    report.errors.iter().for_each(|l| eprintln!("error: {l}"));
    i32::from(!report.errors.is_empty())
}

/// A name for this process in the fleet's heartbeat set: unique per process start.
fn instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{:x}", std::process::id(), nanos)
}

fn init_logging(json: bool) {
    let env = env_logger::Env::default().default_filter_or("info");
    let mut builder = env_logger::Builder::from_env(env);
    crate::log_format::set_up(&mut builder, json);
    let logger = builder.build();
    let max = logger.filter();
    // warnings and errors a client can cause are bounded per source (`log_limit`)
    if log::set_boxed_logger(Box::new(crate::log_limit::Limited::new(logger))).is_ok() {
        log::set_max_level(max);
    }
}

fn run(args: &Args, snapshot: Snapshot, rt: Runtime, exe: std::path::PathBuf) -> i32 {
    let server_cfg = snapshot.config.server.clone();
    let (opt, conf) = pingora_settings(args, &server_cfg);
    // before anything can accept a request: SIGHUP would otherwise kill the process
    let sighup = match install_sighup() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot install the SIGHUP handler: {e}");
            return 1;
        }
    };
    let sigusr2 = match install_sigusr2() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot install the SIGUSR2 handler: {e}");
            return 1;
        }
    };
    if let Err(e) = listeners_free(args, &server_cfg) {
        eprintln!("{e}");
        return 1;
    }
    let draining = match install_drain_signals() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot install the SIGTERM handler: {e}");
            return 1;
        }
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let shared: SharedSnapshot = Arc::new(ArcSwap::from_pointee(snapshot));
    let gateway = Gateway {
        shared: shared.clone(),
        metrics: rt.metrics.clone(),
        draining: draining.clone(),
    };
    let connections = Arc::new(client_connections(&server_cfg, &rt.metrics));
    match edge_service(args, &server, gateway, &shared, &server_cfg, &connections) {
        Ok(proxy) => {
            server.add_service(proxy);
        }
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    }
    add_background_services(
        &mut server,
        args,
        &rt,
        &shared,
        sighup,
        draining,
        connections,
    );
    server.add_service(background_service(
        "upgrade in place",
        Upgrader {
            successor: Successor {
                conf: std::path::absolute(args.conf())
                    .unwrap_or_else(|_| args.conf().to_path_buf()),
                exe,
                daemon: args.daemon,
                upgrade_sock: server_cfg.upgrade_sock.clone().into(),
                wait: crate::services::upgrade::wait_for_successor(
                    std::env::var("TOLLGATE_UPGRADE_WAIT_MS").ok().as_deref(),
                ),
            },
            flag: sigusr2,
        },
    ));
    server.run_forever()
}

/// Pingora's options and server settings from the command line and `server`.
fn pingora_settings(args: &Args, server_cfg: &config::model::ServerSettings) -> (Opt, ServerConf) {
    let mut conf = ServerConf {
        threads: server_cfg.threads,
        daemon: args.daemon,
        pid_file: server_cfg.pid_file.clone(),
        error_log: server_cfg.error_log.clone(),
        upgrade_sock: server_cfg.upgrade_sock.clone(),
        grace_period_seconds: Some(server_cfg.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        // attempts per request; each pool stops at its own `retries` (fail_to_connect)
        max_retries: crate::config::defaults::MAX_RETRIES + 1,
        ..ServerConf::default()
    };
    conf.work_stealing = true;
    let opt = Opt {
        upgrade: args.upgrade,
        daemon: args.daemon,
        nocapture: false,
        test: false,
        conf: None,
    };
    (opt, conf)
}

/// Pingora binds in its own thread and panics there on failure, leaving a process that looks
/// alive; a listener that cannot be had ends start-up here, before anything runs (with -u the
/// listeners come from the old process).
fn listeners_free(args: &Args, server_cfg: &config::model::ServerSettings) -> Result<(), String> {
    if args.upgrade {
        return Ok(());
    }
    for addr in server_cfg.listen.iter().chain(server_cfg.admin.iter()) {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Err(format!(
                "{}: cannot listen on {addr}: {e}",
                args.conf().display()
            ));
        }
    }
    Ok(())
}

/// The count of client connections per listener, each listener's limit fitted to the
/// descriptor limit (raised to the hard limit first).
fn client_connections(
    server_cfg: &config::model::ServerSettings,
    metrics: &Metrics,
) -> Connections {
    let n = server_cfg.listen.len();
    let descriptors = connections::descriptor_limit().unwrap_or(u64::MAX);
    let limit = connections::fit_to_descriptors(server_cfg.max_connections, n, descriptors);
    if let Some(asked) = server_cfg.max_connections.filter(|&m| m > limit) {
        log::warn!(
            "server.max_connections {asked} lowered to {limit} per listener: the process may open {descriptors} files, each client connection may take two, and {} are kept for the rest",
            config::defaults::RESERVED_DESCRIPTORS
        );
    }
    Connections::new(
        &server_cfg.listen,
        &vec![limit; n],
        server_cfg.max_connections_per_ip,
        metrics,
    )
}

/// The proxy on every listener (TLS ones pick their certificate by SNI), inside the `Edge`.
fn edge_service(
    args: &Args,
    server: &Server,
    gateway: Gateway,
    shared: &SharedSnapshot,
    server_cfg: &config::model::ServerSettings,
    connections: &Arc<Connections>,
) -> Result<Service<Edge<Gateway>>, String> {
    let metrics = gateway.metrics.clone();
    let mut app = HttpProxy::new(gateway, server.configuration.clone());
    app.handle_init_modules();
    if server_cfg.h2c {
        let mut options = HttpServerOptions::default();
        options.h2c = true;
        app.server_options = Some(options);
    }
    let mut proxy = Service::new(
        "tollgate proxy".to_string(),
        Edge {
            proxy: Arc::new(app),
            shared: shared.clone(),
            h2c: server_cfg.h2c,
            connections: connections.clone(),
            metrics: metrics.clone(),
        },
    );
    for (addr, tls) in server_cfg.listen.iter().zip(&server_cfg.listen_tls) {
        if !*tls {
            proxy.add_tcp(&addr.to_string());
            continue;
        }
        let callbacks = Box::new(SniCertificates {
            shared: shared.clone(),
            listener: *addr,
        });
        let mut settings = TlsSettings::with_callbacks(callbacks)
            .map_err(|e| format!("{}: tls: {e}", args.conf().display()))?;
        settings.enable_h2();
        // Mozilla's "intermediate" profile: X25519, prime256v1 and secp384r1 only (OpenSSL 3
        // also offers X448 and secp521r1, which sslyze's intermediate check refuses)
        settings
            .set_groups_list(TLS_GROUPS)
            .map_err(|e| format!("{}: tls: groups {TLS_GROUPS}: {e}", args.conf().display()))?;
        proxy.add_tls_with_settings(&addr.to_string(), None, settings);
    }
    // TLS connections are counted, and wait for their first byte, before the handshake
    proxy
        .endpoints()
        .set_pre_tls_callback(Arc::new(connections::BeforeTls {
            connections: connections.clone(),
            shared: shared.clone(),
            metrics,
        }));
    Ok(proxy)
}

/// The admin listener on `addr` (one thread), and the sampler of what its operator view
/// shows.
fn add_admin(server: &mut Server, admin: Admin, addr: std::net::SocketAddr) {
    server.add_service(background_service(
        "operator view sampler",
        OpsSampler {
            shared: admin.shared.clone(),
            rates: admin.rates.clone(),
            metrics: admin.metrics.clone(),
            fleet: admin.fleet.clone(),
            interval: sample_interval(std::env::var("TOLLGATE_SAMPLE_INTERVAL_MS").ok().as_deref()),
        },
    ));
    let mut service = Service::new("tollgate admin".to_string(), admin);
    service.add_tcp(&addr.to_string());
    service.threads = Some(1);
    server.add_service(service);
}

/// The services that keep things fresh: upstream health checks, the addresses of upstream
/// servers given by name, the token issuers' keys, the counter sweeper.
fn add_upkeep(server: &mut Server, rt: &Runtime, shared: &SharedSnapshot) {
    let metrics = &rt.metrics;
    server.add_service(background_service(
        "upstream health checks",
        HealthChecker {
            pools: {
                let shared = shared.clone();
                move || shared.load().pools.clone()
            },
        },
    ));
    // runs always: idle while no pool has a server given by name, so that a reload can add one
    server.add_service(background_service(
        "upstream dns",
        crate::upstream::DnsRefresher {
            pools: {
                let shared = shared.clone();
                move || shared.load().pools.clone()
            },
            lookups: metrics.upstream_dns_lookups.clone(),
        },
    ));
    // runs always: idle without a `jwks_uri`, so that a reload can add one
    server.add_service(background_service(
        "jwks fetcher",
        crate::services::jwks::JwksFetcher {
            shared: shared.clone(),
            metrics: metrics.clone(),
        },
    ));
    // runs always: idle without `redis` or long fixed windows
    server.add_service(background_service(
        "usage archive",
        crate::services::fleet_sync::archive::Archiver::new(
            shared.clone(),
            crate::services::fleet_sync::archive::from_ms(
                std::env::var("TOLLGATE_USAGE_ARCHIVE_FROM_MS")
                    .ok()
                    .as_deref(),
            ),
            metrics.clone(),
        ),
    ));
    server.add_service(background_service(
        "counter sweeper",
        Sweeper {
            registry: rt.registry.clone(),
            clock: rt.clock.clone(),
            tracked: metrics.tracked_counters.clone(),
        },
    ));
}

/// The Redis sync (runs always: idle without a `redis` section, so that a reload can add one),
/// and the departure that ends a terminating process once no client connection is left,
/// after the sync's last round.
fn add_sync(server: &mut Server, rt: &Runtime, shared: &SharedSnapshot, conns: &Arc<Connections>) {
    let leaving = Arc::new(Leaving::default());
    server.add_service(background_service(
        "departure",
        Departure {
            leaving: leaving.clone(),
            connections: conns.clone(),
            phases: Mutex::new(Some(server.watch_execution_phase())),
        },
    ));
    server.add_service(background_service(
        "redis sync",
        SyncService {
            shared: shared.clone(),
            accounts: Arc::new(Accounts::new(
                rt.registry.clone(),
                rt.fleet.clone(),
                rt.clock.clone(),
                instance_id(),
            )),
            metrics: rt.metrics.clone(),
            slots_down: Default::default(),
            last_error: Default::default(),
            reply_errors: Default::default(),
            leaving,
        },
    ));
}

/// The services beside the proxy: the Redis sync and the departure, the reloader, the admin
/// listener and its sampler, health checks, the counter sweeper and the readiness probe.
fn add_background_services(
    server: &mut Server,
    args: &Args,
    rt: &Runtime,
    shared: &SharedSnapshot,
    sighup: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
    connections: Arc<Connections>,
) {
    let metrics = &rt.metrics;
    let server_cfg = shared.load().config.server.clone();
    let reload_status = Arc::new(ReloadStatus::default());
    let rates = Arc::new(DecisionRates::default());
    let ready = Arc::new(AtomicBool::new(false));
    if let Some(t) = &shared.load().config.tracing {
        server.add_service(background_service(
            "trace export",
            crate::request::trace::TraceExport {
                settings: t.clone(),
                dropped: metrics.trace_spans_dropped.clone(),
            },
        ));
    }
    add_sync(server, rt, shared, &connections);
    let reloader = Reloader {
        status: reload_status.clone(),
        path: args.conf().to_path_buf(),
        shared: shared.clone(),
        runtime: rt.clone(),
        metrics: metrics.clone(),
        flag: sighup,
        watch: Default::default(),
    };
    // what the files held when loaded, before the first request: the watch (a thread, made
    // in the reloader's task, after a daemon's fork) compares them when it begins, so an edit
    // in between is not taken as what was loaded
    reloader.remember_files();
    server.add_service(background_service("config reloader", reloader));
    if let Some(admin_addr) = server_cfg.admin {
        let admin = Admin {
            shared: shared.clone(),
            reload: reload_status,
            rates,
            metrics: metrics.clone(),
            ready: ready.clone(),
            draining,
            fleet: rt.fleet.clone(),
            connections,
        };
        add_admin(server, admin, admin_addr);
    }
    add_upkeep(server, rt, shared);
    server.add_service(background_service(
        "readiness probe",
        ReadinessProbe {
            listen: server_cfg.listen.clone(),
            listen_tls: server_cfg.listen_tls.clone(),
            ready,
            fleet: rt.fleet.clone(),
            tracing: shared.load().config.tracing.is_some(),
            jwks: (shared.load().config.tenant.jwks.iter())
                .map(|j| j.keys.clone())
                .collect(),
        },
    ));
}
