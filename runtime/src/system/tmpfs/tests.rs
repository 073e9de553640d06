use super::*;
use crate::system::mounts::parse_mountinfo;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

const CONTAINER: &str = "\
2101 2100 0:380 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
2102 2101 0:381 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
2103 2101 0:382 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,inode64
2104 2103 0:383 / /dev/pts rw,nosuid,noexec,relatime - devpts devpts rw,gid=5,mode=620,ptmxmode=666
2105 2103 0:44 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k,inode64
2106 2101 0:384 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
2107 2106 0:385 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755,inode64
2108 2103 253:1 /var/lib/x/termination-log /dev/termination-log rw,relatime - ext4 /dev/vda1 rw
2109 2101 0:386 / /run rw,nosuid,nodev - tmpfs tmpfs rw,size=1024k,mpol=bind:0
2110 2101 0:387 / /a rw - tmpfs tmpfs rw,size=1m
2111 2101 0:387 / /b rw - tmpfs tmpfs rw,size=1m
2112 2101 0:388 / /weird\\040name rw - tmpfs tmpfs rw,size=1m
";
const SHIM: &str = "\
22 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw
44 22 0:44 / /run/containerd/sandboxes/x/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k,inode64
";

/// runc's `/dev` and the cgroup v1 tmpfs are carried; the pod's shm (a
/// mount of the shim's namespace), a bind, a tmpfs mounted twice, one with
/// an option torpor does not know and one whose path CRIU's option syntax
/// cannot hold are left to CRIU.
#[test]
fn the_containers_own_tmpfs_mounts() {
    let fresh: Vec<String> = ["/dev", "/sys/fs/cgroup", "/dev/shm", "/run", "/a", "/b", "/weird name"].map(String::from).to_vec();
    let kept = own_mounts(&parse_mountinfo(CONTAINER), &parse_mountinfo(SHIM), &fresh);
    assert_eq!(
        kept,
        vec![
            Kept {
                mountpoint: "/dev".into(),
                data: "size=65536k,mode=755,inode64".into(),
                flags: vec!["nosuid".into(), "strictatime".into()]
            },
            Kept {
                mountpoint: "/sys/fs/cgroup".into(),
                data: "mode=755,inode64".into(),
                flags: vec!["ro".into(), "nosuid".into(), "nodev".into(), "noexec".into(), "relatime".into()]
            },
        ]
    );
    // A tmpfs the spec binds in (a kubelet's token volume) is not taken,
    // though the shim's namespace does not show it.
    let token = "2113 2101 0:389 / /var/run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw,size=1m\n";
    assert!(own_mounts(&parse_mountinfo(token), &[], &fresh).is_empty());
    assert_eq!(own_mounts(&parse_mountinfo(token), &[], &["/var/run/secrets/kubernetes.io/serviceaccount".to_string()]).len(), 1);
}

/// A manifest from a snapshot is checked before anything reaches mount(2)
/// or CRIU's options.
#[test]
fn a_hostile_manifest_entry_is_refused() {
    let ok = Kept { mountpoint: "/dev".into(), data: "size=64m,mode=755".into(), flags: vec!["nosuid".into(), "relatime".into()] };
    assert_eq!(check(&ok), Ok(()));
    let bad = |f: &dyn Fn(&mut Kept)| {
        let mut k = ok.clone();
        f(&mut k);
        check(&k).unwrap_err()
    };
    assert!(bad(&|k| k.mountpoint = "dev".into()).contains("plain absolute path"));
    assert!(bad(&|k| k.mountpoint = "/".into()).contains("plain absolute path"));
    assert!(bad(&|k| k.mountpoint = "/dev/../etc".into()).contains("plain absolute path"));
    assert!(bad(&|k| k.mountpoint = "/dev]:x".into()).contains("plain absolute path"));
    assert!(bad(&|k| k.mountpoint = "/d ev".into()).contains("plain absolute path"));
    assert!(bad(&|k| k.data = "size=64m,exec".into()).contains("\"exec\""));
    assert!(bad(&|k| k.data = "mode=755,size=1,nr_inodes=x/y".into()).contains("nr_inodes=x/y"));
    assert!(bad(&|k| k.flags = vec!["nosuid".into()]).contains("mount flags"));
    assert!(bad(&|k| k.flags = vec!["relatime".into(), "noatime".into()]).contains("mount flags"));
    assert!(bad(&|k| k.flags = vec!["relatime".into(), "shared".into()]).contains("mount flags"));
}

/// A tmpfs mounted by the test, unmounted (with what is below it) however
/// the test ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        mounts::detach_under(self.0.parent().unwrap());
    }
}

/// What the suspend archives of a mount comes back in a fresh tmpfs with
/// the manifest's options: files, links, device nodes, and the mount
/// points of the mounts below it (empty: what they hold is not the
/// tmpfs's). Dropping the preparation leaves no mount and no directory.
#[test]
fn a_mount_is_archived_and_mounted_again() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    mount(Some("tmpfs"), &src, Some("tmpfs"), MsFlags::empty(), Some("size=1m,mode=755")).unwrap();
    let _src = Mounted(src.clone());
    std::fs::create_dir(src.join("pts")).unwrap();
    std::fs::write(src.join("termination-log"), b"").unwrap();
    std::fs::write(src.join("note"), b"kept").unwrap();
    std::os::unix::fs::symlink("/proc/self/fd", src.join("fd")).unwrap();
    nix::sys::stat::mknod(
        &src.join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    mount(Some("tmpfs"), &src.join("pts"), Some("tmpfs"), MsFlags::empty(), Some("size=1m")).unwrap();
    std::fs::write(src.join("pts/inner"), b"not ours").unwrap();
    let log = d.path().join("termination-log");
    std::fs::write(&log, b"the host's file").unwrap();
    mount(Some(log.as_path()), &src.join("termination-log"), None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();

    let image = d.path().join("image");
    let work = d.path().join("work");
    std::fs::create_dir_all(&image).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    rootfs::capture_mount(&src, &image.join(archive_name(0))).unwrap();
    let kept =
        Kept { mountpoint: "/dev".into(), data: "size=2m,mode=711".into(), flags: vec!["ro".into(), "nosuid".into(), "noatime".into()] };
    std::fs::write(image.join(MANIFEST), serde_json::to_vec(&Manifest { mounts: vec![kept] }).unwrap()).unwrap();

    let prepared = prepare(&image, &work).unwrap();
    let dir = work.join("tmpfs-0");
    assert_eq!(prepared.external, vec![format!("mnt[torpor-tmpfs-0]:{}", dir.display())]);
    let m = mounts::mountinfo("/proc/self/mountinfo").unwrap().into_iter().rfind(|m| Path::new(&m.mount_point) == dir).expect("mounted");
    assert_eq!(m.fstype, "tmpfs");
    assert!(
        m.mount_options.split(',').any(|o| o == "ro") && m.mount_options.contains("nosuid") && m.mount_options.contains("noatime"),
        "{m:?}"
    );
    assert!(m.super_options.contains("size=2048k") && m.super_options.contains("mode=711"), "{m:?}");
    assert_eq!(std::fs::read(dir.join("note")).unwrap(), b"kept");
    assert_eq!(std::fs::read_link(dir.join("fd")).unwrap(), Path::new("/proc/self/fd"));
    let null = std::fs::symlink_metadata(dir.join("null")).unwrap();
    assert!(null.file_type().is_char_device() && null.rdev() == nix::sys::stat::makedev(1, 3));
    assert_eq!(std::fs::read_dir(dir.join("pts")).unwrap().count(), 0, "a mount point comes back empty");
    assert_eq!(std::fs::metadata(dir.join("termination-log")).unwrap().len(), 0);
    drop(prepared);
    assert!(!dir.exists());
    assert!(!mounts::mountinfo("/proc/self/mountinfo").unwrap().iter().any(|m| Path::new(&m.mount_point).starts_with(&work)));
}

/// An image without a manifest (CRIU carried its tmpfs mounts) needs
/// nothing; a manifest that lies is refused with nothing left mounted.
#[test]
fn no_manifest_and_a_bad_one() {
    let d = tempfile::tempdir().unwrap();
    let p = prepare(d.path(), d.path()).unwrap();
    assert!(p.external.is_empty());
    let kept = Kept { mountpoint: "/dev".into(), data: "size=2m,context=x".into(), flags: vec!["relatime".into()] };
    std::fs::write(d.path().join(MANIFEST), serde_json::to_vec(&Manifest { mounts: vec![kept] }).unwrap()).unwrap();
    let e = prepare(d.path(), d.path()).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)) && e.to_string().contains("context=x"), "{e}");
    std::fs::write(d.path().join(MANIFEST), br#"{"mounts":[],"extra":1}"#).unwrap();
    assert!(matches!(prepare(d.path(), d.path()).unwrap_err(), Error::Corrupt(_)));
    assert!(!mounts::mountinfo("/proc/self/mountinfo").unwrap().iter().any(|m| Path::new(&m.mount_point).starts_with(d.path())));
}
