//! Development certificates for a local cluster (`latchkey certs`): one CA,
//! a certificate per node (server and client use, for mutual TLS between
//! peers), a client certificate, and a certificate per named user (its
//! common name is the user: a replica that checks client certificates
//! authenticates a call carrying it as that user, see
//! `latchkey_server::auth`). Made with `rcgen`; ECDSA P-256 keys.
//!
//! For trying TLS out and for tests. A production cluster should take its
//! certificates from the organisation's CA: these have no revocation, a
//! validity into the far future, and the CA key lies next to them.
//!
//! ```no_run
//! # fn demo() -> Result<(), latchkey::certs::CertsError> {
//! let written = latchkey::certs::write_cluster(
//!     std::path::Path::new("certs"),
//!     3,
//!     &["node1.example.internal".to_string()],
//!     &["alice".to_string()],
//! )?;
//! assert!(written.iter().any(|p| p.ends_with("user-alice.pem")));
//! assert!(written.iter().any(|p| p.ends_with("ca.pem")));
//! # Ok(()) }
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertsError {
    /// rcgen refused the parameters (a host name it cannot encode, say).
    #[error("cannot make the certificate for {what}: {reason}")]
    Generate {
        /// Which certificate.
        what: String,
        /// rcgen's reason.
        reason: String,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {reason}")]
    Write {
        /// The file.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The directory already holds a CA: refusing to replace it (the
    /// certificates signed by it would stop working).
    #[error("{0} exists already: remove it, or pick another --out directory")]
    Exists(String),
}

/// A development CA: it signs node and client certificates.
pub struct DevCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

fn generate_error(what: &str) -> impl Fn(rcgen::Error) -> CertsError + '_ {
    move |e| CertsError::Generate {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

impl DevCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<DevCa, CertsError> {
        let err = generate_error("the CA");
        let key = KeyPair::generate().map_err(&err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(&err)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(&err)?;
        Ok(DevCa { cert, key })
    }

    /// The CA certificate, PEM (what clients and replicas trust).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key, PEM.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for `common_name`, valid for `hosts` (DNS names or IP
    /// addresses), usable as a server and as a client certificate. With
    /// `expired`, its validity ended in 2000 (for tests of refusals).
    pub fn issue(
        &self,
        common_name: &str,
        hosts: &[String],
        expired: bool,
    ) -> Result<Issued, CertsError> {
        let err = generate_error(common_name);
        let key = KeyPair::generate().map_err(&err)?;
        let mut params = CertificateParams::new(hosts.to_vec()).map_err(&err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            params.not_before = rcgen::date_time_ymd(1999, 1, 1);
            params.not_after = rcgen::date_time_ymd(2000, 1, 1);
        }
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(&err)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The names every development node certificate holds, whatever `hosts`
/// adds: the loopback names, so a local cluster works as it is.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Write a CA (`ca.pem`, `ca-key.pem`), `nodes` node certificates
/// (`node-N.pem`, `node-N-key.pem`, for the loopback names, `hosts`, and
/// the node's peer name [`crate::peer_certificate_name`]) and
/// a client certificate (`client.pem`, `client-key.pem`) and, for each of
/// `users`, a client certificate whose common name is that user
/// (`user-NAME.pem`, `user-NAME-key.pem`) into `dir`, created if missing.
/// Keys are written readable by their owner only. Returns the files
/// written.
pub fn write_cluster(
    dir: &Path,
    nodes: u64,
    hosts: &[String],
    users: &[String],
) -> Result<Vec<PathBuf>, CertsError> {
    for user in users {
        if user.is_empty()
            || user.len() > 128
            || !user
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
        {
            return Err(CertsError::Generate {
                what: format!("user {user:?}"),
                reason: "a user name here is 1 to 128 letters, digits and -_.@ (it becomes a \
                         file name)"
                    .into(),
            });
        }
    }
    let ca_path = dir.join("ca.pem");
    if ca_path.exists() {
        return Err(CertsError::Exists(ca_path.display().to_string()));
    }
    std::fs::create_dir_all(dir).map_err(|e| CertsError::Write {
        path: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let ca = DevCa::new("latchkey development CA")?;
    let mut names: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    names.extend(hosts.iter().filter(|h| !h.trim().is_empty()).cloned());
    let mut written = Vec::new();
    write_file(dir, "ca.pem", &ca.cert_pem(), false, &mut written)?;
    write_file(dir, "ca-key.pem", &ca.key_pem(), true, &mut written)?;
    for id in 1..=nodes {
        let mut node_names = names.clone();
        node_names.push(crate::peer_certificate_name(id));
        let node = ca.issue(&format!("latchkey node {id}"), &node_names, false)?;
        write_file(
            dir,
            &format!("node-{id}.pem"),
            &node.cert_pem,
            false,
            &mut written,
        )?;
        write_file(
            dir,
            &format!("node-{id}-key.pem"),
            &node.key_pem,
            true,
            &mut written,
        )?;
    }
    let client = ca.issue("latchkey client", &[], false)?;
    write_file(dir, "client.pem", &client.cert_pem, false, &mut written)?;
    write_file(dir, "client-key.pem", &client.key_pem, true, &mut written)?;
    for user in users {
        let cert = ca.issue(user, &[], false)?;
        write_file(
            dir,
            &format!("user-{user}.pem"),
            &cert.cert_pem,
            false,
            &mut written,
        )?;
        write_file(
            dir,
            &format!("user-{user}-key.pem"),
            &cert.key_pem,
            true,
            &mut written,
        )?;
    }
    Ok(written)
}

fn write_file(
    dir: &Path,
    name: &str,
    contents: &str,
    private: bool,
    written: &mut Vec<PathBuf>,
) -> Result<(), CertsError> {
    let path = dir.join(name);
    let err = |e: std::io::Error| CertsError::Write {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&path).map_err(err)?;
    file.write_all(contents.as_bytes()).map_err(err)?;
    file.sync_all().map_err(err)?;
    written.push(path);
    Ok(())
}
