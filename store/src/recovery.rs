//! Recovery at open: every record brought to a resting state after a crash
//! (commits, fetches and evictions finished or undone), writers' stagings
//! kept, everything else in staging and trash cleared, orphaned snapshot
//! directories removed (docs/STORE.md, "Crash recovery").
//!
//! Why `impl Store` here: recovery rewrites the records of every other
//! concern (commit, fetch, eviction) and the staging table in one pass
//! before any of them runs; it needs the database, the paths and the
//! staging table that `Store` owns, and nothing else calls it.

use std::collections::HashMap;
use std::path::Path;

use tracing::{error, info, warn};

use crate::chunk;
use crate::db::{self, LocalState, Tx};
use crate::error::{Error, Result};
use crate::id::{ActorName, SnapshotId};
use crate::local;
use crate::local::remove_file_if_present;
use crate::manifest::MANIFEST_FILE;
use crate::state::Store;
use crate::util::lock;

impl Store {
    /// Bring every record to a resting state after a crash: clean staging and
    /// trash, finish or undo commits, fetches and evictions, delete orphans.
    pub(crate) fn recover(&self) -> Result<()> {
        self.recover_stagings()?;
        local::clear_dir(&self.paths.trash)?;
        for rec in db::records(&self.db, None)? {
            let id = rec.id();
            let dir = self.snapshot_dir(&id);
            let local_ok = || -> bool {
                std::fs::read(dir.join(MANIFEST_FILE)).map(|b| chunk::sha256_hex(&b) == rec.manifest_digest).unwrap_or(false)
            };
            let mut fixed = rec.clone();
            match &rec.local {
                LocalState::Committing { .. } => {
                    if local_ok() {
                        fixed.local = LocalState::Present;
                    } else {
                        // The commit never returned: drop it (the generation stays used).
                        warn!(snapshot = %id, "recovery: dropping interrupted commit");
                        local::remove_tree(&dir, &self.paths.trash)?;
                        let tx = Tx::begin(&self.db)?;
                        tx.delete(&id)?;
                        tx.commit()?;
                        continue;
                    }
                }
                LocalState::Fetching { .. } => {
                    if local_ok() {
                        fixed.local = LocalState::Present;
                    } else {
                        info!(snapshot = %id, "recovery: interrupted fetch discarded");
                        local::remove_tree(&dir, &self.paths.trash)?;
                        fixed.local = LocalState::Absent;
                    }
                }
                LocalState::Evicting => {
                    info!(snapshot = %id, "recovery: finishing interrupted eviction");
                    local::remove_tree(&dir, &self.paths.trash)?;
                    fixed.local = LocalState::Absent;
                }
                LocalState::Present if !local_ok() => {
                    error!(snapshot = %id, dir = %dir.display(), "recovery: local copy missing or its manifest changed");
                    local::remove_tree(&dir, &self.paths.trash)?;
                    fixed.local = LocalState::Absent;
                    fixed.last_error = Some(format!("local copy at {} was missing or damaged at open", dir.display()));
                }
                LocalState::Present | LocalState::Absent => {}
            }
            if fixed.local != rec.local || fixed.last_error != rec.last_error {
                let tx = Tx::begin(&self.db)?;
                tx.put(&fixed)?;
                tx.commit()?;
            }
        }
        self.remove_orphans()
    }

    /// Snapshot directories no record accounts for (a commit that crashed
    /// before its record, a record removed before its files).
    pub(crate) fn remove_orphans(&self) -> Result<()> {
        fn walk(store: &Store, dir: &Path, rel: &str) -> Result<()> {
            let rd = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| Error::io("list", dir, e))?;
                let p = entry.path();
                let name = entry.file_name().to_string_lossy().to_string();
                if !p.is_dir() {
                    continue;
                }
                if name == "_gen" {
                    let actor = ActorName::new(rel).ok();
                    let rd = std::fs::read_dir(&p).map_err(|e| Error::io("list", &p, e))?;
                    for g in rd {
                        let g = g.map_err(|e| Error::io("list", &p, e))?;
                        let generation = g.file_name().to_string_lossy().parse::<u64>().ok();
                        let keep = match (&actor, generation) {
                            (Some(a), Some(n)) => {
                                db::record(&store.db, &SnapshotId::new(a.clone(), n))?.is_some_and(|r| r.local != LocalState::Absent)
                            }
                            _ => false,
                        };
                        if !keep {
                            warn!(path = %g.path().display(), "recovery: removing orphaned snapshot directory");
                            local::remove_tree(&g.path(), &store.paths.trash)?;
                        }
                    }
                } else {
                    let rel = if rel.is_empty() { name } else { format!("{rel}/{name}") };
                    walk(store, &p, &rel)?;
                }
            }
            Ok(())
        }
        walk(self, &self.paths.snapshots, "")
    }

    /// After a restart: writers' stagings (those with an actor sidecar) are
    /// kept and can still be committed or aborted; anything else there (a
    /// fetch or commit cut short) is removed.
    pub(crate) fn recover_stagings(&self) -> Result<()> {
        let dir = &self.paths.staging;
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
        let mut kept = HashMap::new();
        let mut remove = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                let actor = std::fs::read_to_string(self.staging_sidecar(&name)).ok().and_then(|a| ActorName::new(a).ok());
                match actor {
                    Some(a) => {
                        kept.insert(name, (a, false));
                    }
                    None => remove.push(p),
                }
            } else if !(name.ends_with(".actor") && self.paths.staging.join(name.trim_end_matches(".actor")).is_dir()) {
                remove.push(p);
            }
        }
        for p in remove {
            if p.is_dir() {
                local::remove_tree(&p, &self.paths.trash)?;
            } else {
                remove_file_if_present(&p)?;
            }
        }
        if !kept.is_empty() {
            info!(stagings = kept.len(), "recovery: kept writers' stagings (not committed yet)");
        }
        *lock(&self.stagings) = kept;
        Ok(())
    }
}
