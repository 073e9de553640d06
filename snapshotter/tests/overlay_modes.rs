//! Modes of the overlay snapshotter's directories (issue 37, item 1): under
//! the daemon's umask 077, a snapshot's `fs` (the root of a container's
//! rootfs) is still 0755 and its `work` 0711, as containerd's overlay
//! snapshotter makes them, so a container running as a non-root user can
//! read its rootfs; the snapshot's own directory and `snapshots/` stay 0700.
//!
//! Its own test binary: it sets the process's umask, which is process-wide.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use torpor_snapshotter::overlay::{Options, Overlay};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn a_snapshots_rootfs_is_0755_under_the_daemons_umask() {
    torpor_snapshotter::daemon::private_umask();
    let root = tempfile::tempdir().unwrap();
    let o = Overlay::open(root.path(), Options::default()).unwrap();
    o.prepare("layer-1", "", HashMap::new()).unwrap();
    o.commit("layer-1-committed", "layer-1", HashMap::new()).unwrap();
    o.prepare("container-rw", "layer-1-committed", HashMap::new()).unwrap();
    o.view("container-ro", "layer-1-committed", HashMap::new()).unwrap();

    let snapshots = root.path().join("snapshots");
    assert_eq!(mode(&snapshots), 0o700, "snapshots/");
    let mut seen = 0;
    for e in std::fs::read_dir(&snapshots).unwrap() {
        let dir = e.unwrap().path();
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        assert_eq!(mode(&dir.join("fs")), 0o755, "{}/fs", dir.display());
        if dir.join("work").exists() {
            assert_eq!(mode(&dir.join("work")), 0o711, "{}/work", dir.display());
        }
        seen += 1;
    }
    assert_eq!(seen, 3, "one directory per snapshot (the committed layer, the active and the view)");
}
