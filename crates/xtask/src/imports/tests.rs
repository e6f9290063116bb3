//! Tests of `cargo xtask imports` on tiny crates written to a temp directory.

use std::fs;
use std::path::{Path, PathBuf};

use super::{analyze, check, Analysis};

/// A crate in a fresh temp directory, removed on drop.
struct TempCrate {
    dir: PathBuf,
}

impl TempCrate {
    /// Write `files` (path under the crate, text) and a Cargo.toml naming
    /// the package `name`.
    fn new(name: &str, files: &[(&str, &str)]) -> TempCrate {
        let dir = std::env::temp_dir().join(format!("xtask-imports-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        fs::write(
            dir.join("Cargo.toml"),
            format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\n"),
        )
        .unwrap();
        TempCrate { dir }
    }

    fn analyze(&self) -> Analysis {
        analyze(&self.dir, "tmp").unwrap()
    }

    /// Edges as "from -> to (names)".
    fn edges(&self) -> Vec<String> {
        edge_lines(&self.analyze())
    }
}

impl Drop for TempCrate {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn edge_lines(a: &Analysis) -> Vec<String> {
    a.edges
        .iter()
        .map(|(from, to, names)| format!("{from} -> {to} ({})", names.join(", ")))
        .collect()
}

/// The report with runs of spaces collapsed (column widths vary).
fn squeezed(a: &Analysis) -> String {
    a.report
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn dirs(c: &TempCrate) -> Vec<PathBuf> {
    vec![Path::new(&c.dir).to_path_buf()]
}

#[test]
fn a_circle_of_two_files_is_found_and_fails_the_check() {
    let c = TempCrate::new(
        "circle",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
            ("src/b.rs", "pub struct B;\npub fn f(_: crate::a::A) {}\n"),
        ],
    );
    let a = c.analyze();
    assert_eq!(a.circles, [vec!["src/a.rs", "src/b.rs"]]);
    assert!(
        a.report
            .contains("circle 1: src/a.rs -> src/b.rs (B); src/b.rs -> src/a.rs (A)\n"),
        "{}",
        a.report
    );
    let report = squeezed(&a);
    assert!(
        report.contains("floor 1 src/a.rs [circle 1] -> src/b.rs\n"),
        "{report}"
    );
    assert!(
        report.contains("floor 1 src/b.rs [circle 1] -> src/a.rs\n"),
        "{report}"
    );
    assert!(report.contains("floor 1 src/lib.rs\n"), "{report}");
    assert_eq!(a.summary, "circle: 3 files, 1 circle");
    let exit = check(&dirs(&c)).unwrap_err();
    assert_eq!(exit.code, 1);
}

#[test]
fn floors_count_up_from_files_that_import_nothing() {
    let c = TempCrate::new(
        "floors",
        &[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "pub struct A;\n"),
            ("src/b.rs", "use crate::a::A;\npub struct B(A);\n"),
            ("src/c.rs", "use crate::{a::A, b::B};\n"),
        ],
    );
    let a = c.analyze();
    assert!(a.circles.is_empty());
    let report = squeezed(&a);
    assert!(report.contains("floor 1 src/a.rs\n"), "{report}");
    assert!(
        report.contains("floor 2 src/b.rs -> src/a.rs\n"),
        "{report}"
    );
    assert!(
        report.ends_with("floor 3 src/c.rs -> src/a.rs, src/b.rs"),
        "{report}"
    );
    assert_eq!(a.summary, "floors: 4 files, 0 circles");
    assert!(check(&dirs(&c)).is_ok());
}

#[test]
fn a_re_export_through_lib_leads_to_the_defining_file() {
    let c = TempCrate::new(
        "reexport",
        &[
            (
                "src/lib.rs",
                "mod a;\nmod b;\npub use a::A;\npub(crate) use a::{Other as Renamed};\n",
            ),
            ("src/a.rs", "pub struct A;\npub struct Other;\n"),
            (
                "src/b.rs",
                "use crate::A;\nfn f() { let _ = crate::Renamed; }\n",
            ),
        ],
    );
    assert_eq!(c.edges(), ["src/b.rs -> src/a.rs (A, Renamed)"]);
}

#[test]
fn grouped_use_trees_give_an_edge_per_file() {
    let c = TempCrate::new(
        "grouped",
        &[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n"),
            ("src/a.rs", "pub struct X;\n"),
            ("src/b/mod.rs", "mod inner;\npub struct Y;\npub use inner::Z;\n"),
            ("src/b/inner.rs", "pub struct Z;\n"),
            ("src/c.rs", "pub trait T {}\n"),
            (
                "src/d.rs",
                "use crate::{a::X, b::{self, Y, Z}, c::T as _};\nuse std::{fmt, io::{self, Read}};\n",
            ),
        ],
    );
    assert_eq!(
        c.edges(),
        [
            "src/d.rs -> src/a.rs (X)",
            "src/d.rs -> src/b/inner.rs (Z)",
            "src/d.rs -> src/b/mod.rs (Y, b)",
            "src/d.rs -> src/c.rs (T)",
        ]
    );
}

#[test]
fn super_paths_from_a_child_file() {
    let c = TempCrate::new(
        "super",
        &[
            ("src/lib.rs", "mod p;\npub fn top() {}\n"),
            ("src/p/mod.rs", "mod q;\npub struct P;\n"),
            (
                "src/p/q.rs",
                "fn f() -> super::P { super::super::top(); self::g(); super::P }\nfn g() {}\n",
            ),
        ],
    );
    assert_eq!(
        c.edges(),
        [
            "src/p/q.rs -> src/lib.rs (top)",
            "src/p/q.rs -> src/p/mod.rs (P)"
        ]
    );
}

#[test]
fn relative_paths_to_child_modules_and_aliases_are_followed() {
    let c = TempCrate::new(
        "relative",
        &[
            ("src/lib.rs", "mod locks;\nmod x;\nuse x::Name as Alias;\n"),
            (
                "src/locks/mod.rs",
                "mod timers;\nuse timers::Timers;\nfn f() { timers::start(); }\n",
            ),
            (
                "src/locks/timers.rs",
                "pub struct Timers;\npub fn start() {}\nuse crate::Alias;\n",
            ),
            ("src/x.rs", "pub struct Name;\n"),
        ],
    );
    assert_eq!(
        c.edges(),
        [
            "src/lib.rs -> src/x.rs (Name)",
            "src/locks/mod.rs -> src/locks/timers.rs (Timers, start)",
            "src/locks/timers.rs -> src/x.rs (Alias)",
        ]
    );
}

#[test]
fn cfg_test_code_is_ignored() {
    let c = TempCrate::new(
        "cfgtest",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "pub struct A;\n#[cfg(test)]\nmod helpers;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n    fn f() { let _ = crate::b::B; }\n}\n",
            ),
            ("src/a/helpers.rs", "use crate::b::B;\n"),
            ("src/b.rs", "pub struct B;\n"),
        ],
    );
    let a = c.analyze();
    assert_eq!(edge_lines(&a), Vec::<String>::new());
    assert_eq!(a.summary, "cfgtest: 3 files, 0 circles");
    assert!(
        a.report
            .contains("left out: src/a/helpers.rs: #[cfg(test)] module"),
        "{}",
        a.report
    );
}

#[test]
fn comments_doc_links_and_strings_are_ignored() {
    let c = TempCrate::new(
        "comments",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                concat!(
                    "//! See [`crate::b`].\n",
                    "/// Like [`crate::b::B`], not [super::b::B].\n",
                    "// use crate::b::B;\n",
                    "/* crate::b::B /* nested crate::b::B */ crate::b::B */\n",
                    "pub fn f() -> usize {\n",
                    "    let s = \"crate::b::B \\\" crate::b::B\";\n",
                    "    let r = r#\"crate::b::B \" crate::b::B\"#;\n",
                    "    let c = '\"';\n",
                    "    s.len() + r.len() + c.len_utf8()\n",
                    "}\n",
                ),
            ),
            ("src/b.rs", "pub struct B;\n"),
        ],
    );
    assert_eq!(c.edges(), Vec::<String>::new());
}

#[test]
fn trait_impls_import_the_trait_and_the_type() {
    let c = TempCrate::new(
        "traitimpl",
        &[
            (
                "src/lib.rs",
                concat!(
                    "mod locks;\nmod replica;\npub use replica::Replica;\n",
                    "pub(crate) use locks::Host;\npub struct Top;\n",
                    "impl<F: Fn() -> u8> Host for Top {\n    fn host(&self) {}\n}\n",
                ),
            ),
            ("src/locks/mod.rs", "pub trait Host {\n    fn host(&self);\n}\n"),
            ("src/replica/mod.rs", "mod host;\npub struct Replica;\n"),
            (
                "src/replica/host.rs",
                "use super::Replica;\n\nimpl crate::locks::Host for Replica {\n    fn host(&self) {}\n}\n",
            ),
        ],
    );
    assert_eq!(
        c.edges(),
        [
            "src/lib.rs -> src/locks/mod.rs (Host)",
            "src/replica/host.rs -> src/locks/mod.rs (Host)",
            "src/replica/host.rs -> src/replica/mod.rs (Replica)",
        ]
    );
}

#[test]
fn an_unreadable_crate_is_an_error_message() {
    let missing =
        std::env::temp_dir().join(format!("xtask-imports-{}-missing", std::process::id()));
    let err = analyze(&missing, "missing").unwrap_err();
    assert!(err.contains("cannot read directory"), "{err}");
}
