//! The text `cargo xtask imports` prints for a crate.

use std::fmt::Write as _;

use super::graph::Layout;
use super::load::Crate;
use super::resolve::Edges;

/// The per-file listing and the circles of one crate (the summary line is
/// [`summary`]).
pub fn crate_report(krate: &Crate, label: &str, edges: &Edges, layout: &Layout) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "== {} ({label})", krate.name);
    let mut order: Vec<usize> = (0..krate.files.len()).collect();
    order.sort_by_key(|&f| (layout.floor[f], f));
    let name = |f: usize| match layout.circle_of[f] {
        Some(c) => format!("{} [circle {}]", krate.files[f].rel, c + 1),
        None => krate.files[f].rel.clone(),
    };
    let width = (0..krate.files.len())
        .map(|f| name(f).len())
        .max()
        .unwrap_or(0);
    for f in order {
        let imports: Vec<&str> = edges
            .get(&f)
            .map(|to| to.keys().map(|&t| krate.files[t].rel.as_str()).collect())
            .unwrap_or_default();
        let line = if imports.is_empty() {
            format!("  floor {:>2}  {}", layout.floor[f], name(f))
        } else {
            format!(
                "  floor {:>2}  {:<width$}  -> {}",
                layout.floor[f],
                name(f),
                imports.join(", ")
            )
        };
        let _ = writeln!(out, "{line}");
    }
    for skipped in &krate.skipped {
        let _ = writeln!(out, "  (left out: {skipped})");
    }
    for (c, files) in layout.circles.iter().enumerate() {
        let mut ties = Vec::new();
        for &a in files {
            let Some(to) = edges.get(&a) else { continue };
            for (&b, names) in to {
                if files.contains(&b) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    ties.push(format!(
                        "{} -> {} ({})",
                        krate.files[a].rel,
                        krate.files[b].rel,
                        names.join(", ")
                    ));
                }
            }
        }
        let _ = writeln!(out, "circle {}: {}", c + 1, ties.join("; "));
    }
    out
}

/// `latchkey-server: 31 files, 0 circles`
pub fn summary(krate: &Crate, layout: &Layout) -> String {
    let circles = layout.circles.len();
    format!(
        "{}: {} files, {} circle{}",
        krate.name,
        krate.files.len(),
        circles,
        if circles == 1 { "" } else { "s" }
    )
}
