//! Actor names and snapshot ids.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A name or id that does not parse (the store's error wraps it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidId {
    #[error("invalid actor name {value:?}: {reason}")]
    Actor { value: String, reason: String },
    #[error("invalid snapshot id {value:?}: {reason}")]
    Snapshot { value: String, reason: String },
}

type Result<T> = std::result::Result<T, InvalidId>;

/// Longest accepted actor name (a DNS subdomain's limit).
pub const ACTOR_NAME_MAX: usize = 253;

/// A validated actor name ([`torpor_api::ids::ActorId`]'s rules: one or two
/// '/'-separated segments of `[a-z0-9._-]`, each starting and ending with a
/// letter or digit, at most 253 characters, no `..`). Such a name is safe
/// as a relative path (local tier) and an object key prefix (object tier);
/// a segment can never start with `_`, which the layouts use for their own
/// names (`_gen`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ActorName(String);

impl ActorName {
    /// Checked by [`torpor_api::ids::ActorId`], the one parser of actor ids
    /// (the same rules in the annotations, the store and torporctl).
    pub fn new(value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        match torpor_api::ids::ActorId::parse(&value) {
            Ok(id) => Ok(ActorName(id.into_string())),
            Err(e) => Err(InvalidId::Actor { value, reason: e.problem.to_string() }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name's segments (split at '/').
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl fmt::Display for ActorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ActorName {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self> {
        ActorName::new(s)
    }
}

impl TryFrom<String> for ActorName {
    type Error = InvalidId;
    fn try_from(s: String) -> Result<Self> {
        ActorName::new(s)
    }
}

impl From<ActorName> for String {
    fn from(a: ActorName) -> String {
        a.0
    }
}

/// One snapshot: an actor's suspended state at a generation. Generations of an
/// actor start at 1 and only grow; a generation number is never reused.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SnapshotId {
    pub actor: ActorName,
    pub generation: u64,
}

impl SnapshotId {
    pub fn new(actor: ActorName, generation: u64) -> Self {
        SnapshotId { actor, generation }
    }

    /// The key of this snapshot in the metadata database: `<actor>|<generation:020>`
    /// ('|' is not an actor character, so an actor's keys form one range).
    pub(crate) fn db_key(&self) -> String {
        format!("{}|{:020}", self.actor, self.generation)
    }

    pub(crate) fn from_db_key(key: &str) -> Option<SnapshotId> {
        let (actor, generation) = key.split_once('|')?;
        Some(SnapshotId { actor: ActorName::new(actor).ok()?, generation: generation.parse().ok()? })
    }
}

impl fmt::Display for SnapshotId {
    /// `<actor>@<generation>`, e.g. `default/web-0@7`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.actor, self.generation)
    }
}

impl FromStr for SnapshotId {
    type Err = InvalidId;
    /// Parses `<actor>@<generation>`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| InvalidId::Snapshot { value: s.to_string(), reason: reason.to_string() };
        let (actor, generation) = s.rsplit_once('@').ok_or_else(|| bad("expected <actor>@<generation>"))?;
        let generation: u64 = generation.parse().map_err(|_| bad("generation is not a number"))?;
        if generation == 0 {
            return Err(bad("generations start at 1"));
        }
        Ok(SnapshotId { actor: ActorName::new(actor)?, generation })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_names() {
        for ok in ["a", "default/web-0", "ns/pod.name_x-1", "0abc", &"a".repeat(253)] {
            assert_eq!(ActorName::new(ok).unwrap().as_str(), ok);
        }
        for bad in ["", "/a", "a/", "a//b", "A", "a b", "_a", "a/_gen", "a/../b", "a..b", ".a", "a/.b", "-a", "a\u{e9}", &"a".repeat(254)] {
            let err = ActorName::new(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn snapshot_ids() {
        let id: SnapshotId = "default/web-0@7".parse().unwrap();
        assert_eq!(id.actor.as_str(), "default/web-0");
        assert_eq!(id.generation, 7);
        assert_eq!(id.to_string(), "default/web-0@7");
        assert_eq!(SnapshotId::from_db_key(&id.db_key()), Some(id));
        assert!("a@0".parse::<SnapshotId>().is_err());
        assert!("a@x".parse::<SnapshotId>().is_err());
        assert!("a".parse::<SnapshotId>().is_err());
    }
}
