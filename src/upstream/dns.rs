//! Upstream servers given by name: every address of the name is a server of the pool
//! (balanced, health-checked and skipped after a failed connection as an address given as such
//! is), and the name is looked up again when its answer runs out (its TTL, within `dns.min_ttl`
//! and `dns.max_ttl`), by the pools' `DnsRefresher`, off the request path. A new answer reaches the
//! balancer through pingora's `LoadBalancer::update` (which keeps the health of the addresses
//! that stay); a failed lookup keeps the last addresses, is counted
//! (`tollgate_upstream_dns_lookups_total{pool,result}`) and logged, at most once a minute while
//! it goes on, and is tried again after `dns.min_ttl`. A pool whose servers are all addresses
//! has none of this: its balancer and its requests are as they were.

use crate::config::dns::{lookup, resolver, Answer};
use crate::config::model::{DnsSettings, UpstreamSpec};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use hickory_resolver::TokioResolver;
use parking_lot::Mutex;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::Backend;
use prometheus::IntCounterVec;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// While lookups of a name keep failing, one line about it this often at most.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The resolver that the pools of one config share, made on its first use, in the runtime of
/// the refresher (the one of the load has gone with its thread).
pub struct Resolving {
    pub settings: DnsSettings,
    resolver: OnceLock<Result<TokioResolver, String>>,
}

impl Resolving {
    pub fn new(settings: DnsSettings) -> Self {
        Resolving {
            settings,
            resolver: OnceLock::new(),
        }
    }

    async fn lookup(&self, host: &str) -> Result<Answer, String> {
        match self.resolver.get_or_init(|| resolver(&self.settings)) {
            Ok(r) => lookup(r, &self.settings, host).await,
            Err(why) => Err(why.clone()),
        }
    }
}

/// One server given by name.
struct Entry {
    host: String,
    port: u16,
    /// A lookup of it is under way.
    busy: AtomicBool,
    state: Mutex<EntryState>,
}

struct EntryState {
    addrs: Vec<IpAddr>,
    /// When to look it up again.
    due: Instant,
    /// Failed lookups in a row, and when the last line about them was written.
    failures: u64,
    logged: Option<Instant>,
}

/// The servers of a pool with names: its addresses, and each name's of now.
pub struct Names {
    resolving: Arc<Resolving>,
    literal: Vec<SocketAddr>,
    entries: Vec<Entry>,
    /// What the balancer's discovery answers.
    set: Arc<ArcSwap<BTreeSet<Backend>>>,
    /// One change of the balancer at a time (pingora's `update` asks it of its callers).
    applying: Mutex<()>,
}

fn backend(addr: SocketAddr) -> Backend {
    Backend {
        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
        weight: 1,
        ext: Default::default(),
    }
}

impl Names {
    /// The servers of `spec`, its names as looked up at load (due again after their TTL).
    pub fn new(spec: &UpstreamSpec, resolving: Arc<Resolving>) -> Names {
        let now = Instant::now();
        let entries = spec
            .names
            .iter()
            .map(|n| Entry {
                host: n.host.clone(),
                port: n.port,
                busy: AtomicBool::new(false),
                state: Mutex::new(EntryState {
                    addrs: n.addrs.clone(),
                    due: now + n.ttl,
                    failures: 0,
                    logged: None,
                }),
            })
            .collect();
        let names = Names {
            resolving,
            literal: spec.servers.clone(),
            entries,
            set: Arc::new(ArcSwap::from_pointee(BTreeSet::new())),
            applying: Mutex::new(()),
        };
        names.publish();
        names
    }

    /// The discovery of the pool's balancer: whatever was published last.
    pub fn discovery(&self) -> Box<Discovery> {
        Box::new(Discovery(Arc::clone(&self.set)))
    }

    /// Set what the discovery answers: the addresses, and those of each name.
    fn publish(&self) {
        let mut set: BTreeSet<Backend> = self.literal.iter().map(|a| backend(*a)).collect();
        for e in &self.entries {
            let st = e.state.lock();
            set.extend(
                st.addrs
                    .iter()
                    .map(|ip| backend(SocketAddr::new(*ip, e.port))),
            );
        }
        self.set.store(Arc::new(set));
    }

    /// The names due for a lookup at `now`, each marked as under way.
    pub fn due(&self, now: Instant) -> Vec<usize> {
        (0..self.entries.len())
            .filter(|&i| {
                let e = &self.entries[i];
                e.state.lock().due <= now && !e.busy.swap(true, Ordering::AcqRel)
            })
            .collect()
    }

    /// Look up name `i` again; with new addresses, publish them and run `update` (the
    /// balancer's), one change at a time.
    pub async fn refresh(&self, i: usize, pool: &str, lookups: &IntCounterVec, update: impl Fn()) {
        let Some(e) = self.entries.get(i) else {
            return;
        };
        let answer = self.resolving.lookup(&e.host).await;
        let result = if answer.is_ok() { "ok" } else { "error" };
        lookups.with_label_values(&[pool, result]).inc();
        let settings = &self.resolving.settings;
        if e.settle(answer, pool, settings.min_ttl, Instant::now()) {
            let _one = self.applying.lock();
            self.publish();
            update();
        }
        e.busy.store(false, Ordering::Release);
    }
}

impl Entry {
    /// Take a lookup's outcome at `now`; whether the addresses changed.
    fn settle(
        &self,
        answer: Result<Answer, String>,
        pool: &str,
        retry: Duration,
        now: Instant,
    ) -> bool {
        let mut st = self.state.lock();
        let answer = match answer {
            Ok(a) => a,
            Err(why) => {
                st.due = now + retry;
                st.failures += 1;
                if st
                    .logged
                    .is_none_or(|t| now.duration_since(t) >= FAILURE_LOG_EVERY)
                {
                    st.logged = Some(now);
                    log::warn!(
                        "upstream {pool}: cannot resolve {}: {why}; its last addresses stay ({}); failed lookups in a row: {} (logged once a minute at most)",
                        self.host,
                        addrs_text(&st.addrs),
                        st.failures
                    );
                }
                return false;
            }
        };
        st.due = now + answer.ttl;
        if st.failures > 0 {
            log::info!(
                "upstream {pool}: {} resolves again, after {} failed lookups",
                self.host,
                st.failures
            );
            (st.failures, st.logged) = (0, None);
        }
        let (mut old, mut new) = (st.addrs.clone(), answer.addrs.clone());
        old.sort_unstable();
        new.sort_unstable();
        if old == new {
            return false;
        }
        log::info!(
            "upstream {pool}: {} resolves to {} (was {})",
            self.host,
            addrs_text(&answer.addrs),
            addrs_text(&st.addrs)
        );
        st.addrs = answer.addrs;
        true
    }
}

fn addrs_text(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The discovery of a pool with names: the set `Names` published last (never waits).
pub struct Discovery(Arc<ArcSwap<BTreeSet<Backend>>>);

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        Ok((BTreeSet::clone(&self.0.load()), HashMap::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(addrs: &[&str]) -> Entry {
        Entry {
            host: "api.internal".into(),
            port: 80,
            busy: AtomicBool::new(false),
            state: Mutex::new(EntryState {
                addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
                due: Instant::now(),
                failures: 0,
                logged: None,
            }),
        }
    }

    fn answer(addrs: &[&str], ttl: u64) -> Result<Answer, String> {
        Ok(Answer {
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            ttl: Duration::from_secs(ttl),
        })
    }

    #[test]
    fn a_new_answer_changes_the_addresses_and_when_to_ask_again() {
        let e = entry(&["10.0.0.1"]);
        let now = Instant::now();
        // the same addresses in another order are no change
        assert!(!e.settle(answer(&["10.0.0.1"], 30), "p", Duration::from_secs(1), now));
        assert_eq!(e.state.lock().due, now + Duration::from_secs(30));
        assert!(e.settle(
            answer(&["10.0.0.2", "10.0.0.1"], 5),
            "p",
            Duration::from_secs(1),
            now
        ));
        assert!(!e.settle(
            answer(&["10.0.0.1", "10.0.0.2"], 5),
            "p",
            Duration::from_secs(1),
            now
        ));
        assert_eq!(e.state.lock().addrs.len(), 2);
    }

    #[test]
    fn a_failed_lookup_keeps_the_addresses_and_is_logged_once_a_minute() {
        let e = entry(&["10.0.0.1"]);
        let now = Instant::now();
        let retry = Duration::from_secs(1);
        assert!(!e.settle(Err("timeout".into()), "p", retry, now));
        assert!(!e.settle(Err("timeout".into()), "p", retry, now + retry));
        let st = e.state.lock();
        assert_eq!(st.addrs, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            (st.failures, st.due, st.logged),
            (2, now + 2 * retry, Some(now))
        );
        drop(st);
        assert!(!e.settle(Err("timeout".into()), "p", retry, now + FAILURE_LOG_EVERY));
        assert_eq!(e.state.lock().logged, Some(now + FAILURE_LOG_EVERY));
        // an answer ends the streak
        assert!(!e.settle(answer(&["10.0.0.1"], 5), "p", retry, now));
        assert_eq!(e.state.lock().failures, 0);
    }
}
