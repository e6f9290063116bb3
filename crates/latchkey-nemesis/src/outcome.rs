//! How a workload records a write the cluster did not acknowledge.

use latchkey::Error as ClientError;
use latchkey_check::EventKind;

/// The completion kind of a write that failed with `e`: `Fail` only when
/// it certainly did not take effect (refused, invalid), `Unknown`
/// otherwise (a timeout or a lost connection may hide an applied write).
pub fn write_failure(e: &ClientError) -> EventKind {
    match e {
        ClientError::Refused(_)
        | ClientError::InvalidArgument(_)
        | ClientError::BadEndpoint { .. } => EventKind::Fail,
        _ => EventKind::Unknown,
    }
}
