//! Looking up upstream servers given by name (`dns`): every address of a name (A and AAAA),
//! and how long the answer holds (its TTL within `min_ttl` and `max_ttl`). As the C library
//! does, /etc/hosts first (a name it has is answered from it alone, kept `max_ttl`), then a
//! resolver that asks `dns.servers` (or the nameservers of /etc/resolv.conf, with its search
//! domains). The lookups at load (`lookup_now`: `-t`, the start, each reload) run on a thread
//! of their own, since a reload validates inside the gateway's runtime; the pools' own
//! re-resolution (`upstream::dns`) calls `lookup` in the background.

use crate::config::model::DnsSettings;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::op::Query;
use hickory_resolver::proto::rr::{Name, RecordType};
use hickory_resolver::{Hosts, TokioResolver};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// What a lookup found: every address of the name, in the order of the answer (A first), and
/// how long it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub addrs: Vec<IpAddr>,
    pub ttl: Duration,
}

/// A nameserver at `addr`, over UDP and TCP on its port.
fn nameserver(addr: SocketAddr) -> NameServerConfig {
    let mut udp = ConnectionConfig::udp();
    udp.port = addr.port();
    let mut tcp = ConnectionConfig::tcp();
    tcp.port = addr.port();
    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
}

/// A resolver for `settings`. Its cache keeps answers within the same bounds, and a name that
/// does not exist for at most `min_ttl`, so that a retry after a failure asks again.
pub fn resolver(settings: &DnsSettings) -> Result<TokioResolver, String> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = if settings.servers.is_empty() {
        TokioResolver::builder(provider)
            .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))?
    } else {
        let servers = settings.servers.iter().map(|a| nameserver(*a)).collect();
        TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), provider)
    };
    let opts: &mut ResolverOpts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    // read by `from_hosts` at each lookup instead, as a whole: the resolver's own reading
    // would ask the nameservers for the family a name of /etc/hosts lacks
    opts.use_hosts_file = ResolveHosts::Never;
    opts.timeout = settings.timeout;
    opts.positive_min_ttl = Some(settings.min_ttl);
    opts.positive_max_ttl = Some(settings.max_ttl);
    opts.negative_max_ttl = Some(settings.min_ttl);
    builder
        .build()
        .map_err(|e| format!("cannot make a resolver: {e}"))
}

/// The addresses /etc/hosts gives `host` (read now, so that a change is seen at the next
/// lookup), if it names it.
fn from_hosts(host: &str, settings: &DnsSettings) -> Option<Answer> {
    let hosts = Hosts::from_system().ok()?;
    let name = Name::from_ascii(host).ok()?;
    let mut addrs: Vec<IpAddr> = Vec::new();
    for kind in [RecordType::A, RecordType::AAAA] {
        if let Some(found) = hosts.lookup_static_host(&Query::query(name.clone(), kind)) {
            addrs.extend(found.answers().iter().filter_map(|r| r.data.ip_addr()));
        }
    }
    (!addrs.is_empty()).then_some(Answer {
        addrs,
        ttl: settings.max_ttl,
    })
}

/// Every address of `host`, and how long to keep them; an answer without any is an error.
pub async fn lookup(
    resolver: &TokioResolver,
    settings: &DnsSettings,
    host: &str,
) -> Result<Answer, String> {
    if let Some(answer) = from_hosts(host, settings) {
        return Ok(answer);
    }
    let found = tokio::time::timeout(settings.timeout, resolver.lookup_ip(host))
        .await
        .map_err(|_| format!("no answer within {:?}", settings.timeout))?
        .map_err(|e| {
            if e.is_nx_domain() {
                "no such name (NXDOMAIN)".to_string()
            } else if e.is_no_records_found() {
                "no A or AAAA record".to_string()
            } else {
                e.to_string()
            }
        })?;
    let mut addrs: Vec<IpAddr> = Vec::new();
    for a in found.iter() {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    if addrs.is_empty() {
        return Err("no address".to_string());
    }
    let left = found
        .valid_until()
        .saturating_duration_since(Instant::now());
    Ok(Answer {
        addrs,
        ttl: left.clamp(settings.min_ttl, settings.max_ttl),
    })
}

/// Look up each of `hosts` at once, now, on a thread of its own (the caller may be inside a
/// runtime, where it cannot wait for another); one result per host, in order.
pub fn lookup_now(settings: &DnsSettings, hosts: &[String]) -> Vec<Result<Answer, String>> {
    let failed = |why: String| hosts.iter().map(|_| Err(why.clone())).collect();
    let work = || -> Result<Vec<Result<Answer, String>>, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a resolver: {e}"))?;
        rt.block_on(async {
            let resolver = resolver(settings)?;
            let each = hosts.iter().map(|h| lookup(&resolver, settings, h));
            Ok(join_all(each).await)
        })
    };
    std::thread::scope(|s| match s.spawn(work).join() {
        Ok(Ok(results)) => results,
        Ok(Err(why)) => failed(why),
        Err(_) => failed("the lookup failed".to_string()),
    })
}

/// Await every future together (a config's names are looked up at once, not one after the
/// other); their results in order. The futures borrow the resolver, so they are polled here
/// rather than spawned.
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<(usize, Pin<Box<F>>)> = futures.map(Box::pin).enumerate().collect();
    let mut done: Vec<(usize, F::Output)> = Vec::with_capacity(pending.len());
    std::future::poll_fn(|cx| {
        pending.retain_mut(|(i, f)| match f.as_mut().poll(cx) {
            Poll::Ready(v) => {
                done.push((*i, v));
                false
            }
            Poll::Pending => true,
        });
        if pending.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, v)| v).collect()
}
