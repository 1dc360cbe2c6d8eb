//! `GET /api/usage` (issue 45 item 3): what each tenant used of one tier of one rule in its
//! previous and current window, for billing: fleet-wide from a real redis-server (two real
//! gateways counting, JSON and CSV, plans and thresholds, a sliding window's previous window,
//! a fixed window's once gone told as unknown), paged through 100,000 tenants, across a real
//! Redis Cluster's primaries, and from one instance's counters without Redis.

mod common;
use common::{
    eventually, metric_sum, now_ms, period_with_room, request, Cluster, Gateway, RedisServer,
    Upstream,
};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The cases take turns (gateways and Redis servers each, on a 2-core machine).
static TURN: Mutex<()> = Mutex::new(());

const TOKEN: &str = "0123456789abcdef0123";

/// A rule `api` per tenant, a sliding window with an hour-long tier `p` (premium: its own); a
/// fixed window `fixed` of `p`; one per address.
fn config(up: &Upstream, redis: Option<&str>, p: u64) -> String {
    let mut cfg = common::one_route_config(up.addr, 1, &format!("  admin_token: {TOKEN}"))
        + &format!(
            r#"tenant:
  from:
    - header: x-org-id
      trusted: true
plans:
  premium: [acme]
limits:
  - id: api
    pathPattern: /api/**
    algorithm: sliding_window
    tiers: [{{ period: 1s, threshold: 1000 }}, {{ period: {p}, threshold: 100 }}]
    plans:
      premium: [{{ period: {p}, threshold: 500 }}]
  - id: fixed
    pathPattern: /fixed/**
    tiers: [{{ period: {p}, threshold: 100 }}]
  - id: by-ip
    per: ip
    pathPattern: /ip/**
    tiers: [{{ period: {p}, threshold: 5 }}]
"#
        );
    if let Some(endpoint) = redis {
        cfg += &format!(
            "redis:\n  {endpoint}\n  key_prefix: tg\n  sync_interval: 200ms\n  timeout: 1s\n"
        );
    }
    cfg
}

fn admin(gw: &Gateway, path: &str) -> common::Response {
    let auth = format!("Bearer {TOKEN}");
    request(gw.admin, "GET", path, &[("authorization", &auth)]).expect("the admin listener answers")
}

fn hit(gw: &Gateway, tenant: &str, n: usize) {
    for _ in 0..n {
        let r = gw.get("/api/x", &[("x-org-id", tenant)]);
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

/// Every page of the export from `first` on: the rows by tenant (a repeated tenant must repeat
/// its counts: nothing changes meanwhile), and the number of pages.
fn all_pages(gw: &Gateway, first: &str) -> (HashMap<String, (u64, u64)>, usize) {
    let mut rows: HashMap<String, (u64, u64)> = HashMap::new();
    let mut path = first.to_string();
    let mut pages = 0;
    loop {
        let r = admin(gw, &path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let v = r.json();
        pages += 1;
        for t in v["tenants"].as_array().expect("tenants") {
            let tenant = t["tenant"].as_str().expect("tenant").to_string();
            let counts = (
                t["previous"].as_u64().expect("n"),
                t["current"].as_u64().expect("n"),
            );
            if let Some(before) = rows.insert(tenant.clone(), counts) {
                assert_eq!(before, counts, "{tenant} given twice with other counts");
            }
        }
        // the Link header and `next` agree
        match v["next"].as_str() {
            Some(next) => {
                let link = r
                    .header("link")
                    .expect("a Link to the next page")
                    .to_string();
                assert!(link.ends_with("; rel=\"next\""), "{link}");
                assert!(link.contains(&format!("cursor={next}")), "{link} {next}");
                path = link[1..link.find('>').expect(">")].to_string();
            }
            None => {
                assert!(r.header("link").is_none());
                return (rows, pages);
            }
        }
        assert!(pages < 1000, "the export never ends");
    }
}

/// The rows of an answer, by tenant: (tenant, plan, threshold, previous, current).
fn rows_of(v: &Value) -> Vec<(String, Value, Value, u64, u64)> {
    let mut rows: Vec<(String, Value, Value, u64, u64)> = v["tenants"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|t| {
                    let n = |k: &str| t[k].as_u64().unwrap_or(u64::MAX);
                    let tenant = t["tenant"].as_str().unwrap_or_default().to_string();
                    (
                        tenant,
                        t["plan"].clone(),
                        t["threshold"].clone(),
                        n("previous"),
                        n("current"),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by(|x, y| x.0.cmp(&y.0));
    rows
}

#[test]
fn usage_tells_each_tenant_fleet_wide_in_json_and_csv() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let p = period_with_room(3600, 120);
    let cfg = config(&up, Some(&format!("url: {}", redis.url())), p);
    let (a, b) = (Gateway::start(&cfg), Gateway::start(&cfg));
    hit(&a, "acme", 5);
    hit(&b, "acme", 3);
    hit(&b, "globex", 2);
    // last hour's counts, as the fleet left them in Redis
    let now = now_ms();
    let start = now / (p * 1000) * (p * 1000);
    let prev = |t: &str| format!("tg:{{{t}}}:api:{}:{start}", start - p * 1000);
    redis.cmd(&["SET", &prev("acme"), "40", "EX", "600"]);
    redis.cmd(&["SET", &prev("initech"), "7", "EX", "600"]);
    let path = format!("/api/usage?rule=api&period={p}");
    let plan = |s: &str| Value::String(s.into());
    let want = vec![
        ("acme".to_string(), plan("premium"), Value::from(500), 40, 8),
        ("globex".into(), Value::Null, 100.into(), 0, 2),
        ("initech".into(), Value::Null, 100.into(), 7, 0),
    ];
    let mut last = Value::Null;
    let told = eventually(Duration::from_secs(10), || {
        last = admin(&a, &path).json();
        rows_of(&last) == want
    });
    assert!(told, "{last:#}");
    assert_eq!(last["source"], "redis");
    assert_eq!(last["rule"], "api");
    assert_eq!(last["unit"], "requests");
    assert_eq!(last["current"]["start_ms"], start);
    assert_eq!(last["current"]["end_ms"], start + p * 1000);
    assert_eq!(last["previous"]["start_ms"], start - p * 1000);
    assert!(
        last["current"]["start"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z')),
        "{last:#}"
    );
    assert_eq!(last["next"], Value::Null);
    // the other instance tells the same, and CSV says it line by line
    let csv = admin(&b, &format!("{path}&format=csv"));
    assert_eq!(csv.status, 200);
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    let mut lines: Vec<&str> = csv.body.lines().collect();
    assert_eq!(
        lines.remove(0),
        "tenant,plan,threshold,unit,previous_window,previous,current_window,current"
    );
    lines.sort_unstable();
    assert_eq!(lines.len(), 3, "{}", csv.body);
    assert!(
        lines[0].starts_with("acme,premium,500,requests,"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].ends_with(",40,") || lines[0].contains(",40,"),
        "{}",
        lines[0]
    );
    assert!(lines[0].ends_with(",8"), "{}", lines[0]);
    assert!(
        lines[1].starts_with("globex,,100,requests,") && lines[1].ends_with(",2"),
        "{}",
        lines[1]
    );
    // a fixed window's previous counts are gone 10 s after its end (contract section 6):
    // told as unknown, not as 0
    for _ in 0..2 {
        assert_eq!(a.get("/fixed/x", &[("x-org-id", "acme")]).status, 200);
    }
    let fixed = format!("/api/usage?rule=fixed&period={p}");
    let mut v = Value::Null;
    assert!(
        eventually(Duration::from_secs(10), || {
            v = admin(&b, &fixed).json();
            v["tenants"][0]["current"] == 2
        }),
        "{v:#}"
    );
    let kept = now_ms() < start + 10_000;
    assert_eq!(v["previous"]["kept"], kept, "{v:#}");
    if !kept {
        assert_eq!(v["tenants"][0]["previous"], Value::Null, "{v:#}");
        let csv = admin(&b, &format!("{fixed}&format=csv")).body;
        assert!(csv.contains(",requests,") && csv.contains("Z,,"), "{csv}");
    }
    // the 1s tier's keys are not kept beyond their window and grace
    for k in redis.keys("tg:{acme}:api:*") {
        let parts: Vec<&str> = k.split(':').collect();
        if parts.len() == 5
            && parts[4].parse::<u64>().ok() == parts[3].parse::<u64>().ok().map(|s| s + 1000)
        {
            assert!(redis.int(&["PTTL", &k]) <= 61_000, "{k}");
        }
    }
}

#[test]
fn usage_mistakes_get_a_problem_that_names_them() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up, None, 3600));
    for (path, status, says) in [
        ("/api/usage", 400, "rule=<id> is required"),
        ("/api/usage?rule=nope", 404, r#"no rule \"nope\""#),
        (
            "/api/usage?rule=by-ip",
            422,
            "counts per ip, not per tenant",
        ),
        (
            "/api/usage?rule=api&period=2h",
            400,
            "the rule's tiers are 1s, 1h",
        ),
        ("/api/usage?rule=api&limit=0", 400, "expected 1 to 10000"),
        (
            "/api/usage?rule=api&cursor=zz",
            400,
            "not one this endpoint gave",
        ),
    ] {
        let r = admin(&gw, path);
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{path}"
        );
        assert!(r.body.contains(says), "{path}: {}", r.body);
    }
    // the admin token guards it as every /api/ endpoint
    let r = request(gw.admin, "GET", "/api/usage?rule=api", &[]).expect("answer");
    assert_eq!(r.status, 401);
}

#[test]
fn usage_without_redis_tells_this_instances_counts_a_page_at_a_time() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let up = Upstream::start("u");
    let p = period_with_room(3600, 60);
    let gw = Gateway::start(&config(&up, None, p));
    hit(&gw, "acme", 3);
    hit(&gw, "globex", 1);
    hit(&gw, "a,\"quoted\" one", 2);
    let first = admin(&gw, "/api/usage?rule=api&limit=2").json();
    assert_eq!(first["source"], "this instance");
    assert_eq!(
        first["tenants"].as_array().map(Vec::len),
        Some(2),
        "{first:#}"
    );
    let (rows, pages) = all_pages(&gw, "/api/usage?rule=api&limit=2");
    assert_eq!(pages, 2);
    let want: HashMap<String, (u64, u64)> = [("acme", 3), ("globex", 1), ("a,\"quoted\" one", 2)]
        .into_iter()
        .map(|(t, n)| (t.to_string(), (0, n)))
        .collect();
    assert_eq!(rows, want);
    let csv = admin(&gw, "/api/usage?rule=api&format=csv").body;
    assert!(
        csv.contains("\r\n\"a,\"\"quoted\"\" one\",,100,requests,"),
        "{csv}"
    );
}

/// Count keys of the rule `api` for `n` tenants in the current window (and, for some, the
/// previous), with noise beside them: ledgers, another rule, another window.
fn fill(redis: &RedisServer, (start, end): (u64, u64), prev_start: u64, n: usize) {
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client.get_connection().expect("connection");
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let mut p = redis::pipe();
        for &i in chunk {
            let t = format!("t{i:06}");
            if i % 10 != 9 {
                p.cmd("SET")
                    .arg(format!("tg:{{{t}}}:api:{start}:{end}"))
                    .arg(i % 97 + 1)
                    .ignore();
                p.cmd("HSET")
                    .arg(format!("tg:{{{t}}}:api:{start}:{end}:fleet"))
                    .arg("m")
                    .arg(1)
                    .ignore();
            }
            if i % 2 == 0 || i % 10 == 9 {
                p.cmd("SET")
                    .arg(format!("tg:{{{t}}}:api:{prev_start}:{start}"))
                    .arg(i % 13 + 1)
                    .ignore();
            }
            p.cmd("SET")
                .arg(format!("tg:{{{t}}}:other:{start}:{end}"))
                .arg(5)
                .ignore();
            p.cmd("SET")
                .arg(format!("tg:{{{t}}}:api:{}:{}", start + 1000, start + 2000))
                .arg(5)
                .ignore();
        }
        p.query::<()>(&mut conn).expect("filled");
    }
}

#[test]
fn usage_pages_through_100000_tenants() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let p = period_with_room(3600, 300);
    let start = now_ms() / (p * 1000) * (p * 1000);
    let n = 100_000;
    fill(&redis, (start, start + p * 1000), start - p * 1000, n);
    let gw = Gateway::start(&config(&up, Some(&format!("url: {}", redis.url())), p));
    let (rows, pages) = all_pages(&gw, &format!("/api/usage?rule=api&period={p}&limit=10000"));
    assert!((10..=40).contains(&pages), "{pages} pages");
    assert_eq!(rows.len(), n, "every tenant, each once");
    for i in 0..n {
        let t = format!("t{i:06}");
        let current = if i % 10 != 9 { (i % 97 + 1) as u64 } else { 0 };
        let previous = if i % 2 == 0 || i % 10 == 9 {
            (i % 13 + 1) as u64
        } else {
            0
        };
        assert_eq!(rows.get(&t), Some(&(previous, current)), "{t}");
    }
}

#[test]
fn usage_visits_every_primary_of_a_cluster() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(3, 0);
    let up = Upstream::start("u");
    let p = period_with_room(3600, 120);
    let gw = Gateway::start(&config(
        &up,
        Some(&format!("cluster: {}", cluster.seeds())),
        p,
    ));
    let tenants: Vec<String> = (0..30).map(|i| format!("c{i}")).collect();
    for (i, t) in tenants.iter().enumerate() {
        hit(&gw, t, i % 3 + 1);
    }
    let want: HashMap<String, (u64, u64)> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), (0, (i % 3 + 1) as u64)))
        .collect();
    let path = format!("/api/usage?rule=api&period={p}&limit=7");
    let mut got = HashMap::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            got = all_pages(&gw, &path).0;
            got == want
        }),
        "{got:?}"
    );
    let servers: std::collections::HashSet<u16> = cluster
        .keys("tg:*:api:*")
        .into_iter()
        .map(|(port, _, _)| port)
        .collect();
    assert!(
        servers.len() >= 2,
        "the keys spread over the primaries: {servers:?}"
    );
}

#[test]
fn usage_names_the_missing_scan_right_of_an_acl_user() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "on",
        "nopass",
        "~*",
        "&*",
        "+@all",
        "--user",
        "gw",
        "on",
        ">gw-secret",
        "~tg:*",
        "+@all",
        "-scan",
    ]);
    let up = Upstream::start("u");
    let url = format!("url: redis://gw:gw-secret@127.0.0.1:{}", redis.port);
    let gw = Gateway::start(&config(&up, Some(&url), 3600));
    let r = admin(&gw, "/api/usage?rule=api");
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.body.contains("permissions to run the 'scan' command") && r.body.contains("add +scan"),
        "{}",
        r.body
    );
    redis.cmd(&["ACL", "SETUSER", "gw", "+scan"]);
    let r = admin(&gw, "/api/usage?rule=api");
    assert_eq!(r.status, 200, "{}", r.body);
}

/// A fixed window's counts outlive its keys in the usage archive (`fleet_sync::archive`):
/// windows of 20 s archived here (`TOLLGATE_USAGE_ARCHIVE_FROM_MS`, as an hour's or a month's
/// are), by one of two instances, the previous window told from the archive once its keys are
/// gone (10 s after its end),
/// for a tenant with a count in the current window (its previous from the archive beside it) and
/// one without (from the archive alone).
#[test]
fn usage_tells_a_fixed_windows_previous_counts_from_the_archive() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let redis = RedisServer::start();
    let up = Upstream::start("u");
    let cfg = common::one_route_config(up.addr, 1, &format!("  admin_token: {TOKEN}"))
        + &format!(
            r#"tenant:
  from: [{{ header: x-org-id, trusted: true }}]
limits:
  - id: short
    pathPattern: /**
    tiers: [{{ period: 20, threshold: 100 }}]
redis:
  url: {}
  key_prefix: tg
  sync_interval: 200ms
  timeout: 1s
"#,
            redis.url()
        );
    let env = [("TOLLGATE_USAGE_ARCHIVE_FROM_MS", "20000")];
    // started while no window's copy is under way (each instance looks for a window to copy
    // from shortly after its end until 9 s after it): an instance that came up during that
    // span could miss a window the other had copied, and the metrics below count every window
    // since they started
    assert!(eventually(Duration::from_secs(25), || (9_100..13_000)
        .contains(&(now_ms() % 20_000))));
    let (gw, other) = (
        Gateway::start_with_env(&cfg, &env),
        Gateway::start_with_env(&cfg, &env),
    );
    // a window with 5 s left at least
    assert!(eventually(Duration::from_secs(20), || now_ms() % 20_000 < 15_000));
    let start = now_ms() / 20_000 * 20_000;
    let end = start + 20_000;
    for _ in 0..3 {
        assert_eq!(gw.get("/x", &[("x-org-id", "acme")]).status, 200);
    }
    assert_eq!(gw.get("/x", &[("x-org-id", "globex")]).status, 200);
    // and 1,200 tenants more, as the fleet counted them (more than one write of the copy holds)
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client.get_connection().expect("connection");
    let mut p = redis::pipe();
    for i in 0..1200 {
        p.cmd("SET")
            .arg(format!("tg:{{f{i:04}}}:short:{start}:{end}"))
            .arg(2)
            .arg("PXAT")
            .arg(end + 10_000)
            .ignore();
    }
    p.query::<()>(&mut conn).expect("filled");
    // the next window: acme again
    assert!(eventually(Duration::from_secs(20), || now_ms() >= end));
    assert_eq!(gw.get("/x", &[("x-org-id", "acme")]).status, 200);
    // the window's keys gone (10 s after its end), the archive holds its counts
    let key = |t: &str| format!("tg:{{{t}}}:short:{start}:{end}");
    assert!(
        eventually(Duration::from_secs(20), || {
            matches!(redis.cmd(&["EXISTS", &key("acme")]), redis::Value::Int(0))
        }),
        "the window's keys expire"
    );
    assert!(now_ms() < end + 20_000, "still the previous window");
    let archive = format!("tg:usage:{{short}}:{start}:{end}");
    // one of the two copied it
    let copied = format!("usage archive: rule short: 1202 partitions of the window {start}..{end}");
    let copies = [&gw, &other]
        .iter()
        .filter(|g| g.log().contains(&copied))
        .count();
    assert_eq!(copies, 1, "{}\n{}", gw.log(), other.log());
    // and their metrics say so: one copied it, the other found it copied
    let archived = |result: &str| -> f64 {
        [&gw, &other]
            .iter()
            .map(|g| {
                metric_sum(
                    &g.metrics(),
                    &format!("tollgate_usage_archive_total{{result=\"{result}\"}}"),
                )
            })
            .sum()
    };
    // (every long window that ended since they started: each copied once, found copied by
    // the other)
    assert!(
        eventually(Duration::from_secs(5), || archived("copied") >= 1.0
            && archived("elsewhere") == archived("copied")),
        "copied {}, elsewhere {}, error {}; their archive lines:\n{}",
        archived("copied"),
        archived("elsewhere"),
        archived("error"),
        [&gw, &other]
            .iter()
            .flat_map(|g| {
                g.log()
                    .lines()
                    .filter(|l| l.contains("usage archive"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(archived("error"), 0.0);
    assert_eq!(redis.int(&["HGET", &archive, "acme"]), 3);
    assert_eq!(redis.int(&["HGET", &archive, "f1199"]), 2);
    // the tenants and the field that elected the copier
    assert_eq!(redis.int(&["HLEN", &archive]), 1203);
    // (the time before the read: the TTL read is at most the expiry less that)
    let before = now_ms();
    let ttl = redis.int(&["PTTL", &archive]);
    assert!(
        ttl > 0 && ttl <= (end + 30_000 - before) as i64,
        "pttl {ttl}"
    );
    let v = admin(&gw, "/api/usage?rule=short&limit=10000").json();
    assert_eq!(v["previous"]["start_ms"], start, "{v:#}");
    assert_eq!(v["previous"]["kept"], true, "{v:#}");
    let mut rows = rows_of(&v);
    rows.iter_mut().for_each(|r| r.2 = Value::Null);
    assert_eq!(rows.len(), 1202, "{}", v["next"]);
    assert!(rows
        .iter()
        .filter(|r| r.0.starts_with('f'))
        .all(|r| (r.3, r.4) == (2, 0)));
    rows.retain(|r| !r.0.starts_with('f'));
    assert_eq!(
        rows,
        vec![
            ("acme".to_string(), Value::Null, Value::Null, 3, 1),
            ("globex".into(), Value::Null, Value::Null, 1, 0),
        ],
        "{v:#}"
    );
}
