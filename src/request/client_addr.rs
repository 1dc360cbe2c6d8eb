//! The client address (contract section 5): the socket peer, or, when the peer is a trusted
//! proxy, the X-Forwarded-For entry found by walking it right to left past trusted proxies
//! only. A client cannot choose its address by sending X-Forwarded-For.

use http::header::HeaderName;
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};

/// The header's name, built once: a lookup by `&str` parses the name each time.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Is `ip` one of the trusted proxies?
pub fn trusted(ip: IpAddr, nets: &[IpNet]) -> bool {
    !nets.is_empty() && nets.iter().any(|n| n.contains(&ip.to_canonical()))
}

/// Parse one X-Forwarded-For entry: `1.2.3.4`, `2001:db8::1`, `1.2.3.4:5678`, `[2001:db8::1]:80`.
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(entry).ok()?.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .map(|ip| ip.to_canonical())
}

/// Resolve the client address from the peer and the X-Forwarded-For header values (in the
/// order they were received). An unparsable entry stops the walk at the last trusted hop.
pub fn client_ip<'a, I>(peer: IpAddr, xff_values: I, trusted_proxies: &[IpNet]) -> IpAddr
where
    I: DoubleEndedIterator<Item = &'a [u8]>,
{
    let peer = peer.to_canonical();
    if !trusted(peer, trusted_proxies) {
        return peer;
    }
    let mut current = peer;
    for value in xff_values.rev() {
        for entry in value.rsplit(|b| *b == b',') {
            match parse_entry(entry) {
                None => return current,
                Some(ip) => {
                    current = ip;
                    if !trusted(ip, trusted_proxies) {
                        return ip;
                    }
                }
            }
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let xff: [&[u8]; 1] = [b"6.6.6.6"];
        assert_eq!(
            client_ip(ip("1.1.1.1"), xff.into_iter(), &[]),
            ip("1.1.1.1")
        );
    }

    #[test]
    fn walks_right_to_left_past_trusted_only() {
        let nets: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let xff: [&[u8]; 2] = [b"6.6.6.6, 2.2.2.2", b"10.0.0.7"];
        // 10.0.0.7 is trusted, 2.2.2.2 is not: the client is 2.2.2.2, whatever 6.6.6.6 says
        assert_eq!(
            client_ip(ip("10.1.1.1"), xff.into_iter(), &nets),
            ip("2.2.2.2")
        );
        let all_trusted: [&[u8]; 1] = [b"10.0.0.9"];
        assert_eq!(
            client_ip(ip("10.1.1.1"), all_trusted.into_iter(), &nets),
            ip("10.0.0.9")
        );
        let garbage: [&[u8]; 1] = [b"not-an-ip"];
        assert_eq!(
            client_ip(ip("10.1.1.1"), garbage.into_iter(), &nets),
            ip("10.1.1.1")
        );
        let with_port: [&[u8]; 1] = [b"[2001:db8::1]:443"];
        assert_eq!(
            client_ip(ip("10.1.1.1"), with_port.into_iter(), &nets),
            ip("2001:db8::1")
        );
    }

    #[test]
    fn v4_mapped_peer_is_canonical() {
        assert_eq!(
            client_ip(ip("::ffff:1.2.3.4"), std::iter::empty(), &[]),
            ip("1.2.3.4")
        );
    }
}
