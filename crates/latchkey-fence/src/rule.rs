//! The one decision every gate makes: what admitting a token does to a
//! resource whose highest token is known.

use crate::error::FenceError;

/// A token admitted by a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The token is higher than any seen for the resource (or the first
    /// one); it is now the resource's highest.
    Raised {
        /// The highest token before this one, `None` for the first token.
        previous: Option<u64>,
    },
    /// The token equals the highest already seen: the same holder writing
    /// again. Nothing changed.
    Repeated,
}

/// What admitting `token` to `resource`, whose highest token is `highest`,
/// does: the rules 2 to 5 of [`FenceGate`](crate::FenceGate).
pub(crate) fn decide(
    resource: &str,
    token: u64,
    highest: Option<u64>,
) -> Result<Admission, FenceError> {
    if token == 0 {
        return Err(FenceError::ZeroToken {
            resource: resource.to_owned(),
        });
    }
    match highest {
        Some(highest) if token < highest => Err(FenceError::Stale {
            resource: resource.to_owned(),
            token,
            highest,
        }),
        Some(highest) if token == highest => Ok(Admission::Repeated),
        previous => Ok(Admission::Raised { previous }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_cases() {
        assert!(matches!(
            decide("r", 0, None),
            Err(FenceError::ZeroToken { .. })
        ));
        assert_eq!(
            decide("r", 3, None).ok(),
            Some(Admission::Raised { previous: None })
        );
        assert_eq!(decide("r", 3, Some(3)).ok(), Some(Admission::Repeated));
        assert_eq!(
            decide("r", 4, Some(3)).ok(),
            Some(Admission::Raised { previous: Some(3) })
        );
        assert!(matches!(
            decide("r", 2, Some(3)),
            Err(FenceError::Stale {
                token: 2,
                highest: 3,
                ..
            })
        ));
    }
}
