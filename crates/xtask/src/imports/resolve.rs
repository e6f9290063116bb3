//! Resolving the paths a file refers to, to the files that define the items:
//! the import edges between a crate's files.
//!
//! A path is walked through modules (a segment naming a child module
//! descends); its first non-module segment is the item. An item defined in
//! the module is there; one the module imports or re-exports is followed to
//! where it comes from (globs too, when they lead to a definition); anything
//! else stays with the module. Paths leaving the crate resolve to nothing.

use std::collections::{BTreeMap, BTreeSet};

use super::load::Crate;
use super::parse::{Binding, Reference};

/// Edges: importing file -> imported file -> names used. Files are indices
/// into [`Crate::files`]; a file never has an edge to itself.
pub type Edges = BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>>;

/// How deep re-exports may be followed before giving up (a guard; the
/// `seen` set already stops loops).
const MAX_DEPTH: usize = 64;

/// (module, name) pairs already being followed: a loop guard.
type Seen = BTreeSet<(usize, String)>;

/// Where a path leads.
#[derive(Clone, Copy, Debug)]
struct Target {
    /// The module holding the item (or the module the path names).
    module: usize,
    /// The module defines the item (false: the module was the last place the
    /// item could be followed to).
    defined: bool,
}

/// The import edges of `krate`.
pub fn edges(krate: &Crate) -> Edges {
    let resolver = Resolver { krate };
    let mut edges = Edges::new();
    for (from_file, file) in krate.files.iter().enumerate() {
        for reference in &file.refs {
            if let Some((target, name)) = resolver.reference(reference) {
                let to_file = krate.modules[target.module].file;
                if to_file != from_file {
                    edges
                        .entry(from_file)
                        .or_default()
                        .entry(to_file)
                        .or_default()
                        .insert(name);
                }
            }
        }
    }
    edges
}

struct Resolver<'k> {
    krate: &'k Crate,
}

impl Resolver<'_> {
    /// The target of one reference and the name to show for it.
    fn reference(&self, r: &Reference) -> Option<(Target, String)> {
        let mut seen = Seen::new();
        let (target, name) = self.resolve(r.scope, &r.path, &mut seen, 0)?;
        Some((target, if r.glob { "*".to_string() } else { name }))
    }

    fn root(&self, mut module: usize) -> usize {
        while let Some(parent) = self.krate.modules[module].parent {
            module = parent;
        }
        module
    }

    /// Resolve `path` as written in module `from`: None when it leads out of
    /// the crate (or to nothing known, like a local name or the prelude).
    fn resolve(
        &self,
        from: usize,
        path: &[String],
        seen: &mut Seen,
        depth: usize,
    ) -> Option<(Target, String)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let (first, rest) = path.split_first()?;
        let modules = &self.krate.modules;
        match first.as_str() {
            "::" => None,
            "crate" | "$crate" => self.walk(self.root(from), first, rest, seen, depth),
            "self" => self.walk(from, first, rest, seen, depth),
            "super" => {
                let mut module = modules[from].parent?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    module = modules[module].parent?;
                    rest = &rest[1..];
                }
                self.walk(module, first, rest, seen, depth)
            }
            name => {
                // 2018 edition: a path may start at a child module or at a
                // name the module defines or imports.
                let module = &modules[from];
                if let Some(&child) = module.children.get(name) {
                    return self.walk(child, name, rest, seen, depth);
                }
                if module.defs.contains(name) {
                    let target = Target {
                        module: from,
                        defined: true,
                    };
                    return Some((target, name.to_string()));
                }
                if !seen.insert((from, name.to_string())) {
                    return None;
                }
                module
                    .uses
                    .iter()
                    .filter(|u| u.binding == Binding::Name(name.to_string()))
                    .find_map(|u| {
                        let mut full = u.path.clone();
                        full.extend(rest.iter().cloned());
                        self.resolve(from, &full, seen, depth + 1)
                    })
            }
        }
    }

    /// Walk `rest` down from `module` (reached by the segment `last`): child
    /// modules descend; the first other segment is an item of the module.
    fn walk(
        &self,
        mut module: usize,
        last: &str,
        rest: &[String],
        seen: &mut Seen,
        depth: usize,
    ) -> Option<(Target, String)> {
        let mut last = last;
        for (i, segment) in rest.iter().enumerate() {
            match self.krate.modules[module].children.get(segment) {
                Some(&child) => {
                    module = child;
                    last = segment;
                }
                None => {
                    let target = self.item(module, segment, &rest[i + 1..], seen, depth);
                    return Some((target, segment.clone()));
                }
            }
        }
        let target = Target {
            module,
            defined: true,
        };
        Some((target, last.to_string()))
    }

    /// Where the item `name` of `module` (followed by the segments `tail`,
    /// when `name` is itself a re-exported module) comes from.
    fn item(
        &self,
        module: usize,
        name: &str,
        tail: &[String],
        seen: &mut Seen,
        depth: usize,
    ) -> Target {
        let here = Target {
            module,
            defined: false,
        };
        let m = &self.krate.modules[module];
        if m.defs.contains(name) {
            return Target {
                module,
                defined: true,
            };
        }
        if depth > MAX_DEPTH || !seen.insert((module, name.to_string())) {
            return here;
        }
        let follow = |prefix: &[String], seen: &mut Seen, glob: bool| {
            let mut full = prefix.to_vec();
            if glob {
                full.push(name.to_string());
            }
            full.extend(tail.iter().cloned());
            self.resolve(module, &full, seen, depth + 1)
        };
        for u in &m.uses {
            if u.binding == Binding::Name(name.to_string()) {
                // An import of something outside the crate stays here.
                return follow(&u.path, seen, false).map_or(here, |(t, _)| t);
            }
        }
        for u in &m.uses {
            if u.binding == Binding::Glob {
                if let Some((t, _)) = follow(&u.path, seen, true) {
                    if t.defined {
                        return t;
                    }
                }
            }
        }
        here
    }
}
