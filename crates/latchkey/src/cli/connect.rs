//! How the tool reaches a cluster: the client built from the global
//! options (endpoints, timeout, cluster secret, TLS files, user).

use std::time::Duration;

use latchkey::{Client, ClientOptions, ClusterSecret, TlsOptions};

use super::args::Args;
use super::failure::Failure;

/// The client for `args`' endpoints, with their timeout, cluster secret,
/// TLS settings and user.
pub fn client(args: &Args) -> Result<Client, Failure> {
    if args.endpoints.iter().all(|e| e.trim().is_empty()) {
        return Err(Failure::Usage(
            "no endpoints: pass --endpoints host:port,... or set LATCHKEY_ENDPOINTS".into(),
        ));
    }
    let mut options = ClientOptions::default()
        .with_request_timeout(args.timeout)
        .with_attempt_timeout(args.timeout.min(Duration::from_secs(3)));
    if let Some(path) = &args.cluster_secret_file {
        let secret = ClusterSecret::from_file(path).map_err(|e| Failure::Usage(e.to_string()))?;
        options = options.with_cluster_secret(secret.as_str());
    }
    if let Some(tls) = client_tls(args)? {
        options = options.with_tls(tls);
    }
    if let Some(user) = &args.user {
        let (name, password) = match (user.split_once(':'), &args.password) {
            (Some((name, password)), None) => (name.to_string(), password.to_string()),
            (None, Some(password)) => (user.clone(), password.clone()),
            (Some(_), Some(_)) => {
                return Err(Failure::Usage(
                    "give the password once: --user NAME:PASSWORD or --password, not both".into(),
                ))
            }
            (None, None) => {
                return Err(Failure::Usage(format!(
                    "--user {user} needs a password: --password, LATCHKEY_PASSWORD or \
                     --user {user}:PASSWORD"
                )))
            }
        };
        options = options.with_user(name, password);
    }
    let endpoints = args.endpoints.iter().filter(|e| !e.trim().is_empty());
    Ok(Client::with_options(endpoints, options)?)
}

/// `--cert` and `--key` go together.
pub fn identity_paths(
    args: &Args,
) -> Result<Option<(&std::path::Path, &std::path::Path)>, Failure> {
    match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Ok(Some((cert.as_path(), key.as_path()))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(Failure::Usage(
            "--cert needs --key (its private key)".into(),
        )),
        (None, Some(_)) => Err(Failure::Usage("--key needs --cert".into())),
    }
}

/// The client's TLS settings: with --cacert, TLS; with --cert and --key
/// too, a client certificate.
pub fn client_tls(args: &Args) -> Result<Option<TlsOptions>, Failure> {
    let identity = identity_paths(args)?;
    match &args.cacert {
        Some(ca) => TlsOptions::from_files(ca, identity)
            .map(Some)
            .map_err(|e| Failure::Usage(e.to_string())),
        None if identity.is_some() => Err(Failure::Usage(
            "--cert and --key need --cacert (the CA that signs the replicas' certificates)".into(),
        )),
        None => Ok(None),
    }
}

/// The non-empty `--endpoints`, trimmed.
pub fn endpoints(args: &Args) -> Vec<String> {
    args.endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect()
}
