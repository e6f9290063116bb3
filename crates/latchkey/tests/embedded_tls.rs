//! TLS between clients and replicas and mutual TLS between peers, and what
//! is refused: a plaintext client on a TLS port, a TLS client on a
//! plaintext port, a replica certificate from another CA, client
//! certificates that are expired or from another CA, peer (Raft) or
//! membership calls without a client certificate, and a peer call whose
//! certificate (valid, of the cluster's CA) names another node than the
//! sender it claims. Each refusal leaves the
//! cluster serving, with the same leader and term.
//!
//! The certificates come from `latchkey::certs` (what `latchkey certs`
//! writes), made fresh for each test.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use latchkey::certs::{DevCa, Issued};
use latchkey::{Client, ClientOptions, Error, Identity, Node, ServerTls, TlsOptions};
use latchkey_proto::v1::RaftMessage;

mod common;

use common::{addrs, reserve, secret, settings, SecretHeader, SECRET};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(120);

fn loopback() -> Vec<String> {
    vec!["127.0.0.1".to_string(), "localhost".to_string()]
}

/// What node `id`'s certificate names: loopback, and its peer name.
fn node_names(id: u64) -> Vec<String> {
    let mut names = loopback();
    names.push(latchkey::peer_certificate_name(id));
    names
}

fn identity(issued: &Issued) -> Result<Identity, latchkey::TlsError> {
    Identity::from_pem(
        issued.cert_pem.clone().into_bytes(),
        issued.key_pem.clone().into_bytes(),
    )
}

fn trust(ca: &DevCa) -> Result<TlsOptions, latchkey::TlsError> {
    TlsOptions::new(ca.cert_pem().into_bytes())
}

/// `n` nodes forming a TLS cluster whose certificates `ca` signs.
async fn start_tls_cluster(
    dir: &Path,
    n: u64,
    ca: &DevCa,
    require_client_certificate: bool,
    certificate_users: bool,
) -> Result<BTreeMap<u64, Node>, Box<dyn std::error::Error>> {
    let listeners = reserve(n)?;
    let members = addrs(&listeners)?;
    let mut nodes = BTreeMap::new();
    for (id, ports) in listeners {
        let cert = ca.issue(&format!("latchkey node {id}"), &node_names(id), false)?;
        let tls = ServerTls::new(identity(&cert)?, trust(ca)?)
            .require_client_certificate(require_client_certificate)
            .certificate_users(certificate_users);
        let node = Node::builder(id)
            .listener(ports.client)
            .peer_listener(ports.peer)
            .data_dir(dir.join(format!("node-{id}")))
            .initial_members(members.iter().cloned())
            .raft_settings(settings())
            .cluster_secret(secret())
            .tls(tls)
            .start()
            .await?;
        nodes.insert(id, node);
    }
    Ok(nodes)
}

fn client(nodes: &BTreeMap<u64, Node>, tls: Option<TlsOptions>) -> Result<Client, Error> {
    let mut options = ClientOptions::default()
        .with_request_timeout(Duration::from_secs(2))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_cluster_secret(SECRET);
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    Client::with_options(nodes.values().map(|n| n.local_addr().to_string()), options)
}

/// (leader, term) as every node sees it, once they agree.
async fn agreed(nodes: &BTreeMap<u64, Node>) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen: Vec<_> = nodes
            .values()
            .map(|n| {
                let s = n.status();
                (s.leader_id, s.term)
            })
            .collect();
        if let Some((Some(leader), term)) = seen.first().copied() {
            if seen.iter().all(|s| *s == (Some(leader), term)) {
                return Ok((leader, term));
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the nodes do not agree on a leader: {seen:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A vote from node 2's id and incarnation, to `node`, with a higher term.
fn vote_for(
    node: &Node,
    from: &Node,
    term: u64,
) -> Result<RaftMessage, Box<dyn std::error::Error>> {
    let vote = latchkey_storage::types::VoteWire {
        vote: latchkey_storage::types::Vote::new(term + 100, from.id()),
        last_log_id: None,
    };
    Ok(RaftMessage {
        payload: latchkey_core::codec::encode(&vote)?.into(),
        to_id: node.id(),
        to_incarnation: node.incarnation(),
        from_id: from.id(),
        from_incarnation: from.incarnation(),
        leadership_transfer: false,
    })
}

/// A Raft client to `addr` over TLS with `tls`, sending the cluster secret.
fn raft_over_tls(
    addr: &str,
    tls: &TlsOptions,
) -> Result<common::RaftCaller, Box<dyn std::error::Error>> {
    let channel = latchkey_proto::channel(addr, Duration::from_secs(2), Some(tls))?;
    Ok(
        latchkey_proto::v1::raft_client::RaftClient::with_interceptor(
            channel,
            SecretHeader(Some(SECRET)),
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_and_refuses_what_it_must() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let ca = DevCa::new("test CA")?;
        let rogue = DevCa::new("rogue CA")?;
        // The peers elect a leader: Raft runs over mutual TLS.
        let nodes = start_tls_cluster(dir.path(), 3, &ca, false, false).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;

        // A client trusting the CA works, locks and fenced writes included.
        let good = client(&nodes, Some(trust(&ca)?))?;
        good.put("tls/k", "v").await?;
        assert_eq!(good.get("tls/k").await?, Some(b"v".to_vec()));
        let session = good.session(Duration::from_secs(10)).await?;
        let guard = session.lock("tls/lock").acquire().await?;
        guard.put("tls/fenced", "yes").await?;
        guard.release().await?;
        session.close().await?;
        // The nodes' own (in-process) clients reach the others over TLS.
        for node in nodes.values() {
            assert_eq!(node.client().get("tls/k").await?, Some(b"v".to_vec()));
        }
        let (leader, term) = agreed(&nodes).await?;

        // A plaintext client on the TLS port gets nothing through.
        let plain = client(&nodes, None)?;
        let refused = plain.get("tls/k").await;
        assert!(
            refused.is_err(),
            "a plaintext client was answered: {refused:?}"
        );
        // A client trusting another CA refuses the replicas' certificates.
        let misled = client(&nodes, Some(trust(&rogue)?))?;
        let refused = misled.get("tls/k").await;
        let text = format!("{refused:?}").to_lowercase();
        assert!(
            refused.is_err() && text.contains("certificate"),
            "a client trusting another CA: {refused:?}"
        );

        // Peer calls over TLS without a client certificate are refused
        // whatever they carry, even the right secret and a member's id.
        let target = &nodes[&leader];
        let member = nodes
            .values()
            .find(|n| n.id() != leader)
            .ok_or("no follower")?;
        let addr = target.peer_addr().to_string();
        let mut anonymous = raft_over_tls(&addr, &trust(&ca)?)?;
        let answer = anonymous.vote(vote_for(target, member, term)?).await;
        let text = format!("{answer:?}").to_lowercase();
        assert!(
            answer.is_err() && text.contains("certificate"),
            "a vote without a client certificate: {answer:?}"
        );
        // A valid certificate of the cluster's CA speaks only for the node
        // it names: another node's certificate (or a client's) claiming to
        // be this member is refused.
        let other_id = nodes
            .keys()
            .copied()
            .find(|id| *id != leader && *id != member.id())
            .ok_or("no third node")?;
        let impostors = [
            ca.issue("latchkey node", &node_names(other_id), false)?,
            ca.issue("latchkey client", &[], false)?,
        ];
        for impostor in &impostors {
            let tls = trust(&ca)?.with_identity(identity(impostor)?);
            let mut raft = raft_over_tls(&addr, &tls)?;
            let answer = raft.vote(vote_for(target, member, term)?).await;
            assert_eq!(
                answer.as_ref().map(|_| ()).map_err(|s| s.code()),
                Err(tonic::Code::PermissionDenied),
                "a vote from node {} with another's certificate: {answer:?}",
                member.id()
            );
        }
        // Client certificates from another CA, or expired ones, fail the
        // handshake: no call gets through.
        let stranger = rogue.issue("stranger", &loopback(), false)?;
        let expired = ca.issue("expired", &loopback(), true)?;
        for (what, cert) in [("another CA's", &stranger), ("an expired", &expired)] {
            let tls = trust(&ca)?.with_identity(identity(cert)?);
            let mut raft = raft_over_tls(&addr, &tls)?;
            let answer = raft.vote(vote_for(target, member, term)?).await;
            assert!(
                answer.is_err(),
                "a vote with {what} client certificate was answered: {answer:?}"
            );
            let tls_client = client(&nodes, Some(tls))?;
            let refused = tls_client.get("tls/k").await;
            assert!(
                refused.is_err(),
                "a client with {what} certificate was answered: {refused:?}"
            );
        }
        // Membership changes without a client certificate are refused too,
        // though the client has the cluster secret.
        let refused = good.add_member(9, "127.0.0.1:1", false).await;
        let text = format!("{refused:?}").to_lowercase();
        assert!(
            refused.is_err() && text.contains("certificate"),
            "a membership change without a client certificate: {refused:?}"
        );

        // Nothing moved: same leader and term, and the cluster serves.
        assert_eq!(agreed(&nodes).await?, (leader, term));
        good.put("tls/after", "ok").await?;
        for (_, node) in nodes {
            node.shutdown().await;
        }
        Ok(())
    })
    .await?
}

/// With client certificates required, a client without one is refused at
/// the handshake and one with a certificate of the CA is served; a TLS
/// client on a plaintext replica fails instead of falling back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_when_required_and_no_fallback_to_plaintext() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let ca = DevCa::new("test CA")?;
        let nodes = start_tls_cluster(dir.path(), 1, &ca, true, false).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let anonymous = client(&nodes, Some(trust(&ca)?))?;
        let refused = anonymous.put("k", "v").await;
        assert!(
            refused.is_err(),
            "a client without a certificate: {refused:?}"
        );
        let cert = ca.issue("latchkey client", &[], false)?;
        let with_cert = client(&nodes, Some(trust(&ca)?.with_identity(identity(&cert)?)))?;
        with_cert.put("k", "v").await?;
        assert_eq!(with_cert.get("k").await?, Some(b"v".to_vec()));
        // The node's own client presents the node's certificate.
        assert_eq!(nodes[&1].client().get("k").await?, Some(b"v".to_vec()));
        for (_, node) in nodes {
            node.shutdown().await;
        }

        // A plaintext replica, and a client that insists on TLS.
        let (plain_nodes, _) = common::start_cluster(&dir.path().join("plain"), 1).await?;
        plain_nodes[&1]
            .wait_for_leader(Duration::from_secs(30))
            .await?;
        let tls_client = client(&plain_nodes, Some(trust(&ca)?))?;
        let refused = tls_client.get("k").await;
        assert!(
            refused.is_err(),
            "a TLS client on a plaintext port: {refused:?}"
        );
        for (_, node) in plain_nodes {
            node.shutdown().await;
        }
        Ok(())
    })
    .await?
}

/// `options` on every node of `nodes`, with the cluster's CA and, if
/// given, a client certificate.
fn tls_client(
    nodes: &BTreeMap<u64, Node>,
    ca: &DevCa,
    cert: Option<&Issued>,
    options: ClientOptions,
) -> Result<Client, Box<dyn std::error::Error>> {
    let mut tls = trust(ca)?;
    if let Some(cert) = cert {
        tls = tls.with_identity(identity(cert)?);
    }
    Ok(Client::with_options(
        nodes.values().map(|n| n.local_addr().to_string()),
        options
            .with_request_timeout(Duration::from_secs(5))
            .with_tls(tls),
    )?)
}

/// With access control on, a client certificate of the cluster's CA whose
/// common name is a user authenticates as that user without a password,
/// with that user's grants only; a certificate naming no user is
/// anonymous; one naming the user but from another CA is refused at the
/// handshake; and a membership change made with a certificate user who
/// lacks admin is refused even with the cluster secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_its_user() -> TestResult {
    use latchkey::{CommandError, Permission};
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let ca = DevCa::new("test CA")?;
        let rogue = DevCa::new("rogue CA")?;
        let nodes = start_tls_cluster(dir.path(), 3, &ca, false, true).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let admin = tls_client(&nodes, &ca, None, ClientOptions::default())?;
        admin.add_user("root", Some("root-pw")).await?;
        admin.add_user("alice", None).await?;
        admin.add_role("jobs").await?;
        admin
            .grant_permission("jobs", Permission::Write, "jobs/")
            .await?;
        admin
            .grant_permission("jobs", Permission::Read, "jobs/")
            .await?;
        admin.grant_role("alice", "jobs").await?;
        admin.auth_enable().await?;

        let alice_cert = ca.issue("alice", &[], false)?;
        let alice = tls_client(&nodes, &ca, Some(&alice_cert), ClientOptions::default())?;
        assert_eq!(
            alice.auth_status().await?,
            (true, Some("alice".to_string()))
        );
        alice.put("jobs/1", "queued").await?;
        assert_eq!(alice.get("jobs/1").await?, Some(b"queued".to_vec()));
        match alice.put("billing/1", "x").await {
            Err(Error::Refused(CommandError::PermissionDenied {
                user, permission, ..
            })) if user == "alice" && permission == Permission::Write => {}
            other => return Err(format!("alice outside her prefix: {other:?}").into()),
        }

        // A certificate of the CA that names no user is anonymous.
        let nobody_cert = ca.issue("nobody", &[], false)?;
        let nobody = tls_client(&nodes, &ca, Some(&nobody_cert), ClientOptions::default())?;
        match nobody.put("jobs/2", "x").await {
            Err(Error::Refused(CommandError::AuthRequired)) => {}
            other => return Err(format!("a certificate naming no user: {other:?}").into()),
        }
        // The same name from another CA does not even connect.
        let forged_cert = rogue.issue("alice", &[], false)?;
        let forged = tls_client(&nodes, &ca, Some(&forged_cert), ClientOptions::default())?;
        let refused = forged.get("jobs/1").await;
        assert!(
            refused.is_err(),
            "alice's name from a rogue CA: {refused:?}"
        );

        // On the peer listener the certificate names who makes the change:
        // alice holds the secret and a certificate of the CA, but not admin.
        let alice_peer = tls_client(
            &nodes,
            &ca,
            Some(&alice_cert),
            ClientOptions::default().with_cluster_secret(SECRET),
        )?;
        match alice_peer.change_voters([1, 2, 3]).await {
            Err(Error::Refused(CommandError::PermissionDenied {
                user, permission, ..
            })) if user == "alice" && permission == Permission::Admin => {}
            other => return Err(format!("a membership change by alice: {other:?}").into()),
        }
        // A root certificate on the peer listener may change it.
        let root_cert = ca.issue("root", &[], false)?;
        let root_peer = tls_client(
            &nodes,
            &ca,
            Some(&root_cert),
            ClientOptions::default().with_cluster_secret(SECRET),
        )?;
        root_peer.change_voters([1, 2, 3]).await?;
        // Which credential wins: a named user over the certificate, and on
        // the client listener the cluster secret (root) over it too.
        let alice_as_root = tls_client(
            &nodes,
            &ca,
            Some(&alice_cert),
            ClientOptions::default().with_user("root", "root-pw"),
        )?;
        assert_eq!(
            alice_as_root.auth_status().await?,
            (true, Some("root".to_string()))
        );
        assert_eq!(alice_peer.auth_status().await?, (true, None));
        alice_peer.put("billing/1", "as the cluster").await?;
        assert_eq!(alice.get("jobs/1").await?, Some(b"queued".to_vec()));
        for (_, node) in nodes {
            node.shutdown().await;
        }
        Ok(())
    })
    .await?
}
