//! Size expressions: the sympy strings the archive writes for tensor sizes,
//! restricted to what ddmlip's row domains need — a monomial
//! `factor · s₁ · s₂ …` (e.g. `s35`, `16*s35`).

use std::collections::BTreeMap;
use std::fmt;

/// `factor · Π symbols` with integer factor (a constant when `symbols` is empty).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeExpr {
    /// The integer coefficient.
    pub factor: i64,
    /// Symbol names, sorted (repeated for powers).
    pub symbols: Vec<String>,
}

impl SizeExpr {
    /// A literal size.
    pub fn constant(n: i64) -> SizeExpr {
        SizeExpr {
            factor: n,
            symbols: Vec::new(),
        }
    }

    /// The size symbol `name`.
    pub fn symbol(name: &str) -> SizeExpr {
        SizeExpr {
            factor: 1,
            symbols: vec![name.to_string()],
        }
    }

    /// The literal value, when the size is fixed.
    pub fn as_constant(&self) -> Option<i64> {
        self.symbols.is_empty().then_some(self.factor)
    }

    /// Parses `Symbol('s28', positive=True, integer=True)`, `s28`, `16*s28`,
    /// `Mul(Integer(16), Symbol('s28'))` or an integer; anything else (sums,
    /// floor division, …) is refused with a message naming it.
    pub fn parse(text: &str) -> Result<SizeExpr, String> {
        let refuse = || {
            format!("unsupported size expression `{text}` (ddmlip reads products of size symbols, like `16*s35`)")
        };
        parse_product(text.trim()).ok_or_else(refuse)
    }

    /// The value with the given symbol values; `None` when a symbol is unbound
    /// or the product overflows.
    pub fn eval(&self, values: &BTreeMap<String, usize>) -> Option<usize> {
        let mut v = usize::try_from(self.factor).ok()?;
        for s in &self.symbols {
            v = v.checked_mul(*values.get(s)?)?;
        }
        Some(v)
    }

    fn times(mut self, other: SizeExpr) -> Option<SizeExpr> {
        self.factor = self.factor.checked_mul(other.factor)?;
        self.symbols.extend(other.symbols);
        self.symbols.sort();
        Some(self)
    }
}

impl fmt::Display for SizeExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.symbols.is_empty() {
            return write!(f, "{}", self.factor);
        }
        if self.factor != 1 {
            write!(f, "{}*", self.factor)?;
        }
        write!(f, "{}", self.symbols.join("*"))
    }
}

/// Splits at top-level occurrences of `sep` (outside parentheses and quotes).
fn split_top(s: &str, sep: char) -> Vec<&str> {
    let (mut depth, mut quoted, mut start) = (0i32, false, 0);
    let mut parts = Vec::new();
    for (i, c) in s.char_indices() {
        match c {
            '\'' | '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            c if c == sep && depth == 0 && !quoted => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn call_args<'a>(s: &'a str, name: &str) -> Option<&'a str> {
    s.strip_prefix(name)?.strip_prefix('(')?.strip_suffix(')')
}

fn parse_product(s: &str) -> Option<SizeExpr> {
    let factors = split_top(s, '*');
    let mut acc = SizeExpr::constant(1);
    for f in factors {
        acc = acc.times(parse_factor(f.trim())?)?;
    }
    Some(acc)
}

fn parse_factor(s: &str) -> Option<SizeExpr> {
    if let Some(args) = call_args(s, "Symbol") {
        let first = split_top(args, ',').into_iter().next()?.trim();
        let name = first
            .strip_prefix('\'')
            .and_then(|n| n.strip_suffix('\''))
            .or_else(|| first.strip_prefix('"').and_then(|n| n.strip_suffix('"')))?;
        return valid_name(name).then(|| SizeExpr::symbol(name));
    }
    if let Some(args) = call_args(s, "Integer") {
        return args.trim().parse().ok().map(SizeExpr::constant);
    }
    if let Some(args) = call_args(s, "Mul") {
        let mut acc = SizeExpr::constant(1);
        for a in split_top(args, ',') {
            acc = acc.times(parse_product(a.trim())?)?;
        }
        return Some(acc);
    }
    if let Ok(n) = s.parse::<i64>() {
        return Some(SizeExpr::constant(n));
    }
    valid_name(s).then(|| SizeExpr::symbol(s))
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_torch_writes() {
        let s35 = SizeExpr::symbol("s35");
        assert_eq!(
            SizeExpr::parse("Symbol('s35', positive=True, integer=True)").unwrap(),
            s35
        );
        assert_eq!(SizeExpr::parse("s35").unwrap(), s35);
        let sixteen = SizeExpr {
            factor: 16,
            symbols: vec!["s35".into()],
        };
        assert_eq!(SizeExpr::parse("16*s35").unwrap(), sixteen);
        assert_eq!(
            SizeExpr::parse("Mul(Integer(16), Symbol('s35', positive=True, integer=True))")
                .unwrap(),
            sixteen
        );
        assert_eq!(SizeExpr::parse("7").unwrap(), SizeExpr::constant(7));
        let values = BTreeMap::from([("s35".to_string(), 5usize)]);
        assert_eq!(sixteen.eval(&values), Some(80));
        assert_eq!(sixteen.to_string(), "16*s35");
    }

    #[test]
    fn refuses_sums_and_floor_division() {
        for bad in ["s1 + 1", "FloorDiv(s1, 2)", "Symbol(s1)", "", "2*"] {
            let err = SizeExpr::parse(bad).unwrap_err();
            assert!(err.contains("unsupported size expression"), "{bad}: {err}");
        }
    }
}
