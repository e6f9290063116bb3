//! Access-control grants to their typed form and back.

use crate::v1;
use crate::ReplicaFailure;

/// An access-control grant in its typed form.
pub fn grant_to_wire(grant: latchkey_core::auth::Grant) -> v1::Grant {
    use latchkey_core::auth::Permission as P;
    v1::Grant {
        permission: match grant.permission {
            P::Read => v1::Permission::Read,
            P::Write => v1::Permission::Write,
            P::Lock => v1::Permission::Lock,
            P::Admin => v1::Permission::Admin,
        } as i32,
        prefix: grant.prefix,
    }
}

/// A typed grant; an unknown or missing permission is an invalid argument.
pub fn grant_from_wire(grant: v1::Grant) -> Result<latchkey_core::auth::Grant, ReplicaFailure> {
    use latchkey_core::auth::Permission as P;
    let permission = match v1::Permission::try_from(grant.permission) {
        Ok(v1::Permission::Read) => P::Read,
        Ok(v1::Permission::Write) => P::Write,
        Ok(v1::Permission::Lock) => P::Lock,
        Ok(v1::Permission::Admin) => P::Admin,
        Ok(v1::Permission::Unspecified) | Err(_) => {
            return Err(ReplicaFailure::InvalidArgument(
                "a grant's permission must be READ, WRITE, LOCK or ADMIN".into(),
            ))
        }
    };
    Ok(latchkey_core::auth::Grant {
        permission,
        prefix: grant.prefix,
    })
}
