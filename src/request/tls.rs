//! TLS at the edge: each handshake picks its certificate by SNI from the snapshot running at
//! that moment: the exact host first, then a wildcard (`*.example.com` for one label), then the
//! listener's own. A reload thus changes the certificate of new handshakes only; connections
//! already open keep theirs. (The certificates are loaded with the config:
//! `config::certificates`.)

use crate::snapshot::SharedSnapshot;
use async_trait::async_trait;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::tls::ssl::NameType;
use std::net::SocketAddr;

/// The certificate callback of one TLS listener.
pub struct SniCertificates {
    pub shared: SharedSnapshot,
    pub listener: SocketAddr,
}

#[async_trait]
impl TlsAccept for SniCertificates {
    async fn certificate_callback(&self, ssl: &mut TlsRef) {
        let sni = ssl.servername(NameType::HOST_NAME).map(str::to_owned);
        let snap = self.shared.load();
        match snap.config.tls.pick(sni.as_deref(), self.listener) {
            Some(pair) => {
                if let Err(e) = pair.use_in(ssl) {
                    log::warn!(
                        "tls: cannot use {} for a handshake: {e}",
                        pair.cert_file.display()
                    );
                }
            }
            None => log::warn!("tls: no certificate for listener {}", self.listener),
        }
    }
}
