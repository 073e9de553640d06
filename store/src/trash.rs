//! Emptying the local tier's trash: the trees `local::remove_tree`
//! renamed into `<root>/trash/` are deleted by one background thread, which
//! cuts big files down step by step before it unlinks them.
//!
//! Why paced: unlinking a 1 GiB file frees all its extents at once, and on
//! ext4 (mounted with `discard` above all) that holds the journal: every
//! fsync on the file system waits meanwhile. On the bench machine the
//! unlink of a 1 GiB file took 660 ms and a small fsync beside it 240 ms;
//! the same file cut by 16 MiB every 50 ms, the slowest fsync beside it
//! took 4 ms. Resumes fsync their records, and a snapshot evicted, removed
//! or collected beside one stalled it. Smaller cuts at the same pace are
//! gentler still: beside a 256 MiB file cut by 16 MiB every 50 ms, one
//! fsync in ten (rename and directory included) took 5 to 12 ms; cut by
//! 4 MiB every 12.5 ms, 1.3 to 4 ms.
//!
//! A tree is gone from the store once renamed into the trash; its space is
//! freed over the next seconds (about 3 s per GiB). What a stopped daemon
//! left in the trash is deleted at the next open (`recovery`).

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;
use std::time::Duration;

use tracing::warn;

/// A file is cut down by this much at a time before it is unlinked.
const STEP: u64 = 4 << 20;
/// The pause after each cut (320 MiB/s).
const PAUSE: Duration = Duration::from_micros(12_500);

/// The emptier thread's queue (`None`: it could not be started, and trees
/// are deleted at once by the caller).
static EMPTIER: OnceLock<Option<Sender<PathBuf>>> = OnceLock::new();

/// Delete `tree` (a directory or file in the trash) in the background,
/// paced.
pub fn delete_later(tree: PathBuf) {
    let queue = EMPTIER.get_or_init(|| {
        let (tx, rx) = channel::<PathBuf>();
        let started = std::thread::Builder::new().name("store-trash".into()).spawn(move || {
            for tree in rx {
                delete_paced(&tree);
            }
        });
        match started {
            Ok(_) => Some(tx),
            Err(e) => {
                warn!(error = %e, "could not start the trash emptier: trees are deleted at once");
                None
            }
        }
    });
    let unsent = match queue {
        Some(tx) => tx.send(tree).err().map(|e| e.0),
        None => Some(tree),
    };
    if let Some(tree) = unsent {
        delete_paced(&tree);
    }
}

/// Cut the big files of `tree` down, then delete it. A failure is logged
/// (the next open deletes what is left).
fn delete_paced(tree: &Path) {
    match cut_big_files(tree) {
        // Deleted meanwhile (a store reopened in this process empties its trash).
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            warn!(path = %tree.display(), error = %e, "trash: could not cut a big file down (it is unlinked whole)");
        }
        _ => {}
    }
    let removed = match fs::symlink_metadata(tree) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(tree),
        Ok(_) => fs::remove_file(tree),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            warn!(path = %tree.display(), error = %e, "trash: could not delete (the next open of the store does)");
        }
        _ => {}
    }
}

/// Every regular file under `path` (symbolic links are not followed) bigger
/// than [`STEP`], truncated by `STEP` every [`PAUSE`] down to empty. A file
/// with other hard links is left whole: it is the same file as a copy still
/// in use (a staging view and the committed snapshot share their files), and
/// unlinking it frees nothing.
fn cut_big_files(path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            cut_big_files(&entry?.path())?;
        }
    } else if meta.is_file() && meta.nlink() == 1 && meta.len() > STEP {
        let f = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
        let mut len = meta.len();
        while len > 0 {
            len = len.saturating_sub(STEP);
            f.set_len(len)?;
            std::thread::sleep(PAUSE);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree with big and small files and directories is deleted; its big
    /// files are cut down first.
    #[test]
    fn a_tree_in_the_trash_is_deleted_in_the_background() {
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("ctr/sub")).unwrap();
        let big = std::fs::File::create(tree.join("ctr/pages-1.img")).unwrap();
        big.set_len(3 * STEP + 5).unwrap();
        std::fs::write(tree.join("ctr/core-1.img"), b"core").unwrap();
        std::fs::write(tree.join("ctr/sub/x"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tree.join("ctr/link")).unwrap();
        let lone = t.path().join("lone");
        std::fs::write(&lone, b"y").unwrap();
        delete_later(tree.clone());
        delete_later(lone.clone());
        delete_later(t.path().join("never-there"));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while tree.exists() || lone.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the trash was not emptied: {:?}",
                std::fs::read_dir(t.path()).unwrap().collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(std::fs::metadata("/etc/passwd").is_ok(), "a symbolic link's target is not touched");
    }

    #[test]
    fn a_big_file_is_cut_to_empty() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::File::create(&p).unwrap().set_len(2 * STEP + 1).unwrap();
        cut_big_files(t.path()).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
    }

    /// A file with another hard link outside the tree (a snapshot's file
    /// under its staging view) keeps its content.
    #[test]
    fn a_file_linked_elsewhere_is_not_cut() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("tree")).unwrap();
        let kept = t.path().join("kept");
        std::fs::File::create(&kept).unwrap().set_len(2 * STEP + 1).unwrap();
        std::fs::hard_link(&kept, t.path().join("tree/view")).unwrap();
        cut_big_files(&t.path().join("tree")).unwrap();
        delete_paced(&t.path().join("tree"));
        assert!(!t.path().join("tree").exists());
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), 2 * STEP + 1, "the other link's file is whole");
    }
}
