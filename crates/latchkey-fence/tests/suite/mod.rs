//! The conformance suite: every rule of `FenceGate`'s documentation,
//! checked on fresh gates. The database gates run it through adapters that
//! open a transaction per admission (`tests/conformance.rs`).

use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use std::thread;

use latchkey_fence::{Admission, FenceError, FenceGate};

/// One check of the suite: a name and a function run on a fresh gate.
type Check = (&'static str, fn(&dyn FenceGate, &Limits));

/// What a gate's storage cannot hold, so the suite leaves it out.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Resource names cannot hold NUL (PostgreSQL's text type).
    pub no_nul_in_names: bool,
    /// The largest token the gate stores (`i64::MAX` in a database).
    pub max_token: u64,
}

impl Limits {
    /// No limit: any name, any token.
    pub const NONE: Limits = Limits {
        no_nul_in_names: false,
        max_token: u64::MAX,
    };
    /// A database's limits, `nul` telling whether names may hold NUL.
    #[allow(dead_code)]
    pub const fn database(nul: bool) -> Limits {
        Limits {
            no_nul_in_names: !nul,
            max_token: i64::MAX as u64,
        }
    }
}

/// Every rule of the module documentation, checked on fresh gates from
/// `make`.
pub fn conformance(limits: Limits, make: impl Fn() -> Box<dyn FenceGate>) {
    let checks: &[Check] = &[
        ("first_token_raises", first_token_raises),
        ("accepts_increasing_and_equal", accepts_increasing_and_equal),
        ("refuses_lower", refuses_lower),
        (
            "refusal_leaves_state_untouched",
            refusal_leaves_state_untouched,
        ),
        ("zero_is_refused", zero_is_refused),
        ("resources_are_independent", resources_are_independent),
        ("any_resource_name", any_resource_name),
        ("concurrent_pair_keeps_max", concurrent_pair_keeps_max),
        (
            "concurrent_equal_tokens_raise_once",
            concurrent_equal_tokens_raise_once,
        ),
        (
            "concurrent_admissions_are_monotonic",
            concurrent_admissions_are_monotonic,
        ),
    ];
    for (name, check) in checks {
        eprintln!("conformance: {name}");
        let gate = make();
        check(&*gate, &limits);
    }
}

fn first_token_raises(gate: &dyn FenceGate, _limits: &Limits) {
    assert_eq!(gate.highest("r").unwrap(), None);
    assert_eq!(
        gate.admit("r", 5).unwrap(),
        Admission::Raised { previous: None }
    );
    assert_eq!(gate.highest("r").unwrap(), Some(5));
}

fn accepts_increasing_and_equal(gate: &dyn FenceGate, limits: &Limits) {
    assert_eq!(
        gate.admit("r", 1).unwrap(),
        Admission::Raised { previous: None }
    );
    assert_eq!(gate.admit("r", 1).unwrap(), Admission::Repeated);
    assert_eq!(
        gate.admit("r", 2).unwrap(),
        Admission::Raised { previous: Some(1) }
    );
    assert_eq!(
        gate.admit("r", 100).unwrap(),
        Admission::Raised { previous: Some(2) }
    );
    assert_eq!(gate.admit("r", 100).unwrap(), Admission::Repeated);
    assert_eq!(gate.admit("r", 100).unwrap(), Admission::Repeated);
    assert_eq!(gate.highest("r").unwrap(), Some(100));
    assert_eq!(
        gate.admit("r", limits.max_token).unwrap(),
        Admission::Raised {
            previous: Some(100)
        }
    );
    assert_eq!(
        gate.admit("r", limits.max_token).unwrap(),
        Admission::Repeated
    );
    assert_eq!(gate.highest("r").unwrap(), Some(limits.max_token));
}

fn refuses_lower(gate: &dyn FenceGate, _limits: &Limits) {
    gate.admit("X", 34).unwrap();
    let err = gate.admit("X", 33).unwrap_err();
    match &err {
        FenceError::Stale {
            resource,
            token,
            highest,
        } => {
            assert_eq!(resource, "X");
            assert_eq!((*token, *highest), (33, 34));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "token 33 is older than 34 already seen for resource \"X\": \
         a newer lock holder has written; this writer must stop"
    );
    // Far below too, and still after a raise.
    assert!(matches!(
        gate.admit("X", 1),
        Err(FenceError::Stale {
            token: 1,
            highest: 34,
            ..
        })
    ));
    gate.admit("X", 40).unwrap();
    assert!(matches!(
        gate.admit("X", 34),
        Err(FenceError::Stale {
            token: 34,
            highest: 40,
            ..
        })
    ));
}

fn refusal_leaves_state_untouched(gate: &dyn FenceGate, _limits: &Limits) {
    gate.admit("r", 10).unwrap();
    gate.admit("other", 3).unwrap();
    for bad in [9, 1, 0] {
        gate.admit("r", bad).unwrap_err();
        assert_eq!(gate.highest("r").unwrap(), Some(10), "after refusing {bad}");
        assert_eq!(
            gate.highest("other").unwrap(),
            Some(3),
            "after refusing {bad}"
        );
    }
    // The holder of 10 is still admitted, as a repeat; 11 still raises from 10.
    assert_eq!(gate.admit("r", 10).unwrap(), Admission::Repeated);
    assert_eq!(
        gate.admit("r", 11).unwrap(),
        Admission::Raised { previous: Some(10) }
    );
}

fn zero_is_refused(gate: &dyn FenceGate, _limits: &Limits) {
    // On a fresh resource: refused, and the resource stays unseen.
    let err = gate.admit("fresh", 0).unwrap_err();
    assert!(
        matches!(&err, FenceError::ZeroToken { resource } if resource == "fresh"),
        "{err:?}"
    );
    assert!(err.to_string().contains("token 0"), "{err}");
    assert!(err.to_string().contains("never issued"), "{err}");
    assert_eq!(gate.highest("fresh").unwrap(), None);
    // On a known resource: ZeroToken, not Stale.
    gate.admit("known", 5).unwrap();
    assert!(matches!(
        gate.admit("known", 0),
        Err(FenceError::ZeroToken { .. })
    ));
    assert_eq!(gate.highest("known").unwrap(), Some(5));
}

fn resources_are_independent(gate: &dyn FenceGate, _limits: &Limits) {
    gate.admit("a", 10).unwrap();
    assert_eq!(
        gate.admit("b", 3).unwrap(),
        Admission::Raised { previous: None }
    );
    assert!(matches!(gate.admit("a", 5), Err(FenceError::Stale { .. })));
    gate.admit("b", 5).unwrap();
    assert_eq!(gate.highest("a").unwrap(), Some(10));
    assert_eq!(gate.highest("b").unwrap(), Some(5));
    assert_eq!(gate.highest("c").unwrap(), None);
    // No normalisation: these are all different resources.
    for name in ["A", "a ", " a", "a/", "ａ"] {
        assert_eq!(gate.highest(name).unwrap(), None, "{name:?}");
        assert_eq!(
            gate.admit(name, 1).unwrap(),
            Admission::Raised { previous: None },
            "{name:?}"
        );
    }
    assert_eq!(gate.highest("a").unwrap(), Some(10));
}

fn any_resource_name(gate: &dyn FenceGate, limits: &Limits) {
    let names = [
        "",
        "tab\there",
        "line\nbreak",
        "cr\rlf\n",
        "back\\slash",
        "\\t literally",
        "end\t3\t0000",
        "latchkey-fence 1",
        "é✓🔒",
        "nul\0byte",
    ];
    let names: Vec<&str> = names
        .into_iter()
        .filter(|n| !(limits.no_nul_in_names && n.contains('\0')))
        .collect();
    for (i, name) in names.iter().enumerate() {
        gate.admit(name, i as u64 + 1).unwrap();
    }
    for (i, name) in names.iter().enumerate() {
        assert_eq!(gate.highest(name).unwrap(), Some(i as u64 + 1), "{name:?}");
    }
}

/// Two threads admit 5 and 6 at the same moment, many times: 6 always wins
/// and the highest is never left at 5.
fn concurrent_pair_keeps_max(gate: &dyn FenceGate, _limits: &Limits) {
    for round in 0..50 {
        let resource = format!("pair/{round}");
        let barrier = Barrier::new(2);
        let (five, six) = thread::scope(|s| {
            let five = s.spawn(|| {
                barrier.wait();
                gate.admit(&resource, 5)
            });
            let six = s.spawn(|| {
                barrier.wait();
                gate.admit(&resource, 6)
            });
            (five.join().unwrap(), six.join().unwrap())
        });
        match six.unwrap() {
            Admission::Raised {
                previous: None | Some(5),
            } => {}
            other => panic!("round {round}: 6 admitted as {other:?}"),
        }
        match five {
            Ok(Admission::Raised { previous: None }) => {}
            Err(FenceError::Stale {
                token: 5,
                highest: 6,
                ..
            }) => {}
            other => panic!("round {round}: 5 answered {other:?}"),
        }
        assert_eq!(gate.highest(&resource).unwrap(), Some(6), "round {round}");
    }
}

/// Many threads admitting the same token at once: exactly one raises it,
/// the others see a repeat.
fn concurrent_equal_tokens_raise_once(gate: &dyn FenceGate, _limits: &Limits) {
    const THREADS: usize = 8;
    for round in 0..10 {
        let resource = format!("same/{round}");
        let barrier = Barrier::new(THREADS);
        let answers: Vec<Admission> = thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        gate.admit(&resource, 7).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let raised = answers
            .iter()
            .filter(|a| **a == Admission::Raised { previous: None })
            .count();
        let repeated = answers
            .iter()
            .filter(|a| **a == Admission::Repeated)
            .count();
        assert_eq!((raised, repeated), (1, THREADS - 1), "{answers:?}");
        assert_eq!(gate.highest(&resource).unwrap(), Some(7));
    }
}

/// Threads admit interleaved increasing tokens on shared resources. A log of
/// accepted tokens checks that no accepted token is lower than one accepted
/// before the call began, that every refusal names a higher accepted token,
/// and that the final highest is the largest token offered.
fn concurrent_admissions_are_monotonic(gate: &dyn FenceGate, _limits: &Limits) {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 20;
    const RESOURCES: [&str; 3] = ["m/0", "m/1", "m/2"];
    let accepted: BTreeMap<&str, Mutex<Vec<u64>>> =
        RESOURCES.iter().map(|r| (*r, Mutex::default())).collect();
    let barrier = Barrier::new(THREADS as usize);
    thread::scope(|s| {
        for thread_index in 0..THREADS {
            let (accepted, barrier) = (&accepted, &barrier);
            s.spawn(move || {
                barrier.wait();
                for round in 0..ROUNDS {
                    let token = round * THREADS + thread_index + 1;
                    for k in 0..RESOURCES.len() {
                        // Vary the order of resources between threads.
                        let resource = RESOURCES[(k + thread_index as usize) % RESOURCES.len()];
                        let log = &accepted[resource];
                        let floor = log.lock().unwrap().iter().copied().max().unwrap_or(0);
                        match gate.admit(resource, token) {
                            Ok(_) => {
                                assert!(
                                    token >= floor,
                                    "{resource}: accepted {token} after {floor} was accepted"
                                );
                                log.lock().unwrap().push(token);
                            }
                            Err(FenceError::Stale {
                                token: refused,
                                highest,
                                ..
                            }) => {
                                assert_eq!(refused, token);
                                assert!(highest > token, "{resource}: {token} vs {highest}");
                                assert!(highest >= floor, "{resource}: {highest} < {floor}");
                                assert!(highest <= ROUNDS * THREADS, "never offered: {highest}");
                            }
                            Err(other) => panic!("{resource}: unexpected {other:?}"),
                        }
                    }
                }
            });
        }
    });
    for resource in RESOURCES {
        let log = accepted[resource].lock().unwrap();
        let max = log.iter().copied().max();
        // The largest token offered can never be refused.
        assert_eq!(max, Some(ROUNDS * THREADS), "{resource}");
        assert_eq!(gate.highest(resource).unwrap(), max, "{resource}");
    }
}
