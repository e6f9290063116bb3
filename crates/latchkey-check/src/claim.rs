//! The token rules that locks and semaphores share (a grant's token and
//! the accepted writes carrying it): token 0 is never issued, each token
//! belongs to one holder, and grants increase in real-time order.
//! `lock_safety` and `semaphores` collect [`Claim`]s and call these; each
//! says what its `place` is (a lock's resource, a semaphore's name).

use std::collections::BTreeMap;

use crate::history::Operation;
use crate::order::later_lower;
use crate::verdict::Violation;

/// Detailed violations collected per rule; enough to pick a short witness.
pub(crate) const MAX_PER_RULE: usize = 256;

/// A grant or accepted write: something that claims a token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'h> {
    pub(crate) op: &'h Operation,
    /// What the token was granted on: a lock's resource, a semaphore.
    pub(crate) place: &'h str,
    pub(crate) holder: &'h str,
    pub(crate) token: u64,
}

/// Rule: token 0 is never issued. `kind`: what was granted ("lock",
/// "a permit of").
pub(crate) fn zero_tokens(grants: &[Claim], kind: &str, violations: &mut Vec<Violation>) {
    for g in grants.iter().filter(|g| g.token == 0).take(MAX_PER_RULE) {
        violations.push(Violation::new(
            format!(
                "{kind} {:?} granted to {} with token 0, which is never issued",
                g.place, g.holder
            ),
            g.op.events(),
        ));
    }
}

/// Rule: each token belongs to one holder. Every claim carrying a token
/// (grants and accepted writes alike) must name the same place and holder;
/// each claim that does not is reported against the latest earlier claim
/// (by invocation) with another owner.
pub(crate) fn token_owners<'a, 'h: 'a>(
    claims: impl Iterator<Item = &'a Claim<'h>>,
    violations: &mut Vec<Violation>,
) {
    let mut by_token: BTreeMap<u64, Vec<&Claim>> = BTreeMap::new();
    for c in claims {
        by_token.entry(c.token).or_default().push(c);
    }
    let mut found = 0;
    for (token, mut claims) in by_token {
        claims.sort_by_key(|c| c.op.invoke.index);
        for (j, later) in claims.iter().enumerate() {
            let earlier = claims[..j]
                .iter()
                .rev()
                .find(|c| (c.place, c.holder) != (later.place, later.holder));
            if let Some(earlier) = earlier {
                let mut events = earlier.op.events();
                events.extend(later.op.events());
                violations.push(Violation::new(
                    format!(
                        "token {token} belongs to two holders: {} on {:?} and {} on {:?}",
                        earlier.holder, earlier.place, later.holder, later.place
                    ),
                    events,
                ));
                found += 1;
                if found >= MAX_PER_RULE {
                    return;
                }
            }
        }
    }
}

/// Rule: grants increase. A grant that ended before another was invoked
/// has a lower token (tokens come from one counter, so across places too).
pub(crate) fn grants_increase(grants: &[Claim], violations: &mut Vec<Violation>) {
    let tokens: Vec<(&Operation, u64)> = grants.iter().map(|g| (g.op, g.token)).collect();
    for (i, j) in later_lower(&tokens, &tokens, MAX_PER_RULE) {
        let (Some(a), Some(b)) = (grants.get(i), grants.get(j)) else {
            continue;
        };
        let mut events = a.op.events();
        events.extend(b.op.events());
        violations.push(Violation::new(
            format!(
                "token went back: {} got token {} on {:?}, then a later acquire gave {} token {} on {:?}",
                a.holder, a.token, a.place, b.holder, b.token, b.place
            ),
            events,
        ));
    }
}
