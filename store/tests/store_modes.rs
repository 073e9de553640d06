//! Modes of everything the store writes (issue 14, finding 1): a snapshot is
//! an actor's process memory, so every directory of the local tier and of
//! the file:// object tier is 0700 and every file 0600.
//!
//! Its own test binary: it sets the process's umask, which is process-wide.

mod store_common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use store_common::*;
use torpor_store::{CommitOptions, Store};

/// Every path under `root` (itself included) whose mode is not 0700 for a
/// directory or 0600 for a file, with its mode.
fn loose_modes(root: &Path) -> Vec<String> {
    loose(root).into_iter().map(|(p, m)| format!("{} {m:04o}", p.display())).collect()
}

fn loose(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    // What the trash emptier deleted meanwhile is gone, not loose.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let meta = match std::fs::symlink_metadata(root) {
        Err(e) if gone(&e) => return out,
        m => m.unwrap(),
    };
    let mode = meta.mode() & 0o7777;
    let want = if meta.is_dir() { 0o700 } else { 0o600 };
    if mode != want {
        out.push((root.to_path_buf(), mode));
    }
    if meta.is_dir() {
        let entries = match std::fs::read_dir(root) {
            Err(e) if gone(&e) => return out,
            d => d.unwrap(),
        };
        for e in entries {
            match e {
                Err(e) if gone(&e) => {}
                e => out.extend(loose(&e.unwrap().path())),
            }
        }
    }
    out
}

fn set_umask(mask: u32) {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_directory_is_0700_and_every_file_0600_in_both_tiers() {
    // With a loose umask the local tier is still private: its modes are
    // the store's own, not the umask's. The writer (CRIU, the rootfs tar)
    // creates its files with its own modes (0644, 0640 here).
    set_umask(0o022);
    let tmp = tempfile::tempdir().unwrap();
    let (root, objects) = (tmp.path().join("store"), tmp.path().join("objects"));
    let store = Store::open(config(&root, &objects)).await.unwrap();
    let st = store.begin(&actor("default/web-0")).await.unwrap();
    assert_eq!(mode(&st.path), 0o700, "a staging is private before anything is dumped into it");
    write_tree(&st.path, 1, 1 << 20);
    std::fs::write(st.path.join("rootfs-diff.tar"), vec![b't'; 10_000]).unwrap();
    let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    store.upload(&info.id, None).await.unwrap();
    let (_, m) = store.inspect(&info.id).await.unwrap();
    let core = m.entries.iter().find(|e| e.path == "ctr-a/core-1.img").unwrap();
    assert_eq!(core.mode, 0o640, "the manifest keeps the writer's mode");
    let loose = loose_modes(&root);
    assert!(loose.is_empty(), "local tier (umask 022): {loose:?}");
    assert_eq!(mode(&objects), 0o700, "the object tier's directory is private whatever the umask");
    // A fetched copy too.
    store.evict(&info.id).await.unwrap();
    let co = store.checkout(&info.id, None).await.unwrap();
    assert!(co.fetched);
    let loose = loose_modes(&root);
    assert!(loose.is_empty(), "local tier after a fetch: {loose:?}");
    store.release(&co.lease).await.unwrap();
    store.shutdown().await;
    drop(store);

    // Under the daemon's umask the object tier's objects are private too
    // (object_store's file:// tier creates them with the umask's modes).
    // (torpor-snapshotter's daemon sets umask 077 at start.)
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let tmp = tempfile::tempdir().unwrap();
    let (root, objects) = (tmp.path().join("store"), tmp.path().join("objects"));
    let store = Store::open(config(&root, &objects)).await.unwrap();
    let st = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st.path, 2, 1 << 20);
    let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    store.upload(&info.id, None).await.unwrap();
    let st2 = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st2.path, 3, 1 << 16);
    let (path, lease) = store.view_staging(&st2.id).await.unwrap();
    assert_eq!(mode(&path), 0o700, "a staging view");
    store.release(&lease).await.unwrap();
    store.abort(&st2.id).await.unwrap();
    assert!(!files_under(&objects.join("chunks")).is_empty());
    let loose = loose_modes(&objects);
    assert!(loose.is_empty(), "object tier (the daemon's umask): {loose:?}");
    let loose = loose_modes(&root);
    assert!(loose.is_empty(), "local tier: {loose:?}");
    store.shutdown().await;
}
