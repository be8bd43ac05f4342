//! Calico's label selector language, as written in an IPPool's
//! `nodeSelector` and `namespaceSelector` (libcalico-go `lib/selector`).
//!
//! Grammar (lowest precedence first; blanks are spaces and tabs only, as in
//! Calico's tokenizer):
//!
//! ```text
//! selector  := ""  |  or
//! or        := and ( "||" and )*
//! and       := operation ( "&&" operation )*
//! operation := "!"* ( "all()" | "global()" | "has(" key ")" | "(" or ")"
//!                   | key ( "==" | "!=" | "contains" | "starts with" | "ends with" ) string
//!                   | key ( "in" | "not in" ) "{" [ string ( "," string )* [ "," ] ] "}" )
//! key       := [A-Za-z0-9_./-]{1,512}
//! string    := '"' [^"]* '"'  |  "'" [^']* "'"      (no escapes)
//! ```
//!
//! The operator words are only recognised right after a key, so a key may be
//! spelled `in` or `has`. An absent label satisfies `!=` and `not in` and
//! fails every other test. `global()` matches every label set here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

/// Calico's limit on the length of a label key in a selector.
const MAX_KEY_LEN: usize = 512;
/// How deep parentheses may nest: the parser recurses once per level, and
/// a deeper selector would overflow the stack (Go's growable stacks have no
/// such limit; no real selector comes near it).
const MAX_NESTING: usize = 256;

/// A parsed Calico selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    root: Node,
}

/// Why a selector did not parse; the message names the selector text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

/// The expression tree (`&&` and `||` are n-ary, like Calico's).
#[derive(Debug, Clone, PartialEq)]
enum Node {
    All,
    Global,
    Label { key: String, test: Test },
    Not(Box<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
}

/// What a [`Node::Label`] asks of its label's value.
#[derive(Debug, Clone, PartialEq)]
enum Test {
    Has,
    Eq(String),
    Ne(String),
    Contains(String),
    StartsWith(String),
    EndsWith(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
}

impl Selector {
    /// Parses `text`; an empty or blank selector is `all()`.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let fail = |why: String| SelectorError(format!("failed to parse selector {text:?}: {why}"));
        let toks = tokenize(text).map_err(fail)?;
        if toks.is_empty() {
            return Ok(Selector { root: Node::All });
        }
        let mut p = Parser {
            toks,
            pos: 0,
            depth: 0,
        };
        let root = p.or().map_err(fail)?;
        match p.toks.get(p.pos) {
            None => Ok(Selector { root }),
            Some(t) => Err(fail(format!("unexpected {t} at end of selector"))),
        }
    }

    /// Whether the labels match.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.root.eval(labels)
    }

    /// True for a selector that matches every label set syntactically (empty
    /// string, `all()`, `global()` alone) — lets callers skip reading labels.
    pub fn matches_everything(&self) -> bool {
        matches!(self.root, Node::All | Node::Global)
    }
}

impl FromStr for Selector {
    type Err = SelectorError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Selector::parse(text)
    }
}

impl Node {
    fn eval(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Node::All | Node::Global => true,
            Node::Not(n) => !n.eval(labels),
            Node::And(ns) => ns.iter().all(|n| n.eval(labels)),
            Node::Or(ns) => ns.iter().any(|n| n.eval(labels)),
            Node::Label { key, test } => {
                let value = labels.get(key).map(String::as_str);
                match (test, value) {
                    (Test::Has, v) => v.is_some(),
                    // The two negative tests hold for an absent label.
                    (Test::Ne(s), v) => v != Some(s.as_str()),
                    (Test::NotIn(set), v) => v.is_none_or(|v| !set.contains(v)),
                    (_, None) => false,
                    (Test::Eq(s), Some(v)) => v == s,
                    (Test::Contains(s), Some(v)) => v.contains(s.as_str()),
                    (Test::StartsWith(s), Some(v)) => v.starts_with(s.as_str()),
                    (Test::EndsWith(s), Some(v)) => v.ends_with(s.as_str()),
                    (Test::In(set), Some(v)) => set.contains(v),
                }
            }
        }
    }
}

/// A lexical token; the end of input is the end of the token list.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Key(String),
    Str(String),
    Has(String),
    /// Punctuation, an operator, an operator word or `all()` / `global()`.
    Sym(&'static str),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Key(k) => write!(f, "label {k:?}"),
            Tok::Str(s) => write!(f, "string {s:?}"),
            Tok::Has(k) => write!(f, "'has({k})'"),
            Tok::Sym(s) => write!(f, "'{s}'"),
        }
    }
}

/// Symbols, two-character ones first.
const SYMBOLS: [&str; 10] = ["==", "!=", "&&", "||", "!", "(", ")", "{", "}", ","];
/// Operator words, valid only right after a key; "not in" before "in".
const WORDS: [&str; 5] = ["contains", "starts with", "ends with", "not in", "in"];

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-')
}

fn trim_blanks(s: &str) -> &str {
    s.trim_start_matches([' ', '\t'])
}

/// Splits a label key off the front of `s`.
fn cut_key(s: &str) -> Result<(String, &str), String> {
    let end = s.bytes().position(|b| !is_key_byte(b)).unwrap_or(s.len());
    match &s[..end] {
        "" => Err("expected a label name".into()),
        k if k.len() > MAX_KEY_LEN => Err(format!("label too long: {k}")),
        k => Ok((k.to_owned(), &s[end..])),
    }
}

/// Strips the operator word `op` off the front of `s`, its words separated by
/// any blanks (or none, so `notin` is `not in`), when no key character follows.
fn cut_word<'a>(s: &'a str, op: &str) -> Option<&'a str> {
    let mut rest = s;
    for (i, w) in op.split(' ').enumerate() {
        if i > 0 {
            rest = trim_blanks(rest);
        }
        rest = rest.strip_prefix(w)?;
    }
    (!rest.bytes().next().is_some_and(is_key_byte)).then_some(rest)
}

/// Strips `name(` blanks `)` off the front of `s` (`all()`, `global()`).
fn cut_call<'a>(s: &'a str, name: &str) -> Option<Result<&'a str, String>> {
    let rest = trim_blanks(s.strip_prefix(name)?.strip_prefix('(')?);
    Some(
        rest.strip_prefix(')')
            .ok_or(format!("no closing ')' after {name}(")),
    )
}

fn tokenize(text: &str) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut rest = trim_blanks(text);
    while let Some(c) = rest.chars().next() {
        let (tok, next) = if let Some(sym) = SYMBOLS.into_iter().find(|s| rest.starts_with(s)) {
            (Tok::Sym(sym), &rest[sym.len()..])
        } else if c == '=' || c == '&' || c == '|' {
            return Err(format!("expected '{c}{c}'"));
        } else if c == '"' || c == '\'' {
            let end = rest[1..].find(c).ok_or("unterminated string")?;
            (Tok::Str(rest[1..=end].to_owned()), &rest[end + 2..])
        } else if let Some(Tok::Key(k)) = toks.last() {
            // Right after a key, only an operator may follow.
            WORDS
                .into_iter()
                .find_map(|op| cut_word(rest, op).map(|r| (Tok::Sym(op), r)))
                .ok_or_else(|| format!("expected an operator after label {k:?}"))?
        } else if let Some(r) = rest.strip_prefix("has(") {
            let (key, r) = cut_key(trim_blanks(r))?;
            let r = trim_blanks(r).strip_prefix(')');
            (Tok::Has(key), r.ok_or("no closing ')' after has(")?)
        } else if let Some(r) = cut_call(rest, "all") {
            (Tok::Sym("all()"), r?)
        } else if let Some(r) = cut_call(rest, "global") {
            (Tok::Sym("global()"), r?)
        } else if c.is_ascii() && is_key_byte(c as u8) {
            let (key, r) = cut_key(rest)?;
            (Tok::Key(key), r)
        } else {
            return Err(format!("unexpected character {c:?}"));
        };
        toks.push(tok);
        rest = trim_blanks(next);
    }
    Ok(toks)
}

/// One level of the grammar, as a [`Parser`] method.
type Step = fn(&mut Parser) -> Result<Node, String>;

/// A recursive-descent parser over the token list.
struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    /// Parentheses open at this point.
    depth: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += usize::from(t.is_some());
        t
    }

    /// Consumes the next token if it is the symbol `sym`.
    fn eat(&mut self, sym: &str) -> bool {
        let hit = matches!(self.toks.get(self.pos), Some(Tok::Sym(s)) if *s == sym);
        self.pos += usize::from(hit);
        hit
    }

    /// `sub ( sep sub )*`: one `sub`, or all of them under `join`.
    fn chain(&mut self, sep: &str, sub: Step, join: fn(Vec<Node>) -> Node) -> Result<Node, String> {
        let mut ns = vec![sub(self)?];
        while self.eat(sep) {
            ns.push(sub(self)?);
        }
        Ok(if ns.len() == 1 {
            ns.remove(0)
        } else {
            join(ns)
        })
    }

    /// `and ( "||" and )*`
    fn or(&mut self) -> Result<Node, String> {
        self.chain("||", Self::and, Node::Or)
    }

    /// `operation ( "&&" operation )*`
    fn and(&mut self) -> Result<Node, String> {
        self.chain("&&", Self::operation, Node::And)
    }

    /// A possibly negated test, `all()`, `global()` or parenthesised `or`.
    fn operation(&mut self) -> Result<Node, String> {
        let mut negated = false;
        while self.eat("!") {
            negated = !negated;
        }
        let node = match self.next() {
            Some(Tok::Sym("all()")) => Node::All,
            Some(Tok::Sym("global()")) => Node::Global,
            Some(Tok::Has(key)) => Node::Label {
                key,
                test: Test::Has,
            },
            Some(Tok::Key(key)) => {
                let test = self.test(&key)?;
                Node::Label { key, test }
            }
            Some(Tok::Sym("(")) => {
                if self.depth == MAX_NESTING {
                    return Err(format!("parentheses nested more than {MAX_NESTING} deep"));
                }
                self.depth += 1;
                let inner = self.or()?;
                self.depth -= 1;
                if !self.eat(")") {
                    return Err("expected ')'".into());
                }
                inner
            }
            Some(t) => return Err(format!("unexpected {t}")),
            None => return Err("unexpected end of selector, expected an expression".into()),
        };
        Ok(if negated {
            Node::Not(Box::new(node))
        } else {
            node
        })
    }

    /// The operator and operand after the label `key`.
    fn test(&mut self, key: &str) -> Result<Test, String> {
        let end = || format!("unexpected end of selector after label {key:?}");
        let op = match self.next() {
            Some(Tok::Sym(op)) => op,
            Some(t) => return Err(format!("expected an operator after label {key:?}, not {t}")),
            None => return Err(end()),
        };
        if op == "in" || op == "not in" {
            if !self.eat("{") {
                return Err(format!("expected '{{' after '{op}'"));
            }
            let mut set = BTreeSet::new();
            while let Some(Tok::Str(s)) = self.toks.get(self.pos) {
                set.insert(s.clone());
                self.pos += 1;
                if !self.eat(",") {
                    break;
                }
            }
            if !self.eat("}") {
                return Err("expected '}' or a string in set literal".into());
            }
            return Ok(if op == "in" {
                Test::In(set)
            } else {
                Test::NotIn(set)
            });
        }
        let make: fn(String) -> Test = match op {
            "==" => Test::Eq,
            "!=" => Test::Ne,
            "contains" => Test::Contains,
            "starts with" => Test::StartsWith,
            "ends with" => Test::EndsWith,
            _ => {
                return Err(format!(
                    "expected an operator after label {key:?}, not '{op}'"
                ));
            }
        };
        match self.next() {
            Some(Tok::Str(s)) => Ok(make(s)),
            Some(t) => Err(format!("expected a string after '{op}', not {t}")),
            None => Err(end()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case a line: `selector => labels ("k=v,k2=v2"; empty: none) => expected match`.
    const MATCHES: &str = r#"
        => => true
        all() => a=b => true
        global() => a=b => true
        !all() => => false
        has(a) => a= => true
        has( a\t) => a=x => true
        has(a) => b=x => false
        a == "x" => a=x => true
        a == 'x' => a=x => true
        a == 'x' => a=y => false
        a == 'say "hi"' => a=say "hi" => true
        a == "it's" => a=it's => true
        a == "" => a= => true
        a != 'x' => => true
        a != 'x' => a=y => true
        a != 'x' => a=x => false
        a in { "x", 'y' } => a=y => true
        a in { "x", 'y' } => a=z => false
        a in {'x'} => => false
        a not in {'x', 'y'} => a=x => false
        a not in {'x', 'y'} => a=z => true
        a not in {'x', 'y'} => => true
        a in {} => a= => false
        a not in { } => a= => true
        a in {'x',} => a=x => true
        a in{'x'} => a=x => true
        a notin {'x'} => a=y => true
        a not \t in {'x'} => a=x => false
        a contains 'ell' => a=hello => true
        a starts   with 'he' => a=hello => true
        a ends with 'lo' => a=hello => true
        a ends with 'he' => a=hello => false
        a contains '' => a=v => true
        a contains '' => => false
        a starts with '' => => false
        a ends with '' => => false
        has(a) || has(b) && has(c) => a= => true
        has(a) || has(b) && has(c) => b= => false
        has(a) || has(b) && has(c) => b=,c= => true
        has(a) && has(b) || has(c) => c= => true
        has(a) && has(b) || has(c) => a= => false
        (has(a) || has(b)) && has(c) => a= => false
        (has(a) || has(b)) && has(c) => a=,c= => true
        ((( has(a) ))) => a= => true
        !has(a) => => true
        !!has(a) => => false
        ! ! !has(a) => => true
        !has(a) && has(b) => a=,b= => false
        !(has(a) && has(b)) => a= => true
        !a == 'x' => a=y => true
        kubernetes.io/hostname == 'node-1' => kubernetes.io/hostname=node-1 => true
        projectcalico.org/name=="ns"&&a_b-c.d!="x" => projectcalico.org/name=ns => true
        \thas(x)\t||\tk8s.io/x\tin\t{'y'}\t => k8s.io/x=y => true
        in == 'x' => in=x => true
        has == 'x' && all == 'y' => has=x,all=y => true
        contains contains 'o' => contains=foo => true
    "#;

    /// One case a line: `selector => a fragment of its parse error`.
    const ERRORS: &str = r#"
        a == "x => unterminated string
        a == 'x => unterminated string
        a = 'x' => expected '=='
        has(a) & has(b) => expected '&&'
        has(a) | has(b) => expected '||'
        has(a) # x => unexpected character '#'
        a == 'x' ; b => unexpected character ';'
        has(a => no closing ')' after has(
        has() => expected a label name
        all(x) => no closing ')' after all(
        global( => no closing ')' after global(
        a foo 'x' => expected an operator after label "a"
        a inx {} => expected an operator after label "a"
        a => unexpected end of selector after label "a"
        a == => unexpected end of selector after label "a"
        a == b => expected a string after '==', not label "b"
        a && b => expected an operator after label "a", not '&&'
        a in 'x' => expected '{' after 'in'
        a not in => expected '{' after 'not in'
        a in {'x' => expected '}'
        a in {'x' 'y'} => expected '}'
        a in {,} => expected '}'
        a in {'x',,} => expected '}'
        a in {b} => expected '}'
        has(a) && => unexpected end of selector
        || has(a) => unexpected '||'
        ! => unexpected end of selector
        () => unexpected ')'
        (has(a) => expected ')'
        has(a)) => unexpected ')' at end of selector
        has(a) has(b) => unexpected 'has(b)' at end of selector
        all() all() => unexpected 'all()' at end of selector
        'x' => unexpected string "x"
        has(a) && && has(b) => unexpected '&&'
        has(a)\n => unexpected character
    "#;

    /// The lines of a table, split at `=>`, trimmed of spaces, with `\t` and
    /// `\n` unescaped.
    fn rows(table: &str) -> impl Iterator<Item = Vec<String>> {
        let unescape = |f: &str| {
            f.trim_matches(' ')
                .replace(r"\t", "\t")
                .replace(r"\n", "\n")
        };
        let lines = table
            .lines()
            .map(|l| l.trim_matches(' '))
            .filter(|l| !l.is_empty());
        lines.map(move |l| l.split("=>").map(unescape).collect())
    }

    fn labels(spec: &str) -> BTreeMap<String, String> {
        let pairs = spec.split(',').filter(|p| !p.is_empty());
        pairs
            .map(|p| p.split_once('=').unwrap())
            .map(|(k, v)| (k.into(), v.into()))
            .collect()
    }

    #[test]
    fn matching() {
        for row in rows(MATCHES) {
            let (sel, spec, want) = (&row[0], &row[1], row[2] == "true");
            let got = Selector::parse(sel).expect(sel).matches(&labels(spec));
            assert_eq!(got, want, "{sel:?} on {spec:?}");
        }
    }

    #[test]
    fn errors_name_the_selector() {
        let long = format!("{} == 'x'", "k".repeat(MAX_KEY_LEN + 1));
        for row in rows(ERRORS).chain([vec![long, "label too long".into()]]) {
            let (sel, want) = (&row[0], &row[1]);
            let e = Selector::parse(sel).expect_err(sel);
            let prefix = format!("failed to parse selector {sel:?}: ");
            assert!(
                e.0.starts_with(&prefix) && e.0.contains(want),
                "{sel:?}: {e}"
            );
        }
        assert!(Selector::parse(&format!("{} == 'x'", "k".repeat(MAX_KEY_LEN))).is_ok());
        let e = Selector::parse("a == 'x").unwrap_err().to_string();
        assert_eq!(
            e,
            r#"failed to parse selector "a == 'x": unterminated string"#
        );
    }

    #[test]
    fn matches_everything() {
        for s in ["", "  \t ", "all()", " all( ) ", "global()", "(all())"] {
            assert!(Selector::parse(s).unwrap().matches_everything(), "{s:?}");
        }
        for s in ["!all()", "all() && has(a)", "has(a)", "a != 'x'"] {
            assert!(!Selector::parse(s).unwrap().matches_everything(), "{s:?}");
        }
    }

    #[test]
    fn from_str_and_equality() {
        let a: Selector = "has(a) && b == 'c'".parse().unwrap();
        assert_eq!(a, Selector::parse(" has( a )&&b==\"c\"\t").unwrap());
        assert_ne!(a, Selector::parse("has(a)").unwrap());
        assert!("a ==".parse::<Selector>().is_err());
    }
}
