//! The TLS of upstream connections: how a pool's servers are verified.

use crate::config::model::UpstreamTls;

/// Verification of a TLS pool's servers: against `ca` (or the system's roots), by name, unless
/// `verify: false`.
pub(crate) fn tls_options(options: &mut pingora::upstreams::peer::PeerOptions, tls: &UpstreamTls) {
    options.verify_cert = tls.verify;
    options.verify_hostname = tls.verify;
    options.ca = tls.ca.clone();
}
