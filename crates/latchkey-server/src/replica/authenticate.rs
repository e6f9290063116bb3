//! Who a call comes from: a user with a password, the cluster's own
//! secret, a client certificate's user, or anonymous (see `crate::auth`
//! for the checks themselves).

use latchkey_core::auth::{AuthOutcome, AuthQuery};
use latchkey_core::{validate_query, Outcome, Query};

use crate::auth::{Caller, Certificates};

use super::Replica;

impl Replica {
    /// Who a call with `metadata`, over a connection whose verified client
    /// certificates are `certs`, comes from: the user it names if the
    /// password matches, the replica's own application if it carries the
    /// cluster secret, the user its client certificate names, or else
    /// anonymous (see `crate::auth`).
    pub(crate) async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        certs: Option<Certificates>,
    ) -> Result<Caller, tonic::Status> {
        let named = crate::auth::credentials(metadata)?;
        if let (None, Some(offered)) = (&named, metadata.get(latchkey_proto::CLUSTER_SECRET_HEADER))
        {
            // The cluster's own credential: a replica's in-process client
            // forwarding to the leader, or an operator holding the file.
            return match &self.peers.credentials().secret {
                Some(secret) if secret.matches(offered.as_bytes()) => Ok(Caller::Internal),
                _ => {
                    crate::auth::log_refusal("(cluster secret)");
                    Err(tonic::Status::unauthenticated(
                        "the call carries a cluster secret that is not this cluster's",
                    ))
                }
            };
        }
        let Some((user, password)) = named else {
            return self.certificate_caller(certs);
        };
        let stored = self.stored_credentials(&user)?;
        // An unknown user (or one without a password) costs the same work
        // as a wrong password, so timing does not tell which users exist.
        let (hash, known) = match stored {
            Some(Some(hash)) => (hash, true),
            _ => (crate::auth::decoy_hash().to_string(), false),
        };
        let verified = {
            let cache = std::sync::Arc::clone(&self.verified);
            let who = user.clone();
            // Password checks are expensive on purpose: at most a few at a
            // time, so a flood of logins cannot take every core.
            let _permit = crate::auth::LOGINS.acquire().await;
            tokio::task::spawn_blocking(move || cache.check(&who, &hash, &password))
                .await
                .unwrap_or(false)
                && known
        };
        if verified {
            Ok(Caller::User(user))
        } else {
            crate::auth::log_refusal(&user);
            Err(tonic::Status::unauthenticated(format!(
                "wrong user or password for {user:?} (or the user has no password, or this \
                 replica has not applied it yet)"
            )))
        }
    }

    /// What this replica's state holds for `user`: `None` if no such user,
    /// `Some(None)` if it has no password, else its password hash.
    fn stored_credentials(&self, user: &str) -> Result<Option<Option<String>>, tonic::Status> {
        let query = Query::Auth(AuthQuery::Credentials {
            name: user.to_string(),
        });
        validate_query(&query).map_err(|e| tonic::Status::unauthenticated(e.to_string()))?;
        match self.local_query(&query) {
            Ok(Ok(Outcome::Auth(AuthOutcome::Credentials(stored)))) => Ok(stored),
            Ok(other) => Err(tonic::Status::internal(format!(
                "credentials answered with {other:?}"
            ))),
            Err(failure) => Err(tonic::Status::unavailable(failure.to_string())),
        }
    }

    /// The user a verified client certificate names, if this replica's
    /// state has that user; else anonymous.
    fn certificate_caller(&self, certs: Option<Certificates>) -> Result<Caller, tonic::Status> {
        if !self.certificate_users {
            return Ok(Caller::Anonymous);
        }
        let Some(user) = crate::auth::certificate_user(certs.as_deref().map(Vec::as_slice)) else {
            return Ok(Caller::Anonymous);
        };
        if validate_query(&Query::Auth(AuthQuery::Credentials { name: user.clone() })).is_err() {
            return Ok(Caller::Anonymous);
        }
        Ok(match self.stored_credentials(&user)? {
            Some(_) => Caller::User(user),
            None => Caller::Anonymous,
        })
    }
}
