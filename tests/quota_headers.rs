//! The quota headers, in-process under a fake clock (contract sections 5 and 9): every
//! `RateLimit-Policy` and `RateLimit` value parses as a Structured Field list (RFC 9651, the
//! `sfv` crate) with Integer `q`, `w`, `r` and `t`; after a denial `t=` and `Retry-After` say
//! when a request really is admitted again, for each algorithm.

use http::{HeaderMap, Method};
use std::path::Path;
use std::sync::Arc;
use tollgate::config;
use tollgate::limits::headers::{apply, retry_after_secs};
use tollgate::limits::{CounterRegistry, FakeClock, LimitRequest, Limiter, Verdict};

fn config_text(algorithm: &str, tiers: &str) -> String {
    format!(
        "server: {{ listen: [\"127.0.0.1:1\"] }}\n\
         upstreams: {{ app: {{ servers: [\"127.0.0.1:2\"] }} }}\n\
         routes: [{{ id: all, path: /**, upstream: app }}]\n\
         limits:\n  - id: search\n    pathPattern: /**\n    algorithm: {algorithm}\n    tiers: {tiers}\n"
    )
}

struct Rig {
    cfg: config::model::Config,
    limiter: Limiter,
    clock: Arc<FakeClock>,
}

impl Rig {
    fn new(algorithm: &str, tiers: &str) -> Rig {
        let cfg = config::load_str(Path::new("t.yaml"), &config_text(algorithm, tiers))
            .expect("valid config");
        let metrics = tollgate::metrics::Metrics::new().unwrap();
        let registry = CounterRegistry::new(metrics.evictions.clone(), metrics.untracked.clone());
        // a whole second, far from the epoch, 0.3 s into it
        let clock = Arc::new(FakeClock::at_ms(1_800_000_000_300));
        let limiter = Limiter::build(
            &cfg.rules,
            &cfg.plans,
            &registry,
            &metrics.decisions,
            100_000,
            clock.clone(),
            Arc::new(tollgate::services::fleet_sync::Fleet::default()),
        );
        Rig {
            cfg,
            limiter,
            clock,
        }
    }

    /// One request: (allowed, the response's headers as text).
    fn hit(&self) -> (bool, Vec<(String, String)>, u64) {
        let headers = HeaderMap::new();
        let segments = tollgate::matching::Segments::new("/q");
        let req = LimitRequest {
            method: &Method::GET,
            host: None,
            path: &segments,
            tenant: b"acme",
            plan: None,
            client_ip: "10.0.0.1".parse().unwrap(),
            headers: &headers,
        };
        let d = self.limiter.decide(&req, &self.cfg.plans);
        let allowed = d.verdict == Verdict::Allow;
        let mut resp = HeaderMap::new();
        apply(&mut resp, &self.limiter, &d, self.cfg.headers, !allowed);
        let out = resp
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        (allowed, out, if allowed { 0 } else { retry_after_secs(&d) })
    }
}

fn header<'h>(h: &'h [(String, String)], name: &str) -> &'h str {
    h.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {h:?}"))
}

/// Parse a value as an SF list whose members are Strings with Integer parameters; returns each
/// member's (string, [(param, integer)]).
fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not a Structured Field list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .unwrap_or_else(|| panic!("{value:?}: a member is not a String"))
                    .as_str()
                    .to_string();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let n = v.as_integer().unwrap_or_else(|| {
                            panic!("{value:?}: parameter {} is not an Integer", k.as_str())
                        });
                        (k.as_str().to_string(), i64::from(n))
                    })
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("{value:?}: an inner list"),
        })
        .collect()
}

fn param(p: &[(String, i64)], name: &str) -> i64 {
    p.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {name} in {p:?}"))
}

#[test]
fn every_ratelimit_value_is_a_structured_field_with_integers() {
    for algorithm in ["fixed_window", "sliding_window", "token_bucket"] {
        let rig = Rig::new(
            algorithm,
            "[{ period: 500ms, threshold: 3 }, { period: 1h, threshold: 999999999999999 }]",
        );
        for i in 0..5 {
            let (allowed, h, _) = rig.hit();
            let policy = sf_list(header(&h, "ratelimit-policy"));
            assert_eq!(policy.len(), 2, "{algorithm}: {policy:?}");
            assert_eq!(policy[0].0, "search/500ms");
            assert_eq!(param(&policy[0].1, "q"), 3);
            assert_eq!(param(&policy[0].1, "w"), 1, "a sub-second window is 1 s");
            assert_eq!(param(&policy[1].1, "q"), 999_999_999_999_999);
            assert_eq!(param(&policy[1].1, "w"), 3600);
            let rl = sf_list(header(&h, "ratelimit"));
            assert_eq!(rl.len(), 1);
            assert!(param(&rl[0].1, "r") >= 0);
            assert!(param(&rl[0].1, "t") >= 1);
            assert_eq!(allowed, i < 3, "{algorithm} request {i}");
        }
    }
}

/// After a denial, `t=` equals `Retry-After`; a request `t` seconds later is admitted, and one
/// a second earlier is not (so `t` is neither late nor early by a whole second).
#[test]
fn after_a_denial_t_and_retry_after_say_when_a_request_is_admitted() {
    for algorithm in ["fixed_window", "sliding_window", "token_bucket"] {
        let rig = Rig::new(algorithm, "[{ period: 10, threshold: 5 }]");
        // fill the window over its first seconds, so a sliding window's weight matters
        for _ in 0..5 {
            assert!(rig.hit().0, "{algorithm}");
            rig.clock.advance_ms(700);
        }
        // a bucket refilled a little meanwhile: hit until refused
        let mut tries = 0;
        let (h, retry_after) = loop {
            let (allowed, h, retry_after) = rig.hit();
            if !allowed {
                break (h, retry_after);
            }
            tries += 1;
            assert!(tries < 3, "{algorithm}: over the limit by now");
        };
        let t = param(&sf_list(header(&h, "ratelimit"))[0].1, "t") as u64;
        assert_eq!(
            header(&h, "ratelimit"),
            format!("\"search/10s\";r=0;t={t}"),
            "{algorithm}"
        );
        assert_eq!(t, retry_after, "{algorithm}: t= and Retry-After agree");
        // a second early: still refused; at t: admitted
        rig.clock.advance_ms((t - 1) * 1000);
        assert!(!rig.hit().0, "{algorithm}: refused a second before t={t}");
        rig.clock.advance_ms(1000);
        assert!(rig.hit().0, "{algorithm}: admitted at t={t}");
    }
}
