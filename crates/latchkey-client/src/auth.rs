//! Access control from the client: turning it on and off, users, roles and
//! their grants (the replicas' `Auth` service; see `latchkey_core::auth`
//! for the rules). Every call is made as the client's own user
//! ([`ClientOptions::with_user`](crate::ClientOptions::with_user)); while
//! access control is enabled, each needs the admin permission except
//! [`Client::auth_status`]. An example is on [`Client::auth_enable`].

use latchkey_core::auth::Permission;
use latchkey_proto::v1::{self, auth_change_request::Change, auth_client::AuthClient};
use latchkey_proto::MAX_MESSAGE_BYTES;
use tonic::transport::Channel;

use crate::error::Error;
use crate::kv::Client;
use crate::router::Target;
use crate::transport::{as_user, classify_status, refused, Attempt, Credentials};

/// A user as the replicas report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// Its roles, in name order.
    pub roles: Vec<String>,
    /// It can log in with a password.
    pub has_password: bool,
}

fn auth_client(channel: Channel) -> AuthClient<Channel> {
    AuthClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// `role` with the grant of `permission` on `prefix`.
fn role_grant(role: &str, permission: Permission, prefix: &[u8]) -> v1::AuthRoleGrant {
    v1::AuthRoleGrant {
        role: role.to_string(),
        grant: Some(latchkey_proto::wire::grant_to_wire(
            latchkey_core::auth::Grant {
                permission,
                prefix: prefix.to_vec(),
            },
        )),
    }
}

impl Client {
    /// An `Auth` client on `target`'s channel, with this client's user.
    fn auth_target(target: Target) -> Result<AuthClient<Channel>, Attempt> {
        match target {
            Target::Remote { channel, .. } => Ok(auth_client(channel)),
            Target::Local(_) => Err(Attempt::NotSent("access-control calls go over gRPC".into())),
        }
    }

    fn as_user<T>(&self, message: T) -> Result<tonic::Request<T>, Attempt> {
        let user = Credentials::new(self.router().options()).map_err(Attempt::not_usable)?;
        Ok(as_user(&user, message))
    }

    /// One `Auth` call of `message` (`rpc` makes it), through the router
    /// (retried like any read, or any write with `is_write`); `answer`
    /// splits the reply into its typed error and its value.
    async fn auth_call<Q, R, T, Fut>(
        &self,
        is_write: bool,
        message: Q,
        rpc: impl Fn(AuthClient<Channel>, tonic::Request<Q>) -> Fut,
        answer: impl Fn(R) -> (Option<v1::Error>, T),
    ) -> Result<T, Error>
    where
        Q: Clone,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        self.router()
            .call(is_write, |target, _| {
                let message = message.clone();
                let (rpc, answer) = (&rpc, &answer);
                async move {
                    let auth = Self::auth_target(target)?;
                    let request = self.as_user(message)?;
                    match rpc(auth, request).await {
                        Ok(reply) => {
                            let (error, value) = answer(reply.into_inner());
                            Ok(refused(error)?.map(|()| value))
                        }
                        Err(status) => Err(classify_status(&status)),
                    }
                }
            })
            .await?
            .map_err(Error::Refused)
    }

    async fn auth_change(&self, change: Change) -> Result<(), Error> {
        let message = v1::AuthChangeRequest {
            change: Some(change),
        };
        self.auth_call(
            true,
            message,
            |mut auth, request| async move { auth.change(request).await },
            |reply: v1::AuthChangeReply| (reply.error, ()),
        )
        .await
    }

    /// Whether access control is enabled, and which user this client is
    /// (`None`: it names none).
    pub async fn auth_status(&self) -> Result<(bool, Option<String>), Error> {
        self.auth_call(
            false,
            v1::AuthStatusRequest {},
            |mut auth, request| async move { auth.status(request).await },
            |reply: v1::AuthStatusReply| {
                let user = (!reply.user.is_empty()).then_some(reply.user);
                (reply.error, (reply.enabled, user))
            },
        )
        .await
    }

    /// Turn access control on. Refused unless a user named `root` exists
    /// (it gets the root role: every permission). From then on every call
    /// must name a user.
    ///
    /// Every access-control call is made as the client's own user
    /// ([`ClientOptions::with_user`](crate::ClientOptions::with_user));
    /// while access control is enabled, each needs the admin permission
    /// except [`Client::auth_status`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), latchkey_client::Error> {
    /// use latchkey_client::{Client, ClientOptions, Permission};
    ///
    /// let admin = Client::connect(["127.0.0.1:7101"])?;
    /// admin.add_user("root", Some("root-password")).await?;
    /// admin.add_user("app", Some("app-password")).await?;
    /// admin.add_role("jobs").await?;
    /// admin.grant_permission("jobs", Permission::Write, "jobs/").await?;
    /// admin.grant_role("app", "jobs").await?;
    /// admin.auth_enable().await?;
    ///
    /// let app = Client::with_options(
    ///     ["127.0.0.1:7101"],
    ///     ClientOptions::default().with_user("app", "app-password"),
    /// )?;
    /// app.put("jobs/1", "queued").await?;          // allowed
    /// assert!(app.put("billing/1", "x").await.is_err()); // PermissionDenied
    /// # Ok(()) }
    /// ```
    pub async fn auth_enable(&self) -> Result<(), Error> {
        self.auth_change(Change::Enable(v1::AuthEmpty {})).await
    }

    /// Turn access control off (needs admin while it is on).
    pub async fn auth_disable(&self) -> Result<(), Error> {
        self.auth_change(Change::Disable(v1::AuthEmpty {})).await
    }

    /// Add a user, with a password or without one (`None`: it cannot log
    /// in with a password). The replica stores only a salted hash.
    pub async fn add_user(&self, name: &str, password: Option<&str>) -> Result<(), Error> {
        self.auth_change(Change::AddUser(v1::AuthUser {
            name: name.to_string(),
            password: password.unwrap_or_default().to_string(),
        }))
        .await
    }

    /// Set (or with `None`, clear) a user's password.
    pub async fn change_password(&self, name: &str, password: Option<&str>) -> Result<(), Error> {
        self.auth_change(Change::ChangePassword(v1::AuthUser {
            name: name.to_string(),
            password: password.unwrap_or_default().to_string(),
        }))
        .await
    }

    /// Remove a user.
    pub async fn delete_user(&self, name: &str) -> Result<(), Error> {
        self.auth_change(Change::DeleteUser(name.to_string())).await
    }

    /// Add a role without grants.
    pub async fn add_role(&self, name: &str) -> Result<(), Error> {
        self.auth_change(Change::AddRole(name.to_string())).await
    }

    /// Remove a role (and take it from every user).
    pub async fn delete_role(&self, name: &str) -> Result<(), Error> {
        self.auth_change(Change::DeleteRole(name.to_string())).await
    }

    /// Let `role` do `permission` on every key (or lock name) starting
    /// with `prefix` (empty: all of them).
    pub async fn grant_permission(
        &self,
        role: &str,
        permission: Permission,
        prefix: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        let grant = role_grant(role, permission, prefix.as_ref());
        self.auth_change(Change::GrantPermission(grant)).await
    }

    /// Take a grant from `role`.
    pub async fn revoke_permission(
        &self,
        role: &str,
        permission: Permission,
        prefix: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        let grant = role_grant(role, permission, prefix.as_ref());
        self.auth_change(Change::RevokePermission(grant)).await
    }

    /// Give `user` the role `role`.
    pub async fn grant_role(&self, user: &str, role: &str) -> Result<(), Error> {
        self.auth_change(Change::GrantRole(v1::AuthUserRole {
            user: user.to_string(),
            role: role.to_string(),
        }))
        .await
    }

    /// Take the role `role` from `user`.
    pub async fn revoke_role(&self, user: &str, role: &str) -> Result<(), Error> {
        self.auth_change(Change::RevokeRole(v1::AuthUserRole {
            user: user.to_string(),
            role: role.to_string(),
        }))
        .await
    }

    /// Every user and every role, in name order.
    pub async fn list_users_and_roles(&self) -> Result<(Vec<String>, Vec<String>), Error> {
        self.auth_call(
            false,
            v1::AuthListRequest {},
            |mut auth, request| async move { auth.list(request).await },
            |reply: v1::AuthListReply| (reply.error, (reply.users, reply.roles)),
        )
        .await
    }

    /// One user (`None`: no such user).
    pub async fn get_user(&self, name: &str) -> Result<Option<UserInfo>, Error> {
        let message = v1::AuthNameRequest {
            name: name.to_string(),
        };
        self.auth_call(
            false,
            message,
            |mut auth, request| async move { auth.get_user(request).await },
            |reply: v1::AuthUserReply| {
                let user = reply.found.then_some(UserInfo {
                    roles: reply.roles,
                    has_password: reply.has_password,
                });
                (reply.error, user)
            },
        )
        .await
    }

    /// One role's grants, as `(permission, prefix)` (`None`: no such role).
    pub async fn get_role(&self, name: &str) -> Result<Option<Vec<(Permission, Vec<u8>)>>, Error> {
        let message = v1::AuthNameRequest {
            name: name.to_string(),
        };
        self.auth_call(
            false,
            message,
            |mut auth, request| async move { auth.get_role(request).await },
            |reply: v1::AuthRoleReply| {
                let grants = reply.found.then(|| {
                    reply
                        .grants
                        .into_iter()
                        .filter_map(|g| latchkey_proto::wire::grant_from_wire(g).ok())
                        .map(|g| (g.permission, g.prefix))
                        .collect()
                });
                (reply.error, grants)
            },
        )
        .await
    }
}
