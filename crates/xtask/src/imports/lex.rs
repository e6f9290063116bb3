//! Lexing Rust source into the few tokens the import scanner needs.
//!
//! Comments (`//`, `///`, `//!`, nested `/* */`), string literals (plain,
//! byte, C and raw, `r#"..."#`), char and byte literals and numbers never
//! reach the scanner: a literal becomes one [`Tok::Lit`], a comment nothing.
//! Lifetimes (`'a`) are dropped too; raw identifiers (`r#type`) lose their
//! `r#`.

/// One token of Rust source, as far as the import scanner cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword (`crate`, `use`, `Foo`, `_`).
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character (`{`, `;`, `#`, `<`, `*`, ...).
    Punct(char),
    /// A string, char or number literal (its content is gone).
    Lit,
}

/// The tokens of `src`. Unterminated comments and literals end at the end
/// of the input; lexing never fails.
pub fn lex(src: &str) -> Vec<Tok> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&chars, i);
        } else if let Some(end) = raw_or_prefixed_string(&chars, i) {
            toks.push(Tok::Lit);
            i = end;
        } else if c == '"' {
            toks.push(Tok::Lit);
            i = skip_quoted(&chars, i + 1, '"');
        } else if c == '\'' {
            i = char_or_lifetime(&chars, i, &mut toks);
        } else if c == 'r'
            && next == Some('#')
            && chars.get(i + 2).is_some_and(|&c| is_ident_start(c))
        {
            let (ident, end) = ident_at(&chars, i + 2);
            toks.push(Tok::Ident(ident));
            i = end;
        } else if is_ident_start(c) {
            let (ident, end) = ident_at(&chars, i);
            toks.push(Tok::Ident(ident));
            i = end;
        } else if c.is_ascii_digit() {
            i += 1;
            while i < chars.len()
                && (chars[i].is_alphanumeric()
                    || chars[i] == '_'
                    || (chars[i] == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
            {
                i += 1;
            }
            toks.push(Tok::Lit);
        } else if c == ':' && next == Some(':') {
            toks.push(Tok::PathSep);
            i += 2;
        } else {
            toks.push(Tok::Punct(c));
            i += 1;
        }
    }
    toks
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The identifier starting at `start` and the index just past it.
fn ident_at(chars: &[char], start: usize) -> (String, usize) {
    let mut end = start;
    while end < chars.len() && is_ident_continue(chars[end]) {
        end += 1;
    }
    (chars[start..end].iter().collect(), end)
}

/// Index just past the (possibly nested) block comment starting at `start`.
fn skip_block_comment(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Index just past a literal whose body starts at `i` and ends at `quote`,
/// honouring backslash escapes.
fn skip_quoted(chars: &[char], mut i: usize, quote: char) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// A raw string (`r"..."`, `r#"..."#`, `br#"..."#`, `cr"..."`) or a prefixed
/// string or byte (`b"..."`, `c"..."`, `b'x'`) starting at `i`: the index
/// just past it, or None when there is none at `i`.
fn raw_or_prefixed_string(chars: &[char], i: usize) -> Option<usize> {
    // The prefix must start a token, not continue an identifier (`sub"` is
    // not a thing, but `bar` followed by `"` must not be read as `b` `ar"`).
    if i > 0 && is_ident_continue(chars[i - 1]) {
        return None;
    }
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if chars.get(j) == Some(&'r') {
        let mut k = j + 1;
        let mut hashes = 0;
        while chars.get(k) == Some(&'#') {
            hashes += 1;
            k += 1;
        }
        if chars.get(k) != Some(&'"') {
            return None;
        }
        k += 1;
        while k < chars.len() {
            if chars[k] == '"' && (1..=hashes).all(|h| chars.get(k + h) == Some(&'#')) {
                return Some(k + 1 + hashes);
            }
            k += 1;
        }
        return Some(k);
    }
    if j == i {
        return None;
    }
    match chars.get(j) {
        Some('"') => Some(skip_quoted(chars, j + 1, '"')),
        Some('\'') if chars[i] == 'b' => Some(skip_quoted(chars, j + 1, '\'')),
        _ => None,
    }
}

/// At a `'`: a char literal (pushed as [`Tok::Lit`]) or a lifetime or label
/// (dropped). Returns the index just past it.
fn char_or_lifetime(chars: &[char], i: usize, toks: &mut Vec<Tok>) -> usize {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), _) => {
            toks.push(Tok::Lit);
            skip_quoted(chars, i + 1, '\'')
        }
        (Some(_), Some('\'')) => {
            toks.push(Tok::Lit);
            i + 3
        }
        (Some(&c), _) if is_ident_start(c) => ident_at(chars, i + 1).1,
        _ => {
            toks.push(Tok::Punct('\''));
            i + 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        lex(src)
            .into_iter()
            .filter_map(|t| match t {
                Tok::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_and_literals_leave_no_identifiers() {
        let src = r####"
            // crate::a::A
            /// [`crate::b`]
            //! crate::c
            /* outer /* nested crate::d */ still crate::e */
            let s = "crate::f \" crate::g";
            let r = r#"crate::h " crate::i"#;
            let b = br##"crate::j"# crate::k"##;
            let c = '"'; let d = '\''; let e = b'x'; let l: &'static str = x;
            keep
        "####;
        assert_eq!(
            idents(src),
            [
                "let", "s", "let", "r", "let", "b", "let", "c", "let", "d", "let", "e", "let", "l",
                "str", "x", "keep"
            ]
        );
    }

    #[test]
    fn paths_and_raw_identifiers() {
        assert_eq!(
            lex("crate::r#type::X"),
            [
                Tok::Ident("crate".into()),
                Tok::PathSep,
                Tok::Ident("type".into()),
                Tok::PathSep,
                Tok::Ident("X".into())
            ]
        );
    }
}
