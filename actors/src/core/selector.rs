//! Label and field selectors parsed and evaluated as the kube-apiserver does
//! (`labels.Parse`, `fields.ParseSelector` and the core registries' field labels; written
//! against 1.20, the field labels checked again on the reference, v1.37.2).

use std::collections::BTreeSet;

use thiserror::Error;

use crate::core::object::Object;

/// The most requirements one selector may carry. The API server has no limit, but every
/// watcher evaluates its selector on every event of its key, so a hostile selector must
/// not cost unbounded work per event.
pub const MAX_REQUIREMENTS: usize = 100;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// Label selector grammar: a token where the grammar wants another. `found` is empty
    /// at the end of the input, as in the API server's message.
    #[error("found '{found}', expected: {expected}")]
    Syntax {
        found: String,
        expected: &'static str,
    },
    #[error("invalid label key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("invalid label value {value:?}: {reason}")]
    InvalidValue { value: String, reason: &'static str },
    #[error("for 'Gt', 'Lt' operators, the value must be an integer: {0:?}")]
    NotInteger(String),
    #[error("too many requirements: a selector may have at most {MAX_REQUIREMENTS}")]
    TooManyRequirements,
    /// Field selector: a term with no `=`, `==` or `!=` (`fields.parseSelector`'s words,
    /// the whole selector and the term).
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm { selector: String, term: String },
    /// Field selector: an escape other than `\\`, `\,`, `\=`, or a trailing `\`
    /// (`InvalidEscapeSequence`).
    #[error("invalid field selector: invalid escape sequence: {sequence}")]
    InvalidEscape { sequence: String },
    /// Field selector: a bare `,` or `=` in a value (`UnescapedRune`, which prints the
    /// rune as a number, as Go's `%v` of a rune does).
    #[error("invalid field selector: unescaped character in value: {}", *.0 as u32)]
    UnescapedRune(char),
    /// The API server's exact message; the HTTP layer answers it with 400 BadRequest.
    #[error("field label not supported: {label}")]
    FieldLabelNotSupported { label: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------

/// What one label requirement tests. Sets are ordered sets: lookups stay logarithmic
/// however long a client makes an `in (...)` list, and duplicates collapse as in the API
/// server's string sets.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Exists,
    NotExists,
    Eq(String),
    NotEq(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

impl LabelRequirement {
    /// `value` is the object's label under `key`, `None` when it has no such label.
    fn matches(&self, value: Option<&str>) -> bool {
        match &self.op {
            LabelOp::Exists => value.is_some(),
            LabelOp::NotExists => value.is_none(),
            LabelOp::Eq(want) => value == Some(want.as_str()),
            // Negative operators hold for an object without the label at all: `app!=web`
            // selects the unlabelled objects too.
            LabelOp::NotEq(want) => value != Some(want.as_str()),
            LabelOp::In(set) => value.is_some_and(|v| set.contains(v)),
            LabelOp::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
            // A label that is absent or not an integer never compares.
            LabelOp::Gt(n) => int_label(value).is_some_and(|v| v > *n),
            LabelOp::Lt(n) => int_label(value).is_some_and(|v| v < *n),
        }
    }
}

fn int_label(value: Option<&str>) -> Option<i64> {
    value.and_then(|v| v.parse().ok())
}

/// A parsed label selector; one without requirements selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    reqs: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses `s` with `labels.Parse`'s grammar; empty or blank input selects everything.
    pub fn parse(s: &str) -> Result<Self> {
        let mut p = Parser::new(s);
        let mut reqs = Vec::new();
        loop {
            match p.peek() {
                Token::End => break,
                Token::Ident(_) | Token::Not => {}
                other => return Err(syntax(other, "!, identifier, or 'end of string'")),
            }
            // Checked before parsing the next requirement, so a long selector is refused
            // after reading at most the allowed number of requirements.
            if reqs.len() == MAX_REQUIREMENTS {
                return Err(Error::TooManyRequirements);
            }
            reqs.push(p.requirement()?);
            match p.next() {
                Token::End => break,
                // A trailing comma is an error, not an empty requirement.
                Token::Comma => match p.peek() {
                    Token::Ident(_) | Token::Not => {}
                    other => return Err(syntax(other, "identifier after ','")),
                },
                other => return Err(syntax(other, "',' or 'end of string'")),
            }
        }
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Object) -> bool {
        self.reqs.iter().all(|r| r.matches(obj.label(&r.key)))
    }
}

/// One lexical token of a label selector. Keywords (`in`, `notin`) stay identifiers: the
/// API server reads them as keywords only where an operator is expected, so `in=notin`
/// is a valid requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    End,
    Ident(&'a [u8]),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

impl Token<'_> {
    fn literal(&self) -> String {
        match self {
            Token::End => String::new(),
            Token::Ident(b) => String::from_utf8_lossy(b).into_owned(),
            Token::Not => "!".into(),
            Token::Eq => "=".into(),
            Token::DoubleEq => "==".into(),
            Token::NotEq => "!=".into(),
            Token::Gt => ">".into(),
            Token::Lt => "<".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Comma => ",".into(),
        }
    }
}

fn syntax(found: Token<'_>, expected: &'static str) -> Error {
    Error::Syntax {
        found: found.literal(),
        expected,
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn symbol(b: u8) -> Option<Token<'static>> {
    Some(match b {
        b'!' => Token::Not,
        b'=' => Token::Eq,
        b'>' => Token::Gt,
        b'<' => Token::Lt,
        b'(' => Token::Open,
        b')' => Token::Close,
        b',' => Token::Comma,
        _ => return None,
    })
}

/// Splits a label selector into tokens byte by byte, as the API server's lexer: any run
/// of bytes that are neither whitespace nor one of `!=<>(),` is an identifier (validation
/// comes later), and symbols combine greedily into `!=` and `==`.
struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a str) -> Self {
        Lexer {
            src: s.as_bytes(),
            pos: 0,
            done: false,
        }
    }

    /// The next byte, or 0 past the end. A NUL byte also reads as 0, because the API
    /// server's lexer uses that convention and so treats a NUL where a token would start
    /// as the end of the selector; a NUL right after a token just ends that token.
    fn read(&mut self) -> u8 {
        match self.src.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn next_token(&mut self) -> Token<'a> {
        // Once the end is seen nothing after it is lexed, even past a NUL.
        if self.done {
            return Token::End;
        }
        let mut b = self.read();
        while is_space(b) {
            b = self.read();
        }
        if b == 0 {
            self.done = true;
            return Token::End;
        }
        if let Some(single) = symbol(b) {
            let next = self.read();
            let pair = match (b, next) {
                (b'!', b'=') => Some(Token::NotEq),
                (b'=', b'=') => Some(Token::DoubleEq),
                _ => None,
            };
            let tok = match pair {
                Some(pair) => {
                    // No three symbols form a token; the third is looked at and put back.
                    let third = self.read();
                    if third != 0 {
                        self.unread();
                    }
                    pair
                }
                None => {
                    if next != 0 {
                        self.unread();
                    }
                    single
                }
            };
            return tok;
        }
        let start = self.pos - 1;
        loop {
            let end = self.pos;
            let b = self.read();
            if b == 0 {
                return Token::Ident(&self.src[start..end]);
            }
            if is_space(b) || symbol(b).is_some() {
                self.unread();
                return Token::Ident(&self.src[start..end]);
            }
        }
    }
}

/// A recursive-descent parser over [`Lexer`] with one token of lookahead.
struct Parser<'a> {
    lexer: Lexer<'a>,
    peeked: Option<Token<'a>>,
}

impl<'a> Parser<'a> {
    fn new(s: &'a str) -> Self {
        Parser {
            lexer: Lexer::new(s),
            peeked: None,
        }
    }

    fn peek(&mut self) -> Token<'a> {
        match self.peeked {
            Some(t) => t,
            None => {
                let t = self.lexer.next_token();
                self.peeked = Some(t);
                t
            }
        }
    }

    fn next(&mut self) -> Token<'a> {
        match self.peeked.take() {
            Some(t) => t,
            None => self.lexer.next_token(),
        }
    }

    /// `[!]key`, or `key op value(s)`.
    fn requirement(&mut self) -> Result<LabelRequirement> {
        let mut tok = self.next();
        let negated = tok == Token::Not;
        if negated {
            tok = self.next();
        }
        let Token::Ident(raw_key) = tok else {
            return Err(syntax(tok, "identifier"));
        };
        let key = validate_key(raw_key)?;
        if negated {
            // `!key` takes no operator; anything after it fails in the caller, which
            // wants a ',' or the end.
            return Ok(LabelRequirement {
                key,
                op: LabelOp::NotExists,
            });
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(LabelRequirement {
                key,
                op: LabelOp::Exists,
            });
        }
        let op_tok = self.next();
        let op = match op_tok {
            Token::Eq | Token::DoubleEq => LabelOp::Eq(validate_value(self.exact_value()?)?),
            Token::NotEq => LabelOp::NotEq(validate_value(self.exact_value()?)?),
            Token::Gt => LabelOp::Gt(integer(self.exact_value()?)?),
            Token::Lt => LabelOp::Lt(integer(self.exact_value()?)?),
            Token::Ident(b"in") => LabelOp::In(self.value_set()?),
            Token::Ident(b"notin") => LabelOp::NotIn(self.value_set()?),
            other => return Err(syntax(other, "=, ==, !=, in, notin, >, <")),
        };
        Ok(LabelRequirement { key, op })
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; nothing before a ',' or the end is the
    /// empty value (`app=` selects objects whose `app` label is empty).
    fn exact_value(&mut self) -> Result<&'a [u8]> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(b"");
        }
        match self.next() {
            Token::Ident(v) => Ok(v),
            other => Err(syntax(other, "identifier")),
        }
    }

    /// `( v1, v2, ... )`. Empty members are the empty value: `(a,)`, `(,a)` and `(a,,b)`
    /// all hold "" as the API server reads them.
    fn value_set(&mut self) -> Result<BTreeSet<String>> {
        match self.next() {
            Token::Open => {}
            other => return Err(syntax(other, "'('")),
        }
        match self.peek() {
            Token::Ident(_) | Token::Comma => {}
            // `in ()` is read as `in ("")` by a 1.20 API server (its parser's `()` case);
            // so here. (Later versions refuse it: "values set can't be empty".)
            Token::Close => {
                self.next();
                return Ok(BTreeSet::from([String::new()]));
            }
            other => return Err(syntax(other, "',', ')' or identifier")),
        }
        // Raw members first: as in the API server, a syntax error anywhere in the list is
        // reported before an invalid value.
        let mut raw: Vec<&[u8]> = Vec::new();
        loop {
            match self.next() {
                Token::Ident(v) => {
                    raw.push(v);
                    match self.peek() {
                        Token::Comma => {}
                        Token::Close => break,
                        other => return Err(syntax(other, "',' or ')'")),
                    }
                }
                Token::Comma => {
                    if raw.is_empty() {
                        raw.push(b"");
                    }
                    match self.peek() {
                        Token::Close => {
                            raw.push(b"");
                            break;
                        }
                        Token::Comma => {
                            self.next();
                            raw.push(b"");
                        }
                        _ => {}
                    }
                }
                other => return Err(syntax(other, "',', or identifier")),
            }
        }
        match self.next() {
            Token::Close => {}
            other => return Err(syntax(other, "')'")),
        }
        raw.into_iter().map(validate_value).collect()
    }
}

/// `>`/`<` operands: a decimal i64 that is also a valid label value, so `-1` is refused
/// (it does not start alphanumeric) exactly as the API server refuses it.
fn integer(raw: &[u8]) -> Result<i64> {
    let n = std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| Error::NotInteger(String::from_utf8_lossy(raw).into_owned()))?;
    validate_value(raw)?;
    Ok(n)
}

const NAME_CHARS: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// The name part of a key, and any non-empty value: at most 63 of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric.
fn check_name(b: &[u8]) -> Result<(), &'static str> {
    if b.len() > 63 {
        return Err("must be no more than 63 characters");
    }
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    let ends_ok = b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(NAME_CHARS)
    }
}

/// An RFC 1123 subdomain: at most 253 characters, dot-separated non-empty labels of
/// `[a-z0-9-]` that start and end alphanumeric.
fn is_dns_subdomain(b: &[u8]) -> bool {
    b.len() <= 253
        && b.split(|&c| c == b'.').all(|label| {
            label
                .iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && label.first().is_some_and(u8::is_ascii_alphanumeric)
                && label.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

/// A qualified name: `[prefix/]name` with a DNS-subdomain prefix.
fn validate_key(raw: &[u8]) -> Result<String> {
    let invalid = |reason| Error::InvalidKey {
        key: String::from_utf8_lossy(raw).into_owned(),
        reason,
    };
    let mut parts = raw.splitn(3, |&c| c == b'/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => return Err(invalid("may contain at most one '/'")),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err(invalid("the prefix before '/' must be non-empty"));
        }
        if !is_dns_subdomain(prefix) {
            return Err(invalid(
                "the prefix before '/' must be a lowercase RFC 1123 subdomain",
            ));
        }
    }
    if name.is_empty() {
        return Err(invalid("the name part must be non-empty"));
    }
    check_name(name).map_err(invalid)?;
    // Valid keys are ASCII, so the conversion is exact.
    Ok(String::from_utf8_lossy(raw).into_owned())
}

/// A label value: empty, or a valid name.
fn validate_value(raw: &[u8]) -> Result<String> {
    if !raw.is_empty() {
        check_name(raw).map_err(|reason| Error::InvalidValue {
            value: String::from_utf8_lossy(raw).into_owned(),
            reason,
        })?;
    }
    Ok(String::from_utf8_lossy(raw).into_owned())
}

// ---------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    Eq,
    NotEq,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub op: FieldOp,
    pub value: String,
}

/// A parsed field selector; one without requirements selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    reqs: Vec<FieldRequirement>,
}

/// Splits at commas not escaped by a backslash, dropping empty terms (the API server
/// skips them: `a=b,` and `,` are valid). Fails once there are more terms than allowed,
/// before any is parsed.
fn split_terms(s: &str) -> Result<Vec<&str>> {
    fn keep<'s>(terms: &mut Vec<&'s str>, term: &'s str) -> Result<()> {
        if term.is_empty() {
            return Ok(());
        }
        if terms.len() == MAX_REQUIREMENTS {
            return Err(Error::TooManyRequirements);
        }
        terms.push(term);
        Ok(())
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            keep(&mut terms, &s[start..i])?;
            start = i + 1;
        }
    }
    keep(&mut terms, &s[start..])?;
    Ok(terms)
}

/// `field op value`, split at the first operator anywhere in the term (escapes count only
/// in the value, as in the API server). The field is taken verbatim, spaces and all: a
/// misspelt field fails later as an unsupported label.
fn parse_term(selector: &str, term: &str) -> Result<FieldRequirement> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (sym, op) in [
            ("!=", FieldOp::NotEq),
            ("==", FieldOp::Eq),
            ("=", FieldOp::Eq),
        ] {
            if let Some(value) = rest.strip_prefix(sym) {
                return Ok(FieldRequirement {
                    field: term[..i].to_string(),
                    op,
                    value: unescape(value)?,
                });
            }
        }
    }
    Err(Error::FieldTerm {
        selector: selector.to_string(),
        term: term.to_string(),
    })
}

/// Undoes `\\`, `\,` and `\=`; any other escape, a trailing backslash, or a bare `,` or
/// `=` in a value is an error, so every value has exactly one spelling.
fn unescape(value: &str) -> Result<String> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(other) => {
                    return Err(Error::InvalidEscape {
                        sequence: format!("\\{other}"),
                    })
                }
                None => {
                    return Err(Error::InvalidEscape {
                        sequence: "\\".to_string(),
                    })
                }
            },
            c @ (',' | '=') => return Err(Error::UnescapedRune(c)),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// What kcache does with one field label of a resource, as the kube-apiserver treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelSupport {
    /// The API server selects on it and kcache evaluates it the same way.
    Served,
    /// The API server refuses it (`field label not supported`), certainly: the
    /// resource's whole set of labels is known.
    Refused,
    /// The API server may select on it, but kcache does not know how (an Event's
    /// `involvedObject.name`, a Node's `spec.unschedulable`, any label of a resource whose
    /// conversion kcache does not model): the request is the API server's to answer.
    Upstream,
}

/// How the kube-apiserver treats field `label` of `group`/`resource` (the same on 1.20 and
/// the reference, v1.37.2, for the resources refused here; the Pod labels added since —
/// `spec.hostNetwork`, `status.podIPs`, `spec.host` — go upstream). Every resource
/// selects on `metadata.name`; namespaced ones on `metadata.namespace`. Only resources
/// whose complete label set kcache models (ConfigMaps, Secrets, Namespaces, Nodes) refuse
/// anything; any other unmodelled label goes upstream.
pub fn label_support(group: &str, resource: &str, namespaced: bool, label: &str) -> LabelSupport {
    use LabelSupport::{Refused, Served, Upstream};
    if label == "metadata.name" {
        return Served;
    }
    match (group, resource, label) {
        ("", "configmaps", "metadata.namespace") => Served,
        ("", "configmaps", _) => Refused,
        ("", "secrets", "metadata.namespace" | "type") => Served,
        ("", "secrets", _) => Refused,
        // Neither takes metadata.namespace (their own conversion functions).
        ("", "namespaces", "status.phase") => Served,
        ("", "namespaces", _) => Refused,
        ("", "nodes", "spec.unschedulable") => Upstream,
        ("", "nodes", _) => Refused,
        (
            "",
            "pods",
            "metadata.namespace"
            | "spec.nodeName"
            | "spec.restartPolicy"
            | "spec.schedulerName"
            | "spec.serviceAccountName"
            | "status.phase"
            | "status.podIP"
            | "status.nominatedNodeName",
        ) => Served,
        (_, _, "metadata.namespace") if namespaced => Served,
        _ => Upstream,
    }
}

impl FieldSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses `s` as `fields.ParseSelector`: comma-separated `f=v`, `f==v`, `f!=v`, with
    /// `\,`, `\=` and `\\` escapes in values. Only "" selects everything; the input is not
    /// trimmed, so blank input is an unparsable term, as upstream.
    pub fn parse(s: &str) -> Result<Self> {
        let mut terms = split_terms(s)?;
        // The API server sorts the raw terms; keeping its order makes `equality_value`
        // pick the same term as its `RequiresExactMatch` (which the request's
        // authorization name comes from) and `validate_for` report the same label.
        terms.sort_unstable();
        let reqs = terms
            .into_iter()
            .map(|t| parse_term(s, t))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.reqs
    }

    /// The selector without its `field=value` (or `==`) terms: for a watch whose key
    /// already guarantees that equality (a name key only ever holds that name). A watch
    /// keeps its filter for its whole life, so the kubelet's ~100 name watches per node
    /// should not each carry a copy of a term that can never fail.
    pub fn without_equality(mut self, field: &str, value: &str) -> Self {
        self.reqs
            .retain(|r| !(r.op == FieldOp::Eq && r.field == field && r.value == value));
        self.reqs.shrink_to_fit();
        self
    }

    /// The selector with a `field=value` term added, unless it has it already: for a
    /// request served by a key that does not guarantee that equality (`core::cover`).
    /// `field` is a label the filter evaluates (`Object::field`).
    pub fn with_equality(mut self, field: &str, value: &str) -> Self {
        if self.equality_value(field) != Some(value) {
            self.reqs.push(FieldRequirement {
                field: field.to_string(),
                op: FieldOp::Eq,
                value: value.to_string(),
            });
        }
        self
    }

    /// The value of the first `field=value` (or `==`) requirement on `field`. Any such
    /// value is a sound routing key: the selector is a conjunction, so every object it
    /// selects has that value.
    pub fn equality_value(&self, field: &str) -> Option<&str> {
        self.reqs
            .iter()
            .find(|r| r.op == FieldOp::Eq && r.field == field)
            .map(|r| r.value.as_str())
    }

    /// Checks every field label against the kube-apiserver's rules for the resource
    /// ([`label_support`]): refuses the first refused one in the API server's (sorted)
    /// order; `Ok(false)` when some label is the API server's to evaluate, `Ok(true)`
    /// when kcache can serve the selector.
    pub fn validate_for(&self, group: &str, resource: &str, namespaced: bool) -> Result<bool> {
        let support = |r: &&FieldRequirement| label_support(group, resource, namespaced, &r.field);
        if let Some(r) = self
            .reqs
            .iter()
            .find(|r| support(r) == LabelSupport::Refused)
        {
            return Err(Error::FieldLabelNotSupported {
                label: r.field.clone(),
            });
        }
        Ok(self
            .reqs
            .iter()
            .all(|r| support(&r) == LabelSupport::Served))
    }

    /// Whether the object's field values (`Object::field`: "" when unset, as the API
    /// server's field sets) satisfy every requirement.
    pub fn matches(&self, obj: &Object) -> bool {
        self.reqs.iter().all(|r| {
            let have = obj.field(&r.field);
            match r.op {
                FieldOp::Eq => have == r.value,
                FieldOp::NotEq => have != r.value,
            }
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn without_equality_drops_only_the_implied_term() {
        let f = FieldSelector::parse("metadata.name=a,type!=x").unwrap();
        let rest = f.clone().without_equality("metadata.name", "a");
        assert_eq!(
            rest.requirements(),
            [FieldRequirement {
                field: "type".into(),
                op: FieldOp::NotEq,
                value: "x".into()
            }]
        );
        // Another value of the field is a real condition (here: nothing matches).
        let contradictory = FieldSelector::parse("metadata.name=a,metadata.name=b").unwrap();
        let rest = contradictory.without_equality("metadata.name", "a");
        assert_eq!(rest.equality_value("metadata.name"), Some("b"));
        let only = FieldSelector::parse("metadata.name=a").unwrap();
        assert!(only.without_equality("metadata.name", "a").is_empty());
        // `!=` is never implied.
        let ne = FieldSelector::parse("metadata.name!=a").unwrap();
        assert_eq!(
            ne.without_equality("metadata.name", "a")
                .requirements()
                .len(),
            1
        );
    }

    use super::*;
    use crate::core::object::Schema;
    use serde_json::{json, Value};

    /// An object with these `metadata.labels`.
    fn labelled(labels: Value) -> Object {
        Object::from_value(
            Schema::Generic,
            &json!({"metadata": {"name": "o", "labels": labels}}),
        )
        .expect("valid object")
    }

    fn as_object(schema: Schema, v: &Value) -> Object {
        Object::from_value(schema, v).expect("valid object")
    }

    fn variant(e: &Error) -> &'static str {
        match e {
            Error::Syntax { .. } => "Syntax",
            Error::InvalidKey { .. } => "InvalidKey",
            Error::InvalidValue { .. } => "InvalidValue",
            Error::NotInteger(_) => "NotInteger",
            Error::TooManyRequirements => "TooManyRequirements",
            Error::FieldTerm { .. } => "FieldTerm",
            Error::InvalidEscape { .. } | Error::UnescapedRune(_) => "Unescape",
            Error::FieldLabelNotSupported { .. } => "FieldLabelNotSupported",
        }
    }

    #[test]
    fn label_selectors_match_as_upstream() {
        let labels = labelled(json!({
            "app": "web", "tier": "front", "n": "5", "neg": "-3", "empty": "",
            "example.com/team": "a", "text": "five"
        }));
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("   \t\n", true),
            // exists / does not exist
            ("app", true),
            ("missing", false),
            ("!app", false),
            ("!missing", true),
            ("! missing", true),
            ("example.com/team", true),
            ("!example.com/team", false),
            // equality
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("  app  ==  web  ", true),
            ("app=api", false),
            ("app!=web", false),
            ("app!=api", true),
            ("missing=x", false),
            ("missing!=x", true),
            ("empty=", true),
            ("empty==", true),
            ("app=", false),
            ("missing=", false),
            ("empty!=", false),
            ("missing!=", true),
            ("example.com/team=a", true),
            // sets
            ("app in (web, api)", true),
            ("app in (api)", false),
            ("app in(web)", true),
            ("app in ( web )", true),
            ("app notin (api, db)", true),
            ("app notin (web)", false),
            // `()` is the empty value, as a 1.20 API server reads it
            ("empty in ()", true),
            ("app in ( )", false),
            ("missing in ()", false),
            ("app notin ()", true),
            ("empty notin ()", false),
            ("missing in (x)", false),
            ("missing notin (x)", true),
            ("empty in (,)", true),
            ("empty in (x,)", true),
            ("empty in (,x)", true),
            ("app in (x,,web)", true),
            ("app in (web,web)", true),
            ("empty notin (x)", true),
            ("in in (x)", false),
            ("app in (in, notin, web)", true),
            // numeric comparisons
            ("n>4", true),
            ("n>5", false),
            ("n<6", true),
            ("n<5", false),
            ("n > 4", true),
            ("neg<0", true),
            ("neg>0", false),
            ("text>0", false),
            ("text<9", false),
            ("missing>1", false),
            ("missing<1", false),
            // conjunctions
            ("app=web,tier=front", true),
            ("app=web, tier=back", false),
            ("app,!missing,n>1,tier in (front)", true),
            ("app=web,missing", false),
            // a NUL where a token starts ends the selector
            ("app=web \0garbage", true),
        ];
        for &(sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?}: {e}"));
            assert_eq!(s.matches(&labels), want, "{sel:?}");
        }
    }

    #[test]
    fn label_selectors_on_objects_without_labels() {
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("app", false),
            ("!app", true),
            ("app=web", false),
            ("app=", false),
            ("app!=web", true),
            ("app in (web)", false),
            ("app notin (web)", true),
            ("app>1", false),
            ("app<1", false),
            ("!a,!b,c!=d,e notin (f)", true),
        ];
        let none = as_object(Schema::Generic, &json!({"metadata": {"name": "o"}}));
        let null = labelled(Value::Null);
        let empty = labelled(json!({}));
        for &(sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?}: {e}"));
            for (o, what) in [(&none, "none"), (&null, "null"), (&empty, "{}")] {
                assert_eq!(s.matches(o), want, "{sel:?} on {what}");
            }
        }
    }

    #[test]
    fn label_selector_errors() {
        let long = "a".repeat(64);
        let long_key = format!("{long}=x");
        let long_value = format!("a={long}");
        let long_prefix = format!("{}/a", "a".repeat(254));
        let cases: &[(&str, &str)] = &[
            (",", "Syntax"),
            ("a=b,", "Syntax"),
            (",a=b", "Syntax"),
            ("a=b,,c=d", "Syntax"),
            ("=b", "Syntax"),
            ("==", "Syntax"),
            ("!=a", "Syntax"),
            ("!!x", "Syntax"),
            ("!", "Syntax"),
            ("!x=a", "Syntax"),
            ("!x in (a)", "Syntax"),
            ("a=b c", "Syntax"),
            ("a b", "Syntax"),
            ("a==b==c", "Syntax"),
            ("a=!b", "Syntax"),
            ("a=(b)", "Syntax"),
            ("a!==b", "Syntax"),
            ("a foo (b)", "Syntax"),
            ("a in", "Syntax"),
            ("a in b", "Syntax"),
            ("a in (", "Syntax"),
            ("a in (b", "Syntax"),
            ("a in (b c)", "Syntax"),
            ("a in (b))", "Syntax"),
            ("a notin", "Syntax"),
            ("a in ((b))", "Syntax"),
            ("x=a||y=b", "InvalidValue"),
            ("app=web\0garbage", "Syntax"),
            ("-a=b", "InvalidKey"),
            ("a-=b", "InvalidKey"),
            ("a b=c", "Syntax"),
            ("Bad_Prefix.com/a=b", "InvalidKey"),
            ("/a=b", "InvalidKey"),
            ("a/=b", "InvalidKey"),
            ("a/b/c=d", "InvalidKey"),
            ("ex..com/a", "InvalidKey"),
            ("-ex.com/a", "InvalidKey"),
            ("é=x", "InvalidKey"),
            (&long_key, "InvalidKey"),
            (&long_prefix, "InvalidKey"),
            ("a=-b", "InvalidValue"),
            ("a=b-", "InvalidValue"),
            ("a=b/c", "InvalidValue"),
            ("a=é", "InvalidValue"),
            (&long_value, "InvalidValue"),
            ("a in (b, -c)", "InvalidValue"),
            ("a>x", "NotInteger"),
            ("a>", "NotInteger"),
            ("a<1.5", "NotInteger"),
            ("a>99999999999999999999", "NotInteger"),
            // an integer that is not a valid label value
            ("a>-1", "InvalidValue"),
            ("a<+1", "InvalidValue"),
        ];
        for &(sel, want) in cases {
            match LabelSelector::parse(sel) {
                Ok(s) => panic!("{sel:?} parsed as {s:?}, want {want}"),
                Err(e) => assert_eq!(variant(&e), want, "{sel:?}: {e}"),
            }
        }
    }

    #[test]
    fn label_keys_and_values_that_parse() {
        let max_name = "a".repeat(63);
        let subdomain = format!("{}.com", "a".repeat(249));
        let cases: Vec<String> = vec![
            "a".into(),
            "A_b.c-9".into(),
            "9".into(),
            "example.com/a".into(),
            "a-b.example.com/Name_1".into(),
            "in=notin".into(),
            "notin in (in)".into(),
            format!("{max_name}={max_name}"),
            format!("{subdomain}/a"),
            "a=B.c_d-9".into(),
            "a>0".into(),
            "a<10".into(),
            "a>007".into(),
        ];
        for sel in &cases {
            assert!(LabelSelector::parse(sel).is_ok(), "{sel:?}");
        }
    }

    #[test]
    fn requirement_counts_are_capped() {
        let cases: &[(usize, bool)] = &[
            (1, true),
            (MAX_REQUIREMENTS, true),
            (MAX_REQUIREMENTS + 1, false),
            (10_000, false),
        ];
        for &(n, ok) in cases {
            let labels = vec!["a=b"; n].join(",");
            let fields = vec!["metadata.name=b"; n].join(",");
            for (what, got) in [
                ("label", LabelSelector::parse(&labels).err()),
                ("field", FieldSelector::parse(&fields).err()),
            ] {
                let want = (!ok).then_some(Error::TooManyRequirements);
                assert_eq!(got, want, "{what} selector with {n} requirements");
            }
        }
        // Empty field terms do not count.
        let sparse = format!("{},metadata.name=b", ",".repeat(500));
        assert!(FieldSelector::parse(&sparse).is_ok());
    }

    fn req(field: &str, op: FieldOp, value: &str) -> FieldRequirement {
        FieldRequirement {
            field: field.into(),
            op,
            value: value.into(),
        }
    }

    #[test]
    fn field_selectors_parse_as_upstream() {
        use FieldOp::{Eq, NotEq};
        let cases: Vec<(&str, Vec<FieldRequirement>)> = vec![
            ("", vec![]),
            (",", vec![]),
            (",,", vec![]),
            ("a=b", vec![req("a", Eq, "b")]),
            ("a==b", vec![req("a", Eq, "b")]),
            ("a!=b", vec![req("a", NotEq, "b")]),
            ("a=", vec![req("a", Eq, "")]),
            ("a!=", vec![req("a", NotEq, "")]),
            ("=b", vec![req("", Eq, "b")]),
            ("a=b,", vec![req("a", Eq, "b")]),
            ("a=!b", vec![req("a", Eq, "!b")]),
            (" a = b ", vec![req(" a ", Eq, " b ")]),
            ("a=b\\,c", vec![req("a", Eq, "b,c")]),
            ("a=b\\=c", vec![req("a", Eq, "b=c")]),
            ("a=b\\\\c", vec![req("a", Eq, "b\\c")]),
            ("a=b\\\\,c=d", vec![req("a", Eq, "b\\"), req("c", Eq, "d")]),
            ("a=\\,,b=\\=", vec![req("a", Eq, ","), req("b", Eq, "=")]),
            ("Ѩ🃎=x", vec![req("Ѩ🃎", Eq, "x")]),
            ("a\\=b", vec![req("a\\", Eq, "b")]),
            ("a=Ѩ🃎", vec![req("a", Eq, "Ѩ🃎")]),
            // terms come back in the API server's (sorted) order
            (
                "spec.nodeName=n1,metadata.name!=x,metadata.name=b,metadata.name=a",
                vec![
                    req("metadata.name", NotEq, "x"),
                    req("metadata.name", Eq, "a"),
                    req("metadata.name", Eq, "b"),
                    req("spec.nodeName", Eq, "n1"),
                ],
            ),
        ];
        for (sel, want) in cases {
            let got = FieldSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?}: {e}"));
            assert_eq!(got.requirements(), want.as_slice(), "{sel:?}");
            assert_eq!(got.is_empty(), want.is_empty(), "{sel:?}");
        }
        assert!(FieldSelector::everything().is_empty());
    }

    #[test]
    fn field_selector_errors() {
        let cases: &[(&str, &str)] = &[
            ("bogus", "FieldTerm"),
            ("a", "FieldTerm"),
            (" ", "FieldTerm"),
            ("a=b,c", "FieldTerm"),
            ("🃎\\Ѩ", "FieldTerm"),
            ("a=b=c", "Unescape"),
            ("a!==b", "Unescape"),
            ("a===b", "Unescape"),
            ("a=b\\x", "Unescape"),
            ("a=b\\", "Unescape"),
            ("a=\\Ѩ", "Unescape"),
            ("a\\=b=c", "Unescape"),
        ];
        for &(sel, want) in cases {
            match FieldSelector::parse(sel) {
                Ok(s) => panic!("{sel:?} parsed as {s:?}, want {want}"),
                Err(e) => assert_eq!(variant(&e), want, "{sel:?}: {e}"),
            }
        }
    }

    #[test]
    fn equality_values_route_requests() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("metadata.name=x", "metadata.name", Some("x")),
            ("metadata.name==x", "metadata.name", Some("x")),
            ("metadata.name!=x", "metadata.name", None),
            ("metadata.name=", "metadata.name", Some("")),
            (
                "spec.nodeName=n1,status.phase=Running",
                "spec.nodeName",
                Some("n1"),
            ),
            ("spec.nodeName=n1", "metadata.name", None),
            ("metadata.name=a\\,b", "metadata.name", Some("a,b")),
            // the first in the API server's order, as its RequiresExactMatch
            (
                "metadata.name=s2,metadata.name=s1",
                "metadata.name",
                Some("s1"),
            ),
            (
                "metadata.name!=a,metadata.name=b",
                "metadata.name",
                Some("b"),
            ),
            ("", "metadata.name", None),
        ];
        for &(sel, field, want) in cases {
            let s = FieldSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?}: {e}"));
            assert_eq!(s.equality_value(field), want, "{sel:?} {field}");
        }
    }

    #[test]
    fn field_labels_are_validated_per_resource() {
        // (group, resource, namespaced, selector, Err(first refused) / Ok(kcache serves))
        type Case = (
            &'static str,
            &'static str,
            bool,
            &'static str,
            Result<bool, &'static str>,
        );
        let cases: &[Case] = &[
            ("", "pods", true, "", Ok(true)),
            (
                "",
                "pods",
                true,
                "metadata.name=a,metadata.namespace=b",
                Ok(true),
            ),
            (
                "",
                "pods",
                true,
                "spec.nodeName=a,spec.restartPolicy=Always",
                Ok(true),
            ),
            (
                "",
                "pods",
                true,
                "spec.schedulerName=s,spec.serviceAccountName=x",
                Ok(true),
            ),
            (
                "",
                "pods",
                true,
                "status.phase=Running,status.podIP=1",
                Ok(true),
            ),
            ("", "pods", true, "status.nominatedNodeName=n", Ok(true)),
            // Pod labels kcache does not model (an alias, later additions): upstream's.
            ("", "pods", true, "spec.host=n", Ok(false)),
            (
                "",
                "pods",
                true,
                "status.hostIP=1,metadata.name=a",
                Ok(false),
            ),
            (
                "",
                "secrets",
                true,
                "type=Opaque,metadata.name=a,metadata.namespace=b",
                Ok(true),
            ),
            ("", "secrets", true, "spec.nodeName=a", Err("spec.nodeName")),
            ("", "secrets", true, "status.phase=a", Err("status.phase")),
            (
                "",
                "namespaces",
                false,
                "status.phase=Active,metadata.name=n",
                Ok(true),
            ),
            ("", "namespaces", false, "type=x", Err("type")),
            // Namespaces and Nodes have their own conversion, without metadata.namespace.
            (
                "",
                "namespaces",
                false,
                "metadata.namespace=x",
                Err("metadata.namespace"),
            ),
            (
                "",
                "nodes",
                false,
                "metadata.namespace=",
                Err("metadata.namespace"),
            ),
            ("", "nodes", false, "spec.unschedulable=true", Ok(false)),
            (
                "",
                "configmaps",
                true,
                "metadata.name=a,metadata.namespace=b",
                Ok(true),
            ),
            ("", "configmaps", true, "type=x", Err("type")),
            // A refused label wins over one that would go upstream.
            ("", "configmaps", true, "aaa=1,type=x", Err("aaa")),
            ("", "events", true, "involvedObject.name=x", Ok(false)),
            (
                "apps",
                "deployments",
                true,
                "metadata.name=x,metadata.namespace=y",
                Ok(true),
            ),
            ("apps", "deployments", true, "status.phase=x", Ok(false)),
            (
                "example.com",
                "widgets",
                false,
                "metadata.namespace=a",
                Ok(false),
            ),
            // untrimmed fields are different labels
            (
                "",
                "secrets",
                true,
                "metadata.name =a",
                Err("metadata.name "),
            ),
            ("", "secrets", true, "=a", Err("")),
            // the first refused label in the API server's (sorted) order
            ("", "secrets", true, "zzz=1,aaa=1,type=x", Err("aaa")),
        ];
        for &(group, resource, namespaced, sel, want) in cases {
            let s = FieldSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?}: {e}"));
            let got = s.validate_for(group, resource, namespaced);
            let want = want.map_err(|label| Error::FieldLabelNotSupported {
                label: label.to_string(),
            });
            assert_eq!(got, want, "{group}/{resource} {sel:?}");
        }
    }

    #[test]
    fn unsupported_label_message_is_the_api_servers() {
        for (resource, sel, want) in [
            (
                "secrets",
                "spec.nodeName=a",
                "field label not supported: spec.nodeName",
            ),
            ("configmaps", "type=x", "field label not supported: type"),
        ] {
            let e = FieldSelector::parse(sel)
                .and_then(|s| s.validate_for("", resource, true))
                .expect_err("unsupported");
            assert_eq!(e.to_string(), want);
        }
    }

    fn pod() -> Object {
        as_object(
            Schema::Pod,
            &json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"nodeName": "n1", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                         "serviceAccountName": "sa"},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                           "nominatedNodeName": "n2"}
            }),
        )
    }

    #[test]
    fn field_selectors_match_pods_and_secrets() {
        let unscheduled = as_object(
            Schema::Pod,
            &json!({"metadata": {"name": "u", "namespace": "ns"}, "spec": {}, "status": {"phase": "Pending"}}),
        );
        let opaque = as_object(
            Schema::Secret,
            &json!({"metadata": {"name": "s1", "namespace": "ns"}, "type": "Opaque"}),
        );
        let token = as_object(
            Schema::Secret,
            &json!({"metadata": {"name": "s2", "namespace": "ns"}, "type": "kubernetes.io/service-account-token"}),
        );
        let cases: Vec<(&str, Object, bool)> = vec![
            ("", pod(), true),
            ("spec.nodeName=n1", pod(), true),
            ("spec.nodeName==n1", pod(), true),
            ("spec.nodeName=n2", pod(), false),
            ("spec.nodeName!=n2", pod(), true),
            ("spec.nodeName!=n1", pod(), false),
            ("spec.nodeName=n1,status.phase=Running", pod(), true),
            ("spec.nodeName=n1,status.phase=Pending", pod(), false),
            (
                "spec.nodeName=n1,metadata.namespace=ns,metadata.name=p",
                pod(),
                true,
            ),
            ("spec.nodeName=", unscheduled.clone(), true),
            ("spec.nodeName!=", unscheduled.clone(), false),
            ("spec.nodeName=n1", unscheduled.clone(), false),
            ("spec.nodeName!=", pod(), true),
            ("status.podIP=10.0.0.1", pod(), true),
            ("status.phase!=Succeeded,status.phase!=Failed", pod(), true),
            (
                "status.phase!=Succeeded,status.phase!=Failed",
                unscheduled,
                true,
            ),
            ("type=Opaque", opaque.clone(), true),
            ("type=Opaque", token.clone(), false),
            (
                "type!=kubernetes.io/service-account-token",
                opaque.clone(),
                true,
            ),
            (
                "type!=kubernetes.io/service-account-token",
                token.clone(),
                false,
            ),
            (
                "type=kubernetes.io/service-account-token,metadata.name=s2",
                token,
                true,
            ),
            ("metadata.name=s1", opaque.clone(), true),
            ("metadata.name=s2", opaque, false),
        ];
        for (sel, obj, want) in cases {
            let s = FieldSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?}: {e}"));
            assert_eq!(s.matches(&obj), want, "{sel:?} on {obj:?}");
        }
    }
}
