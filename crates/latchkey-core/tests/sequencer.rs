//! The printable form of a sequencer: exact round trips, one spelling per
//! sequencer, typed errors for garbage, and no panics.

use latchkey_core::limits::{MAX_LOCK_NAME_LEN, MAX_SEQUENCER_LEN};
use latchkey_core::lock::{LockMode, Sequencer, SequencerParseError, SessionId, Token};
use proptest::prelude::*;

fn seq(name: &str, mode: LockMode, token: u64, session: u64) -> Sequencer {
    Sequencer {
        name: name.to_string(),
        mode,
        token: Token(token),
        session: SessionId(session),
    }
}

fn parse(s: &str) -> Result<Sequencer, SequencerParseError> {
    s.parse()
}

#[test]
fn printed_form_is_stable() {
    let cases = [
        (seq("jobs", LockMode::Exclusive, 34, 7), "lk1.34.7.x.jobs"),
        (
            seq("a.b-c_d~e", LockMode::Shared, 1, 1),
            "lk1.1.1.s.a.b-c_d~e",
        ),
        (
            seq("x y/z%", LockMode::Exclusive, 2, 3),
            "lk1.2.3.x.x%20y%2Fz%25",
        ),
        (seq("é", LockMode::Exclusive, 2, 3), "lk1.2.3.x.%C3%A9"),
        (
            seq("\n\u{0}", LockMode::Shared, u64::MAX, u64::MAX),
            "lk1.18446744073709551615.18446744073709551615.s.%0A%00",
        ),
    ];
    for (s, printed) in cases {
        assert_eq!(s.to_string(), printed);
        assert_eq!(parse(printed), Ok(s));
    }
}

#[test]
fn printed_form_is_header_and_env_safe() {
    let s = seq("weird \"name\"; =,\r\n\t\u{7f}€", LockMode::Exclusive, 9, 9);
    let printed = s.to_string();
    assert!(
        printed
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)),
        "{printed}"
    );
    assert_eq!(parse(&printed), Ok(s));
}

#[test]
fn longest_sequencer_fits_the_bound() {
    let name = "\u{7f}".repeat(MAX_LOCK_NAME_LEN);
    let s = seq(&name, LockMode::Shared, u64::MAX, u64::MAX);
    let printed = s.to_string();
    assert_eq!(printed.len(), MAX_SEQUENCER_LEN);
    assert_eq!(parse(&printed), Ok(s));
    let longer = format!("{printed}A");
    assert_eq!(
        parse(&longer),
        Err(SequencerParseError::TooLong {
            len: MAX_SEQUENCER_LEN + 1,
            max: MAX_SEQUENCER_LEN
        })
    );
}

#[test]
fn garbage_is_refused_with_a_typed_error() {
    use SequencerParseError::*;
    let cases: &[(&str, SequencerParseError)] = &[
        ("", NotASequencer),
        ("lk2.1.1.x.n", NotASequencer),
        ("LK1.1.1.x.n", NotASequencer),
        ("lk1.", BadNumber { field: "token" }),
        ("lk1.1", MissingField { field: "session" }),
        ("lk1.1.1", MissingField { field: "mode" }),
        ("lk1.1.1.x", MissingField { field: "name" }),
        ("lk1.1.1.x.", BadNameLength { len: 0 }),
        ("lk1.01.1.x.n", BadNumber { field: "token" }),
        ("lk1.+1.1.x.n", BadNumber { field: "token" }),
        ("lk1.-1.1.x.n", BadNumber { field: "token" }),
        ("lk1. 1.1.x.n", BadNumber { field: "token" }),
        (
            "lk1.18446744073709551616.1.x.n",
            BadNumber { field: "token" },
        ),
        ("lk1.1.00.x.n", BadNumber { field: "session" }),
        ("lk1.1.١.x.n", BadNumber { field: "session" }),
        ("lk1.0.1.x.n", ZeroToken),
        ("lk1.1.0.x.n", ZeroSession),
        ("lk1.1.1.X.n", BadMode),
        ("lk1.1.1.xs.n", BadMode),
        ("lk1.1.1..n", BadMode),
        ("lk1.1.1.x.a b", BadEscape { at: 11 }),
        ("lk1.1.1.x.a%", BadEscape { at: 11 }),
        ("lk1.1.1.x.a%2", BadEscape { at: 11 }),
        ("lk1.1.1.x.a%2f", BadEscape { at: 11 }),
        ("lk1.1.1.x.a%G0", BadEscape { at: 11 }),
        // An escape of a character that needs none is a second spelling.
        ("lk1.1.1.x.%41", BadEscape { at: 10 }),
        ("lk1.1.1.x.é", BadEscape { at: 10 }),
        ("lk1.1.1.x.%C3", NotUtf8),
        ("lk1.1.1.x.%FF", NotUtf8),
    ];
    for (input, want) in cases {
        assert_eq!(parse(input).as_ref(), Err(want), "{input:?}");
    }
    let long_name = format!("lk1.1.1.x.{}", "n".repeat(MAX_LOCK_NAME_LEN + 1));
    assert_eq!(
        parse(&long_name),
        Err(BadNameLength {
            len: MAX_LOCK_NAME_LEN + 1
        })
    );
}

#[test]
fn errors_read_well() {
    assert_eq!(
        parse("nope").unwrap_err().to_string(),
        "not a latchkey sequencer: it must start with \"lk1.\""
    );
    assert_eq!(
        parse("lk1.0.1.x.n").unwrap_err().to_string(),
        "sequencer token is 0, which is never issued"
    );
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z./_-]{1,12}",
        ".{1,20}",
        prop::collection::vec(any::<char>(), 1..64).prop_map(|c| c.into_iter().collect()),
    ]
    .prop_filter("names are 1 to 256 bytes", |n| {
        !n.is_empty() && n.len() <= MAX_LOCK_NAME_LEN
    })
}

fn arb_sequencer() -> impl Strategy<Value = Sequencer> {
    (
        arb_name(),
        prop_oneof![Just(LockMode::Exclusive), Just(LockMode::Shared)],
        1..=u64::MAX,
        1..=u64::MAX,
    )
        .prop_map(|(name, mode, token, session)| Sequencer {
            name,
            mode,
            token: Token(token),
            session: SessionId(session),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// parse(print(s)) == s, and the printed form is within the bound.
    #[test]
    fn print_then_parse_is_identity(s in arb_sequencer()) {
        let printed = s.to_string();
        prop_assert!(printed.len() <= MAX_SEQUENCER_LEN);
        prop_assert_eq!(parse(&printed), Ok(s));
    }

    /// Whatever parses prints back to the very same string: one spelling
    /// per sequencer.
    #[test]
    fn parse_then_print_is_identity(input in "lk1\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[xsy]\\.[A-Za-z0-9%._~ -]{0,12}") {
        if let Ok(s) = parse(&input) {
            prop_assert_eq!(s.to_string(), input);
        }
    }

    /// Arbitrary strings never make the parser panic.
    #[test]
    fn parsing_garbage_never_panics(input in ".{0,64}", bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = parse(&input);
        let lossy = String::from_utf8_lossy(&bytes);
        let _ = parse(&lossy);
        let _ = parse(&format!("lk1.{input}"));
        let _ = parse(&format!("lk1.1.1.x.{lossy}"));
    }

    /// Corrupting one byte of a printed sequencer gives an error or another
    /// valid sequencer, never a panic; a valid result reprints exactly.
    #[test]
    fn corrupted_sequencers_never_panic(
        s in arb_sequencer(),
        at in any::<prop::sample::Index>(),
        byte in 0x20u8..0x7f,
    ) {
        let mut printed = s.to_string().into_bytes();
        let i = at.index(printed.len());
        printed[i] = byte;
        let text = String::from_utf8(printed).expect("ASCII in, ASCII out");
        if let Ok(back) = parse(&text) {
            prop_assert_eq!(back.to_string(), text);
        }
    }
}
