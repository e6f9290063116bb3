//! `cargo xtask imports`: the import graph between the files of a crate,
//! each file's floor, and the circles (files that import each other,
//! directly or around a loop).
//!
//! [`lex`] and [`parse`] read a file, [`load`] builds a crate's module tree,
//! [`resolve`] turns references into file-to-file edges, [`graph`] finds
//! floors and circles and [`report`] prints them.

mod graph;
mod lex;
mod load;
mod parse;
mod report;
mod resolve;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::run::{workspace_root, Exit, Result};

/// The crates `cargo xtask imports` looks at when given none, relative to
/// the workspace root.
pub const DEFAULT_CRATES: &[&str] = &["crates/latchkey-server", "crates/latchkey-client"];

/// [`DEFAULT_CRATES`] as paths under the workspace root.
pub fn default_crate_dirs() -> Vec<PathBuf> {
    let root = workspace_root();
    DEFAULT_CRATES.iter().map(|c| root.join(c)).collect()
}

/// A crate directory as given on the command line: absolute, relative to
/// the current directory, or else relative to the workspace root.
pub fn crate_dir(arg: &Path) -> PathBuf {
    if arg.is_absolute() || arg.is_dir() {
        arg.to_path_buf()
    } else {
        workspace_root().join(arg)
    }
}

/// One crate's graph, analysed.
#[derive(Debug)]
pub struct Analysis {
    /// The listing and circles, as printed.
    pub report: String,
    /// `name: N files, M circles`.
    pub summary: String,
    /// Edges as (importing file, imported file, names), files as `src/...`
    /// (read by the tests; the report prints them).
    #[cfg_attr(not(test), allow(dead_code))]
    pub edges: Vec<(String, String, Vec<String>)>,
    /// The circles, each its files as `src/...`.
    pub circles: Vec<Vec<String>>,
}

/// Read and analyse the crate in `dir` (`label` is how the report names the
/// directory).
pub fn analyze(dir: &Path, label: &str) -> std::result::Result<Analysis, String> {
    let krate = load::load(dir)?;
    let edges = resolve::edges(&krate);
    let layout = graph::layout(krate.files.len(), &edges);
    let rel = |f: usize| krate.files[f].rel.clone();
    Ok(Analysis {
        report: report::crate_report(&krate, label, &edges, &layout),
        summary: report::summary(&krate, &layout),
        edges: edges
            .iter()
            .flat_map(|(&a, to)| {
                to.iter()
                    .map(move |(&b, names)| (rel(a), rel(b), names.iter().cloned().collect()))
            })
            .collect(),
        circles: layout
            .circles
            .iter()
            .map(|files| files.iter().map(|&f| rel(f)).collect())
            .collect(),
    })
}

/// Print the graph of each crate in `crate_dirs` and the summary lines.
/// With `check`, a circle in any of them is exit code 1. An unreadable crate
/// is exit code 2.
pub fn run(crate_dirs: &[PathBuf], check: bool) -> Result {
    let mut summaries = Vec::new();
    let mut with_circles = Vec::new();
    for dir in crate_dirs {
        let label = dir.display().to_string();
        let analysis =
            analyze(dir, &label).map_err(|e| Exit::with(2, format!("imports: {label}: {e}")))?;
        println!("{}", analysis.report);
        if !analysis.circles.is_empty() {
            with_circles.push(analysis.summary.clone());
        }
        summaries.push(analysis.summary);
    }
    for summary in &summaries {
        println!("{summary}");
    }
    if check && !with_circles.is_empty() {
        return Err(Exit::with(
            1,
            format!("imports: circles found ({})", with_circles.join("; ")),
        ));
    }
    Ok(())
}

/// `cargo xtask imports --check` on `crate_dirs`: Ok when none has a circle.
/// Meant for `cmd_test`: `imports::check(&imports::default_crate_dirs())?;`.
#[cfg_attr(not(test), allow(dead_code))]
pub fn check(crate_dirs: &[PathBuf]) -> Result {
    run(crate_dirs, true)
}
