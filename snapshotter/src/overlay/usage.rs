//! Disk usage of a directory tree, as containerd's `continuity/fs.DiskUsage`:
//! every distinct inode (by device and inode number, so hard links count once,
//! the root included) and the bytes allocated to them (`st_blocks * 512`).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{Error, Result};

/// Inodes and allocated bytes below (and including) `root`.
pub fn disk_usage(root: &Path) -> Result<(i64, i64)> {
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut size: i64 = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).map_err(|e| Error::io("stat", &p, e))?;
        if seen.insert((md.dev(), md.ino())) {
            size = size.saturating_add((md.blocks() as i64).saturating_mul(512));
        }
        if md.is_dir() {
            let rd = std::fs::read_dir(&p).map_err(|e| Error::io("read directory", &p, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| Error::io("read directory", &p, e))?;
                stack.push(entry.path());
            }
        }
    }
    Ok((seen.len() as i64, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_inodes_once_and_allocated_bytes() {
        let d = tempfile::tempdir().unwrap();
        let (inodes, _) = disk_usage(d.path()).unwrap();
        assert_eq!(inodes, 1);
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/a"), vec![7u8; 64 * 1024]).unwrap();
        std::fs::hard_link(d.path().join("sub/a"), d.path().join("b")).unwrap();
        std::os::unix::fs::symlink("sub/a", d.path().join("c")).unwrap();
        let (inodes, size) = disk_usage(d.path()).unwrap();
        // root, sub, a (= b), c
        assert_eq!(inodes, 4);
        assert!(size >= 64 * 1024, "{size}");
        assert!(size < 2 * 64 * 1024 + 64 * 1024, "hard link counted twice: {size}");
    }

    #[test]
    fn missing_root_is_an_error_naming_it() {
        let e = disk_usage(Path::new("/nonexistent/torpor-usage")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/torpor-usage"), "{e}");
    }
}
