//! Redis Sentinel (issue 43), with real redis-server processes (a primary and its replica),
//! three real redis-sentinel processes (Debian's), two real gateways and wrk: the primary is
//! killed under load, the sentinels promote the replica, and the gateways find it through
//! them. No client sees an error or a 5xx, nothing under its limit is refused, and the
//! promoted primary ends up holding exactly what the gateways admitted.
//!
//! Meant for the release binary, like `cluster` (`make test` runs it with `--release`):
//!
//!     cargo test --release --test sentinel -- --nocapture
#![cfg(not(debug_assertions))]

mod common;
use common::failover::{allowed, nothing_failed_or_lost, until_tiny_is_full, wrk, wrk_result};
use common::sentinel::Sentinel;
use common::{
    eventually, period_with_room, redis_cmd, wait_redis_state, Gateway, RedisServer, TempDir,
    Upstream,
};
use std::time::{Duration, Instant};

const TENANTS: usize = 5;

/// Rules as in `cluster`: `all` never denies, `tiny` (200 an "hour") is full before the fault.
fn config(up: &Upstream, sentinels: &[Sentinel]) -> String {
    let period = period_with_room(3600, 90);
    let nodes: Vec<String> = sentinels
        .iter()
        .map(|s| format!("\"{}\"", s.url()))
        .collect();
    format!(
        "{}tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n  required: true\nlimits:\n  - id: all\n    pathPattern: /**\n    tiers: [{{ period: {period}, threshold: 1000000000 }}]\n  - id: tiny\n    pathPattern: /tiny/**\n    tiers: [{{ period: {period}, threshold: 200 }}]\nredis:\n  sentinel: {{ master: mymaster, nodes: [{}] }}\n  key_prefix: cl\n  sync_interval: 200ms\n  timeout: 100ms\n",
        common::one_route_config(up.addr, 1, ""),
        nodes.join(", ")
    )
}

/// What `server` holds for rule `rule`, over every tenant (the counter keys, not the ledgers).
fn in_redis(server: &RedisServer, rule: &str) -> i64 {
    server.held(&format!("cl:{{*}}:{rule}:*"))
}

/// Until every sentinel names the server on `port` as the primary (a failover ended).
fn until_the_sentinels_name(sentinels: &[Sentinel], port: u16) {
    assert!(
        eventually(Duration::from_secs(15), || sentinels
            .iter()
            .all(|s| s.primary() == Some(port))),
        "no failover: the sentinels name {:?}",
        sentinels.iter().map(Sentinel::primary).collect::<Vec<_>>()
    );
}

/// How many connections listen on the waits channel of `server` (the gateways'; the
/// sentinels' own subscriptions are to another channel).
fn listening(server: &RedisServer) -> i64 {
    match redis_cmd(server.port, &["PUBSUB", "NUMSUB", "cl:waits"]) {
        Ok(redis::Value::Array(v)) => match v.get(1) {
            Some(redis::Value::Int(n)) => *n,
            _ => -1,
        },
        _ => -1,
    }
}

/// Until `n` connections listen on `server`'s waits channel.
fn until_listening(server: &RedisServer, n: i64, gws: &[&Gateway]) {
    assert!(
        eventually(Duration::from_secs(20), || listening(server) == n),
        "{} of {n} listen on the waits channel of the server on {}; logs:\n{}",
        listening(server),
        server.port,
        gws.iter()
            .map(|g| g.log())
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
}

/// A primary, its replica (synced), and three sentinels that know both and one another: down
/// after 500 ms without an answer, two of the three to agree.
fn sentinel_fleet() -> (RedisServer, RedisServer, Vec<Sentinel>) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let synced = || {
        redis_cmd(replica.port, &["INFO", "replication"]).is_ok_and(|v| {
            matches!(v, redis::Value::BulkString(b) if String::from_utf8_lossy(&b).contains("master_link_status:up"))
        })
    };
    assert!(
        eventually(Duration::from_secs(10), synced),
        "the replica never synced"
    );
    // down after 500 ms without an answer, two of the three to agree
    let monitor = format!(
        "sentinel monitor mymaster 127.0.0.1 {} 2\nsentinel down-after-milliseconds mymaster 500\n\
         sentinel failover-timeout mymaster 5000\n",
        primary.port
    );
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(&monitor)).collect();
    // each must know the replica (to promote it) and the two others (to agree)
    assert!(
        eventually(Duration::from_secs(20), || sentinels
            .iter()
            .all(|s| s.knows() == (1, 2))),
        "the sentinels did not find the replica and one another: {:?}",
        sentinels.iter().map(Sentinel::knows).collect::<Vec<_>>()
    );
    (primary, replica, sentinels)
}

#[test]
fn the_primary_killed_under_load_fails_over_through_the_sentinels_and_counting_resumes() {
    let (mut primary, replica, sentinels) = sentinel_fleet();
    let up = Upstream::start("u");
    let cfg = config(&up, &sentinels);
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
    }
    until_listening(&primary, 2, &[&a, &b]);
    let dir = TempDir::new();
    let load = [wrk(&dir, &a, 8), wrk(&dir, &b, 8)];
    until_tiny_is_full([&a, &b], |rule| in_redis(&primary, rule));
    let killed = Instant::now();
    primary.kill();
    until_the_sentinels_name(&sentinels, replica.port);
    let promoted = killed.elapsed();
    // the gateways ask the sentinels again and round to the promoted replica
    let before = in_redis(&replica, "all");
    assert!(
        eventually(Duration::from_secs(10), || in_redis(&replica, "all")
            > before),
        "the gateways did not round to the promoted replica"
    );
    let found = killed.elapsed();
    // and listen on the waits channel of the promoted replica, asking the sentinels again
    // (the channel's connection to the killed primary is lost)
    until_listening(&replica, 2, &[&a, &b]);
    let results: Vec<(u64, u64)> = load.into_iter().map(wrk_result).collect();
    nothing_failed_or_lost(
        [&a, &b],
        &results,
        TENANTS,
        |rule| in_redis(&replica, rule),
        &format!(
            "sentinel failover: promoted {promoted:?} after SIGKILL, the gateways' first round \
             to it {found:?} after"
        ),
    );
}

/// A failover that demotes a primary still running (`SENTINEL FAILOVER`): its connection may
/// stay open and answer READONLY, or close; either way the gateway asks the sentinels again,
/// and every count reaches the new primary, once.
#[test]
fn a_failover_that_demotes_the_running_primary_moves_the_rounds_to_the_new_one() {
    let (primary, replica, sentinels) = sentinel_fleet();
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, &sentinels));
    assert!(wait_redis_state(&gw, "connected"), "{}", gw.log());
    until_listening(&primary, 1, &[&gw]);
    let get = |n: usize| {
        for i in 0..n {
            let tenant = format!("t{}", i % TENANTS);
            assert_eq!(gw.get("/x", &[("x-org-id", &tenant)]).status, 200);
        }
    };
    get(20);
    assert!(
        eventually(Duration::from_secs(5), || in_redis(&primary, "all") == 20),
        "the primary holds {}",
        in_redis(&primary, "all")
    );
    redis_cmd(sentinels[0].port, &["SENTINEL", "FAILOVER", "mymaster"]).expect("failover");
    until_the_sentinels_name(&sentinels, replica.port);
    // the old primary now a replica of the new one
    let demoted = || {
        redis_cmd(primary.port, &["INFO", "replication"]).is_ok_and(|v| {
            matches!(v, redis::Value::BulkString(b) if String::from_utf8_lossy(&b).contains("role:slave"))
        })
    };
    assert!(eventually(Duration::from_secs(15), demoted), "not demoted");
    // the sentinels close the demoted primary's clients, the channel's too: it listens on
    // the new primary
    until_listening(&replica, 1, &[&gw]);
    assert_eq!(listening(&primary), 0);
    get(20);
    assert!(
        eventually(Duration::from_secs(15), || in_redis(&replica, "all") == 40),
        "the new primary holds {} of 40; log:\n{}",
        in_redis(&replica, "all"),
        gw.log()
    );
    assert_eq!(
        allowed(&[&gw], "all"),
        40.0,
        "every request admitted, none refused"
    );
}
