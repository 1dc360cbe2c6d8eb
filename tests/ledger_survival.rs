//! Counts not yet confirmed by Redis survive what can happen to their counter before the next
//! round: a window that rolls twice during an outage, a tenant moving to another plan, a
//! counter evicted while its round is in flight, a reload that changes a rule's identity. And a
//! request past this instance's lease is held for the next round, not refused; a token
//! bucket's tokens admitted during an outage are charged as of Redis's last answer. The
//! real limiter and round code (`Accounts`) under a fake clock; Redis is the Rust twin of the
//! ledger script (`ledger_model`, held to the Lua script on a real redis-server by
//! `tests/ledger_script.rs`).

use http::{HeaderMap, Method};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tollgate::config::{self, Config};
use tollgate::limits::fleet::Fleet as FleetLink;
use tollgate::limits::{CounterRegistry, FakeClock, LimitRequest, Limiter, Verdict};
#[path = "common/ledger_model.rs"]
mod twin;
use tollgate::services::fleet_sync::backend::{
    Exchange, LedgerUpdate, LogReport, RoundError, Update,
};
use tollgate::services::fleet_sync::{Accounts, Round};
use twin::{ledger_model, update_model};

const T0: u64 = 1_800_000_000_000;

struct Fleet {
    clock: Arc<FakeClock>,
    registry: Arc<CounterRegistry>,
    fleet: Arc<FleetLink>,
    accounts: Accounts,
    metrics: tollgate::metrics::Metrics,
    strings: HashMap<String, i64>,
    hashes: HashMap<String, HashMap<String, i64>>,
}

fn config(limits: &str, plans: &str, cap: usize) -> Config {
    let text = format!(
        r#"
server: {{ listen: ["127.0.0.1:1"], max_counters_per_rule: {cap} }}
upstreams: {{ app: {{ servers: ["127.0.0.1:2"] }} }}
routes: [{{ id: all, path: /**, upstream: app }}]
tenant: {{ from: [{{ header: x-org-id, trusted: true }}] }}
{plans}
limits:
{limits}
redis: {{ url: "redis://127.0.0.1:1", key_prefix: s }}
"#
    );
    config::load_str(Path::new("survival.yaml"), &text).expect("valid config")
}

impl Fleet {
    fn new() -> Fleet {
        let metrics = tollgate::metrics::Metrics::new().expect("metrics");
        let registry = Arc::new(CounterRegistry::new(
            metrics.evictions.clone(),
            metrics.untracked.clone(),
        ));
        registry.set_syncing(true);
        let fleet = Arc::new(FleetLink::default());
        let clock = Arc::new(FakeClock::at_ms(T0));
        let accounts = Accounts::new(registry.clone(), fleet.clone(), clock.clone(), "i".into());
        Fleet {
            clock,
            registry,
            fleet,
            accounts,
            metrics,
            strings: HashMap::new(),
            hashes: HashMap::new(),
        }
    }

    fn limiter(&self, cfg: &Config) -> Limiter {
        self.fleet
            .configure(true, cfg.redis.as_ref().expect("redis").on_failure);
        Limiter::build(
            &cfg.rules,
            &cfg.plans,
            &self.registry,
            &self.metrics.decisions,
            cfg.server.max_counters_per_rule,
            self.clock.clone(),
            self.fleet.clone(),
        )
    }

    fn hit(&self, limiter: &Limiter, cfg: &Config, tenant: &str) -> bool {
        self.verdict(limiter, cfg, tenant) == Verdict::Allow
    }

    fn verdict(&self, limiter: &Limiter, cfg: &Config, tenant: &str) -> Verdict {
        self.decide(limiter, cfg, tenant).verdict
    }

    fn decide(&self, limiter: &Limiter, cfg: &Config, tenant: &str) -> tollgate::limits::Decision {
        self.decide_as(limiter, cfg, tenant, false)
    }

    /// `after_hold`: for a request held as long as it may (`decide_after_hold`).
    fn decide_as(
        &self,
        limiter: &Limiter,
        cfg: &Config,
        tenant: &str,
        after_hold: bool,
    ) -> tollgate::limits::Decision {
        let headers = HeaderMap::new();
        let segments = tollgate::matching::Segments::new("/x");
        let req = LimitRequest {
            method: &Method::GET,
            host: None,
            path: &segments,
            tenant: tenant.as_bytes(),
            plan: None,
            client_ip: "10.0.0.1".parse().expect("ip"),
            headers: &headers,
        };
        if after_hold {
            limiter.decide_after_hold(&req, &cfg.plans)
        } else {
            limiter.decide(&req, &cfg.plans)
        }
    }

    /// Admit `n` requests of `tenant`, with a round whenever the instance needs a lease.
    fn admit(&mut self, limiter: &Limiter, cfg: &Config, tenant: &str, n: usize) {
        for _ in 0..n {
            if !self.hit(limiter, cfg, tenant) {
                self.round(cfg);
                assert!(self.hit(limiter, cfg, tenant), "admitted with a lease");
            }
        }
    }

    fn begin(&self, cfg: &Config) -> Round {
        self.accounts
            .begin(cfg.redis.as_ref().expect("redis"), true)
    }

    /// Redis answers the round.
    fn answer(&mut self, round: Round) {
        let answers = round
            .updates
            .iter()
            .map(|u| update_model(&mut self.strings, &mut self.hashes, u))
            .collect();
        let done = self
            .accounts
            .finish(round, &Ok(Exchange::whole(answers, Some(1))));
        assert!(done.ok);
    }

    /// Redis does not answer the round.
    fn fail(&self, round: Round) {
        let done = self.accounts.finish(
            round,
            &Err(RoundError {
                message: "connection refused".into(),
                unapplied: true,
            }),
        );
        assert!(!done.ok);
    }

    fn round(&mut self, cfg: &Config) {
        let r = self.begin(cfg);
        self.answer(r);
    }

    /// The count Redis holds for `tenant`, rule `rule`, window starting at `start`.
    fn held(&self, tenant: &str, rule: &str, start: u64, period_ms: u64) -> i64 {
        let key = format!("s:{{{tenant}}}:{rule}:{start}:{}", start + period_ms);
        self.strings.get(&key).copied().unwrap_or(0)
    }
}

const RULE_10S: &str = "  - { id: r, pathPattern: /**, tiers: [{ period: 10, threshold: 1000 }] }";

#[test]
fn a_window_that_rolls_twice_during_an_outage_keeps_every_count() {
    let mut f = Fleet::new();
    let cfg = config(RULE_10S, "", 1000);
    let limiter = f.limiter(&cfg);
    f.round(&cfg); // connected
    let w0 = T0 / 10_000 * 10_000;
    let counts: [usize; 3] = [3, 2, 4];
    for (i, &n) in counts.iter().enumerate() {
        f.clock.set_ms(w0 + i as u64 * 10_000 + 100);
        f.admit(&limiter, &cfg, "acme", n);
        let r = f.begin(&cfg);
        f.fail(r); // Redis is down through all three windows
    }
    f.clock.advance_ms(1000);
    f.round(&cfg);
    f.round(&cfg);
    for (i, &n) in counts.iter().enumerate() {
        assert_eq!(
            f.held("acme", "r", w0 + i as u64 * 10_000, 10_000),
            n as i64,
            "window {i}"
        );
    }
    f.round(&cfg);
    assert_eq!(
        f.held("acme", "r", w0, 10_000),
        3,
        "sent again: counted once"
    );
}

#[test]
fn a_tenant_moving_to_another_plan_keeps_its_unsent_counts() {
    let mut f = Fleet::new();
    let rule = "  - { id: r, pathPattern: /**, tiers: [{ period: 10, threshold: 1000 }], plans: { gold: [{ period: 10, threshold: 5000 }] } }";
    let before = config(rule, "plans: { gold: [globex] }", 1000);
    let after = config(rule, "plans: { gold: [acme, globex] }", 1000);
    let old = f.limiter(&before);
    f.round(&before);
    f.admit(&old, &before, "acme", 4);
    let new = f.limiter(&after); // a reload: acme is now in plan gold
    drop(old);
    f.admit(&new, &after, "acme", 3);
    f.round(&after);
    f.round(&after);
    let w0 = T0 / 10_000 * 10_000;
    assert_eq!(
        f.held("acme", "r", w0, 10_000),
        7,
        "4 under the old plan, 3 under the new"
    );
}

#[test]
fn a_counter_evicted_while_its_round_is_in_flight_keeps_its_counts() {
    let mut f = Fleet::new();
    let cfg = config(RULE_10S, "", 32); // one counter per shard
    let limiter = f.limiter(&cfg);
    f.round(&cfg);
    f.admit(&limiter, &cfg, "acme", 5);
    let in_flight = f.begin(&cfg);
    // a flood of busier tenants while the round is out, each seen more often than acme's 5, so
    // the sketch would admit them over it: a counter with unsent counts is never evicted, and
    // one that left anyway (its round failing after) is kept aside; without both, acme's 5
    // would be lost here
    for i in 0..400 {
        for _ in 0..8 {
            f.hit(&limiter, &cfg, &format!("flood-{i}"));
        }
    }
    f.fail(in_flight);
    for _ in 0..3 {
        let r = f.begin(&cfg);
        f.answer(r);
    }
    let w0 = T0 / 10_000 * 10_000;
    assert_eq!(f.held("acme", "r", w0, 10_000), 5);
}

#[test]
fn a_reload_that_changes_a_rule_sends_the_old_rules_counts_first() {
    let mut f = Fleet::new();
    let before = config(RULE_10S, "", 1000);
    let after = config(
        "  - { id: r, pathPattern: /**, tiers: [{ period: 60, threshold: 1000 }] }",
        "",
        1000,
    );
    let old = f.limiter(&before);
    f.round(&before);
    f.admit(&old, &before, "acme", 6);
    // the reload: a new period is a new identity, with fresh counters; the old snapshot goes
    let new = f.limiter(&after);
    drop(old);
    f.admit(&new, &after, "acme", 1);
    f.round(&after);
    f.round(&after);
    let w0 = T0 / 10_000 * 10_000;
    assert_eq!(f.held("acme", "r", w0, 10_000), 6, "the old rule's counts");
    assert_eq!(f.held("acme", "r", T0 / 60_000 * 60_000, 60_000), 1);
    // once sent, the retired rule is forgotten
    f.round(&after);
    assert_eq!(f.registry.live().len(), 1);
}

#[test]
fn a_request_past_the_lease_is_held_and_a_shadow_rule_never_holds() {
    for (action, past_lease) in [("reject", Verdict::Hold), ("shadow", Verdict::Allow)] {
        let mut f = Fleet::new();
        let rule = format!(
            "  - {{ id: r, pathPattern: /**, action: {action}, tiers: [{{ period: 1h, threshold: 1000 }}] }}"
        );
        let cfg = config(&rule, "", 1000);
        let limiter = f.limiter(&cfg);
        f.round(&cfg); // connected
                       // far under the limit, no round: the lease (or the cold credit) runs out
        let mut verdicts = Vec::new();
        for _ in 0..500 {
            let v = f.verdict(&limiter, &cfg, "acme");
            verdicts.push(v);
            if v != Verdict::Allow {
                break;
            }
        }
        assert_eq!(verdicts.last(), Some(&past_lease), "{action}: {verdicts:?}");
        if past_lease == Verdict::Hold {
            // the next round asks for the request that waits, and it goes through
            let round = f.begin(&cfg);
            assert!(
                round
                    .updates
                    .iter()
                    .any(|u| matches!(u, Update::Lease(l) if l.need >= 1)),
                "{:?}",
                round.updates
            );
            f.answer(round);
            assert!(f.hit(&limiter, &cfg, "acme"));
        }
    }
}

#[test]
fn a_request_held_while_rounds_are_only_slow_is_decided_as_on_failure_says_not_refused() {
    let mut f = Fleet::new();
    let cfg = config(RULE_10S, "", 1000);
    let limiter = f.limiter(&cfg);
    f.round(&cfg); // connected
    let mut v = Verdict::Allow;
    for _ in 0..2000 {
        v = f.verdict(&limiter, &cfg, "acme");
        if v != Verdict::Allow {
            break;
        }
    }
    assert_eq!(v, Verdict::Hold);
    // no answer came in time (a busy machine, a stalling Redis) and none said the fleet is
    // full: admitted within this instance's share (on_failure: local_share), never refused
    // for a slow round
    for _ in 0..10 {
        assert_eq!(
            f.decide_as(&limiter, &cfg, "acme", true).verdict,
            Verdict::Allow
        );
    }
    // and counted: the next round reports them
    let round = f.begin(&cfg);
    assert!(
        round
            .updates
            .iter()
            .any(|u| matches!(u, Update::Lease(l) if l.used >= 10)),
        "{:?}",
        round.updates
    );
}

/// A fleet whose other instance has admitted `used` of an hour's 100 and holds the rest
/// (leased for requests waiting on it); this instance's limiter.
fn others_hold_the_rest(used: u64) -> (Fleet, Config, Limiter) {
    let mut f = Fleet::new();
    let cfg = config(
        "  - { id: r, pathPattern: /**, tiers: [{ period: 1h, threshold: 100 }] }",
        "",
        1000,
    );
    let limiter = f.limiter(&cfg);
    f.round(&cfg); // connected
    let (start, end) = (
        T0 / 3_600_000 * 3_600_000,
        T0 / 3_600_000 * 3_600_000 + 3_600_000,
    );
    let key = format!("s:{{acme}}:r:{start}:{end}");
    ledger_model(
        &mut f.strings,
        &mut f.hashes,
        &LedgerUpdate {
            ledger_key: format!("{key}:fleet"),
            prev_ledger_key: format!("{key}:fleet"),
            prev_key: key.clone(),
            key,
            member: "other.1".into(),
            used,
            want: 100,
            cap: 100,
            now_ms: T0,
            lease_until_ms: end,
            expire_at_ms: end + 60_000,
            weight_ms: 0,
            period_ms: 3_600_000,
            bucket_ns: 0,
            tolerance_us: 0,
            log: LogReport::default(),
            adopt: 0,
            need: 100 - used,
            spare: 4,
            confirmed: 0,
            direct_cap: 0,
            instances: 0,
            direct_each: 0,
            rest: 0,
            since_ms: 0,
        },
    );
    (f, cfg, limiter)
}

#[test]
fn when_others_hold_the_rest_of_a_nearly_full_window_an_answer_refuses_until_it_ends() {
    let (mut f, cfg, limiter) = others_hold_the_rest(95);
    // no credit under 500 (docs/fleet.md, "Small limits"): held at once
    assert_eq!(f.verdict(&limiter, &cfg, "acme"), Verdict::Hold);
    f.round(&cfg);
    // an answer without room, the fleet at 0.9 x its threshold or more and nobody with room
    // left (`Ledger::capped`): refused at once, without asking again, and told to come back
    // when the window ends (before: held once more, refused at the second such answer)
    let d = f.decide(&limiter, &cfg, "acme");
    assert!(
        matches!(d.verdict, Verdict::Reject { status: 429 }),
        "{d:?}"
    );
    let retry = d.retry_after_ms();
    assert!(
        retry > 3_500_000 && retry <= 3_600_000,
        "retry after {retry} ms"
    );
    let round = f.accounts.begin(cfg.redis.as_ref().expect("redis"), false);
    assert!(
        round.updates.is_empty(),
        "an early round asks nothing: {:?}",
        round.updates
    );
}

/// The same with the fleet at 50 of 100: not full (the others may give back what they hold,
/// or a lost reply stranded it), so answers without room keep the request waiting and asking,
/// within its hold limit; refused only once it has waited that out (docs/fleet.md, "Holding").
#[test]
fn when_others_hold_the_rest_of_an_emptier_window_requests_wait_on() {
    let (mut f, cfg, limiter) = others_hold_the_rest(50);
    assert_eq!(f.verdict(&limiter, &cfg, "acme"), Verdict::Hold);
    for _ in 0..5 {
        f.round(&cfg);
        assert_eq!(f.verdict(&limiter, &cfg, "acme"), Verdict::Hold);
    }
    assert!(matches!(
        f.decide_as(&limiter, &cfg, "acme", true).verdict,
        Verdict::Reject { status: 429 }
    ));
}

#[test]
fn a_round_in_parts_sends_every_count_once_and_no_part_is_larger_than_its_bound() {
    let mut f = Fleet::new();
    let rule = "  - { id: r, pathPattern: /**, tiers: [{ period: 10, threshold: 100000 }] }";
    let cfg = config(rule, "", 10_000);
    let limiter = f.limiter(&cfg);
    f.round(&cfg); // connected
    let w0 = T0 / 10_000 * 10_000;
    f.clock.set_ms(w0 + 100);
    let tenants: Vec<String> = (0..500).map(|i| format!("t{i}")).collect();
    for (i, t) in tenants.iter().enumerate() {
        f.admit(&limiter, &cfg, t, 1 + i % 3);
    }
    let settings = cfg.redis.as_ref().expect("redis");
    let (mut from, mut parts, mut sent) = (None, 0, 0);
    loop {
        let part = f.accounts.begin_part(settings, true, from, 40);
        parts += 1;
        sent += part.updates.len();
        // a part stops after the shard in which it reached its bound: 500 counters over 32
        // shards hold far fewer than 40 to a shard
        assert!(
            part.updates.len() < 40 + 40,
            "part of {}",
            part.updates.len()
        );
        assert_eq!(
            part.heartbeat.is_some(),
            parts == 1,
            "only the first part beats"
        );
        let rest = part.rest;
        f.answer(part);
        match rest {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    assert!(parts >= 500 / 80, "{parts} parts, {sent} updates");
    assert_eq!(sent, 500, "every counter once");
    for (i, t) in tenants.iter().enumerate() {
        assert_eq!(f.held(t, "r", w0, 10_000), 1 + (i % 3) as i64, "{t}");
    }
    // nothing is left for a whole round
    assert!(f.begin(&cfg).updates.is_empty());
}

#[test]
fn a_token_bucket_refills_what_was_admitted_while_redis_was_out_of_reach() {
    let mut f = Fleet::new();
    let cfg = config(
        "  - { id: b, pathPattern: /**, algorithm: token_bucket, tiers: [{ period: 10, threshold: 100 }] }",
        "",
        1000,
    );
    let limiter = f.limiter(&cfg);
    f.round(&cfg); // connected
    f.admit(&limiter, &cfg, "acme", 50);
    f.round(&cfg);
    // Redis goes away for 10 s: 40 more are admitted under on_failure at its start
    f.clock.advance_ms(500);
    let r = f.begin(&cfg);
    f.fail(r);
    for i in 0..40 {
        assert!(
            f.hit(&limiter, &cfg, "acme"),
            "request {i} under on_failure"
        );
    }
    f.clock.advance_ms(10_000);
    // back: one bucket refilled at 10 per second would be full again; Redis hears of the 40
    // only now, and counts them from its last answer, so a burst of 90 fits
    f.round(&cfg);
    f.admit(&limiter, &cfg, "acme", 90);
}

/// A sliding window's record that holds a lease it has not used when its window ends is rolled
/// and reported by the round at that end, an early round that visits every counter, though no
/// request reached it since (docs/fleet.md, "Early rounds"): else Redis weighs the next window
/// with its unused lease until its next periodic round (the simulation's parts seed 1445).
#[test]
fn a_sliding_windows_unused_lease_goes_back_in_the_round_at_its_windows_end() {
    let mut f = Fleet::new();
    let cfg = config(
        "  - { id: r, pathPattern: /**, algorithm: sliding_window, tiers: [{ period: 10, threshold: 100 }] }",
        "",
        1000,
    );
    let settings = cfg.redis.as_ref().expect("redis");
    let limiter = f.limiter(&cfg);
    f.round(&cfg); // connected
    let w0 = T0 / 10_000 * 10_000;
    f.clock.set_ms(w0 + 5_000);
    f.admit(&limiter, &cfg, "quiet", 2);
    f.round(&cfg); // a periodic round: the lease stays, unused
    assert_eq!(
        f.accounts.ends_in_ms(),
        Some(5_000),
        "a round is due at its window's end"
    );
    // an early round for another tenant: quiet's record is no longer one an answer reached
    f.clock.set_ms(w0 + 6_000);
    f.hit(&limiter, &cfg, "busy");
    let early = f.accounts.begin(settings, false);
    f.answer(early);
    // past the end, a request of another tenant: the round it asks for is early
    f.clock.set_ms(w0 + 10_050);
    f.hit(&limiter, &cfg, "busy");
    assert_eq!(f.accounts.ends_in_ms(), Some(0));
    let round = f.accounts.begin(settings, false);
    let quiet = format!("s:{{quiet}}:r:{w0}:{}", w0 + 10_000);
    let report = round.updates.iter().find_map(|u| match u {
        Update::Lease(l) if l.key == quiet => Some((l.used, l.want)),
        _ => None,
    });
    assert_eq!(
        report,
        Some((2, 2)),
        "its count reported, its lease given back: {:?}",
        round.updates
    );
    f.answer(round);
    assert_eq!(f.held("quiet", "r", w0, 10_000), 2);
}
