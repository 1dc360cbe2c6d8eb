//! The certificates of the edge's TLS listeners and of `server.certificates`, read and checked
//! with the rest of the configuration (at start-up, on `-t` and on SIGHUP); they live in the
//! config snapshot, and `request::tls` picks one per handshake.
//!
//! The backend is OpenSSL (Debian's libssl): choosing a certificate during the handshake goes
//! through Pingora's certificate callback, which Pingora offers for OpenSSL and BoringSSL only,
//! and BoringSSL would be built from source on every fresh machine.

use pingora::protocols::tls::TlsRef;
use pingora::tls::ext;
use pingora::tls::pkey::{PKey, Private};
pub use pingora::tls::x509::X509;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A certificate chain (leaf first) and its private key.
pub struct CertKey {
    pub cert_file: PathBuf,
    chain: Vec<X509>,
    key: PKey<Private>,
}

/// Which of the two files of a pair is wrong, and why.
#[derive(Debug, PartialEq, Eq)]
pub enum PairError {
    Cert(String),
    Key(String),
}

impl CertKey {
    /// Read a PEM certificate chain and its PEM private key, and check that they belong
    /// together.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<CertKey, PairError> {
        let cert_pem = std::fs::read(cert_file)
            .map_err(|e| PairError::Cert(format!("cannot read {}: {e}", cert_file.display())))?;
        let chain = X509::stack_from_pem(&cert_pem).unwrap_or_default();
        if chain.is_empty() {
            return Err(PairError::Cert(format!(
                "{} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)",
                cert_file.display()
            )));
        }
        let key_pem = std::fs::read(key_file)
            .map_err(|e| PairError::Key(format!("cannot read {}: {e}", key_file.display())))?;
        let key = PKey::private_key_from_pem(&key_pem).map_err(|_| {
            PairError::Key(format!(
                "{} holds no PEM private key (expected -----BEGIN PRIVATE KEY-----)",
                key_file.display()
            ))
        })?;
        let matches = chain[0]
            .public_key()
            .map(|public| public.public_eq(&key))
            .unwrap_or(false);
        if !matches {
            return Err(PairError::Key(format!(
                "the key in {} does not belong to the certificate in {}",
                key_file.display(),
                cert_file.display()
            )));
        }
        Ok(CertKey {
            cert_file: cert_file.to_path_buf(),
            chain,
            key,
        })
    }

    /// Present this certificate in the handshake under way.
    pub fn use_in(&self, ssl: &mut TlsRef) -> Result<(), pingora::tls::error::ErrorStack> {
        ext::ssl_use_certificate(ssl, &self.chain[0])?;
        for c in &self.chain[1..] {
            ext::ssl_add_chain_cert(ssl, c)?;
        }
        ext::ssl_use_private_key(ssl, &self.key)
    }
}

/// Every certificate the configuration names, by listener and by host.
#[derive(Default)]
pub struct Certificates {
    listeners: Vec<(SocketAddr, Arc<CertKey>)>,
    exact: HashMap<String, Arc<CertKey>>,
    /// `*.example.com` is kept under `example.com`.
    wildcard: HashMap<String, Arc<CertKey>>,
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificates")
            .field("listeners", &self.listeners.len())
            .field("hosts", &(self.exact.len() + self.wildcard.len()))
            .finish()
    }
}

impl Certificates {
    pub fn add_listener(&mut self, addr: SocketAddr, pair: Arc<CertKey>) {
        self.listeners.push((addr, pair));
    }

    /// Add a host name of `server.certificates` (already checked by `valid_host`). Returns
    /// false if that name was given before.
    pub fn add_host(&mut self, host: &str, pair: Arc<CertKey>) -> bool {
        let host = host.to_ascii_lowercase();
        match host.strip_prefix("*.") {
            Some(parent) => self.wildcard.insert(parent.to_string(), pair).is_none(),
            None => self.exact.insert(host, pair).is_none(),
        }
    }

    /// The certificate for a handshake on `listener` asking for `sni`.
    pub fn pick(&self, sni: Option<&str>, listener: SocketAddr) -> Option<&Arc<CertKey>> {
        if let Some(name) = sni {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(c) = self.exact.get(&name) {
                return Some(c);
            }
            if let Some((label, parent)) = name.split_once('.') {
                if !label.is_empty() {
                    if let Some(c) = self.wildcard.get(parent) {
                        return Some(c);
                    }
                }
            }
        }
        self.listeners
            .iter()
            .find(|(a, _)| *a == listener)
            .map(|(_, c)| c)
    }
}

/// A host name of `server.certificates`: `api.example.com` or `*.example.com`.
pub fn valid_host(host: &str) -> bool {
    let name = host.strip_prefix("*.").unwrap_or(host);
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert!(valid_host("api.example.com"));
        assert!(valid_host("*.example.com"));
        assert!(valid_host("localhost"));
        assert!(!valid_host("*"));
        assert!(!valid_host("a..b"));
        assert!(!valid_host("api.*.com"));
        assert!(!valid_host("bad host"));
    }
}
