//! Access control: users, roles and permissions on key and lock-name
//! prefixes (etcd's RBAC model), kept in the replicated state so that every
//! replica enforces the same rules, and they survive restarts and
//! snapshots.
//!
//! - A **role** grants permissions, each on a prefix: [`Permission::Read`]
//!   and [`Permission::Write`] on user keys (sequence keys count as keys:
//!   allocating needs write), [`Permission::Lock`] on lock names (opening a
//!   session needs a lock grant on any prefix), [`Permission::Admin`]
//!   (changing users, roles and whether access control is on; the prefix is
//!   ignored). The role named [`ROOT`] grants everything; it exists without
//!   being added.
//! - A **user** has roles and, optionally, a password. The password arrives
//!   here already hashed by the replica that proposed the command (a salted
//!   key-derivation string the shell makes and checks): the core never sees
//!   a password and draws no randomness.
//! - While access control is **enabled** ([`AuthCommand::Enable`], refused
//!   unless a user named [`ROOT`] exists; it is given the root role), a
//!   replica wraps every client command in [`crate::Command::As`] naming
//!   the caller, and [`check_command`] decides at apply time, against the
//!   rules of that moment in the log, on every replica alike. Reads are
//!   checked with [`check_query`] against the replica's applied state.
//! - **Sessions belong to the user who opened them** (under `As`): the
//!   session's owner is recorded, and only that user acts for it (the
//!   session secret is needed on top, whether or not access control is on).
//!
//! A refusal is [`CommandError::PermissionDenied`], naming the user, the
//! missing permission and what it was needed on; it writes nothing.
//!
//! ```
//! use latchkey_core::auth::{AuthCommand, Grant, Permission, ROOT};
//! use latchkey_core::{apply, Command, CommandError, MemStore, Request};
//!
//! let mut store = MemStore::default();
//! let run = |store: &mut MemStore, command: Command| {
//!     apply(store, &Request { now: 1, command }).expect("store")
//! };
//! let admin = |c: AuthCommand| Command::Auth(c);
//! // The replica hashes passwords before it proposes; the core only stores them.
//! let hash = Some("pbkdf2-sha256$...".to_string());
//! run(&mut store, admin(AuthCommand::AddUser { name: ROOT.into(), password: hash })).unwrap();
//! run(&mut store, admin(AuthCommand::AddUser { name: "app".into(), password: None })).unwrap();
//! run(&mut store, admin(AuthCommand::AddRole { name: "jobs".into() })).unwrap();
//! let grant = Grant { permission: Permission::Write, prefix: b"jobs/".to_vec() };
//! run(&mut store, admin(AuthCommand::GrantPermission { role: "jobs".into(), grant })).unwrap();
//! run(&mut store, admin(AuthCommand::GrantRole { user: "app".into(), role: "jobs".into() })).unwrap();
//! run(&mut store, admin(AuthCommand::Enable)).unwrap();
//!
//! let put = |key: &str| Command::As {
//!     user: "app".into(),
//!     command: Box::new(Command::Put { key: key.into(), value: b"v".to_vec() }),
//! };
//! assert!(run(&mut store, put("jobs/1")).is_ok());
//! assert!(matches!(
//!     run(&mut store, put("billing/1")),
//!     Err(CommandError::PermissionDenied { .. })
//! ));
//! ```

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::command::{BatchOp, Command, Condition, Outcome, Query, ScanRange};
use crate::keyspace::{self, AUTH};
use crate::lock::record;
use crate::lock::{LockCommand, LockOutcome, LockQuery, SessionId};
use crate::{CommandError, Store, StoreError};

/// The user who may enable access control, and the role that grants every
/// permission.
pub const ROOT: &str = "root";

/// Longest user or role name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    /// Read user keys (get, scan; the compared keys of a batch).
    Read,
    /// Write user keys (put, delete, batches), allocate from sequences;
    /// open sessions (a client's retry-safe writes and bound keys live in
    /// one).
    Write,
    /// Take, release and list locks; open sessions.
    Lock,
    /// Change users, roles and whether access control is on.
    Admin,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Permission::Read => "read",
            Permission::Write => "write",
            Permission::Lock => "lock",
            Permission::Admin => "admin",
        })
    }
}

impl std::str::FromStr for Permission {
    type Err = CommandError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Permission::Read),
            "write" => Ok(Permission::Write),
            "lock" => Ok(Permission::Lock),
            "admin" => Ok(Permission::Admin),
            other => Err(CommandError::invalid(format!(
                "unknown permission {other:?}: read, write, lock or admin"
            ))),
        }
    }
}

/// One permission on every key (or lock name) starting with `prefix`
/// (empty: all of them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Grant {
    /// What is allowed.
    pub permission: Permission,
    /// On which keys or lock names (ignored for [`Permission::Admin`]).
    #[serde(with = "crate::codec::bytes")]
    pub prefix: Vec<u8>,
}

/// A user as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    /// The password's salted hash as the shell made it; `None`: the user
    /// cannot log in (it exists to own grants until a password is set).
    pub password: Option<String>,
    /// The user's roles.
    pub roles: BTreeSet<String>,
}

/// A role as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleRecord {
    /// What the role allows.
    pub grants: BTreeSet<Grant>,
}

/// A change of the access-control state. Needs [`Permission::Admin`] while
/// access control is enabled. Returns [`Outcome::Auth`]`(`[`AuthOutcome::Done`]`)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    /// Turn access control on: refused unless a user named [`ROOT`] exists;
    /// that user gets the root role.
    Enable,
    /// Turn access control off: every caller may do everything again.
    Disable,
    /// Add a user (refused if it exists).
    AddUser {
        /// The user's name.
        name: String,
        /// The password's salted hash (made by the proposing replica).
        password: Option<String>,
    },
    /// Set or clear a user's password.
    ChangePassword {
        /// The user's name.
        name: String,
        /// The new password's salted hash; `None`: no password login.
        password: Option<String>,
    },
    /// Remove a user (its sessions keep running until they end).
    DeleteUser {
        /// The user's name.
        name: String,
    },
    /// Add a role without grants (refused if it exists).
    AddRole {
        /// The role's name.
        name: String,
    },
    /// Remove a role, and take it from every user.
    DeleteRole {
        /// The role's name.
        name: String,
    },
    /// Add a grant to a role.
    GrantPermission {
        /// The role.
        role: String,
        /// What it now allows.
        grant: Grant,
    },
    /// Take a grant from a role.
    RevokePermission {
        /// The role.
        role: String,
        /// What it no longer allows.
        grant: Grant,
    },
    /// Give a user a role.
    GrantRole {
        /// The user.
        user: String,
        /// The role.
        role: String,
    },
    /// Take a role from a user.
    RevokeRole {
        /// The user.
        user: String,
        /// The role.
        role: String,
    },
}

/// A read of the access-control state. [`AuthQuery::Status`] needs nothing;
/// the others need [`Permission::Admin`] while access control is enabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthQuery {
    /// Whether access control is on (one key read: replicas ask it on
    /// every call).
    Status,
    /// Every user and role name.
    List,
    /// One user: roles and whether it has a password.
    User {
        /// The user's name.
        name: String,
    },
    /// One role's grants.
    Role {
        /// The role's name.
        name: String,
    },
    /// A user's stored password hash, for the replica that checks a
    /// login. Never answered to clients.
    Credentials {
        /// The user's name.
        name: String,
    },
}

/// What an [`AuthCommand`] or [`AuthQuery`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthOutcome {
    /// The change is applied.
    Done,
    /// Answer to [`AuthQuery::Status`]: access control is on.
    Status(bool),
    /// Answer to [`AuthQuery::List`].
    List {
        /// Every user, in name order.
        users: Vec<String>,
        /// Every role, in name order.
        roles: Vec<String>,
    },
    /// Answer to [`AuthQuery::User`] (`None`: no such user).
    User(Option<UserInfo>),
    /// Answer to [`AuthQuery::Role`] (`None`: no such role).
    Role(Option<RoleRecord>),
    /// Answer to [`AuthQuery::Credentials`]: `None` when the user does not
    /// exist; `Some(None)` when it has no password.
    Credentials(Option<Option<String>>),
}

/// A user as [`AuthQuery::User`] shows it (never the password hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// The user's roles, in name order.
    pub roles: Vec<String>,
    /// The user can log in with a password.
    pub has_password: bool,
}

/// A check's verdict: `Ok(Ok(()))` allowed, `Ok(Err(_))` refused.
pub type Checked = Result<Result<(), CommandError>, StoreError>;

const ENABLED: u8 = b'e';
const USER: u8 = b'u';
const ROLE: u8 = b'r';
const OWNER: u8 = b'o';

fn key(kind: u8, rest: &[u8]) -> Vec<u8> {
    let mut k = vec![AUTH, kind];
    k.extend_from_slice(rest);
    k
}

fn owner_key(session: SessionId) -> Vec<u8> {
    key(OWNER, &session.0.to_be_bytes())
}

/// Whether access control is on.
pub fn enabled<S: Store>(store: &S) -> Result<bool, StoreError> {
    Ok(store.get(&key(ENABLED, &[]))?.is_some())
}

fn load_user<S: Store>(store: &S, name: &str) -> Result<Option<UserRecord>, StoreError> {
    record::load(store, &key(USER, name.as_bytes()))
}

fn load_role<S: Store>(store: &S, name: &str) -> Result<Option<RoleRecord>, StoreError> {
    record::load(store, &key(ROLE, name.as_bytes()))
}

fn names<S: Store>(store: &S, kind: u8) -> Result<Vec<String>, StoreError> {
    let prefix = key(kind, &[]);
    Ok(record::scan_prefix(store, &prefix)?
        .into_iter()
        .filter_map(|(k, _)| {
            k.get(prefix.len()..)
                .map(|n| String::from_utf8_lossy(n).into_owned())
        })
        .collect())
}

fn check_name(what: &str, name: &str) -> Result<(), CommandError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(CommandError::invalid(format!(
            "{what} name {name:?}: 1 to {MAX_NAME_LEN} bytes"
        )));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(CommandError::invalid(format!(
            "{what} name {name:?}: no spaces or control characters"
        )));
    }
    Ok(())
}

/// The limits of an [`AuthCommand`] (names, prefixes), before it runs.
pub(crate) fn validate(command: &AuthCommand) -> Result<usize, CommandError> {
    let grant_len = |g: &Grant| g.prefix.len();
    match command {
        AuthCommand::Enable | AuthCommand::Disable => Ok(0),
        AuthCommand::AddUser { name, password }
        | AuthCommand::ChangePassword { name, password } => {
            check_name("user", name)?;
            if password
                .as_ref()
                .is_some_and(|p| p.is_empty() || p.len() > 1024)
            {
                return Err(CommandError::invalid("a password hash of 1 to 1024 bytes"));
            }
            Ok(name.len() + password.as_ref().map_or(0, String::len))
        }
        AuthCommand::DeleteUser { name } => check_name("user", name).map(|()| name.len()),
        AuthCommand::AddRole { name } | AuthCommand::DeleteRole { name } => {
            check_name("role", name).map(|()| name.len())
        }
        AuthCommand::GrantPermission { role, grant }
        | AuthCommand::RevokePermission { role, grant } => {
            check_name("role", role)?;
            if grant.prefix.len() > crate::limits::MAX_KEY_LEN {
                return Err(CommandError::invalid(format!(
                    "a grant's prefix is at most {} bytes",
                    crate::limits::MAX_KEY_LEN
                )));
            }
            Ok(role.len() + grant_len(grant))
        }
        AuthCommand::GrantRole { user, role } | AuthCommand::RevokeRole { user, role } => {
            check_name("user", user)?;
            check_name("role", role)?;
            Ok(user.len() + role.len())
        }
    }
}

fn refuse(why: String) -> Result<Result<Outcome, CommandError>, StoreError> {
    Ok(Err(CommandError::invalid(why)))
}

/// Run an (already validated and permitted) [`AuthCommand`].
pub(crate) fn execute<S: Store>(
    store: &mut S,
    command: &AuthCommand,
) -> Result<Result<Outcome, CommandError>, StoreError> {
    let done = Ok(Ok(Outcome::Auth(AuthOutcome::Done)));
    match command {
        AuthCommand::Enable => {
            let Some(mut root) = load_user(store, ROOT)?.filter(|r| r.password.is_some()) else {
                return refuse(format!(
                    "add a user named {ROOT:?} with a password before enabling access \
                     control: it keeps every permission"
                ));
            };
            root.roles.insert(ROOT.to_string());
            record::save(store, &key(USER, ROOT.as_bytes()), &root)?;
            store.put(&key(ENABLED, &[]), &[1])?;
            done
        }
        AuthCommand::Disable => {
            store.delete(&key(ENABLED, &[]))?;
            done
        }
        AuthCommand::AddUser { name, password } => {
            if load_user(store, name)?.is_some() {
                return refuse(format!("user {name:?} exists already"));
            }
            let user = UserRecord {
                password: password.clone(),
                roles: BTreeSet::new(),
            };
            record::save(store, &key(USER, name.as_bytes()), &user)?;
            done
        }
        AuthCommand::ChangePassword { name, password } => {
            let Some(mut user) = load_user(store, name)? else {
                return refuse(format!("no user {name:?}"));
            };
            user.password = password.clone();
            record::save(store, &key(USER, name.as_bytes()), &user)?;
            done
        }
        AuthCommand::DeleteUser { name } => {
            if name == ROOT && enabled(store)? {
                return refuse(format!(
                    "user {ROOT:?} cannot be deleted while access control is enabled"
                ));
            }
            if load_user(store, name)?.is_none() {
                return refuse(format!("no user {name:?}"));
            }
            store.delete(&key(USER, name.as_bytes()))?;
            done
        }
        AuthCommand::AddRole { name } => {
            if name == ROOT || load_role(store, name)?.is_some() {
                return refuse(format!("role {name:?} exists already"));
            }
            record::save(store, &key(ROLE, name.as_bytes()), &RoleRecord::default())?;
            done
        }
        AuthCommand::DeleteRole { name } => {
            if name == ROOT {
                return refuse(format!("role {ROOT:?} is built in"));
            }
            if load_role(store, name)?.is_none() {
                return refuse(format!("no role {name:?}"));
            }
            store.delete(&key(ROLE, name.as_bytes()))?;
            for user in names(store, USER)? {
                if let Some(mut record) = load_user(store, &user)? {
                    if record.roles.remove(name) {
                        record::save(store, &key(USER, user.as_bytes()), &record)?;
                    }
                }
            }
            done
        }
        AuthCommand::GrantPermission { role, grant }
        | AuthCommand::RevokePermission { role, grant } => {
            if role == ROOT {
                return refuse(format!("role {ROOT:?} grants everything already"));
            }
            let Some(mut record) = load_role(store, role)? else {
                return refuse(format!("no role {role:?}: add it first"));
            };
            let mut grant = grant.clone();
            if grant.permission == Permission::Admin {
                grant.prefix.clear();
            }
            if matches!(command, AuthCommand::GrantPermission { .. }) {
                record.grants.insert(grant);
            } else {
                record.grants.remove(&grant);
            }
            record::save(store, &key(ROLE, role.as_bytes()), &record)?;
            done
        }
        AuthCommand::GrantRole { user, role } | AuthCommand::RevokeRole { user, role } => {
            let Some(mut record) = load_user(store, user)? else {
                return refuse(format!("no user {user:?}"));
            };
            let grant = matches!(command, AuthCommand::GrantRole { .. });
            if grant && role != ROOT && load_role(store, role)?.is_none() {
                return refuse(format!("no role {role:?}: add it first"));
            }
            if !grant && user == ROOT && role == ROOT && enabled(store)? {
                return refuse(format!(
                    "user {ROOT:?} keeps role {ROOT:?} while access control is enabled"
                ));
            }
            if grant {
                record.roles.insert(role.clone());
            } else {
                record.roles.remove(role);
            }
            record::save(store, &key(USER, user.as_bytes()), &record)?;
            done
        }
    }
}

/// Answer an [`AuthQuery`] (the caller's permission is checked by
/// [`check_query`]).
pub(crate) fn query<S: Store>(
    store: &S,
    query: &AuthQuery,
) -> Result<Result<Outcome, CommandError>, StoreError> {
    let outcome = match query {
        AuthQuery::Status => AuthOutcome::Status(enabled(store)?),
        AuthQuery::List => AuthOutcome::List {
            users: names(store, USER)?,
            roles: names(store, ROLE)?,
        },
        AuthQuery::User { name } => AuthOutcome::User(load_user(store, name)?.map(|u| UserInfo {
            has_password: u.password.is_some(),
            roles: u.roles.into_iter().collect(),
        })),
        AuthQuery::Role { name } => AuthOutcome::Role(if name == ROOT {
            Some(RoleRecord {
                grants: [
                    Permission::Read,
                    Permission::Write,
                    Permission::Lock,
                    Permission::Admin,
                ]
                .into_iter()
                .map(|permission| Grant {
                    permission,
                    prefix: Vec::new(),
                })
                .collect(),
            })
        } else {
            load_role(store, name)?
        }),
        AuthQuery::Credentials { name } => {
            AuthOutcome::Credentials(load_user(store, name)?.map(|u| u.password))
        }
    };
    Ok(Ok(Outcome::Auth(outcome)))
}

/// What a permission is needed on.
enum Target<'a> {
    /// One user key (or sequence key).
    Key(&'a [u8]),
    /// Every user key in `[start, end)` (`None`: to the end).
    Range(&'a [u8], Option<&'a [u8]>),
    /// One lock name.
    Lock(&'a str),
    /// Every lock name starting with this.
    LockPrefix(&'a str),
    /// Any grant of the permission at all.
    Any,
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self {
            Target::Key(k) => write!(f, "key {:?}", text(k)),
            Target::Range(s, Some(e)) => write!(f, "keys {:?} to {:?}", text(s), text(e)),
            Target::Range(s, None) => write!(f, "keys from {:?}", text(s)),
            Target::Lock(n) => write!(f, "lock {n:?}"),
            Target::LockPrefix(p) => write!(f, "locks starting with {p:?}"),
            Target::Any => f.write_str("anything"),
        }
    }
}

/// Whether `prefix` covers `target`.
fn covers(prefix: &[u8], target: &Target<'_>) -> bool {
    match target {
        Target::Key(k) => k.starts_with(prefix),
        Target::Lock(n) => n.as_bytes().starts_with(prefix),
        Target::LockPrefix(p) => p.as_bytes().starts_with(prefix),
        Target::Any => true,
        Target::Range(start, end) => {
            if prefix.is_empty() {
                return true;
            }
            // Every key in the range starts with `prefix` when the range
            // begins inside the prefix's keys and ends by their end.
            if !start.starts_with(prefix) {
                return false;
            }
            match (keyspace::prefix_end(prefix), end) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(limit), Some(e)) => *e <= limit.as_slice(),
            }
        }
    }
}

/// The caller's grants: every grant of every role it has.
struct Grants {
    root: bool,
    grants: Vec<Grant>,
}

impl Grants {
    fn load<S: Store>(store: &S, user: &str) -> Result<Option<Grants>, StoreError> {
        let Some(record) = load_user(store, user)? else {
            return Ok(None);
        };
        let mut out = Grants {
            root: false,
            grants: Vec::new(),
        };
        for role in &record.roles {
            if role == ROOT {
                out.root = true;
            } else if let Some(r) = load_role(store, role)? {
                out.grants.extend(r.grants);
            }
        }
        Ok(Some(out))
    }

    fn allows(&self, permission: Permission, target: &Target<'_>) -> bool {
        self.root
            || self.grants.iter().any(|g| {
                g.permission == permission
                    && (permission == Permission::Admin || covers(&g.prefix, target))
            })
    }
}

/// Checks a caller's commands and reads against its grants.
struct Checker<'s, S> {
    store: &'s S,
    user: &'s str,
    grants: Grants,
}

impl<S: Store> Checker<'_, S> {
    fn need(&self, permission: Permission, target: Target<'_>) -> Result<(), CommandError> {
        if self.grants.allows(permission, &target) {
            Ok(())
        } else {
            Err(CommandError::PermissionDenied {
                user: self.user.to_string(),
                permission,
                on: target.to_string(),
            })
        }
    }

    /// The caller may act for `session`: it opened it (or is root). A
    /// session opened without a user (while access control was off) is
    /// root's alone while it is on.
    fn owns(&self, session: SessionId) -> Checked {
        if self.grants.root {
            return Ok(Ok(()));
        }
        match self.store.get(&owner_key(session))? {
            Some(owner) if owner == self.user.as_bytes() => Ok(Ok(())),
            _ => Ok(Err(CommandError::PermissionDenied {
                user: self.user.to_string(),
                permission: Permission::Lock,
                on: format!("session {} (another user's)", session.0),
            })),
        }
    }

    fn batch(&self, conditions: &[Condition], ops: &[BatchOp]) -> Result<(), CommandError> {
        for Condition { key, .. } in conditions {
            self.need(Permission::Read, Target::Key(key))?;
        }
        for op in ops {
            let (BatchOp::Put { key, .. } | BatchOp::Delete { key }) = op;
            self.need(Permission::Write, Target::Key(key))?;
        }
        Ok(())
    }

    fn command(&self, command: &Command) -> Checked {
        use Permission::*;
        let verdict = match command {
            Command::Put { key, .. }
            | Command::Delete { key }
            | Command::NextSequence { key, .. } => self.need(Write, Target::Key(key)),
            Command::PutIfAbsent { key, .. }
            | Command::CompareAndPut { key, .. }
            | Command::GetAndPut { key, .. } => self
                .need(Read, Target::Key(key))
                .and_then(|()| self.need(Write, Target::Key(key))),
            Command::DeleteRange { start, end } => {
                self.need(Write, Target::Range(start, Some(end)))
            }
            // A key bound to a session: the user's own session, and a write.
            Command::PutBound { key, session, .. } => {
                if let Err(e) = self.owns(*session)? {
                    return Ok(Err(e));
                }
                self.need(Write, Target::Key(key))
            }
            Command::Batch { conditions, ops } => self.batch(conditions, ops),
            // A retry-safe write: the user's own session, and the write.
            Command::Once {
                session, command, ..
            } => {
                if let Err(e) = self.owns(*session)? {
                    return Ok(Err(e));
                }
                return self.command(command);
            }
            // Admins administer; only root makes more roots.
            Command::Auth(AuthCommand::GrantRole { role, .. })
                if role == ROOT && !self.grants.root =>
            {
                Err(CommandError::PermissionDenied {
                    user: self.user.to_string(),
                    permission: Admin,
                    on: format!("the {ROOT:?} role (only root grants it)"),
                })
            }
            Command::Auth(_) => self.need(Admin, Target::Any),
            Command::Lock(lock) => return self.lock(lock),
            // The shell never wraps these; refuse rather than guess.
            Command::Group { .. } | Command::As { .. } => Err(CommandError::invalid(
                "a command group or an `As` cannot be run as a user",
            )),
        };
        Ok(verdict)
    }

    fn lock(&self, command: &LockCommand) -> Checked {
        use Permission::Lock as L;
        let session_and = |session: SessionId, name: Option<&str>| -> Checked {
            if let Err(e) = self.owns(session)? {
                return Ok(Err(e));
            }
            Ok(match name {
                Some(n) => self.need(L, Target::Lock(n)),
                None => Ok(()),
            })
        };
        let all_locks = |session: SessionId, names: &mut dyn Iterator<Item = &str>| -> Checked {
            if let Err(e) = self.owns(session)? {
                return Ok(Err(e));
            }
            for n in names {
                if let Err(e) = self.need(L, Target::Lock(n)) {
                    return Ok(Err(e));
                }
            }
            Ok(Ok(()))
        };
        match command {
            // Lock users hold locks in sessions, writers make their writes
            // retry-safe and bind keys in them.
            LockCommand::OpenSession { .. } => Ok(self.need(L, Target::Any).or_else(|refused| {
                self.need(Permission::Write, Target::Any)
                    .map_err(|_| refused)
            })),
            LockCommand::CloseSession { session, .. } => session_and(*session, None),
            // An operator's: whoever owns the session.
            LockCommand::EndSession { .. } | LockCommand::ForceRelease { .. } => {
                Ok(self.need(Permission::Admin, Target::Any))
            }
            LockCommand::Acquire { session, name, .. }
            | LockCommand::Release { session, name, .. }
            | LockCommand::CancelWait { session, name, .. }
            | LockCommand::Proclaim { session, name, .. } => session_and(*session, Some(name)),
            LockCommand::AcquireAll { session, names, .. } => {
                all_locks(*session, &mut names.iter().map(String::as_str))
            }
            LockCommand::ReleaseAll {
                session, grants, ..
            } => all_locks(*session, &mut grants.iter().map(|(name, _)| name.as_str())),
            LockCommand::Fenced {
                sequencer,
                conditions,
                ops,
                ..
            } => {
                if let Err(e) = session_and(sequencer.session, Some(&sequencer.name))? {
                    return Ok(Err(e));
                }
                Ok(self.batch(conditions, ops))
            }
            LockCommand::ExpireSession { .. }
            | LockCommand::ExpireWait { .. }
            | LockCommand::ExpireLockLease { .. }
            | LockCommand::EndLockDelay { .. }
            | LockCommand::Checkpoint { .. } => Ok(Err(CommandError::invalid(
                "the leader's own lock commands are not run as a user",
            ))),
        }
    }

    fn query(&self, query: &Query) -> Checked {
        use Permission::*;
        Ok(match query {
            Query::Get { key } => self.need(Read, Target::Key(key)),
            Query::MultiGet { keys } => keys
                .iter()
                .try_for_each(|k| self.need(Read, Target::Key(k))),
            Query::Scan(range) => {
                let (start, end) = scan_range(range);
                self.need(Read, Target::Range(&start, end.as_deref()))
            }
            Query::Lock(LockQuery::CheckSequencer(s)) => self.need(Lock, Target::Lock(&s.name)),
            Query::Lock(LockQuery::Locks { prefix, .. }) => {
                self.need(Lock, Target::LockPrefix(prefix))
            }
            Query::Lock(LockQuery::Session { session }) => return self.owns(*session),
            // Every session's name and locks: an operator's view.
            Query::Lock(LockQuery::Sessions { .. }) => self.need(Admin, Target::Any),
            Query::Lock(
                LockQuery::TimerState | LockQuery::SessionTimer { .. } | LockQuery::Census,
            ) => Err(CommandError::invalid(
                "the leader's timer state and the census are not read by users",
            )),
            Query::Auth(AuthQuery::Status) => Ok(()),
            Query::Auth(_) => self.need(Admin, Target::Any),
            Query::As { .. } => Err(CommandError::invalid("`As` never nests")),
        })
    }
}

/// The user keys a scan can return: `[start, end)`.
fn scan_range(range: &ScanRange) -> (Vec<u8>, Option<Vec<u8>>) {
    let start = std::cmp::max(&range.start, &range.prefix).clone();
    let prefix_end = keyspace::prefix_end(&range.prefix);
    let end = match (&range.end, prefix_end) {
        (Some(e), Some(p)) => Some(std::cmp::min(e.clone(), p)),
        (Some(e), None) => Some(e.clone()),
        (None, p) => p,
    };
    (start, end)
}

fn checker<'s, S: Store>(
    store: &'s S,
    user: &'s str,
) -> Result<Result<Checker<'s, S>, CommandError>, StoreError> {
    Ok(match Grants::load(store, user)? {
        Some(grants) => Ok(Checker {
            store,
            user,
            grants,
        }),
        None => Err(CommandError::PermissionDenied {
            user: user.to_string(),
            permission: Permission::Read,
            on: "anything: the user does not exist".to_string(),
        }),
    })
}

/// May `user` run `command` (while access control is enabled)? Checked at
/// apply time by [`crate::Command::As`]; a shell may call it earlier to
/// refuse sooner, but the apply-time check is the one that counts.
pub fn check_command<S: Store>(store: &S, user: &str, command: &Command) -> Checked {
    match checker(store, user)? {
        Ok(c) => c.command(command),
        Err(e) => Ok(Err(e)),
    }
}

/// May `user` read `query` (while access control is enabled)?
pub fn check_query<S: Store>(store: &S, user: &str, query: &Query) -> Checked {
    match checker(store, user)? {
        Ok(c) => c.query(query),
        Err(e) => Ok(Err(e)),
    }
}

/// After a command ran as `user`: a session it opened belongs to it.
pub(crate) fn record_owner<S: Store>(
    store: &mut S,
    user: &str,
    outcome: &Outcome,
) -> Result<(), StoreError> {
    if let Outcome::Lock(LockOutcome::SessionOpened { session, .. }) = outcome {
        store.put(&owner_key(*session), user.as_bytes())?;
    }
    Ok(())
}

/// A session ended: forget its owner.
pub(crate) fn forget_owner<S: Store>(store: &mut S, session: SessionId) -> Result<(), StoreError> {
    store.delete(&owner_key(session))
}
