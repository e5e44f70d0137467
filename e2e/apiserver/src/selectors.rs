//! Label selectors (string and `metav1.LabelSelector` forms) and field selectors.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::validation;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: BTreeSet<String>,
}

impl Requirement {
    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let value = labels
            .and_then(|l| l.get(&self.key))
            .and_then(Value::as_str);
        match self.op {
            Op::Equals | Op::In => value.is_some_and(|v| self.values.contains(v)),
            Op::NotEquals | Op::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::GreaterThan | Op::LessThan => {
                let (Some(v), Some(bound)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values
                        .iter()
                        .next()
                        .and_then(|b| b.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == Op::GreaterThan {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.iter().next().map(String::as_str).unwrap_or("");
        let set = self.values.iter().cloned().collect::<Vec<_>>().join(",");
        match self.op {
            Op::Equals => write!(f, "{}={first}", self.key),
            Op::NotEquals => write!(f, "{}!={first}", self.key),
            Op::In => write!(f, "{} in ({set})", self.key),
            Op::NotIn => write!(f, "{} notin ({set})", self.key),
            Op::Exists => write!(f, "{}", self.key),
            Op::DoesNotExist => write!(f, "!{}", self.key),
            Op::GreaterThan => write!(f, "{}>{first}", self.key),
            Op::LessThan => write!(f, "{}<{first}", self.key),
        }
    }
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    /// A `metav1.LabelSelector` with an unknown operator matches nothing.
    nothing: bool,
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty() && !self.nothing
    }

    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.is_empty() {
            return true;
        }
        self.matches(
            obj.get("metadata")
                .and_then(|m| m.get("labels"))
                .and_then(Value::as_object),
        )
    }

    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Parses the `labelSelector` query string syntax.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut p = Parser {
            chars: input.chars().collect(),
            pos: 0,
        };
        let mut requirements = Vec::new();
        p.skip_ws();
        if p.at_end() {
            return Ok(Self::default());
        }
        loop {
            requirements.push(p.requirement()?);
            p.skip_ws();
            if p.at_end() {
                break;
            }
            if !p.eat(',') {
                return Err(SelectorError(format!(
                    "unable to parse requirement: found '{}', expected: ','",
                    p.rest()
                )));
            }
        }
        for r in &requirements {
            if let Err(e) = validation::label_key(&r.key) {
                return Err(SelectorError(format!(
                    "unable to parse requirement: invalid label key {:?}: {e}",
                    r.key
                )));
            }
            for v in &r.values {
                let invalid = match r.op {
                    Op::GreaterThan | Op::LessThan => v.parse::<i64>().is_err(),
                    _ => validation::label_value(v).is_err(),
                };
                if invalid {
                    return Err(SelectorError(format!(
                        "unable to parse requirement: invalid label value: {v:?}"
                    )));
                }
            }
        }
        Ok(Self {
            requirements,
            nothing: false,
        })
    }

    /// Converts a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_object(obj: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(ml) = obj.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                let v = v
                    .as_str()
                    .ok_or_else(|| SelectorError(format!("matchLabels[{k}] must be a string")))?;
                requirements.push(Requirement {
                    key: k.clone(),
                    op: Op::Equals,
                    values: BTreeSet::from([v.to_string()]),
                });
            }
        }
        if let Some(exprs) = obj.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or_else(|| SelectorError("matchExpressions[].key is required".into()))?;
                let values: BTreeSet<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str) {
                    Some("In") => Op::In,
                    Some("NotIn") => Op::NotIn,
                    Some("Exists") => Op::Exists,
                    Some("DoesNotExist") => Op::DoesNotExist,
                    other => {
                        return Err(SelectorError(format!(
                            "{:?} is not a valid label selector operator",
                            other.unwrap_or("")
                        )));
                    }
                };
                requirements.push(Requirement {
                    key: key.to_string(),
                    op,
                    values,
                });
            }
        }
        Ok(Self {
            requirements,
            nothing: false,
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sorted: Vec<&Requirement> = self.requirements.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        let parts: Vec<String> = sorted.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn rest(&self) -> String {
        self.chars[self.pos.min(self.chars.len())..]
            .iter()
            .collect()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_str(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.chars.len() >= self.pos + n
            && self.chars[self.pos..self.pos + n]
                .iter()
                .copied()
                .eq(s.chars())
        {
            self.pos += n;
            true
        } else {
            false
        }
    }

    /// A key or value token: up to whitespace or an operator character.
    fn word(&mut self) -> String {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || matches!(c, ',' | '=' | '!' | '(' | ')' | '<' | '>') {
                break;
            }
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        self.skip_ws();
        if self.eat('!') {
            self.skip_ws();
            let key = self.word();
            if key.is_empty() {
                return Err(SelectorError(
                    "unable to parse requirement: missing key after '!'".into(),
                ));
            }
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
                values: BTreeSet::new(),
            });
        }
        let key = self.word();
        if key.is_empty() {
            return Err(SelectorError(format!(
                "unable to parse requirement: found '{}', expected: identifier",
                self.rest()
            )));
        }
        self.skip_ws();
        if self.at_end() || self.peek() == Some(',') {
            return Ok(Requirement {
                key,
                op: Op::Exists,
                values: BTreeSet::new(),
            });
        }
        let op = if self.eat_str("==") || self.eat('=') {
            Op::Equals
        } else if self.eat_str("!=") {
            Op::NotEquals
        } else if self.eat('>') {
            Op::GreaterThan
        } else if self.eat('<') {
            Op::LessThan
        } else if self.eat_str("notin") {
            Op::NotIn
        } else if self.eat_str("in") {
            Op::In
        } else {
            return Err(SelectorError(format!(
                "unable to parse requirement: found '{}', expected: in, notin, =, ==, !=, gt, lt",
                self.rest()
            )));
        };
        self.skip_ws();
        let values = if matches!(op, Op::In | Op::NotIn) {
            if !self.eat('(') {
                return Err(SelectorError(format!(
                    "unable to parse requirement: found '{}', expected: '('",
                    self.rest()
                )));
            }
            let mut set = BTreeSet::new();
            loop {
                self.skip_ws();
                let v = self.word();
                self.skip_ws();
                set.insert(v);
                if self.eat(')') {
                    break;
                }
                if !self.eat(',') {
                    return Err(SelectorError(format!(
                        "unable to parse requirement: found '{}', expected: ',' or ')'",
                        self.rest()
                    )));
                }
            }
            set
        } else {
            BTreeSet::from([self.word()])
        };
        Ok(Requirement { key, op, values })
    }
}

/// A parsed field selector: conjunction of `path=value` / `path!=value` terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses and checks each field against the resource's supported field labels.
    pub fn parse(input: &str, supported: &[String]) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            let builtin = field == "metadata.name" || field == "metadata.namespace";
            if !builtin && !supported.iter().any(|s| s == field) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The name a selector pins the request to, which RBAC uses for resourceNames.
    pub fn pinned_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, eq, _)| f == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(field, equal, want)| {
            let found = field.split('.').try_fold(obj, |v, step| v.get(step));
            let actual = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *want) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn parses_every_operator() {
        let s =
            LabelSelector::parse("a=1, b==2,c!=3,d in (x, y),e notin (z),f,!g,h>5,i<3").unwrap();
        let l = labels(json!({"a":"1","b":"2","c":"4","d":"y","e":"w","f":"","h":"6","i":"2"}));
        assert!(s.matches(Some(&l)));
        let mut l2 = l.clone();
        l2.insert("g".into(), "x".into());
        assert!(!s.matches(Some(&l2)));
        let mut l3 = l.clone();
        l3.insert("d".into(), "q".into());
        assert!(!s.matches(Some(&l3)));
    }

    #[test]
    fn not_equals_matches_missing_label() {
        let s = LabelSelector::parse("tier!=db").unwrap();
        assert!(s.matches(None));
        assert!(s.matches(Some(&labels(json!({"tier":"web"})))));
        assert!(!s.matches(Some(&labels(json!({"tier":"db"})))));
    }

    #[test]
    fn rejects_garbage() {
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("a in x").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("-bad-=x").is_err());
        assert!(LabelSelector::parse("").unwrap().is_empty());
    }

    #[test]
    fn label_selector_object_round_trips_to_string() {
        let s = LabelSelector::from_object(&json!({"matchLabels":{"app":"web","tier":"x"},"matchExpressions":[{"key":"env","operator":"In","values":["a","b"]}]})).unwrap();
        assert_eq!(s.to_string(), "app=web,env in (a,b),tier=x");
        assert!(s.matches(Some(&labels(json!({"app":"web","tier":"x","env":"b"})))));
    }

    #[test]
    fn field_selectors() {
        let fs =
            FieldSelector::parse("metadata.name=a,metadata.namespace!=kube-system", &[]).unwrap();
        assert!(fs.matches(&json!({"metadata":{"name":"a","namespace":"default"}})));
        assert!(!fs.matches(&json!({"metadata":{"name":"a","namespace":"kube-system"}})));
        assert_eq!(fs.pinned_name(), Some("a"));
        assert!(FieldSelector::parse("spec.foo=1", &[]).is_err());
        let ev =
            FieldSelector::parse("involvedObject.name=x", &["involvedObject.name".into()]).unwrap();
        assert!(ev.matches(&json!({"involvedObject":{"name":"x"}})));
    }
}
