//! Who is calling: the user a client names on each call, proven by its
//! password. The rules (users, roles, grants, whether access control is on)
//! live in the replicated state and are enforced where commands are applied
//! (`latchkey_core::auth`); this module only authenticates.
//!
//! A client names itself with the [`USER_HEADER`] and [`PASSWORD_HEADER`]
//! metadata on every call (visible ASCII; send them over TLS). The replica
//! checks the password against the salted hash the replicated state holds
//! for that user and refuses a wrong pair with UNAUTHENTICATED before
//! anything runs, whether or not access control is enabled, so a client
//! learns at once that its credentials are wrong.
//!
//! Passwords are stored as PBKDF2-HMAC-SHA256 with a 16-byte random salt
//! and [`ITERATIONS`] rounds (ring's implementation, already linked for
//! TLS; `pbkdf2-sha256$ITERATIONS$SALT$HASH`, base64 without padding),
//! made by the replica that proposes the user, so the log never carries a
//! password. Checking one costs tens of milliseconds, so a replica keeps
//! the pairs it has verified (keyed by a SHA-256 of the password, never the
//! password) for as long as the stored hash does not change.
//!
//! A client may instead prove who it is with its TLS client certificate
//! (etcd's convention), when the replica is started with
//! `ServerTls::certificate_users` (`--client-cert-users`): client
//! certificates, optional unless `--client-cert-auth`, are checked against
//! the cluster's CA during the handshake, and a call that
//! names no user and carries no cluster secret is made as the user the
//! certificate's subject common name (CN) names, if the replicated state
//! has that user ([`certificate_user`]). No password is needed: the
//! handshake proved the client holds the certificate's key. A certificate
//! whose CN is not a user is anonymous. Which credential wins when a call
//! carries several: a named user with its password, then the cluster
//! secret (root), then the certificate.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Mutex;

use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
use base64::Engine;
use latchkey_proto::ReplicaFailure;
use ring::{digest, pbkdf2};
use rustls_pki_types::CertificateDer;
use tonic::metadata::MetadataMap;
use tonic::Status;

pub use latchkey_proto::{PASSWORD_HEADER, USER_HEADER};

/// PBKDF2 rounds for a new password hash.
pub const ITERATIONS: u32 = 100_000;
const SCHEME: &str = "pbkdf2-sha256";
const SALT_LEN: usize = 16;
const HASH_LEN: usize = 32;
/// Most verified pairs a replica remembers.
const CACHE_LIMIT: usize = 4096;

/// Password checks (and hashes) running at once on a replica.
pub(crate) static LOGINS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// A stored hash no password matches, checked for unknown users so that a
/// refusal takes as long whether or not the user exists.
pub(crate) fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| {
        format!(
            "{SCHEME}${ITERATIONS}${}${}",
            B64.encode([0u8; SALT_LEN]),
            B64.encode([0u8; HASH_LEN])
        )
    })
}

/// Who made a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No user named.
    Anonymous,
    /// A user whose password was checked.
    User(String),
    /// The application in this process (an embedded `Node`'s own client):
    /// trusted, as the root user while access control is enabled.
    Internal,
}

/// The client certificates a call's connection presented (rustls verified
/// them against the CA), as tonic hands them over.
pub(crate) type Certificates = std::sync::Arc<Vec<CertificateDer<'static>>>;

/// The user a verified client certificate names: the common name of the
/// first certificate's subject (the client's own; rustls verified the chain
/// against the CA during the handshake), if the subject has exactly one
/// common name, in visible ASCII. A subject with several is no user:
/// readers disagree on which counts (Go's, and so etcd's, takes the last),
/// so a CA that checks one could be made to sign for another.
///
/// ```
/// // No certificate (plaintext, or TLS without one): no user.
/// assert_eq!(latchkey_server::auth::certificate_user(None), None);
/// ```
pub fn certificate_user(certs: Option<&[CertificateDer<'_>]>) -> Option<String> {
    let leaf = certs?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    let mut names = cert.subject().iter_common_name();
    let name = names.next()?.as_str().ok()?;
    if names.next().is_some() {
        return None;
    }
    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic())).then(|| name.to_string())
}

/// Hash `password` for storage, with a fresh salt.
pub fn hash_password(password: &str) -> Result<String, ReplicaFailure> {
    let mut salt = [0u8; SALT_LEN];
    getrandom::fill(&mut salt)
        .map_err(|e| ReplicaFailure::Unavailable(format!("cannot draw a password salt: {e}")))?;
    let mut hash = [0u8; HASH_LEN];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds(ITERATIONS),
        &salt,
        password.as_bytes(),
        &mut hash,
    );
    Ok(format!(
        "{SCHEME}${ITERATIONS}${}${}",
        B64.encode(salt),
        B64.encode(hash)
    ))
}

fn rounds(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

/// Whether `password` matches `stored` (a [`hash_password`] string). A
/// stored string this build cannot read matches nothing.
pub fn verify_password(stored: &str, password: &str) -> bool {
    let mut parts = stored.split('$');
    let (Some(SCHEME), Some(iterations), Some(salt), Some(hash), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let (Ok(iterations), Ok(salt), Ok(hash)) = (
        iterations.parse::<u32>(),
        B64.decode(salt),
        B64.decode(hash),
    ) else {
        return false;
    };
    if iterations == 0 || iterations > 10_000_000 {
        return false;
    }
    pbkdf2::verify(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds(iterations),
        &salt,
        password.as_bytes(),
        &hash,
    )
    .is_ok()
}

/// The user and password a call names, if any.
pub(crate) fn credentials(metadata: &MetadataMap) -> Result<Option<(String, String)>, Status> {
    let text = |key: &str| -> Result<Option<String>, Status> {
        match metadata.get(key) {
            None => Ok(None),
            Some(v) => v.to_str().map(|s| Some(s.to_string())).map_err(|_| {
                Status::unauthenticated(format!("the {key} metadata must be visible ASCII"))
            }),
        }
    };
    match (text(USER_HEADER)?, text(PASSWORD_HEADER)?) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) => Ok(Some((user, password))),
        (Some(_), None) => Err(Status::unauthenticated(format!(
            "the call names a user but no password ({PASSWORD_HEADER})"
        ))),
        (None, Some(_)) => Err(Status::unauthenticated(format!(
            "the call carries a password but names no user ({USER_HEADER})"
        ))),
    }
}

/// Pairs this replica has verified: user -> (stored hash, SHA-256 of the
/// password).
#[derive(Default)]
pub(crate) struct Verified {
    pairs: Mutex<BTreeMap<String, (String, Vec<u8>)>>,
}

impl Verified {
    /// Whether `password` is `user`'s, given the hash stored now.
    pub(crate) fn check(&self, user: &str, stored: &str, password: &str) -> bool {
        let fingerprint = digest::digest(&digest::SHA256, password.as_bytes())
            .as_ref()
            .to_vec();
        {
            let pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((hash, known)) = pairs.get(user) {
                if hash == stored && ring_eq(known, &fingerprint) {
                    return true;
                }
            }
        }
        if !verify_password(stored, password) {
            return false;
        }
        let mut pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        if pairs.len() >= CACHE_LIMIT {
            pairs.clear();
        }
        pairs.insert(user.to_string(), (stored.to_string(), fingerprint));
        true
    }
}

/// Refused logins are logged at most every 10 s.
static LAST_LOGGED: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new();

/// Log a refused login, at most one line every 10 seconds.
pub(crate) fn log_refusal(user: &str) {
    if LAST_LOGGED.allow() {
        tracing::warn!(
            %user,
            "refused a call with a wrong user or password (further refusals are logged at most \
             every 10 s)"
        );
    }
}

/// Equal bytes, compared in time that depends only on the lengths.
fn ring_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_against_its_own_hash_only() {
        let stored = hash_password("correct horse").expect("salt");
        assert!(stored.starts_with("pbkdf2-sha256$100000$"));
        assert!(verify_password(&stored, "correct horse"));
        assert!(!verify_password(&stored, "correct horsE"));
        assert!(!verify_password(&stored, ""));
        // Two hashes of one password differ (salted).
        assert_ne!(stored, hash_password("correct horse").expect("salt"));
        for garbage in [
            "",
            "pbkdf2-sha256$x$y$z",
            "md5$1$aa$bb",
            "pbkdf2-sha256$0$AA$AA",
        ] {
            assert!(!verify_password(garbage, "correct horse"), "{garbage}");
        }
    }

    #[test]
    fn the_cache_follows_the_stored_hash() {
        let verified = Verified::default();
        let old = hash_password("one").expect("salt");
        assert!(verified.check("u", &old, "one"));
        assert!(verified.check("u", &old, "one"));
        assert!(!verified.check("u", &old, "two"));
        // The password changed: the old one no longer passes.
        let new = hash_password("two").expect("salt");
        assert!(!verified.check("u", &new, "one"));
        assert!(verified.check("u", &new, "two"));
    }

    #[test]
    fn a_certificate_names_its_common_name() {
        use rcgen::DnType;
        let key = rcgen::KeyPair::generate().expect("a key");
        // The user a self-signed certificate with subject `names` names.
        let user_of = |names: &[(DnType, &str)]| {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
            params.distinguished_name = rcgen::DistinguishedName::new();
            for (kind, value) in names {
                params.distinguished_name.push(kind.clone(), *value);
            }
            let cert = params.self_signed(&key).expect("a certificate");
            certificate_user(Some(std::slice::from_ref(cert.der())))
        };
        let cn = DnType::CommonName;
        assert_eq!(user_of(&[(cn.clone(), "alice")]), Some("alice".into()));
        assert_eq!(user_of(&[]), None);
        assert_eq!(
            user_of(&[(cn.clone(), "alice"), (DnType::OrganizationName, "example")]),
            Some("alice".into())
        );
        // Two common names (the second as a custom type with the CN's
        // OID, 2.5.4.3): no user, whichever a reader would pick.
        let second_cn = DnType::CustomDnType(vec![2, 5, 4, 3]);
        assert_eq!(user_of(&[(cn.clone(), "alice"), (second_cn, "root")]), None);
        assert_eq!(user_of(&[(cn, "two words")]), None);
        assert_eq!(certificate_user(Some(&[])), None);
        assert_eq!(
            certificate_user(Some(&[CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])])),
            None
        );
    }

    #[test]
    fn credentials_come_in_pairs() {
        let mut m = MetadataMap::new();
        assert_eq!(credentials(&m).map_err(|s| s.code()), Ok(None));
        m.insert(USER_HEADER, "alice".parse().expect("ascii"));
        assert!(credentials(&m).is_err());
        m.insert(PASSWORD_HEADER, "pw".parse().expect("ascii"));
        assert_eq!(
            credentials(&m).map_err(|s| s.code()),
            Ok(Some(("alice".into(), "pw".into())))
        );
    }
}
