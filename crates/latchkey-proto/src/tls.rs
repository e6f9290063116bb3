//! TLS for channels to replicas, shared by clients and by replicas calling
//! their peers: which certificate authority to trust, and optionally the
//! caller's own certificate (mutual TLS).
//!
//! The files are PEM. They are read and checked when the options are made
//! ([`TlsOptions::from_files`]), so a missing file, a file without a
//! certificate or a key that is not a private key is a clear error at
//! start, not a handshake failure later. TLS itself is rustls (through
//! tonic's `tls-ring` feature): TLS 1.2 and 1.3 only, no renegotiation, no
//! compression.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {what} {path}: {reason}")]
    Read {
        /// What the file was for (`CA certificate`, `certificate`, `key`).
        what: &'static str,
        /// The path given.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The file holds no PEM certificate, or a malformed one.
    #[error("{what} {source_name}: {reason}")]
    BadCertificate {
        /// What the file was for.
        what: &'static str,
        /// The path (or "the given PEM").
        source_name: String,
        /// What is wrong.
        reason: String,
    },
    /// The file holds no PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[error("key {source_name}: {reason}")]
    BadKey {
        /// The path (or "the given PEM").
        source_name: String,
        /// What is wrong.
        reason: String,
    },
    /// A certificate was given without its key, or a key without its
    /// certificate.
    #[error("{0}")]
    Incomplete(String),
}

/// A certificate chain and its private key, in PEM, checked.
#[derive(Clone)]
pub struct Identity {
    cert_pem: Arc<Vec<u8>>,
    key_pem: Arc<Vec<u8>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    /// Check `cert_pem` (one or more certificates, leaf first) and `key_pem`.
    pub fn from_pem(cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Result<Identity, TlsError> {
        check_certificates("certificate", "the given PEM", &cert_pem)?;
        check_key("the given PEM", &key_pem)?;
        Ok(Identity {
            cert_pem: Arc::new(cert_pem),
            key_pem: Arc::new(key_pem),
        })
    }

    /// Read and check a certificate file and its key file.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        let cert_pem = read("certificate", cert)?;
        check_certificates("certificate", &cert.display().to_string(), &cert_pem)?;
        let key_pem = read("key", key)?;
        check_key(&key.display().to_string(), &key_pem)?;
        Ok(Identity {
            cert_pem: Arc::new(cert_pem),
            key_pem: Arc::new(key_pem),
        })
    }

    /// The certificate chain, PEM.
    pub fn cert_pem(&self) -> &[u8] {
        &self.cert_pem
    }

    /// The private key, PEM.
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    fn to_tonic(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&*self.cert_pem, &*self.key_pem)
    }
}

/// How a channel to a replica uses TLS: the certificate authority whose
/// certificates it trusts (replicas present one signed by it), and the
/// caller's own certificate when the replicas ask for one.
///
/// ```no_run
/// use std::path::Path;
/// use latchkey_proto::TlsOptions;
///
/// # fn demo() -> Result<(), latchkey_proto::TlsError> {
/// let tls = TlsOptions::from_files(
///     Path::new("certs/ca.pem"),
///     Some((Path::new("certs/client.pem"), Path::new("certs/client-key.pem"))),
/// )?;
/// # let _ = tls; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TlsOptions {
    ca_pem: Arc<Vec<u8>>,
    identity: Option<Identity>,
    domain: Option<String>,
}

impl TlsOptions {
    /// Trust the certificates signed by the CA in `ca_pem`; no certificate of
    /// our own.
    pub fn new(ca_pem: Vec<u8>) -> Result<TlsOptions, TlsError> {
        check_certificates("CA certificate", "the given PEM", &ca_pem)?;
        Ok(TlsOptions {
            ca_pem: Arc::new(ca_pem),
            identity: None,
            domain: None,
        })
    }

    /// Read the CA file and, if given, our certificate and key files.
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<TlsOptions, TlsError> {
        let ca_pem = read("CA certificate", ca)?;
        check_certificates("CA certificate", &ca.display().to_string(), &ca_pem)?;
        let identity = match identity {
            Some((cert, key)) => Some(Identity::from_files(cert, key)?),
            None => None,
        };
        Ok(TlsOptions {
            ca_pem: Arc::new(ca_pem),
            identity,
            domain: None,
        })
    }

    /// Present `identity` when the replica asks for a client certificate.
    pub fn with_identity(mut self, identity: Identity) -> TlsOptions {
        self.identity = Some(identity);
        self
    }

    /// Check the replicas' certificates against this name instead of the
    /// host of the address dialled (when replicas are reached by addresses
    /// their certificates do not name).
    pub fn with_domain(mut self, domain: impl Into<String>) -> TlsOptions {
        self.domain = Some(domain.into());
        self
    }

    /// The trusted CA certificates, PEM.
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// Our own certificate, if any.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// tonic's form of these options.
    pub(crate) fn client_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&*self.ca_pem));
        if let Some(identity) = &self.identity {
            config = config.identity(identity.to_tonic());
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn check_certificates(what: &'static str, source_name: &str, pem: &[u8]) -> Result<(), TlsError> {
    let bad = |reason: String| TlsError::BadCertificate {
        what,
        source_name: source_name.to_string(),
        reason,
    };
    let mut found = 0usize;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| bad(format!("malformed PEM: {e}")))?;
        found += 1;
    }
    if found == 0 {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(())
}

fn check_key(source_name: &str, pem: &[u8]) -> Result<(), TlsError> {
    PrivateKeyDer::from_pem_slice(pem)
        .map(|_| ())
        .map_err(|e| TlsError::BadKey {
            source_name: source_name.to_string(),
            reason: format!("holds no usable PEM private key ({e})"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_garbage_files_are_refused_clearly() {
        assert!(matches!(
            TlsOptions::new(Vec::new()),
            Err(TlsError::BadCertificate { .. })
        ));
        assert!(matches!(
            TlsOptions::new(b"not pem at all".to_vec()),
            Err(TlsError::BadCertificate { .. })
        ));
        let broken = b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_vec();
        assert!(TlsOptions::new(broken).is_err());
        assert!(matches!(
            Identity::from_pem(Vec::new(), Vec::new()),
            Err(TlsError::BadCertificate { .. })
        ));
        let missing = TlsOptions::from_files(Path::new("/nonexistent/ca.pem"), None);
        assert!(
            matches!(&missing, Err(TlsError::Read { path, .. }) if path == "/nonexistent/ca.pem"),
            "{missing:?}"
        );
    }
}
