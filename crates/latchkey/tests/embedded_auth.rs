//! Access control end to end on a real three-node cluster: users, roles and
//! grants set through the Rust client, enforced on every call once enabled,
//! with typed refusals that name the missing permission; sessions belong to
//! the user who opened them; wrong passwords are refused; the embedded
//! application keeps root's rights.

use std::time::Duration;

use latchkey::{Client, ClientOptions, CommandError, Error, Permission};
use latchkey_core::auth::Permission as P;
use latchkey_proto::v1;

mod common;

use common::{client_addrs, start_cluster};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(120);

fn as_user(nodes: &[String], user: Option<(&str, &str)>) -> Result<Client, Error> {
    let mut options = ClientOptions::default().with_request_timeout(Duration::from_secs(10));
    if let Some((name, password)) = user {
        options = options.with_user(name, password);
    }
    Client::with_options(nodes, options)
}

/// `result` is a permission refusal for `user` lacking `permission`.
fn denied<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    user: &str,
    permission: Permission,
) -> TestResult {
    match result {
        Err(Error::Refused(CommandError::PermissionDenied {
            user: u,
            permission: p,
            on,
        })) if u == user && p == permission => {
            assert!(!on.is_empty(), "{what}: names what it was needed on");
            Ok(())
        }
        other => {
            Err(format!("{what}: expected {permission} denied to {user}, got {other:?}").into())
        }
    }
}

fn auth_required<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) -> TestResult {
    match result {
        Err(Error::Refused(CommandError::AuthRequired)) => Ok(()),
        other => Err(format!("{what}: expected AuthRequired, got {other:?}").into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_is_enforced_on_every_call() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let addrs = client_addrs(&nodes);
        let anonymous = as_user(&addrs, None)?;

        // Enabling needs a root user first.
        match anonymous.auth_enable().await {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("root"), "{why}"),
            other => return Err(format!("enable without root: {other:?}").into()),
        }
        anonymous.add_user("root", Some("root-pw")).await?;
        anonymous.add_user("app", Some("app-pw")).await?;
        anonymous.add_user("other", Some("other-pw")).await?;
        anonymous.add_role("jobs").await?;
        anonymous.grant_permission("jobs", P::Read, "jobs/").await?;
        anonymous
            .grant_permission("jobs", P::Write, "jobs/")
            .await?;
        anonymous.grant_permission("jobs", P::Lock, "jobs-").await?;
        anonymous.grant_role("app", "jobs").await?;
        anonymous.grant_role("other", "jobs").await?;
        // Still open to everyone until enabled.
        anonymous.put("before", "v").await?;
        anonymous.auth_enable().await?;
        let status = anonymous.auth_status().await;
        assert_eq!(status.ok(), Some((true, None)), "anonymous status");

        // No user: refused, reads and writes alike; nothing written.
        auth_required("anonymous put", anonymous.put("jobs/x", "v").await)?;
        auth_required("anonymous get", anonymous.get("before").await)?;

        // A wrong password is refused before anything runs.
        let intruder = as_user(&addrs, Some(("app", "wrong")))?;
        match intruder.put("jobs/x", "v").await {
            Err(Error::InvalidArgument(why)) => {
                assert!(why.contains("wrong user or password"), "{why}")
            }
            other => return Err(format!("wrong password: {other:?}").into()),
        }

        // The role's grants, and nothing else.
        let app = as_user(&addrs, Some(("app", "app-pw")))?;
        let status = app.auth_status().await;
        assert_eq!(
            status.ok(),
            Some((true, Some("app".to_string()))),
            "app's status"
        );
        app.put("jobs/1", "queued").await?;
        assert_eq!(app.get("jobs/1").await?, Some(b"queued".to_vec()));
        let page = app.scan(latchkey::ScanRange::prefix("jobs/", 0)).await?;
        assert_eq!(page.entries.len(), 1);
        denied(
            "put outside the prefix",
            app.put("billing/1", "x").await,
            "app",
            P::Write,
        )?;
        denied(
            "get outside the prefix",
            app.get("before").await,
            "app",
            P::Read,
        )?;
        denied(
            "scan of everything",
            app.scan(latchkey::ScanRange::prefix("", 0)).await,
            "app",
            P::Read,
        )?;
        denied(
            "sequence outside",
            app.next_sequence("ids", 1).await,
            "app",
            P::Write,
        )?;
        denied(
            "admin",
            app.add_user("mallory", Some("x")).await,
            "app",
            P::Admin,
        )?;
        denied("disable", app.auth_disable().await, "app", P::Admin)?;

        // Locks: within the lock prefix only; the session is app's.
        let session = app.session(Duration::from_secs(5)).await?;
        let guard = session.lock("jobs-1").acquire().await?;
        denied(
            "lock outside the prefix",
            session.lock("billing").try_acquire().await,
            "app",
            P::Lock,
        )?;
        // Another user with the same role and the session's own secret
        // still cannot act for app's session.
        // Straight to the leader (raw calls do not follow NOT_LEADER).
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let leader_addr = nodes[&leader].advertise_addr();
        let channel = latchkey_proto::channel(leader_addr, Duration::from_secs(2), None)?;
        let mut lock = v1::lock_client::LockClient::new(channel);
        let mut release = tonic::Request::new(v1::ReleaseRequest {
            session: session.id().0,
            session_secret: session.secret().0.to_vec(),
            owner: 1,
            request_id: 1_000,
            name: "jobs-1".into(),
            token: guard.token().0,
        });
        release
            .metadata_mut()
            .insert(latchkey_proto::USER_HEADER, "other".parse()?);
        release
            .metadata_mut()
            .insert(latchkey_proto::PASSWORD_HEADER, "other-pw".parse()?);
        let refused = lock
            .release(release)
            .await?
            .into_inner()
            .error
            .ok_or("released")?;
        assert_eq!(
            refused.kind,
            v1::ErrorKind::PermissionDenied as i32,
            "{refused:?}"
        );
        assert_eq!(refused.user, "other");
        assert!(refused.resource.contains("another user's"), "{refused:?}");
        // Nor keep it alive, with its secret or without a user at all.
        for user in [Some(("other", "other-pw")), None] {
            let mut keep_alive = tonic::Request::new(v1::KeepAliveRequest {
                session: session.id().0,
                session_secret: session.secret().0.to_vec(),
            });
            if let Some((name, password)) = user {
                keep_alive
                    .metadata_mut()
                    .insert(latchkey_proto::USER_HEADER, name.parse()?);
                keep_alive
                    .metadata_mut()
                    .insert(latchkey_proto::PASSWORD_HEADER, password.parse()?);
            }
            let reply = lock.keep_alive(keep_alive).await;
            let kind = match &reply {
                Ok(r) => r.get_ref().error.as_ref().map(|e| e.kind),
                Err(_) => None,
            };
            let expected = if user.is_some() {
                v1::ErrorKind::PermissionDenied
            } else {
                v1::ErrorKind::AuthRequired
            };
            assert_eq!(
                kind,
                Some(expected as i32),
                "keep-alive as {user:?}: {reply:?}"
            );
        }
        assert!(guard.is_held());
        guard.put("jobs/fenced", "ok").await?;
        guard.release().await?;
        session.close().await?;

        // The embedded application acts as root.
        nodes[&2].client().put("billing/1", "internal").await?;
        // Every replica holds the same rules (they are replicated state).
        for addr in &addrs {
            let one = as_user(std::slice::from_ref(addr), Some(("app", "app-pw")))?;
            assert!(one.auth_status().await?.0, "{addr}");
        }

        // Root sees users and roles and turns access control off.
        let root = as_user(&addrs, Some(("root", "root-pw")))?;
        let (users, roles) = root.list_users_and_roles().await?;
        assert_eq!(users, ["app", "other", "root"]);
        assert_eq!(roles, ["jobs"]);
        let jobs = root.get_role("jobs").await?.ok_or("no role jobs")?;
        assert_eq!(jobs.len(), 3);
        let app_info = root.get_user("app").await?.ok_or("no user app")?;
        assert_eq!(app_info.roles, ["jobs"]);
        assert!(app_info.has_password);
        match root.delete_user("root").await {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("root"), "{why}"),
            other => return Err(format!("deleting root while enabled: {other:?}").into()),
        }

        // Membership changes need an admin by name: the cluster secret (the
        // peer listener's credential) is not enough on its own, nor with a
        // user who lacks admin. ChangeVoters to the same voters changes
        // nothing when allowed.
        let with_secret = |user: Option<(&str, &str)>| {
            let mut options = ClientOptions::default()
                .with_request_timeout(Duration::from_secs(10))
                .with_cluster_secret(common::SECRET);
            if let Some((name, password)) = user {
                options = options.with_user(name, password);
            }
            Client::with_options(&addrs, options)
        };
        let voters = [1, 2, 3];
        auth_required(
            "membership change with the secret alone",
            with_secret(None)?.change_voters(voters).await,
        )?;
        auth_required(
            "membership change without a user",
            with_secret(None)?
                .add_member(4, &nodes[&3].peer_addr().to_string(), true)
                .await,
        )?;
        denied(
            "membership change by a user without admin",
            with_secret(Some(("app", "app-pw")))?
                .change_voters(voters)
                .await,
            "app",
            P::Admin,
        )?;
        with_secret(Some(("root", "root-pw")))?
            .change_voters(voters)
            .await?;
        let members: Vec<u64> = nodes[&1].status().members.iter().map(|m| m.id).collect();
        assert_eq!(members, voters, "the membership is unchanged");

        root.auth_disable().await?;
        assert_eq!(
            anonymous.get("billing/1").await?,
            Some(b"internal".to_vec())
        );
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
