//! Client connections per listener and per client address (`server.max_connections`,
//! `server.max_connections_per_ip`): each is counted from its accept to its close, before any
//! TLS handshake, and one past a limit is closed as soon as it is accepted (as nginx's
//! `worker_connections` and `limit_conn` do). A listener at its limit makes `/readyz` say not
//! ready, so that a load balancer sends its traffic elsewhere.
//!
//! Plain listeners count a connection where the edge first sees it; TLS listeners in a
//! callback Pingora runs before the handshake, which also gives the client
//! `client_header_timeout` to send its first byte. The count of a TLS connection is released
//! when Pingora drops its socket (a [`Tracer`] held by the socket: Pingora's only hook there).

use crate::metrics::Metrics;
use crate::snapshot::SharedSnapshot;
use ahash::AHashMap;
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::listeners::PreTlsProcess;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, Peek};
use pingora::upstreams::peer::{Tracer, Tracing};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One data plane listener's connections.
struct Listener {
    addr: SocketAddr,
    limit: usize,
    open: AtomicUsize,
    gauge: prometheus::IntGauge,
    refused_full: prometheus::IntCounter,
    refused_per_ip: prometheus::IntCounter,
}

/// Why a connection was closed as soon as it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    ListenerFull,
    PerIp,
}

pub struct Connections {
    listeners: Vec<Listener>,
    /// `server.max_connections_per_ip`.
    per_ip: Option<usize>,
    by_ip: Mutex<AHashMap<IpAddr, usize>>,
}

/// A counted connection; dropping it releases the count.
pub struct Held {
    connections: Arc<Connections>,
    listener: usize,
    ip: Option<IpAddr>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.connections.release(self.listener, self.ip);
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "connection on listener {}", self.listener)
    }
}

/// The count of a TLS connection, held by its socket until Pingora drops it.
struct HeldBySocket(#[allow(dead_code)] Held);

impl std::fmt::Debug for HeldBySocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Tracing for HeldBySocket {
    fn on_connected(&self) {}
    fn on_disconnected(&self) {}
    /// A copy holds nothing: the count is released once, with the socket.
    fn boxed_clone(&self) -> Box<dyn Tracing> {
        Box::new(NothingHeld)
    }
}

#[derive(Debug)]
struct NothingHeld;

impl Tracing for NothingHeld {
    fn on_connected(&self) {}
    fn on_disconnected(&self) {}
    fn boxed_clone(&self) -> Box<dyn Tracing> {
        Box::new(NothingHeld)
    }
}

/// The connections each listener may hold: `configured`, or the default; either lowered to fit
/// `descriptors` (the process's limit on open files), which each client connection may use twice
/// (its own and an upstream connection), less those kept for the rest of the process.
pub fn fit_to_descriptors(configured: Option<usize>, listeners: usize, descriptors: u64) -> usize {
    let share = descriptors.saturating_sub(crate::config::defaults::RESERVED_DESCRIPTORS)
        / 2
        / listeners.max(1) as u64;
    let share = usize::try_from(share).unwrap_or(usize::MAX).max(1);
    configured
        .unwrap_or(crate::config::defaults::DEFAULT_MAX_CONNECTIONS)
        .min(share)
}

/// The limit on open files, raised to the hard limit first (as nginx's
/// `worker_rlimit_nofile`); `None` where it cannot be read.
pub fn descriptor_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    Some(lim.rlim_cur)
}

impl Connections {
    /// `limits[i]`: how many connections `addrs[i]` may hold; `per_ip`: how many one client
    /// address may hold on each.
    pub fn new(
        addrs: &[SocketAddr],
        limits: &[usize],
        per_ip: Option<usize>,
        metrics: &Metrics,
    ) -> Self {
        let listeners = addrs
            .iter()
            .zip(limits)
            .map(|(addr, &limit)| {
                let name = addr.to_string();
                Listener {
                    addr: *addr,
                    limit,
                    open: AtomicUsize::new(0),
                    gauge: metrics.connections.with_label_values(&[&name]),
                    refused_full: metrics
                        .connections_refused
                        .with_label_values(&[&name, "listener_full"]),
                    refused_per_ip: metrics
                        .connections_refused
                        .with_label_values(&[&name, "per_ip"]),
                }
            })
            .collect();
        Connections {
            listeners,
            per_ip,
            by_ip: Mutex::new(AHashMap::new()),
        }
    }

    /// The listener a connection to `local` came in on.
    fn listener_of(&self, local: SocketAddr) -> Option<usize> {
        self.listeners.iter().position(|l| {
            l.addr.port() == local.port()
                && (l.addr.ip() == local.ip() || l.addr.ip().is_unspecified())
        })
    }

    /// Count a connection from `peer` to `local`, or say why it is refused. A connection of no
    /// known listener is counted nowhere (and never refused).
    pub fn open(
        self: &Arc<Self>,
        local: Option<SocketAddr>,
        peer: Option<IpAddr>,
    ) -> Result<Option<Held>, Refused> {
        let Some(i) = local.and_then(|l| self.listener_of(l)) else {
            return Ok(None);
        };
        let l = &self.listeners[i];
        if l.open.fetch_add(1, Ordering::AcqRel) >= l.limit {
            l.open.fetch_sub(1, Ordering::AcqRel);
            l.refused_full.inc();
            return Err(Refused::ListenerFull);
        }
        let ip = match (self.per_ip, peer) {
            (Some(max), Some(ip)) => {
                let mut by_ip = self.by_ip.lock();
                let n = by_ip.entry(ip).or_insert(0);
                if *n >= max {
                    drop(by_ip);
                    l.open.fetch_sub(1, Ordering::AcqRel);
                    l.refused_per_ip.inc();
                    return Err(Refused::PerIp);
                }
                *n += 1;
                Some(ip)
            }
            _ => None,
        };
        l.gauge.inc();
        Ok(Some(Held {
            connections: Arc::clone(self),
            listener: i,
            ip,
        }))
    }

    fn release(&self, listener: usize, ip: Option<IpAddr>) {
        if let Some(l) = self.listeners.get(listener) {
            l.open.fetch_sub(1, Ordering::AcqRel);
            l.gauge.dec();
        }
        if let Some(ip) = ip {
            let mut by_ip = self.by_ip.lock();
            if let Some(n) = by_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    by_ip.remove(&ip);
                }
            }
        }
    }

    /// The listeners holding as many connections as they may.
    pub fn full(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter(|l| l.open.load(Ordering::Acquire) >= l.limit)
            .map(|l| l.addr)
            .collect()
    }

    /// The client connections open on every listener.
    pub fn held(&self) -> usize {
        self.listeners
            .iter()
            .map(|l| l.open.load(Ordering::Acquire))
            .sum()
    }

    /// Each listener's address, open connections and limit.
    pub fn usage(&self) -> Vec<(SocketAddr, usize, usize)> {
        self.listeners
            .iter()
            .map(|l| (l.addr, l.open.load(Ordering::Acquire), l.limit))
            .collect()
    }
}

/// The socket's local address and its peer's IP address.
pub fn addresses(s: &dyn GetSocketDigest) -> (Option<SocketAddr>, Option<IpAddr>) {
    let digest = s.get_socket_digest();
    let inet = |a: Option<&pingora::protocols::l4::socket::SocketAddr>| {
        a.and_then(|a| a.as_inet()).copied()
    };
    let local = digest.as_ref().and_then(|d| inet(d.local_addr()));
    let peer = digest.as_ref().and_then(|d| inet(d.peer_addr()));
    (local, peer.map(|p| p.ip()))
}

/// Run by Pingora on a TLS listener's connection before its handshake: counts the connection
/// (or refuses it) and waits, up to `client_header_timeout`, for the client's first byte.
pub struct BeforeTls {
    pub connections: Arc<Connections>,
    pub shared: SharedSnapshot,
    pub metrics: Arc<Metrics>,
}

#[async_trait]
impl PreTlsProcess for BeforeTls {
    async fn process(&self, stream: &mut L4Stream) -> pingora::Result<()> {
        let (local, peer) = addresses(stream);
        match self.connections.open(local, peer) {
            Ok(Some(held)) => stream.tracer = Some(Tracer(Box::new(HeldBySocket(held)))),
            Ok(None) => {}
            Err(why) => {
                return pingora::Error::e_explain(
                    pingora::ErrorType::ConnectRefused,
                    match why {
                        Refused::ListenerFull => "listener full (server.max_connections)",
                        Refused::PerIp => "client address full (server.max_connections_per_ip)",
                    },
                )
            }
        }
        let wait = self.shared.load().config.server.client_header_timeout;
        let mut first = [0u8; 1];
        match tokio::time::timeout(wait, stream.try_peek(&mut first)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => pingora::Error::e_because(
                pingora::ErrorType::ReadError,
                "client gone before its TLS handshake",
                e,
            ),
            Err(_) => {
                self.metrics
                    .client_error(crate::metrics::ClientError::Timeout);
                pingora::Error::e_explain(
                    pingora::ErrorType::ReadTimedout,
                    "no TLS handshake within client_header_timeout",
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conns(limits: &[usize], per_ip: Option<usize>) -> Arc<Connections> {
        let metrics = Metrics::new().expect("metrics");
        Arc::new(Connections::new(
            &["127.0.0.1:1".parse().unwrap(), "0.0.0.0:2".parse().unwrap()],
            limits,
            per_ip,
            &metrics,
        ))
    }

    #[test]
    fn a_listener_refuses_past_its_limit_and_takes_again_once_one_closes() {
        let c = conns(&[2, 5], None);
        let at = |p: u16| Some(SocketAddr::from(([127, 0, 0, 1], p)));
        let a = c.open(at(1), None).unwrap().unwrap();
        let _b = c.open(at(1), None).unwrap().unwrap();
        assert!(matches!(c.open(at(1), None), Err(Refused::ListenerFull)));
        assert_eq!(c.full(), vec!["127.0.0.1:1".parse::<SocketAddr>().unwrap()]);
        // the other listener (0.0.0.0 takes any local address) is not full
        assert!(c.open(at(2), None).unwrap().is_some());
        drop(a);
        assert!(c.full().is_empty());
        assert!(c.open(at(1), None).unwrap().is_some());
        // an unknown listener is counted nowhere
        assert!(c.open(at(3), None).unwrap().is_none());
    }

    #[test]
    fn one_address_may_hold_at_most_its_share() {
        let c = conns(&[100, 100], Some(2));
        let at = Some(SocketAddr::from(([127, 0, 0, 1], 2)));
        let ip = |n: u8| Some(IpAddr::from([10, 0, 0, n]));
        let a = c.open(at, ip(1)).unwrap();
        let _b = c.open(at, ip(1)).unwrap();
        assert!(matches!(c.open(at, ip(1)), Err(Refused::PerIp)));
        let other = c.open(at, ip(2)).unwrap();
        assert!(other.is_some(), "another address");
        drop(a);
        let again = c.open(at, ip(1)).unwrap();
        assert!(again.is_some());
        assert_eq!(c.usage()[1].1, 3);
        drop((other, again));
        assert_eq!(c.usage()[1].1, 1);
        assert_eq!(
            c.by_ip.lock().len(),
            1,
            "an address with no connection is forgotten"
        );
    }

    #[test]
    fn the_default_fits_the_descriptor_limit() {
        assert_eq!(fit_to_descriptors(None, 1, 1_000_000), 10_000);
        // 20,000 descriptors, 2 listeners: (20,000 - 1,024) / 2 / 2
        assert_eq!(fit_to_descriptors(None, 2, 20_000), 4_744);
        assert_eq!(fit_to_descriptors(Some(50), 2, 20_000), 50);
        assert_eq!(fit_to_descriptors(Some(50_000), 1, 20_000), 9_488);
        assert_eq!(fit_to_descriptors(None, 1, 100), 1, "never 0");
    }
}
