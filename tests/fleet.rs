//! Fleet-wide limits through real redis-server processes and real gateway processes
//! (contract section 6).

mod common;
use common::{
    eventually, metric_sum, period_with_room, wait_redis_state, Cluster, Edit, Gateway,
    RedisServer, Upstream,
};
use std::time::{Duration, Instant};

fn config(up: &Upstream, redis: &str, tiers: &str, extra_redis: &str) -> String {
    let rule = format!("  - id: fleet\n    pathPattern: /**\n    tiers: {tiers}\n");
    config_of(up, 1, &rule, redis, extra_redis)
}

/// A config of `threads`, tenants from `x-org-id`, the rules `limits` (YAML list items) and
/// `redis` (its lines, the key prefix `tg`).
fn config_of(up: &Upstream, threads: usize, limits: &str, redis: &str, extra: &str) -> String {
    format!(
        r#"{head}tenant:
  from:
    - header: x-org-id
      trusted: true
  required: true
limits:
{limits}redis:
  {redis}
  key_prefix: tg
{extra}
"#,
        head = common::one_route_config(up.addr, threads, "")
    )
}

/// Two gateways on `cfg`, both connected to Redis and counting each other as live.
fn pair(cfg: &str) -> (Gateway, Gateway) {
    let (a, b) = (Gateway::start(cfg), Gateway::start(cfg));
    wait_connected(&a);
    wait_connected(&b);
    assert!(eventually(Duration::from_secs(5), || metric_sum(
        &a.metrics(),
        "tollgate_redis_live_instances"
    ) == 2.0));
    (a, b)
}

/// Stop Redis and wait until `gw` has noticed.
fn take_down(redis: &mut RedisServer, gw: &Gateway) {
    redis.kill();
    assert!(wait_redis_state(gw, "disconnected"));
}

fn wait_connected(gw: &Gateway) {
    assert!(
        wait_redis_state(gw, "connected"),
        "gateway did not connect to redis; log:\n{}",
        gw.log()
    );
}

/// `[{ period: P, threshold: N }]` with P about an hour (the smallest from 3600 s up) whose
/// window has `room_s` seconds left now: a test that is done within them (start-up
/// included) sees one window.
fn hourly(threshold: u64, room_s: u64) -> String {
    let p = period_with_room(3600, room_s);
    format!("[{{ period: {p}, threshold: {threshold} }}]")
}

/// One gateway on `redis` (`timeout: 200ms` and `more` redis lines) with a rule far from its
/// limit (plain increments), connected.
fn far_from_the_limit(redis: &RedisServer, up: &Upstream, more: &str) -> Gateway {
    let url = format!("url: {}\n  timeout: 200ms{more}", redis.url());
    let gw = Gateway::start(&config(up, &url, &hourly(1_000_000, 90), ""));
    wait_connected(&gw);
    gw
}

/// `n` requests of tenant `t`: how many were admitted.
fn admitted_of_t(gw: &Gateway, n: usize) -> i64 {
    (0..n)
        .filter(|_| gw.get("/x", &[("x-org-id", "t")]).status == 200)
        .count() as i64
}

/// Until every gateway of `gws` has made `n` more rounds (ok or not) with Redis.
fn rounds_pass(gws: &[&Gateway], n: f64) -> bool {
    let rounds = |g: &Gateway| metric_sum(&g.metrics(), "tollgate_redis_sync_total");
    let before: Vec<f64> = gws.iter().map(|g| rounds(g)).collect();
    eventually(Duration::from_secs(10), || {
        gws.iter().zip(&before).all(|(g, b)| rounds(g) >= b + n)
    })
}

#[test]
fn three_instances_enforce_one_shared_limit_within_5_percent() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    // a window of 30 s or a little more, with room for the start-up and the 9 s of requests
    let period = period_with_room(30, 25);
    let cfg = config(
        &up,
        &format!("url: {}", redis.url()),
        &format!("[{{ period: {period}, threshold: 60 }}]"),
        "",
    );
    let gws: Vec<Gateway> = (0..3).map(|_| Gateway::start(&cfg)).collect();
    gws.iter().for_each(wait_connected);
    // all three see each other in the heartbeat set
    assert!(eventually(Duration::from_secs(5), || gws.iter().all(
        |g| metric_sum(&g.metrics(), "tollgate_redis_live_instances") == 3.0
    )));
    let started = Instant::now();
    let before: Vec<f64> = gws
        .iter()
        .map(|g| metric_sum(&g.metrics(), "tollgate_redis_sync_total"))
        .collect();
    // one tenant sends 3x its limit, round-robin, over about 9 s
    let mut admitted = 0;
    for i in 0..180 {
        let r = gws[i % 3].get("/x", &[("x-org-id", "acme")]);
        assert!(r.status == 200 || r.status == 429, "status {}", r.status);
        if r.status == 200 {
            admitted += 1;
        }
        // pacing: the load is spread over about 9 s (many rounds), not a burst
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("fleet accuracy: admitted {admitted} of a limit of 60 (3 instances)");
    assert!(
        (57..=63).contains(&admitted),
        "admitted {admitted} of a limit of 60"
    );
    // round trips: at most 1/sync_interval + 20 per second per instance
    for (g, b) in gws.iter().zip(before) {
        let rounds = metric_sum(&g.metrics(), "tollgate_redis_sync_total") - b;
        eprintln!(
            "redis round trips: {rounds} in {elapsed:.1} s = {:.1}/s",
            rounds / elapsed
        );
        assert!(
            rounds <= (elapsed + 1.0) * 21.0,
            "{rounds} rounds in {elapsed:.1} s"
        );
    }
    // the fleet's count is in Redis, under the contract's key, with a TTL: once it got
    // there, it stays exact through two more rounds of every instance
    let count = || {
        let keys = redis.counter_keys("tg:{acme}:fleet:*");
        (keys.len() == 1).then(|| redis.int(&["GET", &keys[0]]))
    };
    assert!(
        eventually(Duration::from_secs(10), || count() == Some(admitted as i64)),
        "Redis holds {:?} of {admitted}",
        count()
    );
    assert!(rounds_pass(&gws.iter().collect::<Vec<_>>(), 2.0));
    let keys = redis.counter_keys("tg:{acme}:fleet:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let parts: Vec<&str> = keys[0].split(':').collect();
    let (start, end): (u64, u64) = (parts[3].parse().unwrap(), parts[4].parse().unwrap());
    assert_eq!(end - start, period * 1000);
    assert_eq!(start % (period * 1000), 0, "epoch-aligned");
    assert_eq!(redis.int(&["GET", &keys[0]]), admitted as i64);
    let ttl = redis.int(&["PTTL", &keys[0]]);
    assert!(
        ttl > 0 && ttl <= period as i64 * 1000 + 60_000,
        "pttl {ttl}"
    );
    // the scripts are called by their hash, never sent whole
    let stats = match redis.cmd(&["INFO", "commandstats"]) {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO commandstats: {other:?}"),
    };
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
    assert!(
        !stats.contains("cmdstat_eval:"),
        "a script sent whole: {stats}"
    );
}

#[test]
fn redis_down_keeps_traffic_flowing_and_counts_arrive_when_it_returns() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  timeout: 200ms", redis.url()),
        &hourly(1000, 90),
        "",
    );
    let gw = Gateway::start_with_env(&cfg, &[common::FAST_SAMPLER]);
    wait_connected(&gw);
    // a fresh tenant has a cold credit of 2 (of 1000) until its first lease: a request that
    // races ahead of that round is refused (retry-after 1); this test is about Redis going
    // away, so it waits for that round rather than for the race (a refused request is sent
    // again, until 5 are admitted)
    let mut admitted = 0;
    eventually(Duration::from_secs(5), || {
        match gw.get("/x", &[("x-org-id", "t1")]).status {
            200 => admitted += 1,
            429 => {}
            s => panic!("unexpected {s}"),
        }
        admitted == 5
    });
    assert_eq!(admitted, 5);
    assert!(eventually(Duration::from_secs(5), || redis
        .counter_keys("tg:{t1}:*")
        .len()
        == 1));
    redis.kill();
    // traffic keeps flowing, no 5xx, while the counts wait; until the round that finds Redis
    // gone has timed out (200 ms here), a request past this instance's lease is refused with a
    // short Retry-After, as while a lease is renewed; then `on_failure` (local_share) admits
    // (a refused request is sent again, until 7 are admitted)
    let mut admitted = 0;
    eventually(Duration::from_secs(5), || {
        match gw.get("/x", &[("x-org-id", "t1")]).status {
            200 => admitted += 1,
            429 => {}
            s => panic!("unexpected {s} while Redis is down"),
        }
        admitted == 7
    });
    assert_eq!(admitted, 7, "traffic flows while Redis is down");
    assert!(wait_redis_state(&gw, "disconnected"));
    let m = gw.metrics();
    assert!(
        metric_sum(&m, "tollgate_redis_pending_deltas") >= 7.0,
        "{m}"
    );
    // the status page says the same, as requests
    let status = common::request(gw.admin, "GET", "/api/status", &[])
        .expect("status")
        .json();
    assert!(
        status["redis"]["pending_requests"].as_i64() >= Some(7),
        "{status}"
    );
    assert!(metric_sum(&m, "tollgate_redis_sync_total{result=\"error\"}") >= 1.0);
    assert!(
        eventually(Duration::from_secs(3), || gw
            .metrics()
            .contains("tollgate_redis_connected 0")),
        "the link gauge shows Redis gone"
    );
    let log = gw.log();
    assert_eq!(
        log.matches("redis: sync failed").count(),
        1,
        "one log line per state change:\n{log}"
    );
    // Redis comes back empty: the 7 counts made meanwhile reach it, and since each instance
    // reports its cumulative count, so do the 5 it had confirmed before (the key holds what the
    // fleet admitted in the window)
    redis.restart();
    wait_connected(&gw);
    assert!(eventually(Duration::from_secs(10), || {
        redis
            .counter_keys("tg:{t1}:*")
            .first()
            .is_some_and(|k| redis.int(&["GET", k]) == 12)
    }));
    // no key without a TTL
    for k in redis.keys("*") {
        assert!(redis.int(&["PTTL", &k]) > 0, "{k} has no TTL");
    }
}

#[test]
fn a_redis_slower_than_the_timeout_counts_every_request_once() {
    // Rounds sent while Redis is stopped time out, but Redis reads and applies them when it
    // resumes; sending their counts again must not count them twice.
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!(
            "url: {}\n  timeout: 100ms\n  sync_interval: 200ms",
            redis.url()
        ),
        &hourly(100_000, 90),
        "",
    );
    let gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let rounds = |result: &str| {
        metric_sum(
            &gw.metrics(),
            &format!("tollgate_redis_sync_total{{result=\"{result}\"}}"),
        )
    };
    let mut admitted: i64 = 0;
    let mut send = |n: usize| {
        for _ in 0..n {
            if gw.get("/x", &[("x-org-id", "slow")]).status == 200 {
                admitted += 1;
            }
        }
    };
    send(20);
    for _ in 0..3 {
        redis.signal("STOP");
        send(30);
        // until several rounds have timed out
        let errors = rounds("error");
        assert!(eventually(Duration::from_secs(10), || rounds("error") >= errors + 2.0));
        redis.signal("CONT");
        send(10);
        // until a round has got through again
        let ok = rounds("ok");
        assert!(eventually(Duration::from_secs(10), || rounds("ok") > ok));
    }
    let counted = || {
        redis
            .counter_keys("tg:{slow}:*")
            .first()
            .map_or(0, |k| redis.int(&["GET", k]))
    };
    assert!(
        eventually(Duration::from_secs(10), || counted() == admitted),
        "Redis holds {}, the gateway admitted {admitted}",
        counted()
    );
    // through two more rounds
    assert!(rounds_pass(&[&gw], 2.0));
    assert_eq!(counted(), admitted, "and stays there");
    assert!(rounds("error") >= 3.0, "rounds did time out");
}

#[test]
fn a_gateway_started_without_redis_says_so_and_applies_on_failure_from_the_first_request() {
    let up = Upstream::start("u");
    let nobody = common::free_port(); // nothing listens there
    let cfg = config(
        &up,
        &format!("url: redis://127.0.0.1:{nobody}\n  timeout: 100ms"),
        "[{ period: 1h, threshold: 100 }]",
        "  on_failure: deny",
    );
    let gw = Gateway::start(&cfg);
    assert_eq!(
        gw.get("/x", &[("x-org-id", "t")]).status,
        503,
        "on_failure: deny from the first request"
    );
    assert!(wait_redis_state(&gw, "disconnected"));
    let log = gw.log();
    assert_eq!(
        log.matches("redis: unreachable at start-up").count(),
        1,
        "the first failure is logged once:\n{log}"
    );
}

#[test]
fn on_failure_deny_answers_503_and_allow_lets_everything_through() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let url = format!("url: {}\n  timeout: 200ms", redis.url());
    let deny = Gateway::start(&config(
        &up,
        &url,
        "[{ period: 1h, threshold: 2 }]",
        "  on_failure: deny",
    ));
    let allow = Gateway::start(&config(
        &up,
        &url,
        "[{ period: 1h, threshold: 2 }]",
        "  on_failure: allow",
    ));
    wait_connected(&deny);
    wait_connected(&allow);
    redis.kill();
    for gw in [&deny, &allow] {
        assert!(wait_redis_state(gw, "disconnected"));
    }
    let r = deny.get("/x", &[("x-org-id", "t")]);
    assert_eq!(r.status, 503);
    let body = r.json();
    assert_eq!(
        body["type"], "about:blank",
        "no quota was exceeded: {}",
        r.body
    );
    assert_eq!(body["title"], "Service Unavailable");
    assert!(body["detail"]
        .as_str()
        .is_some_and(|d| d.contains("cannot be checked")));
    assert!(body.get("violated-policies").is_none(), "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        metric_sum(
            &deny.metrics(),
            "tollgate_ratelimit_decisions_total{decision=\"unavailable\""
        ),
        1.0,
        "the 503 is counted"
    );
    assert!(
        !r.body.to_lowercase().contains("redis"),
        "no Redis detail to clients: {}",
        r.body
    );
    for _ in 0..5 {
        assert_eq!(allow.get("/x", &[("x-org-id", "t")]).status, 200);
    }
}

#[test]
fn local_share_divides_the_threshold_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let url = format!("url: {}\n  timeout: 200ms", redis.url());
    let cfg = config(&up, &url, &hourly(10, 90), "");
    let (a, _b) = pair(&cfg);
    take_down(&mut redis, &a);
    // threshold 10 over the 2 instances last seen: 5 here
    let admitted = (0..10)
        .filter(|_| a.get("/x", &[("x-org-id", "t")]).status == 200)
        .count();
    assert_eq!(admitted, 5);
}

#[test]
fn a_redis_cluster_shares_counts_across_two_instances() {
    let cluster = Cluster::start(3, 0);
    let up = Upstream::start("u");
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("\"{}\"", n.url()))
        .collect();
    let cfg = config(
        &up,
        &format!("cluster: [{}]", seeds.join(", ")),
        &hourly(10, 90),
        "",
    );
    let (a, b) = pair(&cfg);
    let tenants = ["acme", "globex", "initech", "umbrella", "hooli", "tyrell"];
    // 3x the threshold, alternating: an instance whose lease is used refuses until its next
    // round, so how soon the fleet is full depends on how fast Redis answers on a busy
    // machine; what the test holds is where the fleet stops
    for t in tenants {
        let mut admitted = 0;
        for i in 0..30 {
            let gw = if i % 2 == 0 { &a } else { &b };
            if gw.get("/x", &[("x-org-id", t)]).status == 200 {
                admitted += 1;
            }
            // pacing: the requests are spread over rounds, as clients' would be
            std::thread::sleep(Duration::from_millis(30));
        }
        assert!(
            (10..=11).contains(&admitted),
            "{t}: admitted {admitted} of 10"
        );
    }
    // each tenant's counter is one key, in its hash-tag slot, holding the fleet's count
    assert!(
        eventually(Duration::from_secs(5), || {
            let k = cluster.keys("tg:{*");
            k.len() == tenants.len() && k.iter().all(|(_, _, v)| (10..=11).contains(v))
        }),
        "{:?}",
        cluster.keys("tg:{*")
    );
    let nodes_used: std::collections::HashSet<u16> = cluster
        .keys("tg:{*")
        .into_iter()
        .map(|(p, _, _)| p)
        .collect();
    assert!(
        nodes_used.len() >= 2,
        "counters spread over the masters: {nodes_used:?}"
    );
}

#[test]
fn on_failure_local_gives_each_instance_the_full_threshold() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let url = format!("url: {}\n  timeout: 200ms", redis.url());
    let cfg = config(&up, &url, &hourly(4, 90), "  on_failure: local");
    let (a, _b) = pair(&cfg);
    take_down(&mut redis, &a);
    let admitted = (0..8)
        .filter(|_| a.get("/x", &[("x-org-id", "t")]).status == 200)
        .count();
    assert_eq!(admitted, 4, "the full threshold, not a share");
}

/// A Redis that comes back without what it acknowledged (a primary killed before its replica
/// had the last writes, here a restart that lost them all): after the first round that it
/// answers, each instance reports its whole count of the window again, so Redis holds what the
/// fleet admitted, although the window is full and no request comes to make them report.
#[test]
fn after_an_outage_each_instance_reports_its_whole_count_again() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  timeout: 200ms", redis.url()),
        &hourly(6, 90),
        "",
    );
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    wait_connected(&a);
    wait_connected(&b);
    let statuses = |gw: &Gateway, n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| gw.get("/x", &[("x-org-id", "t")]).status)
            .collect()
    };
    let admitted = |gw: &Gateway, n: usize| statuses(gw, n).iter().filter(|&&s| s == 200).count();
    let first = [statuses(&a, 3), statuses(&b, 3)];
    assert!(
        first.iter().flatten().all(|&s| s == 200),
        "6 requests under a limit of 6: {first:?}; log a:\n{}\nlog b:\n{}\nmetrics b:\n{}",
        a.log(),
        b.log(),
        b.metrics()
    );
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 6));
    redis.restart(); // empty
    wait_connected(&a);
    wait_connected(&b);
    assert!(
        eventually(Duration::from_secs(5), || redis.held("tg:{t}:*") == 6),
        "Redis holds {} of the 6 the fleet admitted",
        redis.held("tg:{t}:*")
    );
    // and the window stays full
    assert_eq!(admitted(&a, 2) + admitted(&b, 2), 0);
}

#[test]
fn a_redis_restart_that_loses_every_key_costs_at_most_one_window() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  timeout: 200ms", redis.url()),
        &hourly(5, 90),
        "",
    );
    let gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let hit = || gw.get("/x", &[("x-org-id", "t")]).status;
    assert_eq!((0..8).filter(|_| hit() == 200).count(), 5);
    assert!(eventually(Duration::from_secs(5), || redis
        .counter_keys("tg:{t}:*")
        .first()
        .is_some_and(|k| redis.int(&["GET", k]) == 5)));
    redis.restart(); // empty
    wait_connected(&gw);
    // at most one more window's worth gets through, and the count starts again in Redis
    // (once the gateway has made a round with the emptied Redis besides the one that
    // reconnected)
    assert!(rounds_pass(&[&gw], 1.0));
    let extra = (0..10).filter(|_| hit() == 200).count();
    assert!(
        extra <= 5,
        "{extra} extra admissions after losing every key"
    );
    // and the gateway still admits: another tenant gets its whole limit, no more
    let other = (0..8)
        .filter(|_| gw.get("/x", &[("x-org-id", "u")]).status == 200)
        .count();
    assert_eq!(other, 5, "a fresh tenant after the restart");
    // what was admitted since reaches the new Redis, and the window's 5 as well: after the
    // outage the record reports its cumulative count again (`ledger::resync`)
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 5 + extra as i64));
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{u}:*")
        == 5));
}

#[test]
fn a_token_bucket_is_shared_by_the_fleet() {
    // 12 tokens, refilled 12 per hour: within the test, two gateways share 12 in all
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}", redis.url()),
        "[{ period: 1h, threshold: 12 }]",
        "",
    )
    .edit(
        "    pathPattern: /**\n",
        "    pathPattern: /**\n    algorithm: token_bucket\n",
    );
    let (a, b) = pair(&cfg);
    let mut admitted = 0;
    for i in 0..40 {
        let gw = if i % 2 == 0 { &a } else { &b };
        if gw.get("/x", &[("x-org-id", "tb")]).status == 200 {
            admitted += 1;
        }
        // pacing: the requests are spread over rounds, as clients' would be
        std::thread::sleep(Duration::from_millis(20));
    }
    // one bucket's worth (12) and at most one request per instance on credit; without the
    // fleet each gateway would admit 12
    assert!((11..=14).contains(&admitted), "admitted {admitted}");
    let bucket = "tg:{tb}:fleet:bucket";
    assert!(
        eventually(Duration::from_secs(5), || redis.int(&["PTTL", bucket]) > 0),
        "the bucket lives in Redis with a TTL"
    );
}

#[test]
fn readyz_waits_for_the_first_round() {
    // a "Redis" that accepts connections and never answers: the first round ends only at its
    // timeout, and the gateway is not ready before that
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = blackhole.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in blackhole.incoming().flatten() {
            held.push(c);
        }
    });
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: redis://127.0.0.1:{port}\n  timeout: 2s"),
        "[{ period: 1h, threshold: 100 }]",
        "",
    );
    let started = Instant::now();
    let gw = Gateway::start(&cfg); // returns once /readyz answers 200
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "ready after {:?}, before the first round timed out",
        started.elapsed()
    );
    assert!(wait_redis_state(&gw, "disconnected"));
}

#[test]
fn sigterm_sends_the_last_counts_to_redis() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  sync_interval: 60s", redis.url()),
        &hourly(1000, 90),
        "",
    )
    .edit("  threads: 1\n", "  threads: 1\n  grace_period: 1s\n");
    let mut gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let admitted = (0..12)
        .filter(|_| gw.get("/x", &[("x-org-id", "t")]).status == 200)
        .count();
    assert!(admitted > 0);
    // at once: the counts made since the last round exist only in this process
    let pid = gw.child.id() as i32;
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    assert!(eventually(Duration::from_secs(10), || gw
        .child
        .try_wait()
        .ok()
        .flatten()
        .is_some()));
    let total = redis.held("tg:{t}:*");
    assert_eq!(
        total, admitted as i64,
        "every admitted request reached Redis"
    );
}

/// `config` with `grace_period: 30s`, Redis at `redis` reporting every minute only (the counts
/// made since the first round exist only in the process), and a rule of about an hour with
/// 90 s of its window left, charging each answer its `x-usage-tokens` (1 without: the
/// upstream's `/usage/N` says N); the Redis key of tenant `t`'s count (contract section 6:
/// `<key_prefix>:{<partition>}:<rule id>:<window start ms>:<window end ms>`).
fn leaving_config(up: &Upstream, redis: &RedisServer) -> (String, String) {
    let p = period_with_room(3600, 90);
    let start = common::now_ms() / (p * 1000) * (p * 1000);
    let cfg = config(
        up,
        &format!("url: {}\n  sync_interval: 60s", redis.url()),
        &format!("[{{ period: {p}, threshold: 1000 }}]"),
        "",
    )
    .edit("  threads: 1\n", "  threads: 1\n  grace_period: 30s\n")
    .edit(
        "    tiers: [",
        "    cost: { response_header: x-usage-tokens, default: 1 }\n    tiers: [",
    );
    (cfg, format!("tg:{{t}}:fleet:{start}:{}", start + p * 1000))
}

fn sigterm(gw: &Gateway) {
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(gw.child.id() as i32, libc::SIGTERM);
    }
}

/// Until `gw` has exited (at most `within`): its status.
fn exit_of(gw: &mut Gateway, within: Duration) -> Option<std::process::ExitStatus> {
    let mut status = None;
    eventually(within, || {
        status = gw.child.try_wait().ok().flatten();
        status.is_some()
    });
    status
}

/// SIGTERM with nothing in flight: the process sends its last counts and exits with 0 at once,
/// not at the end of its 30 s grace period.
#[test]
fn sigterm_with_nothing_in_flight_exits_at_once_with_the_last_counts_sent() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let (cfg, key) = leaving_config(&up, &redis);
    let mut gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let admitted = (0..12)
        .filter(|_| gw.get("/x", &[("x-org-id", "t")]).status == 200)
        .count();
    assert_eq!(admitted, 12);
    let t = Instant::now();
    sigterm(&gw);
    let status = exit_of(&mut gw, Duration::from_secs(5));
    let took = t.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?} after {took:?}; log:\n{}",
        gw.log()
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(
        redis.int(&["GET", &key]),
        12,
        "every admitted request reached Redis: {:?}",
        redis.counter_keys("tg:*")
    );
}

/// SIGTERM with a request in flight: it is still served, and charged once answered (the last
/// round comes after it), then the process exits with 0, long before its 30 s grace period
/// ends.
#[test]
fn sigterm_serves_the_request_in_flight_then_exits() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let (cfg, key) = leaving_config(&up, &redis);
    let mut gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let addr = gw.addr;
    let slow = std::thread::spawn(move || {
        common::request(addr, "GET", "/delay/2000/usage/7", &[("x-org-id", "t")])
    });
    // until the request is in flight: the gateway has forwarded it to the upstream
    assert!(eventually(
        Duration::from_secs(5),
        || common::connections_to(up.addr) > 0
    ));
    for _ in 0..5 {
        assert_eq!(gw.get("/x", &[("x-org-id", "t")]).status, 200);
    }
    assert!(!slow.is_finished(), "the slow request is still in flight");
    let t = Instant::now();
    sigterm(&gw);
    let r = slow
        .join()
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(r.status, 200, "{}", r.body);
    // the answer came about 2 s after SIGTERM; the exit follows it at once
    let status = exit_of(&mut gw, Duration::from_secs(5));
    let took = t.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?} after {took:?}; log:\n{}",
        gw.log()
    );
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(
        redis.int(&["GET", &key]),
        5 + 7,
        "the request in flight was charged before the last round"
    );
}

/// An upgrade in place (SIGUSR2) with Redis: the new process's local counters start empty, but
/// it goes on from the fleet's count, the old process's last counts included.
#[test]
fn an_upgrade_in_place_goes_on_from_the_fleets_count() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  sync_interval: 200ms", redis.url()),
        &hourly(1000, 90),
        "",
    )
    .edit(
        "  threads: 1\n",
        "  threads: 1\n  grace_period: 1s\n  pid_file: {DIR}/tollgate.pid\n  upgrade_sock: {DIR}/upgrade.sock\n",
    );
    let mut gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let t = [("x-org-id", "t")];
    let old = 30;
    for _ in 0..old {
        assert_eq!(gw.get("/x", &t).status, 200);
    }
    let _new = gw.upgrade_in_place();
    // the new process's own requests, n, and what it tells: the old one's 30 are in it
    let mut n = 0;
    let knows_old = eventually(Duration::from_secs(10), || {
        n += 1;
        let r = gw.get("/x", &t);
        let left: u64 = r
            .header("x-ratelimit-remaining")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        r.status == 200 && left + n <= 1000 - old
    });
    assert!(knows_old, "after {n} requests; log:\n{}", gw.log());
}

#[test]
fn quota_headers_tell_what_this_instance_knows() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}", redis.url()),
        // room for the test, and still more than a minute left at its end
        &hourly(6, 150),
        "",
    );
    let (a, b) = pair(&cfg);
    let hit = |gw: &Gateway| {
        let r = gw.get("/x", &[("x-org-id", "t")]);
        let remaining: Option<u64> = r
            .header("x-ratelimit-remaining")
            .and_then(|v| v.parse().ok());
        (r.status, remaining)
    };
    // two requests back to back on one instance, then on the other, until the fleet has
    // admitted the threshold: `remaining` is what the fleet has left as the instance knows it
    // (never more than the threshold less what this instance admitted itself, and not its
    // lease alone: the first answer of the window says 5 of 6 left, not 0 or 1)
    let mut admitted = 0;
    let mut by = [0u64; 2];
    let mut seen = Vec::new();
    for _ in 0..30 {
        for (k, gw) in [&a, &b].into_iter().enumerate() {
            let first = hit(gw);
            let second = hit(gw);
            for (status, remaining) in [first, second] {
                if status == 200 {
                    admitted += 1;
                    by[k] += 1;
                    let r = remaining.expect("x-ratelimit-remaining");
                    assert!(r <= 6 - by[k], "remaining {r} after {by:?}: {seen:?}");
                    if admitted == 1 {
                        assert_eq!(r, 5, "the fleet's truth: {seen:?}");
                    }
                }
            }
            seen.push((first, second));
            // pacing: the instances take turns, with rounds in between
            std::thread::sleep(Duration::from_millis(60));
        }
        if admitted >= 6 {
            break;
        }
    }
    // docs/fleet.md "The bound", for a threshold under 100: one credit per instance past it (an
    // instance that has not heard of the other's admissions may take one on credit; seen
    // with the whole of tests/fleet.rs running on 2 cores)
    assert!((6..=7).contains(&admitted), "admitted {admitted}: {seen:?}");
    // the fleet has admitted the whole hour's threshold. An instance that has not heard so
    // yet may answer "retry after the next round" once (1 s); that denial asks for the round,
    // and from then on no room can appear before the hour ends, and Retry-After says so on
    // both instances (not 1 s again and again)
    for gw in [&a, &b] {
        let _ = gw.get("/x", &[("x-org-id", "t")]);
    }
    // until both have heard that the fleet admitted the threshold
    let heard = |gw: &Gateway| {
        common::request(gw.admin, "GET", "/api/tenants/t", &[])
            .expect("admin answers")
            .json()["rules"][0]["tiers"][0]["fleet"]["total"]
            .as_u64()
            .unwrap_or(0)
    };
    assert!(
        eventually(Duration::from_secs(5), || heard(&a) >= 6 && heard(&b) >= 6),
        "the fleet's total as each instance knows it: {} and {}",
        heard(&a),
        heard(&b)
    );
    for gw in [&a, &b] {
        let r = gw.get("/x", &[("x-org-id", "t")]);
        assert_eq!(r.status, 429);
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!(retry >= 60, "retry-after {retry}: {seen:?}");
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    }
}

#[test]
fn a_request_past_its_lease_waits_for_the_round_that_grants_it_room() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(&up, &format!("url: {}", redis.url()), &hourly(300, 90), "");
    let (a, _b) = pair(&cfg);
    // a fresh window and a burst from 16 clients: the cold credit goes at once, the requests
    // beyond it wait for the round that grants more, then go through: under the limit, none
    // is refused (a burst may happen to fit the leases; up to 3 tenants are tried until one
    // was held)
    for tenant in ["t1", "t2", "t3"] {
        let addr = a.addr;
        let clients: Vec<_> = (0..16)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..8)
                        .map(|_| {
                            common::request(addr, "GET", "/x", &[("x-org-id", tenant)])
                                .unwrap()
                                .status
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        let statuses: Vec<u16> = clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        assert_eq!(statuses, vec![200; 128], "held, then admitted: {}", a.log());
        let m = a.metrics();
        assert_eq!(
            metric_sum(&m, "tollgate_ratelimit_decisions_total{decision=\"denied\""),
            0.0,
            "{m}"
        );
        let held = metric_sum(&m, "tollgate_fleet_held_total");
        if held >= 1.0 {
            // each held request's wait is in the histogram, none past four hold limits
            // (4 x (2 x 100 ms + 100 ms) = 1.2 s)
            assert_eq!(
                metric_sum(&m, "tollgate_fleet_hold_seconds_count"),
                held,
                "{m}"
            );
            assert_eq!(
                metric_sum(&m, "tollgate_fleet_hold_seconds_bucket{le=\"2.5\"}"),
                held,
                "{m}"
            );
            return;
        }
    }
    panic!("no request of three bursts was held: {}", a.metrics());
}

/// Waiting marks (issue 43): an instance whose requests wait on a filling window, its own
/// part used up, marks the window beside the heartbeat (`tg:instances:waiting...`, a sorted
/// set of `<instance> <count key>`), where the others' heartbeats read it: a holder of an
/// unused part then reports at once rather than at half of it
/// (`tollgate_fleet_waits_heard_total`; the simulation's seed scenario shows what that
/// changes). Under the limit, none of the waiting requests is refused.
#[test]
fn a_holder_hears_that_requests_wait_on_its_window_and_reports_its_part_at_once() {
    let redis = RedisServer::start();
    holder_hears(&format!("url: {}", redis.url()), &[&redis], true);
}

/// The same as a user whose ACL refuses `PUBLISH`: the refusal is said once, the marks are no
/// longer published, and the holder, listening, still hears of them at its heartbeat (it passes
/// over published marks only).
#[test]
fn a_holder_hears_at_its_heartbeat_of_waits_that_could_not_be_published() {
    let redis = RedisServer::start_with(&[
        "--user", "default", "on", "nopass", "~*", "&*", "+@all", "--user", "gateway", "on", ">gw",
        "~tg:*", "&tg:*", "+@all", "-publish",
    ]);
    let url = format!("url: redis://gateway:gw@127.0.0.1:{}", redis.port);
    holder_hears(&url, &[&redis], false);
}

/// The same on a Redis Cluster: the marks live in the heartbeat's slot, on whichever node
/// holds it, and early rounds send them there.
#[test]
fn a_holder_hears_of_waits_through_a_redis_cluster() {
    let cluster = Cluster::start(3, 0);
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("\"{}\"", n.url()))
        .collect();
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    holder_hears(&format!("cluster: [{}]", seeds.join(", ")), &nodes, true);
}

/// Two gateways on `redis_line` (the `redis:` section's endpoint; `servers` hold the keys):
/// steady demand on both, then a burst on B past its part, which waits on A's and marks the
/// window; A hears of it and reports.
fn holder_hears(redis_line: &str, servers: &[&RedisServer], publish: bool) {
    let up = Upstream::start("u");
    let url = format!("{redis_line}\n  sync_interval: 250ms");
    // (each part is at most half of what nobody has admitted, 245 here: B's burst of 272 passes
    // its part whatever the machine's speed; with 128 of 300, a busy machine's parts, 150
    // each, took the whole burst: no wait, no mark, 12 runs of 28 beside two CPU hogs failed)
    let (threshold, burst_n) = (490u64, 8 * 34);
    let cfg = config(&up, &url, &hourly(threshold, 90), "");
    let (a, b) = pair(&cfg);
    let t = [("x-org-id", "t")];
    // steady demand on both (busy at every periodic round), each holding a part of the window
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let steady = |addr: std::net::SocketAddr, gap_ms: u64| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                statuses.push(common::request(addr, "GET", "/x", &t).map_or(0, |r| r.status));
                std::thread::sleep(Duration::from_millis(gap_ms));
            }
            statuses
        })
    };
    let steady = [steady(a.addr, 40), steady(b.addr, 100)];
    // both listen on the waits channel (on a cluster, each on a seed of its choosing)
    let listening = || {
        servers
            .iter()
            .filter_map(|r| common::redis_cmd(r.port, &["PUBSUB", "NUMSUB", "tg:waits"]).ok())
            .map(|v| match v {
                redis::Value::Array(a) => match a.get(1) {
                    Some(redis::Value::Int(n)) => *n,
                    _ => 0,
                },
                _ => 0,
            })
            .sum::<i64>()
    };
    assert!(
        eventually(Duration::from_secs(10), || listening() == 2),
        "{} listen on tg:waits",
        listening()
    );
    // (their steady demand is measured over whole sync intervals)
    assert!(rounds_pass(&[&a, &b], 5.0));
    // the members' counts and ceilings in the window's ledger (said when an assert fails)
    let ledger_state = || -> Vec<String> {
        let mut out = Vec::new();
        for r in servers {
            for k in r.keys("tg:*:fleet:*:fleet") {
                if let Ok(redis::Value::Array(f)) = common::redis_cmd(r.port, &["HGETALL", &k]) {
                    for pair in f.chunks(2) {
                        // (a member's record: six doubles, the count and the ceiling first)
                        if let [redis::Value::BulkString(name), redis::Value::BulkString(v)] = pair
                        {
                            let d: Vec<f64> = v
                                .chunks(8)
                                .map(|c| c.try_into().map_or(f64::NAN, f64::from_le_bytes))
                                .collect();
                            if let [used, ceiling, ..] = d[..] {
                                let name = String::from_utf8_lossy(name);
                                out.push(format!("{name}: used {used}, ceiling {ceiling}"));
                            }
                        }
                    }
                }
            }
        }
        out
    };
    let before = ledger_state();
    // then a burst on B, past its part: its requests wait on A's
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let addr = b.addr;
            std::thread::spawn(move || {
                (0..burst_n / 8)
                    .map(|_| common::request(addr, "GET", "/x", &t).map_or(0, |r| r.status))
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    // (the marks, as Redis keeps them while the burst waits: heartbeats drop them at 500 ms)
    let mut marks = std::collections::BTreeSet::new();
    let waiting = tollgate::services::fleet_sync::backend::waiting_key("tg:instances");
    while clients.iter().any(|c| !c.is_finished()) {
        // (a cluster node that does not hold the key answers MOVED: none there)
        for r in servers {
            if let Ok(now) = common::redis_cmd(r.port, &["ZRANGE", &waiting, "0", "-1"]) {
                marks.extend(common::strings(now));
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let burst: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap_or_default())
        .collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let steady: Vec<u16> = steady
        .into_iter()
        .flat_map(|s| s.join().unwrap_or_default())
        .collect();
    let admitted = steady.len() + burst.len();
    assert!(
        admitted as u64 * 10 < threshold * 9,
        "under 0.9 x the limit: {admitted}"
    );
    assert_eq!(burst, vec![200; burst_n], "B's burst: {}", b.log());
    assert!(steady.iter().all(|&s| s == 200), "A's: {steady:?}");
    // B's requests waited, and marked the window
    let held = metric_sum(&b.metrics(), "tollgate_fleet_held_total");
    assert!(
        held >= 1.0,
        "no request of B's burst waited: {}",
        b.metrics()
    );
    let keys: Vec<String> = servers
        .iter()
        .flat_map(|r| r.keys("tg:*:fleet:*"))
        .collect();
    let of_window = |m: &String| {
        m.split_once(' ')
            .is_some_and(|(_, k)| keys.iter().any(|f| f == &format!("{k}:fleet")))
    };
    assert!(
        marks.iter().any(of_window),
        "marks {marks:?}, keys {keys:?}; the ledger before the burst {before:?}, now {:?}",
        ledger_state()
    );
    // published on the channel, which A hears (its heartbeats pass over published marks)
    let published: u64 = servers
        .iter()
        .filter_map(|r| common::redis_cmd(r.port, &["INFO", "commandstats"]).ok())
        .map(|v| {
            let text = match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                _ => String::new(),
            };
            text.lines()
                .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
                .and_then(|c| c.split(',').next()?.parse().ok())
                .unwrap_or(0)
        })
        .sum();
    if publish {
        assert!(published >= 1, "no PUBLISH reached Redis");
    } else {
        // refused once, then not sent again
        let said = "the fleet's waiting marks could not be published";
        assert_eq!(b.log().matches(said).count(), 1, "{}", b.log());
    }
    // and A, holding its part, heard of them and reported it at once
    let heard = || metric_sum(&a.metrics(), "tollgate_fleet_waits_heard_total");
    assert!(
        eventually(Duration::from_secs(5), || heard() >= 1.0),
        "A did not hear; marks {marks:?}; the ledger before the burst {before:?}, now {:?}; {}",
        ledger_state(),
        a.metrics()
    );
}

/// The waits channel's listener, its connection killed by Redis (`CLIENT KILL TYPE pubsub`):
/// it listens again, on a new connection.
#[test]
fn a_listener_killed_by_redis_listens_again() {
    let (redis, _up, gw, first) = listening_gateway();
    assert!(common::redis_cmd(redis.port, &["CLIENT", "KILL", "TYPE", "pubsub"]).is_ok());
    listens_anew(&redis, &first, &gw);
}

/// A listener whose Redis goes silent without closing its connection (SIGSTOP) finds it by
/// its `PING`, gives that connection up, and listens on a new one once Redis answers again.
#[test]
fn a_listener_finds_a_silent_redis_by_its_ping_and_listens_again() {
    let (redis, _up, gw, first) = listening_gateway();
    redis.signal("STOP");
    let given_up = || gw.log().contains("closed (no answer to PING)");
    let found = eventually(Duration::from_secs(15), given_up);
    redis.signal("CONT");
    assert!(found, "{}", gw.log());
    listens_anew(&redis, &first, &gw);
}

/// A gateway on a redis-server of its own, listening on the waits channel: the server, the
/// upstream, the gateway, and the listening connection's id.
fn listening_gateway() -> (RedisServer, Upstream, Gateway, Vec<String>) {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(&up, &format!("url: {}", redis.url()), &hourly(300, 90), "");
    let gw = Gateway::start(&cfg);
    wait_connected(&gw);
    assert!(
        eventually(Duration::from_secs(10), || listeners(&redis).len() == 1),
        "{:?}",
        listeners(&redis)
    );
    let first = listeners(&redis);
    (redis, up, gw, first)
}

/// The ids of the connections listening on a channel.
fn listeners(redis: &RedisServer) -> Vec<String> {
    let text = match common::redis_cmd(redis.port, &["CLIENT", "LIST", "TYPE", "pubsub"]) {
        Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        _ => String::new(),
    };
    text.lines()
        .filter(|l| l.contains(" sub=1 "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// One connection listens again, not `first`.
fn listens_anew(redis: &RedisServer, first: &[String], gw: &Gateway) {
    let again = || {
        let now = listeners(redis);
        now.len() == 1 && now != first
    };
    assert!(
        eventually(Duration::from_secs(20), again),
        "{:?} after {first:?}; {}",
        listeners(redis),
        gw.log()
    );
}

#[test]
fn a_threshold_change_keeps_the_fleet_counting_on_the_same_redis_key() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    // (one period for every config of the test, with room for all of it)
    let period = period_with_room(3600, 90);
    let at = |threshold: u64| {
        config(
            &up,
            &format!("url: {}", redis.url()),
            &format!("[{{ period: {period}, threshold: {threshold} }}]"),
            "  sync_interval: 100ms",
        )
    };
    let (a, b) = pair(&at(10));
    let acme = [("x-org-id", "acme")];
    let mut admitted = 0;
    for i in 0..6 {
        let gw = if i % 2 == 0 { &a } else { &b };
        if gw.get("/x", &acme).status == 200 {
            admitted += 1;
        }
        // pacing: the requests are spread over rounds, as clients' would be
        std::thread::sleep(Duration::from_millis(30));
    }
    // (the key is written with the first count reported: a part of a filling window reports
    // at a periodic round once its requests stop, not at once)
    let key_of = || {
        let k = redis.counter_keys("tg:{acme}:*");
        (k.len() == 1).then(|| k[0].clone())
    };
    assert!(
        eventually(Duration::from_secs(5), || key_of()
            .is_some_and(|k| redis.int(&["GET", &k]) == admitted)),
        "one counter key holding {admitted}: {:?}",
        redis.counter_keys("tg:{acme}:*")
    );
    let key = key_of().unwrap_or_default();
    // lowered below what the fleet has admitted: both instances deny at once
    for gw in [&a, &b] {
        assert!(gw.reload(&at(admitted as u64 - 2)), "{}", gw.log());
    }
    for gw in [&a, &b] {
        let r = gw.get("/x", &acme);
        assert_eq!(r.status, 429, "no amnesty after a lowered limit");
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    }
    // raised: the fleet goes on from the same key, up to the new threshold
    for gw in [&a, &b] {
        assert!(gw.reload(&at(admitted as u64 + 4)));
    }
    let mut more = 0;
    for i in 0..30 {
        let gw = if i % 2 == 0 { &a } else { &b };
        if gw.get("/x", &acme).status == 200 {
            more += 1;
        }
        // pacing, as above
        std::thread::sleep(Duration::from_millis(30));
    }
    // 4 more, and at most one over per instance (the accuracy bound under 100)
    assert!(
        (4..=6).contains(&more),
        "admitted {more} more after raising by 4"
    );
    assert_eq!(key_of(), Some(key.clone()), "the same Redis key");
    assert!(eventually(Duration::from_secs(5), || redis
        .int(&["GET", &key])
        == admitted + more));
}

/// Three gateways on one Redis, `{ period: P, threshold: 300 }` with `algorithm` (P from 10 s
/// up, with room in its window for the start-up and the bursts): 240 requests (0.8 of the
/// limit) in 4 bursts of 60 concurrent requests, 1.5 s apart, each burst on one instance.
/// Returns the statuses.
fn bursts_at_0_8(algorithm: &str) -> Vec<u16> {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let tiers = format!(
        "[{{ period: {}, threshold: 300 }}]",
        period_with_room(10, 14)
    );
    let cfg = config(&up, &format!("url: {}", redis.url()), &tiers, "").edit(
        &format!("    tiers: {tiers}\n"),
        &format!("    tiers: {tiers}\n    algorithm: {algorithm}\n"),
    );
    assert!(
        cfg.contains("algorithm: "),
        "the config names the algorithm"
    );
    let gws: Vec<Gateway> = (0..3).map(|_| Gateway::start(&cfg)).collect();
    gws.iter().for_each(wait_connected);
    assert!(eventually(Duration::from_secs(5), || gws.iter().all(
        |g| metric_sum(&g.metrics(), "tollgate_redis_live_instances") == 3.0
    )));
    let mut statuses = Vec::new();
    for burst in 0..4 {
        let addr = gws[burst % 3].addr;
        let clients: Vec<_> = (0..60)
            .map(|_| {
                std::thread::spawn(move || {
                    common::request(addr, "GET", "/x", &[("x-org-id", "acme")])
                        .map_or(0, |r| r.status)
                })
            })
            .collect();
        statuses.extend(clients.into_iter().map(|c| c.join().unwrap_or(0)));
        // pacing: the bursts are 1.5 s apart (rounds happen between them)
        std::thread::sleep(Duration::from_millis(1500));
    }
    statuses
}

#[test]
fn bursts_at_0_8_of_the_limit_on_three_gateways_are_never_refused() {
    for algorithm in ["fixed_window", "token_bucket"] {
        let statuses = bursts_at_0_8(algorithm);
        let refused = statuses.iter().filter(|&&s| s != 200).count();
        assert_eq!(refused, 0, "{algorithm}: {refused} of 240 not admitted");
    }
}

/// A tenant at a tiny share of its limit on two gateways, while `outage` happens to Redis:
/// every request is answered 200 (no 429, no 5xx), before, during and after.
fn far_under_the_limit_through(
    outage: impl FnOnce(&mut RedisServer),
    back: impl FnOnce(&mut RedisServer),
) {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  timeout: 100ms", redis.url()),
        &hourly(1_000_000, 90),
        "",
    );
    let (a, b) = pair(&cfg);
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // 4 clients, each alternating between the instances as fast as answers come
    let clients: Vec<_> = (0..4)
        .map(|k| {
            let (addrs, statuses, stop) = ([a.addr, b.addr], statuses.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = k;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let s = common::request(addrs[i % 2], "GET", "/x", &[("x-org-id", "t")])
                        .map_or(0, |r| r.status);
                    statuses.lock().unwrap().push(s);
                    i += 1;
                }
            })
        })
        .collect();
    let served = |n: usize| {
        let before = statuses.lock().unwrap().len();
        assert!(eventually(Duration::from_secs(10), || statuses
            .lock()
            .unwrap()
            .len()
            >= before + n));
    };
    served(200);
    outage(&mut redis);
    assert!(wait_redis_state(&a, "disconnected") || wait_redis_state(&b, "disconnected"));
    served(300);
    back(&mut redis);
    wait_connected(&a);
    wait_connected(&b);
    served(200);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    clients.into_iter().for_each(|c| c.join().unwrap());
    let statuses = statuses.lock().unwrap();
    let bad: Vec<u16> = statuses.iter().copied().filter(|&s| s != 200).collect();
    assert!(
        bad.is_empty(),
        "{} of {} not 200: {bad:?}",
        bad.len(),
        statuses.len()
    );
}

#[test]
fn a_tenant_far_under_its_limit_sees_only_200_while_redis_is_stopped_and_resumed() {
    far_under_the_limit_through(|r| r.signal("STOP"), |r| r.signal("CONT"));
}

#[test]
fn a_tenant_far_under_its_limit_sees_only_200_while_redis_is_killed_and_restarted() {
    far_under_the_limit_through(|r| r.kill(), |r| r.restart());
}

/// `maxmemory-policy noeviction` (docs/operations.md): a full Redis refuses the gateway's
/// writes (OOM error replies), which is Redis failing: `on_failure` applies (here `local`: every request of a
/// tenant far under its limit is answered 200), the reason is logged, and once Redis has room
/// again the counts made meanwhile arrive, each once (a refused write was not applied).
#[test]
fn a_full_redis_with_noeviction_is_redis_failing_and_its_counts_arrive_once_it_has_room() {
    let redis =
        RedisServer::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}\n  on_failure: local", redis.url()),
        &hourly(1000, 90),
        "",
    );
    let gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let tenants: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    let in_redis = || -> i64 {
        tenants
            .iter()
            .flat_map(|t| redis.counter_keys(&format!("tg:{{{t}}}:*")))
            .map(|k| redis.int(&["GET", &k]))
            .sum()
    };
    // each tenant's first request reaches Redis: its key exists
    for t in &tenants {
        assert_eq!(gw.get("/x", &[("x-org-id", t)]).status, 200);
    }
    let mut sent = tenants.len() as i64;
    assert!(eventually(Duration::from_secs(10), || in_redis() == sent));
    // Redis is full: past its maxmemory (as if others' data had filled it), it refuses writes
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    for round in 0..2 {
        for t in &tenants {
            assert_eq!(
                gw.get("/x", &[("x-org-id", t)]).status,
                200,
                "round {round}"
            );
            sent += 1;
        }
        if round == 0 {
            // Redis answers, refusing the writes: an error state naming the kind
            assert!(
                wait_redis_state(&gw, "error"),
                "a full Redis is Redis failing; log:\n{}",
                gw.log()
            );
            let ready = common::request(gw.admin, "GET", "/readyz", &[])
                .expect("readyz")
                .json();
            assert_eq!(ready["redis_error"]["kind"], "oom", "{ready}");
        }
    }
    assert!(
        gw.log().contains("OOM"),
        "the reason is logged:\n{}",
        gw.log()
    );
    // room again: the gateway reconnects and every count made meanwhile arrives, once (a
    // write Redis refused was not applied: it is sent again, not taken as counted)
    redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    wait_connected(&gw);
    assert!(
        eventually(Duration::from_secs(10), || in_redis() == sent),
        "Redis holds {} of {sent}; log:\n{}",
        in_redis(),
        gw.log()
    );
}

/// A round that mixes plain increments (a rule far from its limit) and ledger scripts (a small
/// one) on a Redis that has forgotten its scripts (`SCRIPT FLUSH`, as after a restart or on a
/// promoted replica): the scripts are loaded and only what did not run is sent again, so the
/// plain increments are not counted twice.
#[test]
fn a_redis_without_its_scripts_counts_no_plain_increment_twice() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!("url: {}", redis.url()),
        &hourly(1_000_000, 90),
        "",
    )
    .replace(
        "limits:\n",
        &format!(
            "limits:\n  - id: small\n    pathPattern: /**\n    tiers: {}\n",
            hourly(999, 90)
        ),
    );
    let gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let total = |rule: &str| redis.held(&format!("tg:{{t}}:{rule}:*"));
    let mut admitted = 0;
    for round in 0..5 {
        admitted += (0..6)
            .filter(|_| gw.get("/x", &[("x-org-id", "t")]).status == 200)
            .count() as i64;
        assert!(
            eventually(Duration::from_secs(5), || total("fleet") == admitted
                && total("small") == admitted),
            "round {round}: Redis holds {} (fleet) and {} (small) of {admitted}",
            total("fleet"),
            total("small")
        );
        let _ = redis.cmd(&["SCRIPT", "FLUSH"]);
    }
}

/// Behind one endpoint with plain increments (the default), a Redis restarted empty holds none
/// of the instance's round marks: the gateway sends no round again from them (it says so), and
/// the record's next increment, showing a total below what it had reported, brings its whole
/// count back, once (`backend::journal`, docs/fleet.md).
#[test]
fn after_a_restart_that_lost_every_mark_a_count_comes_back_once() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let gw = far_from_the_limit(&redis, &up, "");
    let send = |n: usize| admitted_of_t(&gw, n);
    assert_eq!(send(7), 7);
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 7));
    // plain increments: no ledger; their rounds' marks
    assert!(!redis.keys("tg:{t}:*").iter().any(|k| k.ends_with(":fleet")));
    assert_eq!(
        redis.keys("tg:rounds:*").len(),
        1,
        "{:?}",
        redis.keys("tg:*")
    );
    redis.restart(); // empty
    wait_connected(&gw);
    assert!(
        eventually(Duration::from_secs(5), || gw
            .log()
            .contains("holds none of this instance's round marks")),
        "{}",
        gw.log()
    );
    assert_eq!(send(1), 1);
    assert!(
        eventually(Duration::from_secs(5), || redis.held("tg:{t}:*") == 8),
        "Redis holds {} of the 8 admitted; log:\n{}",
        redis.held("tg:{t}:*"),
        gw.log()
    );
    assert!(rounds_pass(&[&gw], 3.0));
    assert_eq!(redis.held("tg:{t}:*"), 8, "once");
}

/// A server that lost rounds it answered, with no round failing (a replica promoted under a
/// connection that came back by itself): each round reads back the last answered round's
/// mark, and when it is gone the next round checks and sends again what is missing. Here
/// the rollback is made by hand: the marks of the last requests' rounds removed, and the count
/// set back to what it was before them.
#[test]
fn a_server_that_lost_answered_rounds_gets_them_again_without_a_failed_round() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let gw = far_from_the_limit(&redis, &up, "\n  sync_interval: 200ms");
    let send = |n: usize| admitted_of_t(&gw, n);
    let marks = || {
        let key = redis.keys("tg:rounds:*").pop().unwrap_or_default();
        common::strings(redis.cmd(&["ZRANGE", &key, "0", "-1"]))
    };
    assert_eq!(send(2), 2);
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 2));
    let before = marks();
    assert!(!before.is_empty());
    assert_eq!(send(3), 3);
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 5
        && marks().len() > before.len()));
    let key = redis.keys("tg:rounds:*").pop().unwrap_or_default();
    for m in marks().iter().filter(|m| !before.contains(m)) {
        redis.cmd(&["ZREM", &key, m]);
    }
    let counter = redis.counter_keys("tg:{t}:*").pop().unwrap_or_default();
    redis.cmd(&["SET", &counter, "2", "KEEPTTL"]);
    let errors = metric_sum(&gw.metrics(), "tollgate_redis_sync_total{result=\"error\"}");
    assert!(
        eventually(Duration::from_secs(5), || redis.held("tg:{t}:*") == 5),
        "Redis holds {} of the 5 admitted; log:\n{}",
        redis.held("tg:{t}:*"),
        gw.log()
    );
    assert!(rounds_pass(&[&gw], 3.0));
    assert_eq!(redis.held("tg:{t}:*"), 5, "once");
    assert_eq!(
        metric_sum(&gw.metrics(), "tollgate_redis_sync_total{result=\"error\"}"),
        errors,
        "no round failed"
    );
}

/// A round of plain increments that Redis never ran (its connection closed while Redis held
/// it, unread) is sent again; one that Redis ran after the gateway gave up on it (a timeout) is
/// not sent twice.
#[test]
fn a_round_without_an_answer_is_sent_again_only_if_redis_lacks_it() {
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let gw = far_from_the_limit(&redis, &up, "");
    let errors =
        |gw: &Gateway| metric_sum(&gw.metrics(), "tollgate_redis_sync_total{result=\"error\"}");
    let send = |n: usize| admitted_of_t(&gw, n);
    assert_eq!(send(3), 3);
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 3));
    // 1. Redis holds writes (CLIENT PAUSE ... WRITE): the round waits past its timeout; then
    //    the gateway's connection is closed with the round unread, and Redis resumes
    let before = errors(&gw);
    redis.cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]);
    assert_eq!(send(4), 4);
    assert!(
        eventually(Duration::from_secs(10), || errors(&gw) > before),
        "a round timed out"
    );
    redis.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    redis.cmd(&["CLIENT", "UNPAUSE"]);
    assert!(
        eventually(Duration::from_secs(10), || redis.held("tg:{t}:*") == 7),
        "Redis holds {} of the 7 admitted; log:\n{}",
        redis.held("tg:{t}:*"),
        gw.log()
    );
    // (logged once the repair's answer is in: Redis may hold the count a moment before)
    assert!(
        eventually(Duration::from_secs(5), || {
            gw.log().contains(
            "INFO  tollgate::services::fleet_sync::backend::single] redis: 1 count(s) of rounds the server did not hold sent again"
        )
        }),
        "{}",
        gw.log()
    );
    // 2. Redis holds writes, the round times out, and Redis runs it when it resumes
    let before = errors(&gw);
    redis.cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]);
    assert_eq!(send(5), 5);
    assert!(
        eventually(Duration::from_secs(10), || errors(&gw) > before),
        "a round timed out"
    );
    redis.cmd(&["CLIENT", "UNPAUSE"]);
    assert!(eventually(Duration::from_secs(10), || redis
        .held("tg:{t}:*")
        >= 12));
    assert!(rounds_pass(&[&gw], 3.0));
    assert_eq!(
        redis.held("tg:{t}:*"),
        12,
        "each admitted once; log:\n{}",
        gw.log()
    );
}

/// Behind one endpoint, `plain_increments: false` makes every record lease, as behind a cluster
/// or Sentinel: after an outage that lost what Redis had (here a restart), even a rule far
/// from its limit has its whole count again, with no request since (the ledger script's
/// cumulative report; plain increments, above, need their record's next increment).
#[test]
fn without_plain_increments_a_count_far_from_the_limit_comes_back_after_an_outage() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = config(
        &up,
        &format!(
            "url: {}\n  timeout: 200ms\n  plain_increments: false",
            redis.url()
        ),
        &hourly(1_000_000, 90),
        "",
    );
    let gw = Gateway::start(&cfg);
    wait_connected(&gw);
    let admitted = (0..7)
        .filter(|_| gw.get("/x", &[("x-org-id", "t")]).status == 200)
        .count() as i64;
    assert_eq!(admitted, 7);
    assert!(eventually(Duration::from_secs(5), || redis
        .held("tg:{t}:*")
        == 7));
    // leased: the ledger script reported it (a plain increment writes no ledger)
    assert!(eventually(Duration::from_secs(5), || redis
        .keys("tg:{t}:*")
        .iter()
        .any(|k| k.ends_with(":fleet"))));
    redis.restart(); // empty
    wait_connected(&gw);
    assert!(
        eventually(Duration::from_secs(5), || redis.held("tg:{t}:*") == 7),
        "Redis holds {} of the 7 admitted",
        redis.held("tg:{t}:*")
    );
}

/// A TCP relay to `target` whose answers each come `delay` late: a Redis a few round trips'
/// worth of milliseconds away, for rounds that take long enough to land in.
fn slow_link(target: u16, delay: Duration) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                continue;
            };
            let pump = |mut from: std::net::TcpStream, mut to: std::net::TcpStream, late| {
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        if late {
                            std::thread::sleep(delay);
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                })
            };
            pump(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                false,
            );
            pump(server, client, true);
        }
    });
    port
}

/// Every command `redis` runs from now on, as `MONITOR` prints it (`<unix time> [db addr]
/// "COMMAND" "arg" ...`), collected by a thread of its own.
fn monitor(redis: &RedisServer) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::{BufRead, Write};
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    s.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = std::io::BufReader::new(s);
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert_eq!(ok.trim(), "+OK");
    let into = std::sync::Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            into.lock().unwrap().push(line);
        }
    });
    lines
}

/// A quiet tenant's first request in its window waits on nothing but Redis: it asks at once,
/// and a periodic round in parts (`TOLLGATE_ROUND_PART_UPDATES`: 10 updates a part here; 1,024
/// in a gateway, where 100,000 tenants made 16 parts and 280 ms) lets a round at once run
/// between two of its parts rather than after its last. Each probe's ask (its script call) is
/// in Redis with at most one part's plain increments before it, after the probe was held (and
/// so it is answered within a few round trips, not the periodic round's ten). Without it, a
/// probe held while the round's first parts were in flight saw the rest go first.
#[test]
fn a_quiet_tenants_first_ask_goes_between_the_parts_of_a_periodic_round() {
    let redis = RedisServer::start();
    let link = slow_link(redis.port, Duration::from_millis(20));
    let up = Upstream::start("u");
    let hour = period_with_room(3600, 90);
    let limits = format!(
        "  - id: busy\n    pathPattern: /busy/**\n    tiers: [{{ period: {hour}, threshold: 1000000 }}]
  - id: probe\n    pathPattern: /probe/**\n    tiers: [{{ period: {hour}, threshold: 10 }}]\n"
    );
    let redis_lines =
        format!("url: redis://127.0.0.1:{link}\n  timeout: 2s\n  sync_interval: 500ms");
    let cfg = config_of(&up, 2, &limits, &redis_lines, "");
    let gw = Gateway::start_with_env(&cfg, &[("TOLLGATE_ROUND_PART_UPDATES", "10")]);
    wait_connected(&gw);
    let commands = monitor(&redis);
    // 100 busy tenants far from their limit, each with a count to report at every periodic
    // round: 10 parts of plain increments
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (stop, addr) = (std::sync::Arc::clone(&stop), gw.addr);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in 0..100 {
                    let tenant = format!("busy-{i}");
                    let r = common::request(addr, "GET", "/busy/x", &[("x-org-id", &tenant)]);
                    assert_eq!(r.unwrap().status, 200);
                }
            }
        })
    };
    let increments = |lines: &[String]| {
        lines
            .iter()
            .filter(|l| l.contains("\"INCRBY\" \"tg:{busy-"))
            .count()
    };
    // until two periodic rounds have reported them
    assert!(eventually(Duration::from_secs(10), || increments(
        &commands.lock().unwrap()
    ) >= 200));
    for k in 0..20 {
        let held = || metric_sum(&gw.metrics(), "tollgate_fleet_held_total");
        let (before, addr) = (held(), gw.addr);
        let probe = std::thread::spawn(move || {
            let tenant = format!("probe-{k}");
            common::request(addr, "GET", "/probe/x", &[("x-org-id", &tenant)]).map(|r| r.status)
        });
        // once the gateway holds it (or has answered it), a mark in Redis's own order: what
        // runs after it ran after the probe was held, however late the gateway read it
        assert!(eventually(Duration::from_secs(5), || probe.is_finished()
            || held() > before));
        common::redis_cmd(redis.port, &["ECHO", &format!("held-{k}")]).unwrap();
        assert_eq!(probe.join().unwrap().unwrap(), 200, "{}", gw.log());
        // probes spread over the rounds (a pace, not a wait for something)
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    let lines = commands.lock().unwrap().clone();
    let line_of = |what: &dyn Fn(&str) -> bool| lines.iter().position(|l| what(l));
    let mut before = Vec::new();
    for k in 0..20 {
        let (key, mark) = (
            format!("tg:{{probe-{k}}}"),
            format!("\"ECHO\" \"held-{k}\""),
        );
        let ask = line_of(&|l| l.contains("\"EVALSHA\"") && l.contains(&key))
            .unwrap_or_else(|| panic!("probe-{k} never asked: {}", gw.log()));
        let held = line_of(&|l| l.contains(&mark)).expect("the mark");
        before.push(increments(&lines[held.min(ask)..ask]));
    }
    assert!(
        before.iter().all(|&n| n <= 10),
        "plain increments run between each probe and its ask: {before:?}"
    );
}
