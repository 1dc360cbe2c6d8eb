//! The Lua ledger script on a real redis-server, held to the same answers as its Rust twin
//! (`ledger_model`, which the fleet simulation runs), over random sequences of updates from
//! several members: reports, leases, give-backs, re-sent rounds, sliding windows, and plain
//! increments of direct records between them.

mod common;
use common::RedisServer;
use std::collections::HashMap;
use tollgate::limits::ledger::Answer;
#[path = "common/ledger_model.rs"]
mod twin;
use tollgate::services::fleet_sync::backend::script::{ledger_cmd, load_scripts_blocking};
use tollgate::services::fleet_sync::backend::{answer, CountUpdate, LedgerUpdate, LogReport};
use twin::{count_model, ledger_model};

/// A time in the future (keys expire at absolute times derived from it).
const NOW: u64 = 2_000_000_000_000;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A redis-server of its own, and a connection to it.
fn connected() -> (RedisServer, redis::Connection) {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).expect("client");
    let conn = client.get_connection().expect("connection");
    (redis, conn)
}

fn eval(conn: &mut redis::Connection, u: &LedgerUpdate) -> Answer {
    load_scripts_blocking(conn).expect("SCRIPT LOAD");
    let v: redis::Value = ledger_cmd(u).query(conn).expect("EVALSHA");
    answer(&v).unwrap_or_else(|| panic!("unexpected answer {v:?}"))
}

#[test]
fn the_lua_script_and_its_rust_twin_answer_alike() {
    let (redis, mut conn) = connected();
    let mut strings = HashMap::new();
    let mut hashes = HashMap::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let members = ["a.1", "b.1", "c.1", "a.2"];
    // per (window, member): the cumulative count so far
    let mut used: HashMap<(u64, usize), u64> = HashMap::new();
    let mut checked = 0;
    for step in 0..3000u64 {
        let window = rng.below(3); // three windows, the first two adjacent to the next
        let mode = rng.below(4); // fixed, sliding, token bucket or sliding log
        let sliding = window > 0 && mode == 1;
        let bucket = mode == 2;
        let log = mode == 3;
        let m = rng.below(members.len() as u64) as usize;
        let u = used.entry((window, m)).or_insert(0);
        // mostly growth, sometimes a re-sent (older) count
        if rng.below(5) > 0 {
            *u += rng.below(40);
        }
        let sent = if rng.below(6) == 0 {
            u.saturating_sub(rng.below(10))
        } else {
            *u
        };
        let key = format!("t:{{p}}:r:{window}:{}", window + 1);
        let prev_key = format!("t:{{p}}:r:{}:{window}", window.saturating_sub(1));
        let prev = format!("{prev_key}:fleet");
        if rng.below(40) == 0 {
            // an operator's grant to the window (`fleet_sync::adjust`): the cap widens by it,
            // and a sliding window's or log's next window weighs its previous one less by it
            let g = rng.below(100) as i64;
            let ledger = format!("{key}:fleet");
            redis.int(&["HSET", &ledger, "g:", &g.to_string()]);
            hashes
                .entry(ledger)
                .or_insert_with(HashMap::new)
                .insert("g:".to_string(), g);
        }
        if !bucket && rng.below(4) == 0 {
            // a direct record's plain increment
            let c = CountUpdate {
                key: key.clone(),
                delta: 1 + rng.below(20),
                first: false,
                expire_at_ms: 9_999_999_999_999,
            };
            let real = redis.int(&["INCRBY", &key, &c.delta.to_string()]);
            assert_eq!(real as u64, count_model(&mut strings, &c), "step {step}");
            continue;
        }
        let up = LedgerUpdate {
            ledger_key: format!("{key}:fleet"),
            prev_key: if sliding { prev_key } else { key.clone() },
            key,
            prev_ledger_key: if sliding { prev } else { String::new() },
            member: members[m].to_string(),
            used: sent,
            want: sent + rng.below(80),
            cap: 300,
            now_ms: NOW + step,
            lease_until_ms: NOW + step + rng.below(500),
            expire_at_ms: 9_999_999_999_999,
            weight_ms: if sliding { 1 + rng.below(1000) } else { 0 },
            period_ms: 1000,
            bucket_ns: if bucket { 1_000_000_000 / 300 } else { 0 },
            // a token bucket's period, or a leaky bucket's queue of 0 to 299 and its turn
            tolerance_us: match (bucket, rng.below(2)) {
                (false, _) => 0,
                (true, 0) => 1_000_000,
                (true, _) => (1 + rng.below(300)) * (1_000_000 / 300),
            },
            log: LogReport::default(),
            adopt: if bucket && rng.below(4) == 0 {
                rng.below(50)
            } else {
                0
            },
            need: if rng.below(3) == 0 { rng.below(40) } else { 0 },
            spare: 1 + rng.below(60),
            confirmed: rng.below(sent + 1),
            direct_cap: if !bucket && rng.below(2) == 0 {
                50 + rng.below(200)
            } else {
                0
            },
            instances: 1 + rng.below(5),
            direct_each: rng.below(4),
            // (a fixed window's steady demand until its end; the script ignores it elsewhere)
            rest: if !sliding && !bucket && rng.below(2) == 0 {
                1 + rng.below(300)
            } else {
                0
            },
            since_ms: 0,
        };
        let up = if log {
            // units by bucket of 10 ms (0 to 99), oldest first; the previous window's buckets
            // from `log.from` in the span (none for the first window: its own ledger)
            let mut units = Vec::new();
            let mut b = rng.below(50);
            for _ in 0..rng.below(5) {
                units.push((b, 1 + rng.below(15)));
                b += 1 + rng.below(10);
            }
            LedgerUpdate {
                prev_key: if window > 0 {
                    up.prev_key
                } else {
                    up.key.clone()
                },
                prev_ledger_key: if window > 0 {
                    format!("t:{{p}}:r:{}:{window}:fleet", window - 1)
                } else {
                    up.ledger_key.clone()
                },
                weight_ms: 0,
                direct_cap: 0,
                instances: 0,
                direct_each: 0,
                log: LogReport {
                    bucket_ms: 10,
                    last: 99,
                    from: rng.below(100),
                    units,
                },
                ..up
            }
        } else if sliding {
            up
        } else if bucket {
            LedgerUpdate {
                prev_ledger_key: "t:{p}:r:bucket".into(),
                // the previous window's ledger, whose leases still hold
                prev_key: format!("t:{{p}}:r:{}:{window}:fleet", window.saturating_sub(1)),
                now_ms: NOW + step * 3,
                // tokens admitted since up to 2 s ago (0: now)
                since_ms: if rng.below(2) == 0 {
                    NOW + step * 3 - rng.below(2000).min(step * 3)
                } else {
                    0
                },
                ..up
            }
        } else {
            LedgerUpdate {
                prev_ledger_key: up.ledger_key.clone(),
                ..up
            }
        };
        let real = eval(&mut conn, &up);
        let model = ledger_model(&mut strings, &mut hashes, &up);
        assert_eq!(real, model, "step {step}: {up:?}");
        checked += 1;
    }
    // the keys hold the same counts, and the ledgers the same logs' buckets
    for window in 0..3u64 {
        let key = format!("t:{{p}}:r:{window}:{}", window + 1);
        let real = redis.int(&["GET", &key]);
        assert_eq!(real, strings.get(&key).copied().unwrap_or(0), "{key}");
        let ledger = format!("{key}:fleet");
        // (the members' records are binary: only the logs' buckets are text)
        let real: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
            .arg(&ledger)
            .query(&mut conn)
            .expect("HGETALL");
        let mut real: Vec<(String, i64)> = real
            .into_iter()
            .filter(|(k, _)| k.starts_with("b:"))
            .map(|(k, v)| {
                let n = String::from_utf8_lossy(&v)
                    .parse()
                    .expect("a bucket's count");
                (k, n)
            })
            .collect();
        real.sort();
        let model = hashes.get(&ledger).cloned().unwrap_or_default();
        let mut model: Vec<(String, i64)> = model
            .into_iter()
            .filter(|(k, _)| k.starts_with("b:"))
            .collect();
        model.sort();
        assert_eq!(real, model, "{ledger}");
    }
    assert!(
        hashes
            .values()
            .any(|h| h.keys().any(|k| k.starts_with("b:"))),
        "logs' buckets were counted"
    );
    assert!(checked > 2000, "{checked} script calls");
}

/// A fixed window's update of `member` on key `key` (period 1000 ms, now 10 ms in, the lease
/// to the window's end), with no spare limit: tests change what they are about.
fn window_update(key: &str, member: &str, used: u64, want: u64, cap: u64) -> LedgerUpdate {
    LedgerUpdate {
        key: key.into(),
        ledger_key: format!("{key}:fleet"),
        prev_ledger_key: format!("{key}:fleet"),
        member: member.into(),
        used,
        want,
        cap,
        now_ms: 10,
        lease_until_ms: 1000,
        expire_at_ms: 9_999_999_999_999,
        weight_ms: 0,
        period_ms: 1000,
        bucket_ns: 0,
        tolerance_us: 0,
        log: LogReport::default(),
        adopt: 0,
        need: 0,
        spare: cap,
        confirmed: 0,
        prev_key: key.into(),
        direct_cap: 0,
        instances: 0,
        direct_each: 0,
        rest: 0,
        since_ms: 0,
    }
}

#[test]
fn a_grant_widens_its_window_and_weighs_nothing_on_the_next() {
    let (redis, mut conn) = connected();
    // a window of 100 that counted 100, 40 of them granted
    let prev_key = "t:{p}:g:0:1000";
    redis.int(&["INCRBY", prev_key, "100"]);
    redis.int(&["HSET", &format!("{prev_key}:fleet"), "g:", "40"]);
    let a = eval(&mut conn, &window_update(prev_key, "a.1", 0, 10, 100));
    assert_eq!(
        (a.total, a.grant, a.ceiling),
        (100, 40, 10),
        "room for the 40 granted"
    );
    // the next window, a sliding one at its start: the previous one weighs what it counted
    // and the 10 still leased, less the 40 granted: 70, not 110 (which would leave nothing)
    let key = "t:{p}:g:1000:2000";
    let next = LedgerUpdate {
        prev_ledger_key: format!("{prev_key}:fleet"),
        prev_key: prev_key.into(),
        weight_ms: 1000,
        ..window_update(key, "a.1", 0, 100, 100)
    };
    let b = eval(&mut conn, &next);
    assert_eq!((b.prev, b.grant, b.ceiling), (70, 0, 30), "{b:?}");
}

#[test]
fn a_filling_fixed_window_leases_each_member_its_part_at_once() {
    let (_redis, mut conn) = connected();
    // 200 a window on 3 instances, a spare budget of 20; each member's first request waits
    let ask = |key: &str, member: &str, rest: u64| LedgerUpdate {
        need: 1,
        spare: 20,
        instances: 3,
        rest,
        ..window_update(key, member, 0, 1 + rest, 200)
    };
    // steady demand that does not fill the window (3 x 41 of 200): its own demand until the
    // window's end, past the spare budget's part (21 before 2026-11-28), for each that asks
    let key = "t:{p}:s:0:1000";
    for m in ["a.1", "b.1", "c.1"] {
        assert_eq!(eval(&mut conn, &ask(key, m, 40)).ceiling, 41, "{m}");
    }
    // steady demand that fills it (each wants 131 until the window's end, an instance that
    // holds no lease taken to want as much): a third of it each, at once
    let key = "t:{p}:f:0:1000";
    for m in ["a.1", "b.1", "c.1"] {
        let a = eval(&mut conn, &ask(key, m, 130));
        assert_eq!((a.total, a.ceiling), (0, 66), "{m}: {a:?}");
    }
    // a member with no steady demand gets what waits there out of what is left, as before
    let d = eval(&mut conn, &ask(key, "d.1", 0));
    assert_eq!((d.ceiling, d.room), (1, 1), "{d:?}");
    // a steady member asking again now that 4 members hold leases: its part is re-split to
    // its share of what nobody has admitted (200 x 130 / (4 x 130)), and what it held is kept
    // for it until its next call (it may have admitted up to it before this answer reaches it)
    let a = eval(&mut conn, &ask(key, "a.1", 130));
    assert_eq!((a.ceiling, a.room), (50, 17), "{a:?}");
    let d = eval(&mut conn, &ask(key, "d.1", 0));
    assert_eq!(
        d.held,
        66 + 66 + 66,
        "a.1's 66 held until its next call: {d:?}"
    );
    // its next call: its part is what it holds now
    let a = eval(&mut conn, &ask(key, "a.1", 130));
    assert_eq!(a.ceiling, 50, "{a:?}");
    let d = eval(&mut conn, &ask(key, "d.1", 0));
    assert_eq!(d.held, 50 + 66 + 66, "{d:?}");
}

#[test]
fn the_spare_budget_takes_each_other_member_to_want_at_least_as_much_as_the_asker() {
    let (_redis, mut conn) = connected();
    let key = "t:{p}:w:0:1000";
    let ask = |member: &str, want: u64| LedgerUpdate {
        spare: 20,
        ..window_update(key, member, 0, want, 200)
    };
    // two members' first asks, for 2 each (their load just began)
    for m in ["b.1", "c.1"] {
        assert_eq!(eval(&mut conn, &ask(m, 2)).ceiling, 2, "{m}");
    }
    // the third asks for 20 as its load grew (so will theirs): a third of the spare budget,
    // not 20 x 20 / (20 + 2 + 2), which left the others 1 a call until it was used
    let a = eval(&mut conn, &ask("a.1", 20));
    assert_eq!((a.ceiling, a.fair), (7, 7), "{a:?}");
    // and the others, asking for 20 in turn, get as much
    let b = eval(&mut conn, &ask("b.1", 20));
    assert_eq!(b.ceiling, 7, "{b:?}");
}

#[test]
fn each_key_gets_its_expiry_when_written_first_not_at_every_call() {
    let (redis, mut conn) = connected();
    let key = "t:{p}:x:0:1000";
    let ledger = format!("{key}:fleet");
    let ask = |member: &str, used: u64| LedgerUpdate {
        expire_at_ms: NOW + 20_000,
        ..window_update(key, member, used, used + 10, 200)
    };
    let pexpireats = |conn: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_pexpireat:calls="))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let ttls = || {
        (
            redis.int(&["PTTL", key]) > 0,
            redis.int(&["PTTL", &ledger]) > 0,
        )
    };
    eval(&mut conn, &ask("a.1", 5));
    assert_eq!(
        ttls(),
        (true, true),
        "the count and the ledger a first call wrote"
    );
    // the same member's later calls, reports included, set no expiry again; another
    // member's first lease sets the ledger's
    let before = pexpireats(&mut conn);
    for used in 6..16 {
        eval(&mut conn, &ask("a.1", used));
    }
    assert_eq!(pexpireats(&mut conn), before);
    eval(&mut conn, &ask("b.1", 3));
    assert_eq!(pexpireats(&mut conn), before + 1, "the ledger's, once");
    // keys Redis lost (a restart, an eviction) are written again with their expiry
    redis.int(&["DEL", key, &ledger]);
    let a = eval(&mut conn, &ask("a.1", 17));
    assert_eq!(a.total, 17, "the count, reported again whole");
    assert_eq!(ttls(), (true, true));
}

#[test]
fn what_direct_records_may_still_report_is_kept_out_of_leases_until_the_total_passes_it() {
    let (redis, mut conn) = connected();
    let key = "t:{p}:d:0:1000";
    // a threshold of 1000; direct records may admit up to 300 in all, 100 of it reported
    redis.int(&["INCRBY", key, "100"]);
    let ask = |member: &str, used: u64, need: u64| LedgerUpdate {
        need,
        direct_cap: 300,
        instances: 3,
        direct_each: 1,
        ..window_update(key, member, used, used + need, 1000)
    };
    let a = eval(&mut conn, &ask("a.1", 0, 900));
    assert_eq!(
        (a.total, a.ceiling),
        (100, 700),
        "1000 - 100 counted - the 200 direct records may still report"
    );
    // the lease used and reported: the total passes the cap; kept back now is only what each
    // instance not yet among the members (2 of 3) may hold unreported, 1 each
    let a = eval(&mut conn, &ask("a.1", 700, 300));
    assert_eq!((a.total, a.ceiling), (800, 898));
    // another instance's record runs the script (its direct count comes with it): 1 kept back
    let b = eval(&mut conn, &ask("b.1", 0, 0));
    assert_eq!(b.total, 800);
    let a = eval(&mut conn, &ask("a.1", 898, 2));
    assert_eq!((a.total, a.ceiling), (998, 899));
    let a = eval(&mut conn, &ask("a.1", 899, 0));
    assert_eq!(a.total, 999, "the direct part and the leased part");
}

#[test]
fn a_re_sent_report_changes_nothing_and_leases_never_exceed_the_cap() {
    let (redis, mut conn) = connected();
    // no spare limit here (see the test of the spare budget)
    let base = window_update("t:{p}:r:0:1000", "a.1", 5, 100, 60);
    let first = eval(&mut conn, &base);
    assert_eq!(
        (first.total, first.ceiling),
        (5, 60),
        "alone: all that is free"
    );
    let again = eval(&mut conn, &base);
    assert_eq!(again.total, 5, "the same report twice counts once");
    // another member: the first holds 55 unused, nothing is free
    let b = LedgerUpdate {
        member: "b.1".into(),
        used: 0,
        want: 10,
        ..base.clone()
    };
    let other = eval(&mut conn, &b);
    assert_eq!((other.ceiling, other.held), (0, 55));
    // the first gives back what it does not need: the other can have it
    let back = LedgerUpdate {
        used: 8,
        want: 8,
        ..base.clone()
    };
    assert_eq!(eval(&mut conn, &back).ceiling, 8);
    let other = eval(&mut conn, &b);
    assert_eq!(other.ceiling, 10);
    assert_eq!(redis.int(&["GET", "t:{p}:r:0:1000"]), 8);
    assert!(
        redis.int(&["PTTL", "t:{p}:r:0:1000:fleet"]) > 0,
        "the ledger has a TTL"
    );
}

#[test]
fn a_token_bucket_lease_takes_tokens_and_gives_back_what_is_unused() {
    let (redis, mut conn) = connected();
    // 100 tokens per 10 s: one every 100 ms
    let ask = |member: &str, used: u64, want: u64, at_ms: u64| LedgerUpdate {
        prev_ledger_key: "t:{p}:b:bucket".into(),
        prev_key: "t:{p}:b:-10000:0:fleet".into(),
        now_ms: NOW + at_ms,
        lease_until_ms: NOW + 20_000,
        period_ms: 10_000,
        bucket_ns: 100_000_000,
        tolerance_us: 10_000_000,
        ..window_update("t:{p}:b:0:10000", member, used, want, 100)
    };
    let a = eval(&mut conn, &ask("a.1", 0, 60, 1000));
    assert_eq!(a.ceiling, 60, "60 of the 100 tokens");
    let b = eval(&mut conn, &ask("b.1", 0, 60, 1000));
    assert_eq!(
        (b.ceiling, b.room),
        (20, 20),
        "its fair part of the 40 left: both want 60"
    );
    // a used 10 and gives the rest back: 50 tokens return
    let a = eval(&mut conn, &ask("a.1", 10, 10, 1000));
    assert_eq!(a.ceiling, 10);
    let b = eval(&mut conn, &ask("b.1", 20, 100, 1000));
    assert_eq!(b.ceiling, 90, "the 20 left and the 50 given back");
    // 2 s later the bucket has refilled 20
    let b = eval(&mut conn, &ask("b.1", 90, 200, 3000));
    assert_eq!(b.ceiling, 110);
    assert_eq!(redis.int(&["GET", "t:{p}:b:0:10000"]), 100);
    assert!(
        redis.int(&["PTTL", "t:{p}:b:bucket"]) > 0,
        "the bucket has a TTL"
    );
}

#[test]
fn waiting_requests_are_granted_first_and_forecasts_only_from_the_spare_budget() {
    let (_redis, mut conn) = connected();
    // a threshold of 1000, a spare budget of 40
    let ask = |member: &str, used: u64, need: u64, forecast: u64| LedgerUpdate {
        need,
        spare: 40,
        ..window_update("t:{p}:s:0:1000", member, used, used + need + forecast, 1000)
    };
    // a steady instance asks for 500 ahead: it gets the spare budget, no more
    let a = eval(&mut conn, &ask("a.1", 100, 0, 500));
    assert_eq!(a.ceiling, 140);
    // a burst of 200 waits on another: all of it, from what is free
    let b = eval(&mut conn, &ask("b.1", 0, 200, 300));
    assert_eq!(
        b.ceiling, 200,
        "the need, but no forecast: a holds the spare"
    );
    assert_eq!(b.held, 40);
    // the rest of the threshold stays free for the next burst: 1000 - 300 admitted or needed
    // - 40 held
    let c = eval(&mut conn, &ask("c.1", 0, 700, 0));
    assert_eq!(c.ceiling, 660, "all that is free, and no more");
}

/// A window of `key` in which an instance not yet upgraded (its record as text fields, the
/// format before 2026-11-28) has admitted 20 and holds a lease to 60; its ledger's key.
fn old_member_holding_40(redis: &RedisServer, key: &str) -> String {
    let ledger = format!("{key}:fleet");
    redis.int(&["INCRBY", key, "20"]);
    for (kind, v) in [("u", "20"), ("c", "60"), ("e", "1000"), ("d", "40")] {
        redis.int(&["HSET", &ledger, &format!("{kind}:old.1"), v]);
    }
    ledger
}

#[test]
fn a_text_record_in_the_previous_windows_ledger_weighs_on_a_sliding_window() {
    let (redis, mut conn) = connected();
    // the previous window counted 20, and an instance not yet upgraded holds a lease to 60
    // there, written as text fields
    let prev_key = "t:{p}:s:0:1000";
    let prev_ledger = old_member_holding_40(&redis, prev_key);
    // the next window, half of the previous one still in its span: the previous window weighs
    // its count and the unused lease, 60, half of it now
    let key = "t:{p}:s:1000:2000";
    let mut up = window_update(key, "new.1", 0, 100, 100);
    up.prev_key = prev_key.into();
    up.prev_ledger_key = prev_ledger;
    up.weight_ms = 500;
    let a = eval(&mut conn, &up);
    assert_eq!(a.prev, 60, "{a:?}");
    assert_eq!(a.ceiling, 100 - 30, "{a:?}");
}

#[test]
fn a_member_written_as_text_fields_by_an_earlier_version_is_seen_holding_its_lease() {
    let (redis, mut conn) = connected();
    // an instance not yet upgraded (its record as text fields, the format before 2026-11-28)
    // has admitted 20 of a window of 100 and holds a lease to 60
    let key = "t:{p}:o:0:1000";
    let ledger = old_member_holding_40(&redis, key);
    // an upgraded one sees the 40 it holds unused, and leases only out of the rest
    let a = eval(&mut conn, &window_update(key, "new.1", 0, 100, 100));
    assert_eq!((a.total, a.held), (20, 40), "{a:?}");
    assert!(a.ceiling <= 100 - 20 - 40, "{a:?}");
    // and its own record is one field
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&ledger)
        .query(&mut conn)
        .expect("HKEYS");
    assert!(fields.contains(&"m:new.1".to_string()), "{fields:?}");
    assert!(!fields
        .iter()
        .any(|f| f.ends_with(":new.1") && f != "m:new.1"));
}
