//! Redis Cluster under faults (issue 15), with real redis-server nodes, real gateways and wrk:
//! a master killed under load (its replica takes over), a master stopped for 3 s (the other
//! masters' rounds go on), and a tenant's slot migrated to another master during traffic. In
//! each, no client sees a 5xx and no count is lost or counted twice.
//!
//! Meant for the release binary, like `fleet_load` (`make test` runs it with `--release`):
//!
//!     cargo test --release --test cluster -- --nocapture
#![cfg(not(debug_assertions))]

mod common;
use common::failover::{nothing_failed_or_lost, until_tiny_is_full, wrk, wrk_result};
use common::{
    eventually, metric_sum, period_with_room, redis_cmd, wait_redis_state, Cluster, Gateway,
    TempDir, Upstream,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The cases take turns: the machine has 2 cores, and a cluster of six nodes, two gateways and
/// wrk need them.
static LOCK: Mutex<()> = Mutex::new(());

const TENANTS: [&str; 5] = ["t0", "t1", "t2", "t3", "t4"];

/// Two rules: `all` never denies (its counts are what Redis must hold), `tiny` (200 an hour
/// on `/tiny/**`) is full long before a fault, so that its drift during the fault shows. Their
/// "hour" is the period from 3600 s up whose window has a minute and a half left now: each
/// case, start-up included, sees one window.
fn config(up: &Upstream, seeds: &str) -> String {
    let period = period_with_room(3600, 90);
    format!(
        "{}tenant:\n  from:\n    - header: x-org-id\n      trusted: true\n  required: true\nlimits:\n  - id: all\n    pathPattern: /**\n    tiers: [{{ period: {period}, threshold: 1000000000 }}]\n  - id: tiny\n    pathPattern: /tiny/**\n    tiers: [{{ period: {period}, threshold: 200 }}]\nredis:\n  cluster: {seeds}\n  key_prefix: cl\n  sync_interval: 200ms\n  timeout: 100ms\n",
        common::one_route_config(up.addr, 1, "")
    )
}

/// What Redis holds for rule `rule`, over every tenant.
fn in_redis(cluster: &Cluster, rule: &str) -> i64 {
    cluster
        .keys(&format!("cl:{{*}}:{rule}:*"))
        .iter()
        .map(|(_, _, v)| v)
        .sum()
}

#[test]
fn a_master_killed_under_load_fails_over_and_counting_resumes() {
    let _turn = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::start(3, 1);
    let up = Upstream::start("u");
    let cfg = config(&up, &cluster.seeds());
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    for gw in [&a, &b] {
        assert!(wait_redis_state(gw, "connected"), "{}", gw.log());
    }
    let dir = TempDir::new();
    let victim = cluster.master_of("{t0}").expect("t0's master");
    let load = [wrk(&dir, &a, 6), wrk(&dir, &b, 6)];
    until_tiny_is_full([&a, &b], |rule| in_redis(&cluster, rule));
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    // the replica is promoted; the gateways find it and round to it
    assert!(
        eventually(Duration::from_secs(15), || cluster
            .master_of("{t0}")
            .is_some_and(|m| m != victim)),
        "no failover"
    );
    let promoted = cluster.master_of("{t0}").expect("t0's new master");
    // the gateways saw t0's slot fail, found the promoted replica, and round to it
    let slots_down = |g: &Gateway| metric_sum(&g.metrics(), "tollgate_redis_cluster_slots_down");
    let slot_errors = |g: &Gateway| {
        metric_sum(
            &g.metrics(),
            "tollgate_redis_cluster_slot_rounds_total{result=\"error\"}",
        )
    };
    let on_promoted = || key_value_on(&cluster.nodes[promoted], "t0");
    let before = on_promoted();
    assert!(
        eventually(Duration::from_secs(15), || [&a, &b]
            .iter()
            .all(|g| slot_errors(g) > 0.0 && slots_down(g) == 0.0)
            && on_promoted() > before),
        "the gateways did not round to the promoted replica"
    );
    let gap = killed.elapsed();
    let results: Vec<(u64, u64)> = load.into_iter().map(wrk_result).collect();
    nothing_failed_or_lost(
        [&a, &b],
        &results,
        TENANTS.len(),
        |rule| in_redis(&cluster, rule),
        &format!(
            "failover: {gap:?} from SIGKILL to the gateways' first round to the promoted replica"
        ),
    );
}

/// A second tenant name whose slot is on another master than `of`.
fn tenant_elsewhere(cluster: &Cluster, of: usize) -> String {
    (0..1000)
        .map(|i| format!("other{i}"))
        .find(|t| {
            cluster
                .master_of(&format!("{{{t}}}"))
                .is_some_and(|m| m != of)
        })
        .expect("a tenant on another master")
}

/// Requests for each tenant in turn until `stop`; counts 200s per tenant, and anything else.
fn traffic(
    gw: &Gateway,
    tenants: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<u64>, Vec<String>)> {
    let addr = gw.addr;
    std::thread::spawn(move || {
        let mut ok = vec![0u64; tenants.len()];
        // what the others were: status and body, or the client's error
        let mut other = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for (i, t) in tenants.iter().enumerate() {
                match common::request(addr, "GET", "/x", &[("x-org-id", t)]) {
                    Ok(r) if r.status == 200 => ok[i] += 1,
                    Ok(r) => other.push(format!("{t}: {} {}", r.status, r.body)),
                    Err(e) => other.push(format!("{t}: {e}")),
                }
            }
        }
        (ok, other)
    })
}

/// Three masters without replicas, one gateway connected to them, well inside a window.
fn three_masters_one_gateway() -> (Cluster, Upstream, Gateway) {
    let cluster = Cluster::start(3, 0);
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, &cluster.seeds()));
    assert!(wait_redis_state(&gw, "connected"));
    (cluster, up, gw)
}

fn key_value(cluster: &Cluster, tenant: &str) -> i64 {
    cluster
        .keys(&format!("cl:{{{tenant}}}:all:*"))
        .iter()
        .map(|(_, _, v)| v)
        .sum()
}

#[test]
fn a_stopped_master_holds_up_only_its_own_keys() {
    let _turn = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (cluster, _up, gw) = three_masters_one_gateway();
    let stopped = cluster.master_of("{t0}").expect("t0's master");
    let other = tenant_elsewhere(&cluster, stopped);
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&gw, vec!["t0".into(), other.clone()], Arc::clone(&stop));
    // until both tenants' counts arrive, each on its own master
    assert!(
        eventually(Duration::from_secs(10), || key_value(&cluster, "t0") > 0
            && key_value(&cluster, &other) > 0),
        "counting before the fault: {}",
        gw.log()
    );
    let slot_errors = || {
        metric_sum(
            &gw.metrics(),
            "tollgate_redis_cluster_slot_rounds_total{result=\"error\"}",
        )
    };
    let errors_before = slot_errors();
    cluster.nodes[stopped].signal("STOP");
    let stopped_at = Instant::now();
    // until the gateway has seen a round to the stopped master fail
    assert!(
        eventually(Duration::from_secs(10), || slot_errors() > errors_before),
        "no failed round counted: {}",
        gw.log()
    );
    // while it is stopped, the other tenant's counts keep arriving on its own master
    let before = key_value_except(&cluster, stopped, &other);
    let during = || key_value_except(&cluster, stopped, &other);
    assert!(
        eventually(Duration::from_secs(10), || during() > before),
        "rounds to the other masters went on ({before} -> {}): {}",
        during(),
        gw.log()
    );
    // the scenario: the master stays stopped for 3 s, many rounds (200 ms apart) to it fail
    // meanwhile (and are not each logged)
    std::thread::sleep(Duration::from_secs(3).saturating_sub(stopped_at.elapsed()));
    cluster.nodes[stopped].signal("CONT");
    // until the gateway has seen every slot answer again, under the traffic
    assert!(
        eventually(Duration::from_secs(10), || gw
            .log()
            .contains("every cluster slot answers again")),
        "{}",
        gw.log()
    );
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.join().expect("traffic");
    assert!(failed.is_empty(), "every request answered 200: {failed:?}");
    // the stopped shard's counts arrive after it resumes, once
    assert!(
        eventually(Duration::from_secs(10), || key_value(&cluster, "t0")
            == ok[0] as i64
            && key_value(&cluster, &other) == ok[1] as i64),
        "Redis holds t0 {} of {}, {other} {} of {}",
        key_value(&cluster, "t0"),
        ok[0],
        key_value(&cluster, &other),
        ok[1]
    );
    let m = gw.metrics();
    let errors = metric_sum(
        &m,
        "tollgate_redis_cluster_slot_rounds_total{result=\"error\"}",
    );
    assert!(
        errors >= 1.0,
        "the stopped node's failed rounds are counted:\n{m}"
    );
    assert_eq!(
        metric_sum(&m, "tollgate_redis_cluster_slots_down"),
        0.0,
        "every slot answers again:\n{m}"
    );
    // logged when it stops answering and when it answers again, not at every round
    let log = gw.log();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert_eq!(
        (
            lines("cluster slot(s) did not answer"),
            lines("every cluster slot answers again")
        ),
        (1, 1),
        "{log}"
    );
}

/// `tenant`'s count on one node.
fn key_value_on(node: &common::RedisServer, tenant: &str) -> i64 {
    node.counter_keys(&format!("cl:{{{tenant}}}:all:*"))
        .into_iter()
        .map(|k| node.int(&["GET", &k]))
        .sum()
}

/// `tenant`'s count, asking every node but `stopped` (a stopped node would hold the test up;
/// in a cluster of masters only, each key is on one of them).
fn key_value_except(cluster: &Cluster, stopped: usize, tenant: &str) -> i64 {
    cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != stopped)
        .map(|(_, n)| key_value_on(n, tenant))
        .sum()
}

#[test]
fn a_slot_moved_during_traffic_loses_no_count() {
    let _turn = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (cluster, _up, gw) = three_masters_one_gateway();
    let src = cluster.master_of("{t0}").expect("t0's master");
    let dst = (0..3).find(|&i| i != src).expect("another master");
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&gw, vec!["t0".into()], Arc::clone(&stop));
    // until t0's counts arrive on its master, before the move
    assert!(
        eventually(Duration::from_secs(10), || key_value_on(
            &cluster.nodes[src],
            "t0"
        ) > 0),
        "counting before the move: {}",
        gw.log()
    );
    // move t0's slot, as `redis-cli --cluster reshard` does for each slot
    let (s, d) = (&cluster.nodes[src], &cluster.nodes[dst]);
    let id = |n: &common::RedisServer| match n.cmd(&["CLUSTER", "MYID"]) {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::SimpleString(t) => t,
        other => panic!("CLUSTER MYID: {other:?}"),
    };
    let (src_id, dst_id) = (id(s), id(d));
    let slot = match s.cmd(&["CLUSTER", "KEYSLOT", "{t0}"]) {
        redis::Value::Int(i) => i.to_string(),
        other => panic!("KEYSLOT: {other:?}"),
    };
    d.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
    s.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
    loop {
        let keys: Vec<String> = match s.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]) {
            redis::Value::Array(v) => v
                .into_iter()
                .filter_map(|k| match k {
                    redis::Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        if keys.is_empty() {
            break;
        }
        let port = d.port.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        redis_cmd(s.port, &args).expect("MIGRATE");
        // pacing: the keys move a batch at a time, under the traffic (rounds go on between)
        std::thread::sleep(Duration::from_millis(100));
    }
    for n in &cluster.nodes {
        n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    }
    assert!(eventually(Duration::from_secs(10), || cluster
        .master_of("{t0}")
        == Some(dst)));
    // until the traffic's counts arrive on the new master: the gateway follows the move
    let moved = key_value_on(d, "t0");
    assert!(
        eventually(Duration::from_secs(10), || key_value_on(d, "t0") > moved),
        "no count reached the new master after the move: {}",
        gw.log()
    );
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.join().expect("traffic");
    assert!(failed.is_empty(), "every request answered 200: {failed:?}");
    assert!(
        eventually(Duration::from_secs(10), || key_value(&cluster, "t0")
            == ok[0] as i64),
        "Redis holds {} of {} admitted",
        key_value(&cluster, "t0"),
        ok[0]
    );
    assert!(ok[0] > 100, "traffic ran: {ok:?}");
}
