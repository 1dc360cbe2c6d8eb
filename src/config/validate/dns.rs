//! `dns`: the nameservers (`IP:PORT`) and the bounds of an answer's TTL; and the lookup, at
//! load, of the upstream servers given by name, each of which must resolve to an address.

use super::checker::*;
use crate::config::dns::lookup_now;

/// A name of a pool's `servers` to look up: the pool (its index in the specs), the entry's
/// index, the host and the port.
pub(super) type Pending = (usize, usize, String, u16);

/// `dns`, or its defaults without the section; `None` when it is wrong (names are then not
/// looked up, the config being refused anyway).
pub(super) fn check_dns(c: &mut Checker, d: Option<&DnsFile>) -> Option<DnsSettings> {
    let mut settings = DnsSettings::default();
    let Some(d) = d else {
        return Some(settings);
    };
    let before = c.errors.len();
    for (i, s) in d.servers.iter().enumerate() {
        match s.parse::<SocketAddr>() {
            Ok(a) => settings.servers.push(a),
            Err(_) => c.err(
                &format!("dns.servers[{i}]"),
                format!("invalid nameserver {s:?}: expected IP:PORT such as \"127.0.0.1:53\""),
            ),
        }
    }
    settings.min_ttl = positive(c, "dns.min_ttl", d.min_ttl, settings.min_ttl);
    settings.max_ttl = positive(c, "dns.max_ttl", d.max_ttl, settings.max_ttl);
    settings.timeout = positive(c, "dns.timeout", d.timeout, settings.timeout);
    if settings.max_ttl < settings.min_ttl {
        c.err(
            "dns.max_ttl",
            format!(
                "max_ttl ({:?}) must be at least min_ttl ({:?})",
                settings.max_ttl, settings.min_ttl
            ),
        );
    }
    (c.errors.len() == before).then_some(settings)
}

/// Look up the names of `pending` (all at once), adding each one's addresses to its pool; a
/// name that resolves to no address is an error at its entry, as a wrong address is.
pub(super) fn look_up_names(
    c: &mut Checker,
    dns: &DnsSettings,
    specs: &mut [UpstreamSpec],
    pending: Vec<Pending>,
) {
    if pending.is_empty() {
        return;
    }
    let hosts: Vec<String> = pending.iter().map(|(_, _, h, _)| h.clone()).collect();
    let answers = lookup_now(dns, &hosts);
    for ((pool, i, host, port), answer) in pending.into_iter().zip(answers) {
        let Some(spec) = specs.get_mut(pool) else {
            continue;
        };
        match answer {
            Ok(a) => spec.names.push(ServerName {
                host,
                port,
                addrs: a.addrs,
                ttl: a.ttl,
            }),
            Err(e) => c.err(
                &format!("upstreams.{}.servers[{i}]", spec.name),
                format!("server \"{host}:{port}\" resolves to no address: {e}"),
            ),
        }
    }
}
