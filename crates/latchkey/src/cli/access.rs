//! Access control: `auth` (on, off, status), `user` and `role` (users,
//! their roles, and the roles' grants).

use std::process::ExitCode;

use super::args::{Args, AuthCmd, RoleCmd, UserCmd};
use super::connect::client;
use super::failure::Failure;
use super::output::{out, print_lines};

/// `auth enable|disable|status`.
pub async fn auth(args: &Args, a: &AuthCmd) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    match a {
        AuthCmd::Enable => c.auth_enable().await?,
        AuthCmd::Disable => c.auth_disable().await?,
        AuthCmd::Status => {
            let (enabled, user) = c.auth_status().await?;
            let text = format!(
                "access control: {}\nuser: {}\n",
                if enabled { "enabled" } else { "disabled" },
                user.as_deref().unwrap_or("(none)")
            );
            out(&[text.as_bytes()])?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    out(&[b"OK\n"])?;
    Ok(ExitCode::SUCCESS)
}

/// `user add|passwd|delete|grant-role|revoke-role|list|get`.
pub async fn user(args: &Args, u: &UserCmd) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    match u {
        UserCmd::Add { name, no_password } => {
            let password = if *no_password {
                None
            } else {
                Some(read_password()?)
            };
            c.add_user(name, password.as_deref()).await?
        }
        UserCmd::Passwd { name } => c.change_password(name, Some(&read_password()?)).await?,
        UserCmd::Delete { name } => c.delete_user(name).await?,
        UserCmd::GrantRole { user, role } => c.grant_role(user, role).await?,
        UserCmd::RevokeRole { user, role } => c.revoke_role(user, role).await?,
        UserCmd::List => {
            let (users, _) = c.list_users_and_roles().await?;
            return print_lines(&users);
        }
        UserCmd::Get { name } => {
            let Some(user) = c.get_user(name).await? else {
                return Err(Failure::NotFound(format!("no user {name:?}")));
            };
            let text = format!(
                "roles: {}\npassword: {}\n",
                user.roles.join(","),
                if user.has_password { "yes" } else { "no" }
            );
            out(&[text.as_bytes()])?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    out(&[b"OK\n"])?;
    Ok(ExitCode::SUCCESS)
}

/// `role add|delete|grant|revoke|list|get`.
pub async fn role(args: &Args, r: &RoleCmd) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    let permission = |p: &str| {
        p.parse::<latchkey::Permission>()
            .map_err(|e| Failure::Usage(e.to_string()))
    };
    match r {
        RoleCmd::Add { name } => c.add_role(name).await?,
        RoleCmd::Delete { name } => c.delete_role(name).await?,
        RoleCmd::Grant {
            role,
            permission: p,
            prefix,
        } => c.grant_permission(role, permission(p)?, prefix).await?,
        RoleCmd::Revoke {
            role,
            permission: p,
            prefix,
        } => c.revoke_permission(role, permission(p)?, prefix).await?,
        RoleCmd::List => {
            let (_, roles) = c.list_users_and_roles().await?;
            return print_lines(&roles);
        }
        RoleCmd::Get { name } => {
            let Some(grants) = c.get_role(name).await? else {
                return Err(Failure::NotFound(format!("no role {name:?}")));
            };
            let lines: Vec<String> = grants
                .iter()
                .map(|(p, prefix)| format!("{p}\t{}", String::from_utf8_lossy(prefix)))
                .collect();
            return print_lines(&lines);
        }
    }
    out(&[b"OK\n"])?;
    Ok(ExitCode::SUCCESS)
}

/// One line of stdin, without its line ending: a password, which must not
/// travel as an argument (`ps` shows those).
fn read_password() -> Result<String, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Failure::Usage(format!("cannot read the password from stdin: {e}")))?;
    let password = line.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(Failure::Usage(
            "an empty password: give one on stdin (or --no-password)".into(),
        ));
    }
    Ok(password)
}
