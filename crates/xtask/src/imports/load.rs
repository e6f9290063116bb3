//! Reading a crate's `src/` into a module tree: one node per file, plus the
//! inline `mod` blocks inside files.
//!
//! A file's module comes from its path (`src/lib.rs` the crate root,
//! `src/a.rs` and `src/a/mod.rs` module a, `src/a/b.rs` a::b). A file
//! declared `#[cfg(test)] mod x;` by its parent is left out, and so is a file
//! whose parent module has no file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::parse::{parse, Reference, UseItem};

/// One module: a file's own module or an inline `mod` block in a file.
#[derive(Debug)]
pub struct Module {
    /// Index into [`Crate::files`] of the file that holds the module.
    pub file: usize,
    /// The enclosing module (None for a crate root).
    pub parent: Option<usize>,
    /// Child modules (files and inline blocks), by name.
    pub children: BTreeMap<String, usize>,
    /// Names of the items defined in the module.
    pub defs: BTreeSet<String>,
    /// The module's `use` items, re-exports included.
    pub uses: Vec<UseItem>,
}

/// One source file and what it refers to.
#[derive(Debug)]
pub struct SourceFile {
    /// Path relative to the crate directory, `/`-separated (`src/a/b.rs`).
    pub rel: String,
    /// The references, each with [`Reference::scope`] set to a module index.
    pub refs: Vec<Reference>,
}

/// A crate's files and module tree.
#[derive(Debug)]
pub struct Crate {
    /// The package name from Cargo.toml (else the directory's name).
    pub name: String,
    /// Files sorted by `rel`.
    pub files: Vec<SourceFile>,
    /// Modules; those of a file follow their parent's.
    pub modules: Vec<Module>,
    /// Files left out, with why (`src/x.rs: cfg(test) module`).
    pub skipped: Vec<String>,
}

/// Read the crate in `dir`. An unreadable directory or file is an error
/// message naming it.
pub fn load(dir: &Path) -> Result<Crate, String> {
    let src = dir.join("src");
    let mut paths = Vec::new();
    collect_rs(&src, &mut paths)?;
    let mut by_module: Vec<(Vec<String>, String, PathBuf)> = Vec::new();
    let has_lib = src.join("lib.rs").is_file();
    let mut skipped = Vec::new();
    for path in paths {
        let rel_src = path
            .strip_prefix(&src)
            .map_err(|_| format!("{} is not under {}", path.display(), src.display()))?;
        let parts: Vec<String> = rel_src
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let rel = format!("src/{}", parts.join("/"));
        match module_path(&parts, has_lib) {
            Some(module) => by_module.push((module, rel, path)),
            None => skipped.push(format!("{rel}: not a module of the library")),
        }
    }
    // Parents before children; equal paths (a.rs and a/mod.rs) keep the first.
    by_module.sort();

    let mut parsed = Vec::new();
    for (module, rel, path) in by_module {
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        parsed.push((module, rel, parse(&text)));
    }

    let mut krate = Crate {
        name: package_name(dir),
        files: Vec::new(),
        modules: Vec::new(),
        skipped,
    };
    // Module path of a file module -> its module index.
    let mut file_modules: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    // Module paths declared `#[cfg(test)] mod x;`.
    let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut files = Vec::new();
    for (module_path, rel, file) in parsed {
        let parent = match module_path.split_last() {
            None => None,
            Some((_, parent_path)) => {
                if test_only.iter().any(|t| module_path.starts_with(t)) {
                    krate.skipped.push(format!("{rel}: #[cfg(test)] module"));
                    continue;
                }
                match file_modules.get(parent_path) {
                    Some(&p) => Some(p),
                    None => {
                        krate
                            .skipped
                            .push(format!("{rel}: its parent module has no file"));
                        continue;
                    }
                }
            }
        };
        if file_modules.contains_key(&module_path) {
            krate
                .skipped
                .push(format!("{rel}: a second file for the same module"));
            continue;
        }
        let file_index = files.len();
        let base = krate.modules.len();
        for (index, scope) in file.scopes.iter().enumerate() {
            krate.modules.push(Module {
                file: file_index,
                parent: match scope.parent {
                    Some(p) => Some(base + p),
                    None => parent,
                },
                children: scope
                    .children
                    .iter()
                    .map(|(name, &s)| (name.clone(), base + s))
                    .collect(),
                defs: scope.defs.clone(),
                uses: scope.uses.clone(),
            });
            debug_assert_eq!(krate.modules.len(), base + index + 1);
        }
        if let (Some(p), Some(name)) = (parent, module_path.last()) {
            krate.modules[p]
                .children
                .entry(name.clone())
                .or_insert(base);
        }
        for name in &file.test_mods {
            let mut t = module_path.clone();
            t.push(name.clone());
            test_only.insert(t);
        }
        file_modules.insert(module_path, base);
        let refs = file
            .refs
            .into_iter()
            .map(|r| Reference {
                scope: base + r.scope,
                ..r
            })
            .collect();
        files.push(SourceFile { rel, refs });
    }
    // Files are numbered in module order above; renumber them by path.
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by(|&a, &b| files[a].rel.cmp(&files[b].rel));
    let mut new_index = vec![0; files.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    for module in &mut krate.modules {
        module.file = new_index[module.file];
    }
    let mut slots: Vec<Option<SourceFile>> = files.into_iter().map(Some).collect();
    krate.files = order.iter().filter_map(|&old| slots[old].take()).collect();
    Ok(krate)
}

/// The module path of a file, given its path components below `src/`;
/// None for a file that is not part of the library's module tree
/// (`src/main.rs` beside a `src/lib.rs`, `src/bin/...`).
fn module_path(parts: &[String], has_lib: bool) -> Option<Vec<String>> {
    let (file, dirs) = parts.split_last()?;
    if dirs.first().is_some_and(|d| d == "bin") {
        return None;
    }
    let stem = file.strip_suffix(".rs")?;
    let mut path: Vec<String> = dirs.to_vec();
    match (dirs.is_empty(), stem) {
        (true, "lib") => {}
        (true, "main") if has_lib => return None,
        (true, "main") => {}
        (false, "mod") => {}
        _ => path.push(stem.to_string()),
    }
    Some(path)
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        fs::read_dir(dir).map_err(|e| format!("cannot read directory {}: {e}", dir.display()))?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read directory {}: {e}", dir.display()))?;
        paths.push(entry.path());
    }
    paths.sort();
    for path in paths {
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `name` of Cargo.toml's `[package]`, else the directory's name.
fn package_name(dir: &Path) -> String {
    let fallback = || {
        dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let Ok(manifest) = fs::read_to_string(dir.join("Cargo.toml")) else {
        return fallback();
    };
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some((key, value)) = line.split_once('=') {
                if key.trim() == "name" {
                    return value.trim().trim_matches('"').to_string();
                }
            }
        }
    }
    fallback()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(p: &str) -> Vec<String> {
        p.split('/').map(str::to_string).collect()
    }

    #[test]
    fn module_paths_from_file_paths() {
        assert_eq!(module_path(&parts("lib.rs"), true), Some(vec![]));
        assert_eq!(module_path(&parts("a.rs"), true), Some(parts("a")));
        assert_eq!(module_path(&parts("a/mod.rs"), true), Some(parts("a")));
        assert_eq!(module_path(&parts("a/b.rs"), true), Some(parts("a/b")));
        assert_eq!(module_path(&parts("main.rs"), true), None);
        assert_eq!(module_path(&parts("main.rs"), false), Some(vec![]));
        assert_eq!(module_path(&parts("bin/x.rs"), true), None);
    }
}
