//! Reading one source file: its definitions, `use` trees and path references.
//!
//! Works on the tokens of [`super::lex`], so comments and literals are gone.
//! Items marked `#[cfg(test)]` are skipped by bracket matching; a
//! `#[cfg(test)] mod x;` is remembered so that x's file can be left out.

use std::collections::{BTreeMap, BTreeSet};

use super::lex::{lex, Tok};

/// What a file holds, module by module: index 0 is the file's own module,
/// the others are its inline `mod name { ... }` blocks.
#[derive(Debug, Default)]
pub struct ParsedFile {
    /// The file's module and its inline modules.
    pub scopes: Vec<Scope>,
    /// Paths this file refers to (non-re-export `use` items, paths in code,
    /// the names in `impl` headers).
    pub refs: Vec<Reference>,
    /// Child modules declared as `#[cfg(test)] mod x;` at the file's top level.
    pub test_mods: BTreeSet<String>,
}

/// One module of a file: the file's own, or an inline `mod` block in it.
#[derive(Debug, Default)]
pub struct Scope {
    /// The enclosing scope in the same file (None for the file's module).
    pub parent: Option<usize>,
    /// Inline child modules, by name.
    pub children: BTreeMap<String, usize>,
    /// Names of the items defined here (`fn`, `struct`, ..., inline `mod`,
    /// `macro_rules!`), whatever their visibility.
    pub defs: BTreeSet<String>,
    /// Every `use` item at this module's top level, re-exports included.
    pub uses: Vec<UseItem>,
}

/// One leaf of a `use` tree, its prefix spelled out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UseItem {
    /// The full path (`["crate", "a", "X"]`); a leading `::` is the segment "::".
    pub path: Vec<String>,
    /// The name it brings into scope.
    pub binding: Binding,
}

/// The name a `use` item brings into scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// `use a::X` (X) or `use a::X as Y` (Y).
    Name(String),
    /// `use a::*`.
    Glob,
    /// `use a::Trait as _`.
    Anonymous,
}

/// A path the file refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The scope (index into [`ParsedFile::scopes`]) the path is written in.
    pub scope: usize,
    /// The path as written (`["super", "X"]`, `["timers", "Timers", "new"]`).
    pub path: Vec<String>,
    /// The path is a glob import (`use super::*`).
    pub glob: bool,
}

/// Keywords that start an item: after `#[cfg(test)]` such an item is skipped
/// to its `;` or closing brace; anything else (a field, an expression) also
/// ends at a `,`.
const ITEM_STARTS: &[&str] = &[
    "fn",
    "pub",
    "const",
    "static",
    "type",
    "use",
    "mod",
    "struct",
    "enum",
    "trait",
    "impl",
    "let",
    "unsafe",
    "async",
    "extern",
    "union",
    "macro_rules",
];

/// Identifiers that are never the start of an in-crate path.
const NOT_NAMES: &[&str] = &[
    "as", "async", "await", "const", "dyn", "else", "enum", "extern", "fn", "for", "if", "impl",
    "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static", "struct",
    "trait", "type", "unsafe", "use", "where", "while", "Self", "_",
];

/// Parse the source text of one file.
pub fn parse(src: &str) -> ParsedFile {
    let toks = lex(src);
    let mut p = Parser {
        toks: &toks,
        i: 0,
        depth: 0,
        stack: vec![(0, 0)],
        out: ParsedFile {
            scopes: vec![Scope::default()],
            ..ParsedFile::default()
        },
    };
    p.run();
    p.out
}

struct Parser<'t> {
    toks: &'t [Tok],
    i: usize,
    /// Brace depth at `i`.
    depth: usize,
    /// Open scopes: (scope index, brace depth of its items).
    stack: Vec<(usize, usize)>,
    out: ParsedFile,
}

impl Parser<'_> {
    fn tok(&self, i: usize) -> Option<&Tok> {
        self.toks.get(i)
    }

    fn ident(&self, i: usize) -> Option<&str> {
        match self.toks.get(i) {
            Some(Tok::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn is_punct(&self, i: usize, c: char) -> bool {
        self.toks.get(i) == Some(&Tok::Punct(c))
    }

    fn scope(&self) -> usize {
        self.stack.last().map_or(0, |&(s, _)| s)
    }

    /// At the top level of the current module (not inside a fn, impl, ...).
    fn at_item_level(&self) -> bool {
        self.stack.last().is_some_and(|&(_, d)| d == self.depth)
    }

    fn run(&mut self) {
        let mut public = false;
        while self.i < self.toks.len() {
            let was_public = std::mem::take(&mut public);
            let i = self.i;
            match &self.toks[i] {
                Tok::Punct('#') => self.attribute(),
                Tok::Punct('{') => {
                    self.depth += 1;
                    self.i += 1;
                }
                Tok::Punct('}') => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.stack.len() > 1
                        && self.stack.last().is_some_and(|&(_, d)| self.depth < d)
                    {
                        self.stack.pop();
                    }
                    self.i += 1;
                }
                Tok::Ident(word) => match word.as_str() {
                    "pub" => {
                        self.i = self.skip_visibility(i);
                        public = true;
                    }
                    "use" => self.use_decl(was_public),
                    "mod" => self.mod_decl(),
                    "macro_rules" if self.is_punct(i + 1, '!') => {
                        if let Some(name) = self.ident(i + 2) {
                            self.define(name.to_string());
                        }
                        self.i += 2;
                    }
                    "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" => {
                        self.item_name(i);
                        self.i += 1;
                    }
                    "impl" => {
                        self.impl_header(i);
                        self.i += 1;
                    }
                    _ => self.path_in_code(i),
                },
                _ => self.i += 1,
            }
        }
    }

    /// Past `pub` and its optional `(crate)`, `(super)`, `(in path)`.
    fn skip_visibility(&self, i: usize) -> usize {
        if self.is_punct(i + 1, '(') {
            self.matching(i + 1)
                .map_or(self.toks.len(), |close| close + 1)
        } else {
            i + 1
        }
    }

    /// Index of the bracket closing the one at `open` (any kind; brackets are
    /// assumed balanced).
    fn matching(&self, open: usize) -> Option<usize> {
        let mut depth = 0usize;
        for j in open..self.toks.len() {
            match self.toks[j] {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']' | '}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return Some(j);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// At `#`: an outer attribute is skipped; `#[cfg(test)]` also skips the
    /// item it is on.
    fn attribute(&mut self) {
        let i = self.i;
        let open = if self.is_punct(i + 1, '!') {
            i + 2
        } else {
            i + 1
        };
        if !self.is_punct(open, '[') {
            self.i += 1;
            return;
        }
        let Some(close) = self.matching(open) else {
            self.i = self.toks.len();
            return;
        };
        let cfg_test = open == i + 1
            && self.toks[open + 1..close]
                == [
                    Tok::Ident("cfg".into()),
                    Tok::Punct('('),
                    Tok::Ident("test".into()),
                    Tok::Punct(')'),
                ];
        self.i = close + 1;
        if cfg_test {
            self.skip_test_item();
        }
    }

    /// Skip the item after a `#[cfg(test)]` (and its further attributes).
    fn skip_test_item(&mut self) {
        let mut j = self.i;
        while self.is_punct(j, '#') && self.is_punct(j + 1, '[') {
            match self.matching(j + 1) {
                Some(close) => j = close + 1,
                None => {
                    self.i = self.toks.len();
                    return;
                }
            }
        }
        let start = j;
        let item = self.at_item_level() || self.ident(j).is_some_and(|w| ITEM_STARTS.contains(&w));
        let mut k = if self.ident(j) == Some("pub") {
            self.skip_visibility(j)
        } else {
            j
        };
        if self.ident(k) == Some("mod") {
            if let (Some(name), true) = (self.ident(k + 1), self.is_punct(k + 2, ';')) {
                if self.scope() == 0 && self.at_item_level() {
                    self.out.test_mods.insert(name.to_string());
                }
                self.i = k + 3;
                return;
            }
        }
        k = start;
        let mut depth = 0usize;
        while k < self.toks.len() {
            match self.toks[k] {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(c @ (')' | ']' | '}')) => {
                    if depth == 0 {
                        // The enclosing block ends: the closer is not ours.
                        self.i = k;
                        return;
                    }
                    depth -= 1;
                    if depth == 0 && c == '}' {
                        self.i = k + 1;
                        return;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    self.i = k + 1;
                    return;
                }
                Tok::Punct(',') if depth == 0 && !item => {
                    self.i = k + 1;
                    return;
                }
                _ => {}
            }
            k += 1;
        }
        self.i = k;
    }

    fn define(&mut self, name: String) {
        if self.at_item_level() {
            let scope = self.scope();
            self.out.scopes[scope].defs.insert(name);
        }
    }

    /// At `fn`, `struct`, ...: record the item's name when at item level.
    fn item_name(&mut self, i: usize) {
        let mut j = i + 1;
        if matches!(self.ident(i), Some("static")) && self.ident(j) == Some("mut") {
            j += 1;
        }
        if let Some(name) = self.ident(j) {
            let keyword_after_const = matches!(name, "fn" | "unsafe" | "async" | "extern" | "_")
                && self.ident(i) == Some("const");
            if !keyword_after_const {
                self.define(name.to_string());
            }
        }
    }

    /// At `mod`: `mod x;` (a file module, found by its path) or an inline
    /// `mod x { ... }`, which becomes a scope of its own.
    fn mod_decl(&mut self) {
        let i = self.i;
        let Some(name) = self.ident(i + 1).map(str::to_string) else {
            self.i += 1;
            return;
        };
        if self.is_punct(i + 2, '{') && self.at_item_level() {
            self.define(name.clone());
            let parent = self.scope();
            let index = self.out.scopes.len();
            self.out.scopes.push(Scope {
                parent: Some(parent),
                ..Scope::default()
            });
            self.out.scopes[parent].children.insert(name, index);
            self.depth += 1;
            self.stack.push((index, self.depth));
            self.i = i + 3;
        } else {
            self.i = i + 2;
        }
    }

    /// At `use`: the tree's leaves become the scope's imports and, unless
    /// `public` (a re-export), references.
    fn use_decl(&mut self, public: bool) {
        let mut j = self.i + 1;
        let mut items = Vec::new();
        self.use_tree(&mut j, Vec::new(), &mut items);
        while j < self.toks.len() && !self.is_punct(j, ';') {
            j += 1;
        }
        self.i = j + 1;
        let scope = self.scope();
        for item in items {
            if !public {
                self.out.refs.push(Reference {
                    scope,
                    path: item.path.clone(),
                    glob: item.binding == Binding::Glob,
                });
            }
            if self.at_item_level() {
                self.out.scopes[scope].uses.push(item);
            }
        }
    }

    /// One (sub)tree of a `use` declaration starting at `*j`, below `prefix`.
    fn use_tree(&self, j: &mut usize, prefix: Vec<String>, out: &mut Vec<UseItem>) {
        let mut path = prefix;
        if self.tok(*j) == Some(&Tok::PathSep) {
            path.push("::".to_string());
            *j += 1;
        }
        loop {
            match self.tok(*j) {
                Some(Tok::Ident(s)) => {
                    path.push(s.clone());
                    *j += 1;
                    if self.tok(*j) == Some(&Tok::PathSep) {
                        *j += 1;
                    } else {
                        break;
                    }
                }
                Some(Tok::Punct('*')) => {
                    *j += 1;
                    out.push(UseItem {
                        path,
                        binding: Binding::Glob,
                    });
                    return;
                }
                Some(Tok::Punct('{')) => {
                    *j += 1;
                    loop {
                        if self.is_punct(*j, '}') {
                            *j += 1;
                            return;
                        }
                        let before = *j;
                        self.use_tree(j, path.clone(), out);
                        if self.is_punct(*j, ',') {
                            *j += 1;
                        } else if *j == before || !self.is_punct(*j, '}') {
                            return;
                        }
                    }
                }
                _ => return,
            }
        }
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        let binding = if self.ident(*j) == Some("as") {
            let alias = self.ident(*j + 1).unwrap_or("_").to_string();
            *j += 2;
            if alias == "_" {
                Binding::Anonymous
            } else {
                Binding::Name(alias)
            }
        } else {
            match path.last() {
                Some(last) => Binding::Name(last.clone()),
                None => return,
            }
        };
        if !path.is_empty() {
            out.push(UseItem { path, binding });
        }
    }

    /// At `impl`: the plain names of its header (`impl Trait for Type`) are
    /// references; paths in it are picked up as code.
    fn impl_header(&mut self, i: usize) {
        let mut j = i + 1;
        let mut depth = 0usize;
        while j < self.toks.len() {
            match &self.toks[j] {
                Tok::Punct('{' | ';') if depth == 0 => break,
                Tok::Punct('(' | '[' | '<') => depth += 1,
                // The `>` of `->` closes nothing.
                Tok::Punct('>') if self.is_punct(j - 1, '-') => {}
                Tok::Punct(')' | ']' | '>') => depth = depth.saturating_sub(1),
                Tok::Ident(name)
                    if !NOT_NAMES.contains(&name.as_str())
                        && self.tok(j - 1) != Some(&Tok::PathSep)
                        && self.tok(j + 1) != Some(&Tok::PathSep) =>
                {
                    self.out.refs.push(Reference {
                        scope: self.scope(),
                        path: vec![name.clone()],
                        glob: false,
                    });
                }
                _ => {}
            }
            j += 1;
        }
    }

    /// At an identifier in code: a path `a::b::c` starting here (not in the
    /// middle of a longer path, not a field or method) is a reference.
    fn path_in_code(&mut self, i: usize) {
        let starts_path = self.tok(i + 1) == Some(&Tok::PathSep)
            && matches!(self.tok(i + 2), Some(Tok::Ident(_)))
            && !(i > 0 && matches!(self.toks[i - 1], Tok::PathSep | Tok::Punct('.')))
            && self.ident(i).is_some_and(|w| !NOT_NAMES.contains(&w));
        if !starts_path {
            self.i += 1;
            return;
        }
        let mut path = Vec::new();
        let mut j = i;
        while let Some(seg) = self.ident(j) {
            path.push(seg.to_string());
            if self.tok(j + 1) == Some(&Tok::PathSep) && self.ident(j + 2).is_some() {
                j += 2;
            } else {
                break;
            }
        }
        self.out.refs.push(Reference {
            scope: self.scope(),
            path,
            glob: false,
        });
        self.i = j + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(src: &str) -> Vec<(Vec<String>, Binding)> {
        parse(src).scopes[0]
            .uses
            .iter()
            .map(|u| (u.path.clone(), u.binding.clone()))
            .collect()
    }

    fn p(s: &str) -> Vec<String> {
        s.split("::").map(str::to_string).collect()
    }

    fn name(s: &str) -> Binding {
        Binding::Name(s.to_string())
    }

    #[test]
    fn grouped_use_trees_are_spelled_out() {
        let got = uses("use crate::{a::X, b::{self, Y as Z, c::*}, d::Trait as _};");
        assert_eq!(
            got,
            [
                (p("crate::a::X"), name("X")),
                (p("crate::b"), name("b")),
                (p("crate::b::Y"), name("Z")),
                (p("crate::b::c"), Binding::Glob),
                (p("crate::d::Trait"), Binding::Anonymous),
            ]
        );
    }

    #[test]
    fn definitions_at_item_level_only() {
        let f = parse(
            "pub(crate) struct S; const fn f() { struct Local; } static mut M: u8 = 0;
             impl S { type Out = u8; const K: u8 = 1; } mod inner { pub fn g() {} }
             macro_rules! mac { () => {} } pub union U { a: u8 } trait T { fn t(); }",
        );
        let defs: Vec<&str> = f.scopes[0].defs.iter().map(String::as_str).collect();
        assert_eq!(defs, ["M", "S", "T", "U", "f", "inner", "mac"]);
        assert_eq!(f.scopes[1].defs.iter().collect::<Vec<_>>(), ["g"]);
    }

    #[test]
    fn pub_use_is_no_reference_but_an_import() {
        let f = parse("pub use a::A; pub(crate) use b::B; use c::C;");
        assert_eq!(f.scopes[0].uses.len(), 3);
        let refs: Vec<_> = f.refs.iter().map(|r| r.path.join("::")).collect();
        assert_eq!(refs, ["c::C"]);
    }

    #[test]
    fn cfg_test_items_are_skipped() {
        let f = parse(
            "#[cfg(test)] mod tests { use crate::x::X; }
             #[cfg(test)]
             #[allow(dead_code)]
             mod helpers;
             struct S { #[cfg(test)] f: crate::y::Y, g: u8 }
             #[cfg(not(test))] use crate::z::Z;",
        );
        let refs: Vec<_> = f.refs.iter().map(|r| r.path.join("::")).collect();
        assert_eq!(refs, ["crate::z::Z"]);
        assert!(f.test_mods.contains("helpers"));
        assert!(f.scopes[0].defs.contains("S"));
    }
}
