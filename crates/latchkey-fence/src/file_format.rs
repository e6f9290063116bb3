//! The state file of [`FileFenceGate`](crate::FileFenceGate): encoding and
//! decoding (the format is documented on the gate).

use std::collections::BTreeMap;
/// First line of a state file: format name and version.
const HEADER: &str = "latchkey-fence 1";
/// What every state file's first line starts with, whatever the version.
const FORMAT_NAME: &str = "latchkey-fence ";
/// What the last line of a state file starts with.
const END: &str = "end\t";

/// FNV-1a, 64 bit (as the snapshot format): enough to catch damaged or
/// truncated files; it detects every change of a single byte.
fn checksum(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The state file holding `entries` (in the order given).
pub(crate) fn encode<'a>(entries: impl Iterator<Item = (&'a str, u64)>) -> Vec<u8> {
    let mut out = String::with_capacity(64);
    out.push_str(HEADER);
    out.push('\n');
    let mut count = 0u64;
    for (resource, token) in entries {
        escape_into(&mut out, resource);
        out.push('\t');
        out.push_str(&token.to_string());
        out.push('\n');
        count += 1;
    }
    let sum = checksum(out.as_bytes());
    out.push_str(&format!("{END}{count}\t{sum:016x}\n"));
    out.into_bytes()
}

/// Read a state file; the error says what is wrong with it.
pub(crate) fn decode(bytes: &[u8]) -> Result<BTreeMap<String, u64>, String> {
    if bytes.is_empty() {
        return Err("the file is empty (a truncated write?)".to_owned());
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8 text (bad byte at offset {})", e.valid_up_to()))?;
    let first = text.split('\n').next().unwrap_or_default();
    if !text.contains('\n') && HEADER.starts_with(text) {
        return Err("the first line is incomplete: the file is truncated".to_owned());
    }
    if first != HEADER {
        return Err(match first.strip_prefix(FORMAT_NAME) {
            Some(version) => format!(
                "format version {version:?} is not known to this build, which reads version 1 \
                 (was it written by a newer latchkey?)"
            ),
            None => format!("not a latchkey fence state file (first line {first:?})"),
        });
    }
    let Some(content) = text.strip_suffix('\n') else {
        return Err("the last line is incomplete: the file is truncated".to_owned());
    };
    let (body, end) = match content.rfind('\n') {
        Some(i) => content.split_at(i + 1),
        None => ("", content),
    };
    let Some(end) = end.strip_prefix(END) else {
        return Err("no end line: the file is truncated".to_owned());
    };
    let (count, sum) = end
        .split_once('\t')
        .ok_or_else(|| format!("malformed end line {end:?}"))?;
    let count = parse_decimal(count).ok_or_else(|| format!("malformed entry count {count:?}"))?;
    let computed = format!("{:016x}", checksum(body.as_bytes()));
    if sum != computed {
        return Err(format!(
            "checksum mismatch (stored {sum:?}, computed {computed:?}): the file is damaged"
        ));
    }
    let entries = body
        .strip_prefix(HEADER)
        .and_then(|rest| rest.strip_prefix('\n'))
        .ok_or_else(|| "no entries section after the first line".to_owned())?;
    let mut table = BTreeMap::new();
    for (index, line) in entries.split_terminator('\n').enumerate() {
        let line_no = index + 2;
        let (resource, token) = line
            .split_once('\t')
            .ok_or_else(|| format!("line {line_no}: no tab between resource and token"))?;
        let resource = unescape(resource).map_err(|e| format!("line {line_no}: {e}"))?;
        let token = parse_decimal(token)
            .ok_or_else(|| format!("line {line_no}: malformed token {token:?}"))?;
        if token == 0 {
            return Err(format!(
                "line {line_no}: token 0 for resource {resource:?} (never issued)"
            ));
        }
        if table.insert(resource, token).is_some() {
            return Err(format!("line {line_no}: resource appears twice"));
        }
    }
    if table.len() as u64 != count {
        return Err(format!(
            "the end line counts {count} entries but {} were found",
            table.len()
        ));
    }
    Ok(table)
}

/// A decimal `u64` in canonical form: digits only, no sign, no leading zero.
fn parse_decimal(text: &str) -> Option<u64> {
    let value = text.parse::<u64>().ok()?;
    (value.to_string() == text).then_some(value)
}

/// Append `resource`, escaped, to `out`.
fn escape_into(out: &mut String, resource: &str) {
    for c in resource.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

/// The resource name written as `escaped`.
fn unescape(escaped: &str) -> Result<String, String> {
    let mut out = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push('\\'),
                Some('t') => out.push('\t'),
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some(other) => return Err(format!("unknown escape \\{other} in resource")),
                None => return Err("resource ends with a lone backslash".to_owned()),
            },
            '\r' => return Err("unescaped carriage return in resource".to_owned()),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::iter;

    use super::*;

    #[test]
    fn escaping_round_trips() {
        for name in [
            "",
            "plain",
            "a\tb",
            "line\nbreak",
            "cr\r",
            "back\\slash",
            "\\t",
            "é✓",
        ] {
            let mut escaped = String::new();
            escape_into(&mut escaped, name);
            assert!(!escaped.contains(['\t', '\n', '\r']), "{escaped:?}");
            assert_eq!(unescape(&escaped).as_deref(), Ok(name));
        }
    }

    #[test]
    fn encode_then_decode_is_identity() {
        let table: BTreeMap<String, u64> = [("a".to_owned(), 1), ("b\t\\".to_owned(), u64::MAX)]
            .into_iter()
            .collect();
        let bytes = encode(table.iter().map(|(r, t)| (r.as_str(), *t)));
        assert_eq!(decode(&bytes), Ok(table));
        assert_eq!(decode(&encode(iter::empty())), Ok(BTreeMap::new()));
    }

    #[test]
    fn canonical_decimals_only() {
        assert_eq!(parse_decimal("42"), Some(42));
        for bad in ["", "+4", "042", "-1", " 4", "4 ", "18446744073709551616"] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }
}
