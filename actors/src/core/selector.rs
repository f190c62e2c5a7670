//! Label and field selectors with kube-apiserver 1.20's grammar and per-resource field
//! label support (`labels.Parse`, `fields.ParseSelector`, the registries' field sets).

use serde_json::{Map, Value};
use thiserror::Error;

/// The most requirements one selector may carry: a hostile selector must not cost
/// unbounded work per event.
pub const MAX_REQUIREMENTS: usize = 100;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("unable to parse requirement {0:?}")]
    Unparsable(String),
    #[error("invalid label key {0:?}: must be an optional DNS subdomain prefix and '/', then 63 or fewer alphanumerics, '-', '_' or '.', starting and ending alphanumeric")]
    InvalidKey(String),
    #[error("invalid label value {0:?}: must be 63 or fewer alphanumerics, '-', '_' or '.', starting and ending alphanumeric")]
    InvalidValue(String),
    #[error("for 'in', 'notin' operators, values set can't be empty")]
    EmptySet,
    #[error("for 'Gt', 'Lt' operators, the value must be an integer: {0:?}")]
    NotInteger(String),
    #[error("too many requirements (more than {MAX_REQUIREMENTS})")]
    TooManyRequirements,
    #[error(
        "invalid field selector {0:?}: each term must be field=value, field==value or field!=value"
    )]
    InvalidFieldTerm(String),
    /// The API server's exact message; a 400 BadRequest.
    #[error("field label not supported: {label}")]
    FieldLabelNotSupported { label: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Exists,
    NotExists,
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

/// A parsed label selector; empty selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    reqs: Vec<LabelRequirement>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(is_name_char)
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn valid_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn validate_key(k: &str) -> Result<()> {
    let ok = match k.split_once('/') {
        Some((prefix, name)) => valid_dns_subdomain(prefix) && valid_name(name),
        None => valid_name(k),
    };
    ok.then_some(())
        .ok_or_else(|| Error::InvalidKey(k.to_string()))
}

fn validate_value(v: &str) -> Result<()> {
    (v.is_empty() || valid_name(v))
        .then_some(())
        .ok_or_else(|| Error::InvalidValue(v.to_string()))
}

/// Splits at top-level commas (commas inside `( )` belong to a set).
fn split_terms(s: &str) -> Result<Vec<&str>> {
    let mut terms = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(Error::Unparsable(s.to_string()));
                }
            }
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(Error::Unparsable(s.to_string()));
    }
    terms.push(&s[start..]);
    Ok(terms)
}

fn parse_set(term: &str, rest: &str) -> Result<Vec<String>> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| Error::Unparsable(term.to_string()))?;
    if inner.trim().is_empty() {
        return Err(Error::EmptySet);
    }
    inner
        .split(',')
        .map(|v| {
            let v = v.trim();
            validate_value(v)?;
            Ok(v.to_string())
        })
        .collect()
}

fn parse_label_term(term: &str) -> Result<LabelRequirement> {
    let t = term.trim();
    if t.is_empty() {
        return Err(Error::Unparsable(term.to_string()));
    }
    if let Some(key) = t.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(LabelRequirement {
            key: key.to_string(),
            op: LabelOp::NotExists,
        });
    }
    // Operators made of symbols, longest first.
    for (sym, kind) in [("==", 0), ("!=", 1), ("=", 0), (">", 2), ("<", 3)] {
        if let Some(pos) = t.find(sym) {
            let key = t[..pos].trim();
            let value = t[pos + sym.len()..].trim();
            validate_key(key)?;
            let op = match kind {
                0 | 1 => {
                    validate_value(value)?;
                    if kind == 0 {
                        LabelOp::Eq(value.to_string())
                    } else {
                        LabelOp::NotEq(value.to_string())
                    }
                }
                _ => {
                    let n = value
                        .parse::<i64>()
                        .map_err(|_| Error::NotInteger(value.to_string()))?;
                    if kind == 2 {
                        LabelOp::Gt(n)
                    } else {
                        LabelOp::Lt(n)
                    }
                }
            };
            return Ok(LabelRequirement {
                key: key.to_string(),
                op,
            });
        }
    }
    // `key in (…)`, `key notin (…)`, or a bare `key`.
    let mut words = t.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or("").trim();
    let rest = words.next().unwrap_or("").trim();
    let key_only = key.split('(').next().unwrap_or(key);
    if rest.is_empty() && !key.contains('(') {
        validate_key(key)?;
        return Ok(LabelRequirement {
            key: key.to_string(),
            op: LabelOp::Exists,
        });
    }
    validate_key(key_only)?;
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(LabelRequirement {
            key: key_only.to_string(),
            op: LabelOp::NotIn(parse_set(term, set)?),
        });
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(LabelRequirement {
            key: key_only.to_string(),
            op: LabelOp::In(parse_set(term, set)?),
        });
    }
    Err(Error::Unparsable(term.to_string()))
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn parse(s: &str) -> Result<Self> {
        if s.trim().is_empty() {
            return Ok(Self::everything());
        }
        let terms = split_terms(s)?;
        if terms.len() > MAX_REQUIREMENTS {
            return Err(Error::TooManyRequirements);
        }
        let reqs = terms
            .into_iter()
            .map(parse_label_term)
            .collect::<Result<Vec<_>>>()?;
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str);
            match &r.op {
                LabelOp::Exists => v.is_some(),
                LabelOp::NotExists => v.is_none(),
                LabelOp::Eq(want) => v == Some(want.as_str()),
                // As labels.Requirement.Matches: != and notin match an absent label.
                LabelOp::NotEq(want) => v != Some(want.as_str()),
                LabelOp::In(set) => v.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::NotIn(set) => v.is_none_or(|v| !set.iter().any(|s| s == v)),
                LabelOp::Gt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                LabelOp::Lt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }
        })
    }
}

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

/// A parsed field selector; empty selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    reqs: Vec<FieldRequirement>,
}

/// Splits at commas not escaped with a backslash (`fields.ParseSelector` escaping).
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            cur.push(c);
            if let Some(n) = chars.next() {
                cur.push(n);
            }
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n @ ('\\' | ',' | '=')) => out.push(n),
                _ => return Err(Error::InvalidFieldTerm(s.to_string())),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Finds the first unescaped occurrence of `op` in `term`. Walks characters, not bytes:
/// a selector is client input and may hold any UTF-8.
fn find_unescaped(term: &str, op: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if term[i..].starts_with(op) {
            return Some(i);
        }
    }
    None
}

fn parse_field_term(term: &str) -> Result<FieldRequirement> {
    for (sym, op) in [
        ("!=", FieldOp::NotEq),
        ("==", FieldOp::Eq),
        ("=", FieldOp::Eq),
    ] {
        if let Some(pos) = find_unescaped(term, sym) {
            let field = term[..pos].trim();
            if field.is_empty() {
                return Err(Error::InvalidFieldTerm(term.to_string()));
            }
            return Ok(FieldRequirement {
                field: field.to_string(),
                op,
                value: unescape(&term[pos + sym.len()..])?,
            });
        }
    }
    Err(Error::InvalidFieldTerm(term.to_string()))
}

/// The JSON path of a supported field label.
fn field_path(field: &str) -> Option<&'static [&'static str]> {
    Some(match field {
        "metadata.name" => &["metadata", "name"],
        "metadata.namespace" => &["metadata", "namespace"],
        "spec.nodeName" => &["spec", "nodeName"],
        "spec.restartPolicy" => &["spec", "restartPolicy"],
        "spec.schedulerName" => &["spec", "schedulerName"],
        "spec.serviceAccountName" => &["spec", "serviceAccountName"],
        "status.phase" => &["status", "phase"],
        "status.podIP" => &["status", "podIP"],
        "status.nominatedNodeName" => &["status", "nominatedNodeName"],
        "type" => &["type"],
        _ => return None,
    })
}

/// The value of `field` in `obj`; "" when missing, as the API server's field sets hold
/// empty strings for unset fields.
pub fn field_value<'a>(obj: &'a Value, field: &str) -> &'a str {
    let Some(path) = field_path(field) else {
        return "";
    };
    path.iter()
        .try_fold(obj, |v, p| v.get(p))
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl FieldSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn parse(s: &str) -> Result<Self> {
        if s.trim().is_empty() {
            return Ok(Self::everything());
        }
        let terms = split_unescaped(s, ',');
        if terms.len() > MAX_REQUIREMENTS {
            return Err(Error::TooManyRequirements);
        }
        let reqs = terms
            .iter()
            .map(|t| parse_field_term(t))
            .collect::<Result<Vec<_>>>()?;
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.reqs
    }

    pub fn equality_value(&self, field: &str) -> Option<&str> {
        self.reqs
            .iter()
            .find(|r| r.field == field && r.op == FieldOp::Eq)
            .map(|r| r.value.as_str())
    }

    pub fn validate_for(&self, group: &str, resource: &str) -> Result<()> {
        for r in &self.reqs {
            let extra: &[&str] = match (group, resource) {
                ("", "pods") => &[
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "status.phase",
                    "status.podIP",
                    "status.nominatedNodeName",
                ],
                ("", "secrets") => &["type"],
                ("", "namespaces") => &["status.phase"],
                _ => &[],
            };
            let ok = r.field == "metadata.name"
                || r.field == "metadata.namespace"
                || extra.contains(&r.field.as_str());
            if !ok {
                return Err(Error::FieldLabelNotSupported {
                    label: r.field.clone(),
                });
            }
        }
        Ok(())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|r| {
            let v = field_value(obj, &r.field);
            match r.op {
                FieldOp::Eq => v == r.value,
                FieldOp::NotEq => v != r.value,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn label_grammar_and_matching() {
        let l = labels(json!({"app": "web", "tier": "front", "n": "5"}));
        let cases = [
            ("", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web, api)", true),
            ("app in (api)", false),
            ("app notin (api)", true),
            ("missing notin (api)", true),
            ("missing in (api)", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("n>4", true),
            ("n<5", false),
            ("missing>1", false),
            ("example.com/app", false),
            ("app=", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(Some(&l)), want, "{sel}");
        }
        assert!(LabelSelector::parse("!app").expect("ok").matches(None));
        assert!(!LabelSelector::parse("app").expect("ok").matches(None));
    }

    #[test]
    fn label_errors() {
        let cases = [
            ("a in (", "unparsable"),
            ("a in ()", "empty"),
            ("!!x", "key"),
            ("-a=b", "key"),
            ("a=b c", "value"),
            ("a>x", "int"),
            ("a notin", "unparsable"),
            ("a foo (b)", "unparsable"),
            (",", "unparsable"),
            ("Bad_Prefix.com/a=b", "key"),
        ];
        for (sel, what) in cases {
            assert!(
                LabelSelector::parse(sel).is_err(),
                "{sel} should fail ({what})"
            );
        }
        let many = vec!["a=b"; MAX_REQUIREMENTS + 1].join(",");
        assert_eq!(LabelSelector::parse(&many), Err(Error::TooManyRequirements));
        assert!(LabelSelector::parse("example.com/app=x").is_ok());
    }

    #[test]
    fn field_parsing_and_escapes() {
        let f = FieldSelector::parse("metadata.name=a\\,b,type!=x,spec.nodeName==n1").expect("ok");
        let r = f.requirements();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].value, "a,b");
        assert_eq!(r[1].op, FieldOp::NotEq);
        assert_eq!(f.equality_value("spec.nodeName"), Some("n1"));
        assert_eq!(f.equality_value("type"), None);
        assert_eq!(
            FieldSelector::parse("metadata.name=a\\=b")
                .expect("ok")
                .requirements()[0]
                .value,
            "a=b"
        );
        // Multi-byte characters before an operator (found by the fuzzer: byte-wise slicing panicked).
        assert!(FieldSelector::parse("Ѩ🃎=x").is_ok());
        assert!(FieldSelector::parse("🃎\\Ѩ").is_err());
        for bad in ["bogus", "=x", "a=b\\x", "a"] {
            assert!(FieldSelector::parse(bad).is_err(), "{bad}");
        }
        assert!(FieldSelector::parse("").expect("ok").is_empty());
    }

    #[test]
    fn field_labels_per_resource() {
        let ok = [
            (
                "",
                "pods",
                "spec.nodeName=a,status.phase=Running,status.podIP=1,spec.restartPolicy=Always",
            ),
            (
                "",
                "pods",
                "spec.schedulerName=s,spec.serviceAccountName=x,status.nominatedNodeName=n",
            ),
            (
                "",
                "secrets",
                "type=Opaque,metadata.name=a,metadata.namespace=b",
            ),
            ("", "namespaces", "status.phase=Active"),
            ("apps", "deployments", "metadata.name=x"),
        ];
        for (g, r, s) in ok {
            FieldSelector::parse(s)
                .expect("parse")
                .validate_for(g, r)
                .unwrap_or_else(|e| panic!("{r} {s}: {e}"));
        }
        let bad = [
            ("", "secrets", "spec.nodeName=a"),
            ("", "configmaps", "type=x"),
            ("apps", "pods", "spec.nodeName=a"),
        ];
        for (g, r, s) in bad {
            let e = FieldSelector::parse(s)
                .expect("parse")
                .validate_for(g, r)
                .expect_err("unsupported");
            assert!(
                e.to_string().starts_with("field label not supported: "),
                "{e}"
            );
        }
        let e = FieldSelector::parse("spec.nodeName=a")
            .expect("parse")
            .validate_for("", "secrets")
            .expect_err("x");
        assert_eq!(e.to_string(), "field label not supported: spec.nodeName");
    }

    #[test]
    fn field_matching() {
        let pod = json!({"metadata": {"name": "p", "namespace": "n"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let m = |s: &str| FieldSelector::parse(s).expect("parse").matches(&pod);
        assert!(m("spec.nodeName=n1"));
        assert!(!m("spec.nodeName=n2"));
        assert!(m("spec.nodeName!=n2,status.phase=Running"));
        assert!(m("status.podIP="));
        assert!(!m("status.podIP!="));
        let secret = json!({"metadata": {"name": "s"}, "type": "Opaque"});
        assert!(FieldSelector::parse("type=Opaque")
            .expect("p")
            .matches(&secret));
        assert_eq!(field_value(&secret, "type"), "Opaque");
        assert_eq!(field_value(&secret, "nope"), "");
    }
}
