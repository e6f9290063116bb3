//! `serve`: run one replica in the foreground until SIGINT or SIGTERM (or
//! until it fails), configured from its flags and the global TLS options.

use std::process::ExitCode;
use std::time::Duration;

use latchkey::{ClusterSecret, ClusterState, Node, RaftSettings, ServerTls};

use super::args::{Args, InitialClusterState, LogFormat, Serve};
use super::connect::identity_paths;
use super::failure::Failure;

/// `serve`: flags and files it cannot use are a configuration error (exit
/// 9), not "cluster unavailable"; a replica that fails exits 8.
pub async fn run(args: &Args, s: &Serve) -> Result<ExitCode, Failure> {
    let tls = server_tls(args, s).map_err(|f| Failure::Config(f.to_string()))?;
    serve_until_stopped(s, args.cluster_secret_file.as_deref(), tls).await
}

/// The replica's TLS settings: --cert, --key and --cacert together, or none.
fn server_tls(args: &Args, serve: &Serve) -> Result<Option<ServerTls>, Failure> {
    match (identity_paths(args)?, &args.cacert) {
        (Some((cert, key)), Some(ca)) => ServerTls::from_files(cert, key, ca)
            .map(|tls| {
                Some(
                    tls.require_client_certificate(serve.client_cert_auth)
                        .certificate_users(serve.client_cert_users),
                )
            })
            .map_err(|e| Failure::Usage(e.to_string())),
        (None, None) if serve.client_cert_auth || serve.client_cert_users => Err(Failure::Usage(
            "--client-cert-auth and --client-cert-users need TLS: --cert, --key and --cacert"
                .into(),
        )),
        (None, None) => Ok(None),
        (Some(_), None) => Err(Failure::Usage(
            "serve with --cert needs --cacert (the CA that signs every replica's certificate)"
                .into(),
        )),
        (None, Some(_)) => Err(Failure::Usage(
            "serve with --cacert needs --cert and --key (this replica's certificate)".into(),
        )),
    }
}

/// Start the replica, log that it serves, and wait for a signal or its
/// failure; then shut it down (for at most 5 s).
async fn serve_until_stopped(
    s: &Serve,
    secret_file: Option<&std::path::Path>,
    tls: Option<ServerTls>,
) -> Result<ExitCode, Failure> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match s.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => logs.json().try_init(),
    };
    let settings = RaftSettings::default()
        .with_heartbeat(s.heartbeat)
        .with_election_min(s.election_timeout)
        .with_election_max(s.election_timeout * 2)
        .with_snapshot_every(s.snapshot_every)
        .with_keep_after_snapshot(s.keep_after_snapshot);
    let state = match s.initial_cluster_state {
        InitialClusterState::New => ClusterState::New,
        InitialClusterState::Existing => ClusterState::Existing,
    };
    let mut builder = Node::builder(s.id)
        .listen(s.listen)
        .data_dir(&s.data_dir)
        .initial_members(s.initial_members.iter().cloned())
        .initial_cluster_state(state)
        .max_connections(s.max_connections)
        .max_connections_per_address(s.max_connections_per_address)
        .raft_settings(settings);
    if let Some(a) = &s.advertise {
        builder = builder.advertise(a.clone());
    }
    if let Some(a) = s.peer_listen {
        builder = builder.peer_listen(a);
    }
    if let Some(a) = s.metrics_listen {
        builder = builder.metrics_listen(a);
    }
    if let Some(path) = secret_file {
        let secret = ClusterSecret::from_file(path).map_err(|e| Failure::Config(e.to_string()))?;
        builder = builder.cluster_secret(secret);
    }
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    let node = builder.start().await.map_err(|e| match e {
        latchkey::NodeError::Config(why) => {
            Failure::Config(format!("cannot start node {}: {why}", s.id))
        }
        e => Failure::ReplicaFailed(format!("cannot start node {}: {e}", s.id)),
    })?;
    tracing::info!(
        id = s.id,
        listen = %node.local_addr(),
        peer_listen = %node.peer_addr(),
        metrics_listen = ?node.metrics_addr(),
        incarnation = node.incarnation(),
        "serving"
    );
    // A failed replica exits (non-zero) so that its supervisor restarts it;
    // it never stays up holding its port while serving nothing.
    let failed = tokio::select! {
        _ = wait_for_signal() => None,
        cause = node.failed() => Some(cause),
    };
    tracing::info!("shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(5), node.shutdown()).await;
    match failed {
        None => Ok(ExitCode::SUCCESS),
        Some(cause) => Err(Failure::ReplicaFailed(format!(
            "node {} failed: {cause}",
            s.id
        ))),
    }
}

/// Until SIGTERM or SIGINT arrives (Ctrl-C if those cannot be watched).
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
