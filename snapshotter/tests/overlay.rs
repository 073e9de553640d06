//! The overlay snapshotter in-process, with real overlayfs mounts (needs
//! root, as every test on this machine): layer order, whiteouts, views,
//! crash leftovers and reopening.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use containerd_snapshots::api::types::Mount;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use torpor_snapshotter::overlay::{Options, Overlay, UIDMAP_LABEL};

/// Mounts `mounts` on a fresh dir; unmounts on drop.
struct Mounted {
    target: PathBuf,
}

impl Mounted {
    fn new(dir: &Path, name: &str, mounts: &[Mount]) -> Mounted {
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        let m = &mounts[0];
        let target = dir.join(name);
        std::fs::create_dir_all(&target).unwrap();
        match m.r#type.as_str() {
            "bind" => {
                mount(Some(m.source.as_str()), &target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>).unwrap();
                if m.options.iter().any(|o| o == "ro") {
                    mount(None::<&str>, &target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>)
                        .unwrap();
                }
            }
            "overlay" => {
                let data = m.options.join(",");
                mount(Some("overlay"), &target, Some("overlay"), MsFlags::empty(), Some(data.as_str()))
                    .unwrap_or_else(|e| panic!("mount overlay -o {data}: {e}"));
            }
            other => panic!("unexpected mount type {other}"),
        }
        Mounted { target }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.target.join(rel)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = umount2(&self.target, MntFlags::MNT_DETACH);
    }
}

fn open(root: &Path) -> Overlay {
    Overlay::open(root, Options::default()).unwrap()
}

fn no_labels() -> HashMap<String, String> {
    HashMap::new()
}

#[test]
fn layers_stack_nearest_first_with_whiteouts_and_readonly_views() {
    let tmp = tempfile::tempdir().unwrap();
    let o = open(&tmp.path().join("root"));
    let mnt = tmp.path().join("mnt");

    let m = o.prepare("a", "", no_labels()).unwrap();
    {
        let a = Mounted::new(&mnt, "a", &m);
        std::fs::write(a.path("file"), "a").unwrap();
        std::fs::write(a.path("only-a"), "a").unwrap();
        std::fs::write(a.path("deleted"), "a").unwrap();
    }
    o.commit("A", "a", no_labels()).unwrap();
    let m = o.prepare("b", "A", no_labels()).unwrap();
    assert_eq!(m[0].r#type, "overlay");
    {
        let b = Mounted::new(&mnt, "b", &m);
        assert_eq!(std::fs::read_to_string(b.path("only-a")).unwrap(), "a");
        std::fs::write(b.path("file"), "b").unwrap();
        std::fs::remove_file(b.path("deleted")).unwrap();
    }
    o.commit("B", "b", no_labels()).unwrap();
    let m = o.prepare("c", "B", no_labels()).unwrap();
    {
        let c = Mounted::new(&mnt, "c", &m);
        assert_eq!(std::fs::read_to_string(c.path("file")).unwrap(), "b", "B is above A");
        assert!(!c.path("deleted").exists(), "B's whiteout hides A's file");
        std::fs::write(c.path("file"), "c").unwrap();
    }
    // the usage of the active snapshot counts its upper only
    let u = o.usage("c").unwrap();
    assert!(u.inodes >= 2 && u.size > 0, "{u:?}");

    let m = o.view("v", "B", no_labels()).unwrap();
    assert_eq!(m[0].r#type, "overlay");
    {
        let v = Mounted::new(&mnt, "v", &m);
        assert_eq!(std::fs::read_to_string(v.path("file")).unwrap(), "b");
        assert!(std::fs::write(v.path("x"), "x").is_err(), "a view is read-only");
    }
    let m = o.view("v1", "A", no_labels()).unwrap();
    assert_eq!(m[0].r#type, "bind");
    {
        let v1 = Mounted::new(&mnt, "v1", &m);
        assert_eq!(std::fs::read_to_string(v1.path("file")).unwrap(), "a");
        assert!(std::fs::write(v1.path("x"), "x").is_err(), "a view is read-only");
    }

    // mounts of an existing snapshot are the ones prepare returned
    assert_eq!(o.mounts("c").unwrap(), o.mounts("c").unwrap());
    assert!(o.mounts("A").is_err(), "a committed snapshot has no mounts");

    for k in ["v1", "v", "c", "B", "A"] {
        o.remove(k).unwrap();
    }
    assert!(o.list(&[]).unwrap().is_empty());
    let left: Vec<_> = std::fs::read_dir(o.root().join("snapshots")).unwrap().collect();
    assert!(left.is_empty(), "directories left: {left:?}");
}

#[test]
fn reopen_keeps_snapshots_and_removes_crash_leftovers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let (before, last_id) = {
        let o = open(&root);
        o.prepare("a", "", no_labels()).unwrap();
        std::fs::write(o.root().join("snapshots/1/fs/f"), "kept").unwrap();
        o.commit("A", "a", no_labels()).unwrap();
        o.prepare("b", "A", no_labels()).unwrap();
        o.view("v", "A", no_labels()).unwrap();
        let l: Vec<(String, String)> = o.list(&[]).unwrap().into_iter().map(|i| (i.name, i.parent)).collect();
        (l, 3u64)
    };
    // what a crash leaves: a temp dir, a renamed dir whose record never
    // committed (the next id), a dir whose removal did not finish
    let snaps = root.join("snapshots");
    for d in ["new-1-7", &(last_id + 1).to_string(), "123456"] {
        std::fs::create_dir_all(snaps.join(d).join("fs")).unwrap();
        std::fs::write(snaps.join(d).join("fs/junk"), "junk").unwrap();
    }
    let o = open(&root);
    let after: Vec<(String, String)> = o.list(&[]).unwrap().into_iter().map(|i| (i.name, i.parent)).collect();
    assert_eq!(before, after);
    let mut dirs: Vec<String> = std::fs::read_dir(&snaps).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    dirs.sort();
    assert_eq!(dirs, vec!["1", "2", "3"]);
    assert_eq!(std::fs::read_to_string(snaps.join("1/fs/f")).unwrap(), "kept");
    // the next snapshot gets a fresh, empty directory
    let m = o.prepare("c", "", no_labels()).unwrap();
    let fs = PathBuf::from(&m[0].source);
    assert_eq!(fs, snaps.join((last_id + 1).to_string()).join("fs"));
    assert_eq!(std::fs::read_dir(&fs).unwrap().count(), 0);
}

#[test]
fn a_leftover_directory_of_the_next_id_does_not_block_a_create() {
    let tmp = tempfile::tempdir().unwrap();
    let o = open(&tmp.path().join("root"));
    o.prepare("a", "", no_labels()).unwrap();
    // an orphan appearing while running (e.g. a failed rename cleanup)
    let next = o.root().join("snapshots/2");
    std::fs::create_dir_all(next.join("fs")).unwrap();
    std::fs::write(next.join("fs/junk"), "junk").unwrap();
    let m = o.prepare("b", "", no_labels()).unwrap();
    assert_eq!(PathBuf::from(&m[0].source), next.join("fs"));
    assert!(!next.join("fs/junk").exists());
}

#[test]
fn remove_detaches_mounts_left_below_a_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let o = open(&tmp.path().join("root"));
    let m = o.prepare("a", "", no_labels()).unwrap();
    let fs = PathBuf::from(&m[0].source);
    let sub = fs.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("precious"), "x").unwrap();
    mount(Some(&other), &sub, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    o.remove("a").unwrap();
    assert!(!fs.exists(), "snapshot directory still there");
    assert_eq!(std::fs::read_to_string(other.join("precious")).unwrap(), "x", "the mounted directory's own files are untouched");
}

#[test]
fn owner_follows_id_map_labels_and_parents() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let o = open(&tmp.path().join("root"));
    let labels: HashMap<String, String> = [
        (UIDMAP_LABEL.to_string(), "0:100000:65536".to_string()),
        ("containerd.io/snapshot/gidmapping".to_string(), "0:200000:65536".to_string()),
    ]
    .into();
    let m = o.prepare("a", "", labels).unwrap();
    let md = std::fs::metadata(&m[0].source).unwrap();
    assert_eq!((md.uid(), md.gid()), (100000, 200000));
    o.commit("A", "a", no_labels()).unwrap();
    let m = o.prepare("b", "A", no_labels()).unwrap();
    let upper = m[0].options.iter().find_map(|x| x.strip_prefix("upperdir=")).unwrap();
    let md = std::fs::metadata(upper).unwrap();
    assert_eq!((md.uid(), md.gid()), (100000, 200000), "upper owned like its parent");

    let bad: HashMap<String, String> = [(UIDMAP_LABEL.to_string(), "nonsense".to_string())].into();
    let e = o.prepare("c", "", bad).unwrap_err();
    assert!(e.to_string().contains(UIDMAP_LABEL), "{e}");
    assert!(o.stat("c").is_err(), "a refused prepare leaves no record");
}
