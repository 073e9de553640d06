//! Actor ids and snapshot references: the one parser, with one set of rules,
//! for the annotations (`torpor.dev/actor`, `torpor.dev/restore-from`), the
//! snapshot store and torporctl.
//!
//! An actor id becomes a directory name (local tier), an object key prefix
//! (object tier) and a database key, so it must never be usable as a path
//! of its own making. The rules, the strictest of those torpor applied
//! before they were merged here:
//!
//! - 1 to [`ACTOR_ID_MAX`] characters;
//! - one segment, or two separated by one `/` (`<namespace>/<pod>`);
//! - each segment of `a-z`, `0-9`, `-`, `.`, `_`, starting and ending with a
//!   letter or a digit (so never empty, `.`, `..`, `_gen` or `-x`);
//! - no `..` anywhere (`a..b` too: it reads as a path to a human and to
//!   some tools);
//! - ASCII only: no upper case, spaces, control characters or `@`.
//!
//! A snapshot reference is `<actor>@<generation>`, the generation a whole
//! number from 1 written in canonical decimal (no sign, no leading zero),
//! so that parsing and [`Display`](std::fmt::Display) round-trip exactly.
//! A [`SnapshotSelector`] is `<actor>` (its newest snapshot) or a
//! [`SnapshotRef`].

use std::fmt;
use std::str::FromStr;

/// Longest actor id (a DNS subdomain's limit).
pub const ACTOR_ID_MAX: usize = 253;

/// The rules of an actor id, for error messages and help texts.
pub const ACTOR_ID_FORM: &str = "1 to 253 characters: one segment, or two separated by one '/', \
     each of a-z, 0-9, '-', '.', '_', starting and ending with a letter or digit, no \"..\"";

/// The form of a snapshot reference, for error messages and help texts.
pub const SNAPSHOT_REF_FORM: &str = "<actor>@<generation>, the generation a whole number from 1";

/// The form of a snapshot selector, for error messages and help texts.
pub const SNAPSHOT_SELECTOR_FORM: &str = "<actor> (its newest snapshot) or <actor>@<generation> (a whole number from 1)";

/// What kind of value failed to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    ActorId,
    SnapshotRef,
    SnapshotSelector,
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::ActorId => "actor id",
            IdKind::SnapshotRef => "snapshot reference",
            IdKind::SnapshotSelector => "snapshot",
        })
    }
}

/// What is wrong with a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdProblem {
    /// The actor id is empty.
    Empty,
    /// Longer than [`ACTOR_ID_MAX`] bytes.
    TooLong { len: usize },
    /// More than one `/`.
    TooManySegments { segments: usize },
    /// A leading, trailing or doubled `/`.
    EmptySegment,
    /// `..` somewhere in the id.
    DotDot,
    /// A character outside `a-z 0-9 - . _ /`.
    BadChar { ch: char },
    /// A segment starts or ends with `-`, `.` or `_`.
    BadEdge { segment: String },
    /// A snapshot reference without `@<generation>`.
    NoGeneration,
    /// The generation is not canonical decimal digits (sign, leading zero,
    /// other characters, empty, or more than fits in 64 bits).
    BadGeneration { generation: String },
    /// Generation 0: generations start at 1.
    GenerationZero,
}

impl fmt::Display for IdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdProblem::Empty => write!(f, "it is empty"),
            IdProblem::TooLong { len } => write!(f, "it is {len} characters long, more than {ACTOR_ID_MAX}"),
            IdProblem::TooManySegments { segments } => {
                write!(f, "it has {segments} '/'-separated segments; at most 2 (<namespace>/<name>)")
            }
            IdProblem::EmptySegment => write!(f, "it has an empty segment (a leading, trailing or doubled '/')"),
            IdProblem::DotDot => write!(f, "it contains \"..\""),
            IdProblem::BadChar { ch } => write!(f, "character {ch:?} is not allowed"),
            IdProblem::BadEdge { segment } => {
                write!(f, "segment {segment:?} must start and end with a lower-case letter or a digit")
            }
            IdProblem::NoGeneration => write!(f, "the \"@<generation>\" is missing"),
            IdProblem::BadGeneration { generation } => {
                write!(f, "generation {generation:?} is not a whole number from 1 (digits only, no sign or leading zero)")
            }
            IdProblem::GenerationZero => write!(f, "generations start at 1"),
        }
    }
}

/// An actor id or snapshot reference that does not follow the rules:
/// names the value, what it was meant to be and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdError {
    pub kind: IdKind,
    pub value: String,
    pub problem: IdProblem,
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}: {} (expected {})", self.kind, self.value, self.problem, self.form())
    }
}

impl std::error::Error for IdError {}

impl IdError {
    fn new(kind: IdKind, value: &str, problem: IdProblem) -> IdError {
        // A hostile value can be huge: quote at most a screenful of it.
        let value = if value.len() > 300 {
            let mut end = 300;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &value[..end])
        } else {
            value.to_string()
        };
        IdError { kind, value, problem }
    }

    /// The form the value should have had.
    pub fn form(&self) -> &'static str {
        match (self.kind, &self.problem) {
            (IdKind::SnapshotRef, IdProblem::NoGeneration | IdProblem::BadGeneration { .. } | IdProblem::GenerationZero) => {
                SNAPSHOT_REF_FORM
            }
            (IdKind::SnapshotSelector, IdProblem::BadGeneration { .. } | IdProblem::GenerationZero) => SNAPSHOT_SELECTOR_FORM,
            _ => ACTOR_ID_FORM,
        }
    }
}

/// A valid actor id (see the [module](self) for the rules).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ActorId(String);

impl ActorId {
    /// Checks `value` against the rules.
    pub fn parse(value: &str) -> Result<ActorId, IdError> {
        check_actor(value).map_err(|p| IdError::new(IdKind::ActorId, value, p))?;
        Ok(ActorId(value.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its one or two segments.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

fn check_actor(value: &str) -> Result<(), IdProblem> {
    if value.is_empty() {
        return Err(IdProblem::Empty);
    }
    if let Some(ch) = value.chars().find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-._/".contains(c))) {
        return Err(IdProblem::BadChar { ch });
    }
    // ASCII from here: bytes are characters.
    if value.len() > ACTOR_ID_MAX {
        return Err(IdProblem::TooLong { len: value.len() });
    }
    let segments = value.split('/').count();
    if segments > 2 {
        return Err(IdProblem::TooManySegments { segments });
    }
    if value.contains("..") {
        return Err(IdProblem::DotDot);
    }
    for segment in value.split('/') {
        let edge_ok = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if segment.is_empty() {
            return Err(IdProblem::EmptySegment);
        }
        if !edge_ok(segment.bytes().next()) || !edge_ok(segment.bytes().last()) {
            return Err(IdProblem::BadEdge { segment: segment.to_string() });
        }
    }
    Ok(())
}

/// Parses a generation: canonical decimal, from 1.
fn parse_generation(g: &str) -> Result<u64, IdProblem> {
    let bad = || IdProblem::BadGeneration { generation: g.chars().take(40).collect() };
    if g.is_empty() || !g.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if g == "0" {
        return Err(IdProblem::GenerationZero);
    }
    if g.starts_with('0') {
        return Err(bad());
    }
    g.parse().map_err(|_| bad())
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ActorId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        ActorId::parse(s)
    }
}

impl TryFrom<String> for ActorId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        check_actor(&s).map_err(|p| IdError::new(IdKind::ActorId, &s, p))?;
        Ok(ActorId(s))
    }
}

impl TryFrom<&str> for ActorId {
    type Error = IdError;
    fn try_from(s: &str) -> Result<Self, IdError> {
        ActorId::parse(s)
    }
}

impl From<ActorId> for String {
    fn from(a: ActorId) -> String {
        a.0
    }
}

impl AsRef<str> for ActorId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ActorId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ActorId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// One snapshot: `<actor>@<generation>`, the generation from 1. Serialized
/// (serde) as `{"actor": ..., "generation": ...}`, validated when read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawSnapshotRef")]
pub struct SnapshotRef {
    pub actor: ActorId,
    generation: u64,
}

#[derive(serde::Deserialize)]
struct RawSnapshotRef {
    actor: ActorId,
    generation: u64,
}

impl TryFrom<RawSnapshotRef> for SnapshotRef {
    type Error = IdError;
    fn try_from(r: RawSnapshotRef) -> Result<Self, IdError> {
        SnapshotRef::new(r.actor, r.generation)
    }
}

impl SnapshotRef {
    /// Generation 0 is refused.
    pub fn new(actor: ActorId, generation: u64) -> Result<SnapshotRef, IdError> {
        if generation == 0 {
            return Err(IdError::new(IdKind::SnapshotRef, &format!("{actor}@0"), IdProblem::GenerationZero));
        }
        Ok(SnapshotRef { actor, generation })
    }

    /// Parses `<actor>@<generation>`.
    pub fn parse(value: &str) -> Result<SnapshotRef, IdError> {
        let err = |p| IdError::new(IdKind::SnapshotRef, value, p);
        let (actor, generation) = value.split_once('@').ok_or_else(|| err(IdProblem::NoGeneration))?;
        check_actor(actor).map_err(err)?;
        let generation = parse_generation(generation).map_err(err)?;
        Ok(SnapshotRef { actor: ActorId(actor.to_string()), generation })
    }

    /// From 1.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Display for SnapshotRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.actor, self.generation)
    }
}

impl FromStr for SnapshotRef {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        SnapshotRef::parse(s)
    }
}

/// An actor's newest snapshot (`<actor>`) or one generation of it
/// (`<actor>@<generation>`): what `torpor.dev/restore-from` and torporctl's
/// `snapshots` commands take.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SnapshotSelector {
    pub actor: ActorId,
    /// `None`: the newest.
    pub generation: Option<u64>,
}

impl SnapshotSelector {
    pub fn parse(value: &str) -> Result<SnapshotSelector, IdError> {
        let err = |p| IdError::new(IdKind::SnapshotSelector, value, p);
        let (actor, generation) = match value.split_once('@') {
            Some((a, g)) => (a, Some(parse_generation(g).map_err(err)?)),
            None => (value, None),
        };
        check_actor(actor).map_err(err)?;
        Ok(SnapshotSelector { actor: ActorId(actor.to_string()), generation })
    }

    /// The snapshot, when a generation was given.
    pub fn exact(&self) -> Option<SnapshotRef> {
        self.generation.map(|generation| SnapshotRef { actor: self.actor.clone(), generation })
    }
}

impl From<SnapshotRef> for SnapshotSelector {
    fn from(r: SnapshotRef) -> Self {
        SnapshotSelector { actor: r.actor, generation: Some(r.generation) }
    }
}

impl fmt::Display for SnapshotSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.generation {
            Some(g) => write!(f, "{}@{g}", self.actor),
            None => write!(f, "{}", self.actor),
        }
    }
}

impl FromStr for SnapshotSelector {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        SnapshotSelector::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(v: &str) -> IdProblem {
        ActorId::parse(v).unwrap_err().problem
    }

    #[test]
    fn valid_actor_ids_round_trip() {
        let long = "a".repeat(ACTOR_ID_MAX);
        let long2 = format!("{}/{}", "n".repeat(63), "p".repeat(ACTOR_ID_MAX - 64));
        for ok in ["a", "0", "default/web-0", "team-a/notebook.1", "x.y_z", "ns/pod.name_x-1", "a-b.c_d", "9/9", &long, &long2] {
            let id = ActorId::parse(ok).unwrap_or_else(|e| panic!("{ok:?} refused: {e}"));
            assert_eq!(id.as_str(), ok);
            assert_eq!(id.to_string(), ok);
            assert_eq!(ok.parse::<ActorId>().unwrap(), id);
            assert_eq!(ActorId::try_from(ok.to_string()).unwrap(), id);
        }
        assert_eq!(ActorId::parse("ns/pod").unwrap().segments().collect::<Vec<_>>(), ["ns", "pod"]);
    }

    #[test]
    fn actor_ids_that_could_be_paths_are_refused() {
        assert_eq!(problem(""), IdProblem::Empty);
        assert_eq!(problem("a..b"), IdProblem::DotDot);
        assert_eq!(problem("a/..b"), IdProblem::DotDot);
        assert_eq!(problem(".."), IdProblem::DotDot);
        assert_eq!(problem("../etc"), IdProblem::DotDot);
        assert_eq!(problem("a/../b"), IdProblem::TooManySegments { segments: 3 });
        assert_eq!(problem("a/b/c"), IdProblem::TooManySegments { segments: 3 });
        assert_eq!(problem("/abs"), IdProblem::EmptySegment);
        assert_eq!(problem("a/"), IdProblem::EmptySegment);
        assert_eq!(problem("/"), IdProblem::EmptySegment);
        assert_eq!(problem("a//"), IdProblem::TooManySegments { segments: 3 });
        assert_eq!(problem("."), IdProblem::BadEdge { segment: ".".into() });
        for edge in ["-a", "a-", ".a", "a.", "_gen", "a/_gen", "a_", "ns/-p", "ns./p"] {
            assert!(matches!(problem(edge), IdProblem::BadEdge { .. }), "{edge}: {:?}", problem(edge));
        }
        for (v, ch) in
            [("UPPER", 'U'), ("a b", ' '), ("a;b", ';'), ("a@1", '@'), ("a\u{e9}", '\u{e9}'), ("a\0", '\0'), ("a\\b", '\\'), ("a\nb", '\n')]
        {
            assert_eq!(problem(v), IdProblem::BadChar { ch }, "{v:?}");
        }
        assert_eq!(problem(&"a".repeat(ACTOR_ID_MAX + 1)), IdProblem::TooLong { len: ACTOR_ID_MAX + 1 });
    }

    #[test]
    fn errors_name_the_value_and_the_problem() {
        let e = ActorId::parse("a..b").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("actor id") && msg.contains("\"a..b\"") && msg.contains("contains \"..\""), "{msg}");
        assert!(msg.contains(ACTOR_ID_FORM), "{msg}");
        // A huge value is quoted in part, never split inside a character.
        let huge = "\u{e9}".repeat(10_000);
        let e = ActorId::parse(&huge).unwrap_err();
        assert!(e.value.len() <= 304 && e.value.ends_with("..."), "{}", e.value.len());
        let e = SnapshotRef::parse("web").unwrap_err();
        assert_eq!(e.problem, IdProblem::NoGeneration);
        assert!(e.to_string().contains(SNAPSHOT_REF_FORM), "{e}");
    }

    #[test]
    fn snapshot_refs() {
        let r = SnapshotRef::parse("default/web-0@7").unwrap();
        assert_eq!(r.actor, "default/web-0");
        assert_eq!(r.generation(), 7);
        assert_eq!(r.to_string(), "default/web-0@7");
        assert_eq!("default/web-0@7".parse::<SnapshotRef>().unwrap(), r);
        let max = format!("a@{}", u64::MAX);
        assert_eq!(SnapshotRef::parse(&max).unwrap().generation(), u64::MAX);
        for (bad, p) in [
            ("a", IdProblem::NoGeneration),
            ("a@0", IdProblem::GenerationZero),
            ("a@", IdProblem::BadGeneration { generation: "".into() }),
            ("a@07", IdProblem::BadGeneration { generation: "07".into() }),
            ("a@+7", IdProblem::BadGeneration { generation: "+7".into() }),
            ("a@-1", IdProblem::BadGeneration { generation: "-1".into() }),
            ("a@7x", IdProblem::BadGeneration { generation: "7x".into() }),
            ("a@ 7", IdProblem::BadGeneration { generation: " 7".into() }),
            ("a@1@2", IdProblem::BadGeneration { generation: "1@2".into() }),
            ("a@18446744073709551616", IdProblem::BadGeneration { generation: "18446744073709551616".into() }),
            ("@3", IdProblem::Empty),
            ("a..b@3", IdProblem::DotDot),
            ("../x@1", IdProblem::DotDot),
        ] {
            let e = SnapshotRef::parse(bad).unwrap_err();
            assert_eq!(e.problem, p, "{bad}");
            assert_eq!(e.kind, IdKind::SnapshotRef);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert!(SnapshotRef::new(ActorId::parse("a").unwrap(), 0).is_err());
        assert_eq!(SnapshotRef::new(ActorId::parse("a").unwrap(), 3).unwrap().to_string(), "a@3");
    }

    #[test]
    fn selectors() {
        let s = SnapshotSelector::parse("golden/base").unwrap();
        assert_eq!((s.actor.as_str(), s.generation), ("golden/base", None));
        assert_eq!(s.to_string(), "golden/base");
        assert_eq!(s.exact(), None);
        let s = SnapshotSelector::parse("golden/base@12").unwrap();
        assert_eq!(s.generation, Some(12));
        assert_eq!(s.to_string(), "golden/base@12");
        assert_eq!(s.exact(), Some(SnapshotRef::parse("golden/base@12").unwrap()));
        for bad in ["", "@3", "golden@", "golden@0", "golden@012", "Golden", "a..b", "a/b/c@1", "golden @1"] {
            let e = SnapshotSelector::parse(bad).unwrap_err();
            assert_eq!(e.kind, IdKind::SnapshotSelector, "{bad}");
        }
        assert!(SnapshotSelector::parse("golden@0").unwrap_err().to_string().contains(SNAPSHOT_SELECTOR_FORM));
    }

    #[test]
    fn serde_validates() {
        let r = SnapshotRef::parse("ns/a@2").unwrap();
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, r#"{"actor":"ns/a","generation":2}"#);
        assert_eq!(serde_json::from_str::<SnapshotRef>(&json).unwrap(), r);
        assert!(serde_json::from_str::<SnapshotRef>(r#"{"actor":"a..b","generation":2}"#).is_err());
        assert!(serde_json::from_str::<SnapshotRef>(r#"{"actor":"a","generation":0}"#).is_err());
        assert_eq!(serde_json::to_string(&ActorId::parse("x").unwrap()).unwrap(), r#""x""#);
        assert!(serde_json::from_str::<ActorId>(r#""../x""#).is_err());
    }
}
