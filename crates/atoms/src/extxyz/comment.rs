//! The extended XYZ comment line: `key=value` pairs, tokenised and typed the
//! way ASE's `key_val_str_to_dict` does it, so that files written by ASE read
//! back to the same values, and the inverse quoting used by the writer.

use crate::InfoValue;

/// Splits a comment line into `(key, raw value)` pairs.
///
/// This is ASE's character state machine: `"`, `'`, `{}` and `[]` delimit
/// values (and keys), a backslash takes the next character verbatim (also
/// inside quotes), whitespace separates pairs, `=` may be surrounded by
/// spaces, and a key without `=` gets the value `"T"` (true). Pairs with an
/// empty key are dropped.
pub(crate) fn split_pairs(line: &str) -> Vec<(String, String)> {
    // Each pair is a list of segments separated by `=`: the key, then the value.
    let mut pairs: Vec<Vec<String>> = vec![vec![String::new()]];
    let mut closing: Option<char> = None;
    let mut escaped = false;
    for c in line.trim().chars() {
        if escaped {
            push_char(&mut pairs, c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if let Some(close) = closing {
            if c == close {
                closing = None;
            } else {
                push_char(&mut pairs, c);
            }
        } else if let Some(close) = closing_delimiter(c) {
            closing = Some(close);
        } else if c.is_whitespace() {
            let last_segment_empty = match pairs.last().and_then(|p| p.last()) {
                Some(segment) => segment.is_empty(),
                None => true,
            };
            if !last_segment_empty {
                pairs.push(vec![String::new()]);
            }
        } else if c == '=' {
            // `key = value`: the whitespace before `=` opened an empty pair;
            // drop it so the value attaches to the previous key.
            if pairs.len() > 1
                && pairs
                    .last()
                    .is_some_and(|p| p.len() == 1 && p[0].is_empty())
            {
                pairs.pop();
            }
            if let Some(pair) = pairs.last_mut() {
                pair.push(String::new());
            }
        } else {
            push_char(&mut pairs, c);
        }
    }
    pairs
        .into_iter()
        .filter_map(|mut segments| {
            let key = std::mem::take(segments.first_mut()?);
            if key.is_empty() {
                return None;
            }
            let value = if segments.len() == 1 {
                "T".to_string()
            } else {
                segments[1..].join("=")
            };
            Some((key, value))
        })
        .collect()
}

fn push_char(pairs: &mut [Vec<String>], c: char) {
    if let Some(segment) = pairs.last_mut().and_then(|p| p.last_mut()) {
        segment.push(c);
    }
}

fn closing_delimiter(c: char) -> Option<char> {
    match c {
        '"' => Some('"'),
        '\'' => Some('\''),
        '{' => Some('}'),
        '[' => Some(']'),
        _ => None,
    }
}

/// Types a raw value like ASE: all tokens (split on whitespace and commas)
/// integers ⇒ `Int` (one token) or `IntArray` (zero or several); else all
/// floats ⇒ `Float` / `FloatArray`; else all booleans (`T F true false True
/// False TRUE FALSE`) ⇒ `Bool` / `BoolArray`; else a `_JSON ` prefix holding
/// a JSON string or a flat list of numbers / booleans ⇒ that value; else the
/// string itself. The key `uid` (any case) is always a string, as in ASE.
pub(crate) fn classify_value(key: &str, raw: &str) -> InfoValue {
    if key.eq_ignore_ascii_case("uid") {
        return InfoValue::Str(raw.to_string());
    }
    let tokens = || {
        raw.split(|c: char| c.is_whitespace() || c == ',')
            .filter(|t| !t.is_empty())
    };
    if let Some(ints) = tokens().map(parse_int).collect::<Option<Vec<i64>>>() {
        return if ints.len() == 1 {
            InfoValue::Int(ints[0])
        } else {
            InfoValue::IntArray(ints)
        };
    }
    if let Some(floats) = tokens().map(parse_float).collect::<Option<Vec<f64>>>() {
        return if floats.len() == 1 {
            InfoValue::Float(floats[0])
        } else {
            InfoValue::FloatArray(floats)
        };
    }
    if let Some(bools) = tokens().map(parse_info_bool).collect::<Option<Vec<bool>>>() {
        return if bools.len() == 1 {
            InfoValue::Bool(bools[0])
        } else {
            InfoValue::BoolArray(bools)
        };
    }
    if let Some(json) = raw.strip_prefix("_JSON ") {
        if let Some(value) = parse_json_value(json) {
            return value;
        }
    }
    InfoValue::Str(raw.to_string())
}

/// Python `int()` on a token, limited to `i64` (larger values fall through to
/// float, as numpy's conversion does).
fn parse_int(token: &str) -> Option<i64> {
    token.parse::<i64>().ok()
}

/// Python `float()` on a token (Rust's parser is correctly rounded and also
/// accepts `inf`, `infinity` and `nan` in any case).
pub(crate) fn parse_float(token: &str) -> Option<f64> {
    token.parse::<f64>().ok()
}

fn parse_info_bool(token: &str) -> Option<bool> {
    match token {
        "T" | "true" | "True" | "TRUE" => Some(true),
        "F" | "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// The subset of ASE's `_JSON` payloads that map onto [`InfoValue`]: a
/// string, a number, a boolean, or a flat list of numbers or of booleans.
/// Anything else (objects, nested lists, lists of strings) returns `None`
/// and is kept verbatim as a string, which the writer writes back as is.
fn parse_json_value(text: &str) -> Option<InfoValue> {
    let text = text.trim();
    if text.starts_with('"') {
        let (s, rest) = parse_json_string(text)?;
        return rest.trim().is_empty().then_some(InfoValue::Str(s));
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let items: Vec<&str> = if inner.trim().is_empty() {
            Vec::new()
        } else {
            inner.split(',').map(str::trim).collect()
        };
        if items.is_empty() {
            // numpy makes `np.array([])` a float array.
            return Some(InfoValue::FloatArray(Vec::new()));
        }
        if let Some(bools) = items
            .iter()
            .map(|t| json_bool(t))
            .collect::<Option<Vec<bool>>>()
        {
            return Some(InfoValue::BoolArray(bools));
        }
        let numbers = items
            .iter()
            .map(|t| json_number(t))
            .collect::<Option<Vec<JsonNumber>>>()?;
        if numbers.iter().all(|n| matches!(n, JsonNumber::Int(_))) {
            let ints = numbers.iter().filter_map(|n| {
                if let JsonNumber::Int(i) = n {
                    Some(*i)
                } else {
                    None
                }
            });
            return Some(InfoValue::IntArray(ints.collect()));
        }
        return Some(InfoValue::FloatArray(
            numbers.iter().map(JsonNumber::as_f64).collect(),
        ));
    }
    if let Some(b) = json_bool(text) {
        return Some(InfoValue::Bool(b));
    }
    match json_number(text)? {
        JsonNumber::Int(i) => Some(InfoValue::Int(i)),
        JsonNumber::Float(x) => Some(InfoValue::Float(x)),
    }
}

enum JsonNumber {
    Int(i64),
    Float(f64),
}

impl JsonNumber {
    fn as_f64(&self) -> f64 {
        match *self {
            JsonNumber::Int(i) => i as f64,
            JsonNumber::Float(x) => x,
        }
    }
}

fn json_bool(token: &str) -> Option<bool> {
    match token {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// A JSON number as Python's `json` module reads it (also `NaN`,
/// `Infinity`, `-Infinity`, which Python writes for non-finite floats).
fn json_number(token: &str) -> Option<JsonNumber> {
    match token {
        "NaN" => return Some(JsonNumber::Float(f64::NAN)),
        "Infinity" => return Some(JsonNumber::Float(f64::INFINITY)),
        "-Infinity" => return Some(JsonNumber::Float(f64::NEG_INFINITY)),
        _ => {}
    }
    let body = token.strip_prefix('-').unwrap_or(token);
    if body.is_empty()
        || !body
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    if !body.as_bytes()[0].is_ascii_digit() {
        return None;
    }
    if body.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = token.parse::<i64>() {
            return Some(JsonNumber::Int(i));
        }
    }
    token.parse::<f64>().ok().map(JsonNumber::Float)
}

/// Parses a JSON string literal at the start of `text`; returns the decoded
/// string and the remaining text.
fn parse_json_string(text: &str) -> Option<(String, &str)> {
    let mut chars = text.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &text[i + 1..])),
            '\\' => {
                let (_, e) = chars.next()?;
                match e {
                    '"' => out.push('"'),
                    '\\' => out.push('\\'),
                    '/' => out.push('/'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    'u' => {
                        let first = read_hex4(&mut chars)?;
                        let code = if (0xD800..0xDC00).contains(&first) {
                            // A surrogate pair encodes one code point above U+FFFF.
                            if chars.next()?.1 != '\\' || chars.next()?.1 != 'u' {
                                return None;
                            }
                            let second = read_hex4(&mut chars)?;
                            if !(0xDC00..0xE000).contains(&second) {
                                return None;
                            }
                            0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                        } else {
                            first
                        };
                        out.push(char::from_u32(code)?);
                    }
                    _ => return None,
                }
            }
            c if (c as u32) < 0x20 => return None,
            c => out.push(c),
        }
    }
    None
}

/// True when `text` is one complete JSON value as Python's `json.loads`
/// accepts it (including `NaN`, `Infinity`, `-Infinity`).
pub(crate) fn is_valid_json(text: &str) -> bool {
    match skip_json_value(text.trim_start(), 0) {
        Some(rest) => rest.trim().is_empty(),
        None => false,
    }
}

/// Skips one JSON value at the start of `text`, returning the rest.
fn skip_json_value(text: &str, depth: usize) -> Option<&str> {
    // Deeply nested input must not overflow the stack.
    if depth > 64 {
        return None;
    }
    let text = text.trim_start();
    let first = text.chars().next()?;
    match first {
        '"' => parse_json_string(text).map(|(_, rest)| rest),
        '[' | '{' => {
            let close = if first == '[' { ']' } else { '}' };
            let mut rest = text[1..].trim_start();
            if let Some(after) = rest.strip_prefix(close) {
                return Some(after);
            }
            loop {
                if first == '{' {
                    rest = parse_json_string(rest.trim_start())?
                        .1
                        .trim_start()
                        .strip_prefix(':')?;
                }
                rest = skip_json_value(rest, depth + 1)?.trim_start();
                if let Some(after) = rest.strip_prefix(',') {
                    rest = after;
                } else {
                    return rest.strip_prefix(close);
                }
            }
        }
        _ => {
            let end = text
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
                .unwrap_or(text.len());
            let token = &text[..end];
            let literal =
                matches!(token, "true" | "false" | "null") || json_number(token).is_some();
            literal.then_some(&text[end..])
        }
    }
}

fn read_hex4(chars: &mut std::str::CharIndices<'_>) -> Option<u32> {
    let mut v = 0;
    for _ in 0..4 {
        v = v * 16 + chars.next()?.1.to_digit(16)?;
    }
    Some(v)
}

/// A JSON string literal for `s`, ASCII-only like Python's `json.dumps`.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || (c as u32) >= 0x7f => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `s` as one token of a comment line: unchanged when ASE's tokeniser reads
/// it back verbatim, otherwise double-quoted with `\` and `"` escaped.
pub(crate) fn quote(s: &str) -> String {
    let needs_quotes = s.is_empty()
        || s.chars().any(|c| {
            c.is_whitespace() || matches!(c, '"' | '\'' | '{' | '}' | '[' | ']' | '=' | '\\')
        });
    if !needs_quotes {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(line: &str) -> Vec<(String, String)> {
        split_pairs(line)
    }

    fn kv(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn splits_quoted_bracketed_and_bare_values() {
        let p = pairs(
            r#"Lattice="1 0 0 0 1 0 0 0 1" a=1 b = 2.5 flag c={x y} d=[1, 2] e='q r' s="say \"hi\"""#,
        );
        assert_eq!(
            p,
            vec![
                kv("Lattice", "1 0 0 0 1 0 0 0 1"),
                kv("a", "1"),
                kv("b", "2.5"),
                kv("flag", "T"),
                kv("c", "x y"),
                kv("d", "1, 2"),
                kv("e", "q r"),
                kv("s", "say \"hi\""),
            ]
        );
    }

    #[test]
    fn extra_equals_are_kept_in_value_and_plain_comments_become_flags() {
        assert_eq!(pairs("url=a=b"), vec![kv("url", "a=b")]);
        assert_eq!(
            pairs("  Cubic bulk  silicon "),
            vec![kv("Cubic", "T"), kv("bulk", "T"), kv("silicon", "T")]
        );
        assert_eq!(pairs(""), vec![]);
        assert_eq!(pairs("=5 x=1"), vec![kv("x", "1")]);
        // ASE quirk kept for compatibility: an empty value swallows the next pair.
        assert_eq!(pairs(r#"k="" other=1"#), vec![kv("k", "other=1")]);
    }

    #[test]
    fn classifies_like_ase() {
        use InfoValue::*;
        assert_eq!(classify_value("k", "5"), Int(5));
        assert_eq!(classify_value("k", "+5"), Int(5));
        assert_eq!(classify_value("k", "1.0"), Float(1.0));
        assert_eq!(classify_value("k", "1e+16"), Float(1e16));
        assert_eq!(classify_value("k", "1 2,3"), IntArray(vec![1, 2, 3]));
        assert_eq!(classify_value("k", "1 2.5"), FloatArray(vec![1.0, 2.5]));
        assert_eq!(classify_value("k", ""), IntArray(vec![]));
        assert_eq!(classify_value("k", "99999999999999999999"), Float(1e20));
        assert_eq!(classify_value("k", "T"), Bool(true));
        assert_eq!(classify_value("k", "false"), Bool(false));
        assert_eq!(
            classify_value("k", "T F TRUE"),
            BoolArray(vec![true, false, true])
        );
        assert_eq!(classify_value("k", "t"), Str("t".into()));
        assert_eq!(
            classify_value("k", "hello world"),
            Str("hello world".into())
        );
        assert_eq!(classify_value("uid", "12"), Str("12".into()));
        assert_eq!(classify_value("k", r#"_JSON "T""#), Str("T".into()));
        assert_eq!(classify_value("k", "_JSON [1.5]"), FloatArray(vec![1.5]));
        assert_eq!(classify_value("k", "_JSON [1, 2]"), IntArray(vec![1, 2]));
        assert_eq!(classify_value("k", "_JSON [true]"), BoolArray(vec![true]));
        assert_eq!(classify_value("k", "_JSON []"), FloatArray(vec![]));
        assert!(is_valid_json(
            r#" {"a": [1, 2.5e3, -0.0, NaN], "b": {"c": null}, "d": "x\"y"} "#
        ));
        assert!(
            is_valid_json("[[1, 2], [3, 4]]") && is_valid_json("-Infinity") && is_valid_json("[]")
        );
        for bad in [
            "",
            "not json",
            "[1, 2",
            "{\"a\" 1}",
            "[1,]",
            "\"open",
            "1 2",
            "tru",
        ] {
            assert!(!is_valid_json(bad), "{bad}");
        }
        let nested = r#"_JSON {"a": [1, 2]}"#;
        assert_eq!(classify_value("k", nested), Str(nested.into()));
    }

    #[test]
    fn json_strings_round_trip() {
        for s in ["", "T", "a\"b\\c", "line\nbreak\ttab", "é ü 😀", "\u{1}"] {
            let json = json_string(s);
            let (back, rest) = parse_json_string(&json).unwrap();
            assert_eq!(back, s);
            assert!(rest.is_empty());
        }
    }

    #[test]
    fn quoted_tokens_read_back_verbatim() {
        for s in [
            "plain",
            "with space",
            "q\"uote",
            "back\\slash",
            "{brace}",
            "a=b",
            "it's",
        ] {
            let line = format!("k={} other=1", quote(s));
            assert_eq!(pairs(&line), vec![kv("k", s), kv("other", "1")], "{line}");
        }
    }
}
