//! containerd's filter syntax (`pkg/filters`) for `List`/`Walk`.
//!
//! A filter is a comma-separated list of selectors that must all match; a
//! list of filters matches when any of them does (an empty list, or an empty
//! filter, matches everything). A selector is a field path (`name`,
//! `parent`, `kind`, `labels.<key>`; components may be quoted:
//! `labels."containerd.io/gc.root"`), optionally followed by an operator
//! (`==`, `!=`, `~=` for a regular expression) and a value (bare, `"quoted"`
//! or, for `~=`, `/regex/`). A bare field path tests presence.

use regex::Regex;

use crate::error::{Error, Result};

#[derive(Debug)]
enum Op {
    Present,
    Equal(String),
    NotEqual(String),
    Matches(Regex),
}

#[derive(Debug)]
struct Selector {
    path: Vec<String>,
    op: Op,
}

/// Parsed filters: OR of ANDs of selectors.
#[derive(Debug, Default)]
pub struct Filters(Vec<Vec<Selector>>);

/// What a filter is matched against.
pub trait Fields {
    /// The value of a field path, `None` when the field is absent.
    fn field(&self, path: &[String]) -> Option<String>;
}

impl Filters {
    /// Parses every filter; an error names the filter and what is wrong.
    pub fn parse(filters: &[String]) -> Result<Self> {
        let mut all = Vec::new();
        for f in filters {
            let sels = parse_one(f).map_err(|e| Error::InvalidArgument(format!("invalid filter {f:?}: {e}")))?;
            if sels.is_empty() {
                // an empty filter matches everything
                return Ok(Filters::default());
            }
            all.push(sels);
        }
        Ok(Filters(all))
    }

    pub fn matches(&self, item: &impl Fields) -> bool {
        if self.0.is_empty() {
            return true;
        }
        self.0.iter().any(|sels| sels.iter().all(|s| s.matches(item)))
    }
}

impl Selector {
    fn matches(&self, item: &impl Fields) -> bool {
        let v = item.field(&self.path);
        match &self.op {
            Op::Present => v.is_some(),
            Op::Equal(want) => v.as_deref() == Some(want.as_str()),
            // as containerd: an absent field has the value ""
            Op::NotEqual(want) => v.as_deref().unwrap_or("") != want,
            Op::Matches(re) => re.is_match(v.as_deref().unwrap_or("")),
        }
    }
}

struct Scanner<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(c) if c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }
    fn eat(&mut self, t: &str) -> bool {
        if self.s[self.pos..].starts_with(t.as_bytes()) {
            self.pos += t.len();
            true
        } else {
            false
        }
    }
    fn quoted(&mut self, q: u8) -> std::result::Result<String, String> {
        // at the opening quote
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return Err(format!("unterminated {} string", q as char)),
                Some(c) if c == q => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') if q == b'"' => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'n') => out.push(b'\n'),
                        Some(b't') => out.push(b'\t'),
                        Some(c) => out.push(c),
                        None => return Err("unterminated escape".into()),
                    }
                    self.pos += 1;
                }
                Some(c) => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
        String::from_utf8(out).map_err(|_| "string is not UTF-8".to_string())
    }
    fn field(&mut self) -> std::result::Result<String, String> {
        self.skip_ws();
        if self.peek() == Some(b'"') {
            return self.quoted(b'"');
        }
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'/' {
                self.pos += 1;
            } else {
                break;
            }
        }
        if start == self.pos {
            return Err(format!("expected a field name at offset {start}"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.pos]).into_owned())
    }
    fn value(&mut self, regex: bool) -> std::result::Result<String, String> {
        self.skip_ws();
        match self.peek() {
            Some(b'"') => self.quoted(b'"'),
            Some(b'/') if regex => self.quoted(b'/'),
            _ => {
                let start = self.pos;
                while let Some(c) = self.peek() {
                    if c == b',' {
                        break;
                    }
                    self.pos += 1;
                }
                let v = String::from_utf8_lossy(&self.s[start..self.pos]).trim().to_string();
                if v.is_empty() {
                    return Err(format!("expected a value at offset {start}"));
                }
                Ok(v)
            }
        }
    }
}

fn parse_one(f: &str) -> std::result::Result<Vec<Selector>, String> {
    let mut sc = Scanner { s: f.as_bytes(), pos: 0 };
    let mut sels = Vec::new();
    sc.skip_ws();
    if sc.peek().is_none() {
        return Ok(sels);
    }
    loop {
        let mut path = vec![sc.field()?];
        while sc.eat(".") {
            path.push(sc.field()?);
        }
        sc.skip_ws();
        let op = if sc.eat("==") {
            Op::Equal(sc.value(false)?)
        } else if sc.eat("!=") {
            Op::NotEqual(sc.value(false)?)
        } else if sc.eat("~=") {
            let v = sc.value(true)?;
            Op::Matches(Regex::new(&v).map_err(|e| format!("bad regular expression {v:?}: {e}"))?)
        } else {
            Op::Present
        };
        sels.push(Selector { path, op });
        sc.skip_ws();
        match sc.peek() {
            None => return Ok(sels),
            Some(b',') => sc.pos += 1,
            Some(c) => return Err(format!("unexpected {:?} at offset {}", c as char, sc.pos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Item(HashMap<&'static str, &'static str>);
    impl Fields for Item {
        fn field(&self, path: &[String]) -> Option<String> {
            self.0.get(path.join(".").as_str()).map(|s| s.to_string())
        }
    }

    fn f(s: &[&str]) -> Filters {
        Filters::parse(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn selectors() {
        let it =
            Item([("name", "k8s.io/3/sha256:abc"), ("kind", "committed"), ("parent", ""), ("labels.containerd.io/gc.root", "x")].into());
        assert!(f(&[]).matches(&it));
        assert!(f(&[""]).matches(&it));
        assert!(f(&["kind==committed"]).matches(&it));
        assert!(!f(&["kind==active"]).matches(&it));
        assert!(f(&["kind!=active"]).matches(&it));
        assert!(f(&["kind==committed,name~=sha256"]).matches(&it));
        assert!(!f(&["kind==committed,name~=^default/"]).matches(&it));
        assert!(f(&["kind==active", "name~=/abc$/"]).matches(&it));
        assert!(f(&["labels.\"containerd.io/gc.root\""]).matches(&it));
        assert!(f(&["labels.\"containerd.io/gc.root\"==x"]).matches(&it));
        assert!(!f(&["labels.other"]).matches(&it));
        assert!(f(&["labels.other!=y"]).matches(&it));
        assert!(f(&[r#"name=="k8s.io/3/sha256:abc""#]).matches(&it));
        assert!(f(&["name == k8s.io/3/sha256:abc"]).matches(&it));
    }

    #[test]
    fn bad_filters_are_named() {
        for bad in ["kind==", "==x", "name~=(", "kind==a b,", "labels.\"x"] {
            let e = Filters::parse(&[bad.to_string()]).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
