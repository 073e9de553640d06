//! A container's rootfs changes, carried with its checkpoint.
//!
//! CRIU dumps memory; the files a container wrote live in its rootfs
//! overlay's upper directory, on the node that ran it. So that a restore in a
//! *new* container (restore by identity, on this node or another) finds them,
//! the suspend also writes that upper directory as an OCI image layer
//! changeset into the container's image directory ([`DIFF_FILE`], beside
//! CRIU's images, as runc keeps `descriptors.json` there): directories,
//! regular files, symlinks, hard links, fifos and device nodes with their
//! mode, owner and mtime; an overlay whiteout (a 0/0 character device)
//! becomes `.wh.<name>`, an opaque directory `.wh..wh..opq` right after the
//! directory's own entry. Extended attributes are not carried.
//!
//! The restore applies it to the new container's mounted rootfs — through
//! the overlay, so deletions become whiteouts of the new upper directory —
//! before `runc restore`. Every path is resolved inside the rootfs
//! (`openat2` with `RESOLVE_IN_ROOT`) and the last component is never
//! followed: a symlink in the image or in the diff cannot lead a write out
//! of the rootfs. An entry that climbs out (`..`) or has a type a layer
//! cannot hold refuses the whole diff.
//!
//! Names starting with `.wh.` are reserved by the OCI image layout for
//! whiteouts. A changeset cannot carry an ordinary file of such a name (it
//! would be applied as a deletion), so a capture that meets one in the
//! upper directory fails, naming the file, rather than silently losing it
//! (the suspend fails and the actor keeps running): the format stays the
//! standard OCI changeset, with no torpor-only escape a reader must know.
//! At apply, a whiteout must name one plain entry: `.wh.` alone, `.wh..`
//! and `.wh...` (a removal of the directory itself or of its parent, the
//! bundle) are refused, as are other reserved `.wh..wh.` names and `.wh.`
//! in a directory component.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use tracing::debug;
use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmod, fchmodat, fstatat, futimens, makedev, mkdirat, mknodat, utimensat};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use crate::error::{Error, IoContext, Result};

/// The changeset's file name in a container's image directory.
pub const DIFF_FILE: &str = "rootfs-diff.tar";
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// What a capture wrote or an apply changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DiffStats {
    /// Files, directories, links and nodes written.
    pub entries: u64,
    /// Bytes of regular file content.
    pub bytes: u64,
    /// Deletions (whiteouts) and opaque directories.
    pub deletions: u64,
}

/// The upper directory of a rootfs mount (`overlay` with `upperdir=`); a
/// bind-mounted or read-only rootfs has none.
pub fn upper_dir<'a>(fstype: &str, options: impl IntoIterator<Item = &'a str>) -> Option<PathBuf> {
    if fstype != "overlay" {
        return None;
    }
    options.into_iter().find_map(|o| o.strip_prefix("upperdir=")).map(PathBuf::from)
}

/// Writes the overlay upper directory `upper` as a layer changeset to `out`
/// (a temporary file, fsynced, renamed into place). The container must not
/// run meanwhile (after its dump). The archive is deterministic for the same
/// tree: unchanged files give the same bytes, which the store deduplicates.
pub fn capture(upper: &Path, out: &Path) -> Result<DiffStats> {
    capture_tree(upper, out, None)
}

/// Writes the tree of the mount at `root` to `out` as [`capture`] does,
/// without crossing into the mounts below it: a mount point is archived
/// as an empty directory (or an empty file, for a file bind mount), so
/// that the mounts can be made on it again. Used for the container's own
/// tmpfs mounts ([`crate::system::tmpfs`]); nothing may write to the tree
/// meanwhile (the container is frozen).
pub fn capture_mount(root: &Path, out: &Path) -> Result<DiffStats> {
    let dev = std::fs::symlink_metadata(root).io_context(|| format!("stat {root:?}"))?.dev();
    capture_tree(root, out, Some(dev))
}

fn capture_tree(upper: &Path, out: &Path, one_fs: Option<u64>) -> Result<DiffStats> {
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = File::create(&tmp).io_context(|| format!("create {tmp:?}"))?;
    let mut w = Capture {
        upper,
        tar: tar::Builder::new(BufWriter::new(file)),
        links: HashMap::new(),
        stats: DiffStats::default(),
        one_fs,
    };
    let written = w.walk(Path::new("")).and_then(|()| {
        let file = w
            .tar
            .into_inner()
            .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
            .io_context(|| format!("write {tmp:?}"))?;
        file.sync_all().io_context(|| format!("fsync {tmp:?}"))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).io_context(|| format!("rename {tmp:?} to {out:?}"))?;
    Ok(w.stats)
}

struct Capture<'a> {
    upper: &'a Path,
    tar: tar::Builder<BufWriter<File>>,
    /// Hard links: (dev, inode) → the first path archived.
    links: HashMap<(u64, u64), PathBuf>,
    stats: DiffStats,
    /// The device of the one file system walked ([`capture_mount`]).
    one_fs: Option<u64>,
}

impl Capture<'_> {
    fn walk(&mut self, rel: &Path) -> Result<()> {
        let dir = self.upper.join(rel);
        let mut names = std::fs::read_dir(&dir)
            .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<Vec<OsString>>>())
            .io_context(|| format!("read directory {dir:?}"))?;
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            let path = self.upper.join(&rel);
            let md = std::fs::symlink_metadata(&path).io_context(|| format!("stat {path:?}"))?;
            let ft = md.file_type();
            let mount_point = self.one_fs.is_some_and(|dev| dev != md.dev());
            if name.as_bytes().starts_with(WHITEOUT) {
                return Err(Error::FailedPrecondition(format!(
                    "{path:?}: a file whose name starts with \".wh.\" cannot be carried in a rootfs diff \
                     (OCI layers reserve the prefix for deletions); rename or remove it to suspend the container"
                )));
            }
            if ft.is_char_device() && md.rdev() == 0 {
                let mut wh = OsString::from(OsStr::from_bytes(WHITEOUT));
                wh.push(&name);
                self.marker(&rel.with_file_name(wh))?;
                continue;
            }
            // The overlay's own attributes (an upper directory's, not a tmpfs's).
            if self.one_fs.is_none() {
                for attr in ["trusted.overlay.redirect", "trusted.overlay.metacopy"] {
                    if xattr::get(&path, attr).io_context(|| format!("read xattr {attr} of {path:?}"))?.is_some() {
                        return Err(Error::FailedPrecondition(format!(
                            "{path:?} carries {attr}: a rootfs overlay mounted with redirect_dir or metacopy cannot be captured as a diff"
                        )));
                    }
                }
            }
            let mut h = tar::Header::new_gnu();
            h.set_mode(md.mode() & 0o7777);
            h.set_uid(md.uid().into());
            h.set_gid(md.gid().into());
            h.set_mtime(md.mtime().max(0) as u64);
            h.set_size(0);
            let io = |e: std::io::Error| Error::Io {
                context: format!("archive {path:?}"),
                source: e,
            };
            if mount_point {
                // Kept, empty: what is mounted on it is not this tree's.
                if ft.is_dir() || ft.is_file() {
                    h.set_entry_type(if ft.is_dir() { tar::EntryType::Directory } else { tar::EntryType::Regular });
                    self.tar.append_data(&mut h, &rel, std::io::empty()).map_err(io)?;
                    self.stats.entries += 1;
                }
                continue;
            }
            if ft.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                self.tar.append_data(&mut h, &rel, std::io::empty()).map_err(io)?;
                if is_opaque(&path)? {
                    self.marker(&rel.join(OPAQUE))?;
                }
                self.walk(&rel)?;
            } else if ft.is_file() {
                if md.nlink() > 1 {
                    if let Some(first) = self.links.get(&(md.dev(), md.ino())) {
                        h.set_entry_type(tar::EntryType::Link);
                        self.tar.append_link(&mut h, &rel, first).map_err(io)?;
                        self.stats.entries += 1;
                        continue;
                    }
                    self.links.insert((md.dev(), md.ino()), rel.clone());
                }
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .io_context(|| format!("open {path:?}"))?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(md.len());
                self.tar.append_data(&mut h, &rel, f).map_err(io)?;
                self.stats.bytes += md.len();
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&path).io_context(|| format!("readlink {path:?}"))?;
                h.set_entry_type(tar::EntryType::Symlink);
                self.tar.append_link(&mut h, &rel, target).map_err(io)?;
            } else if ft.is_fifo() || ft.is_char_device() || ft.is_block_device() {
                h.set_entry_type(if ft.is_fifo() {
                    tar::EntryType::Fifo
                } else if ft.is_char_device() {
                    tar::EntryType::Char
                } else {
                    tar::EntryType::Block
                });
                if !ft.is_fifo() {
                    let dev = md.rdev();
                    h.set_device_major(libc::major(dev)).map_err(io)?;
                    h.set_device_minor(libc::minor(dev)).map_err(io)?;
                }
                self.tar.append_data(&mut h, &rel, std::io::empty()).map_err(io)?;
            } else {
                // A socket: its listener (CRIU) binds it again at restore.
                debug!(path = ?path, "rootfs diff: socket skipped");
                continue;
            }
            self.stats.entries += 1;
        }
        Ok(())
    }

    /// An empty regular file: a whiteout or an opaque marker.
    fn marker(&mut self, rel: &Path) -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        self.tar
            .append_data(&mut h, rel, std::io::empty())
            .io_context(|| format!("archive whiteout {rel:?}"))?;
        self.stats.deletions += 1;
        Ok(())
    }
}

fn is_opaque(dir: &Path) -> Result<bool> {
    for attr in ["trusted.overlay.opaque", "user.overlay.opaque"] {
        if xattr::get(dir, attr).io_context(|| format!("read xattr {attr} of {dir:?}"))?.as_deref() == Some(b"y") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Applies the changeset `diff` to the mounted rootfs `rootfs`.
pub fn apply(diff: &Path, rootfs: &Path) -> Result<DiffStats> {
    let file = File::open(diff).io_context(|| format!("open {diff:?}"))?;
    let root = nix::fcntl::open(rootfs, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .io_context(|| format!("open rootfs {rootfs:?}"))?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let corrupt = |what: String| Error::Corrupt(format!("rootfs diff {diff:?}: {what}"));
    let mut stats = DiffStats::default();
    let mut dirs = Vec::new();
    let entries = archive.entries().map_err(|e| corrupt(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| corrupt(e.to_string()))?;
        let raw = entry.path().map_err(|e| corrupt(e.to_string()))?.into_owned();
        let rel = inside(&raw).ok_or_else(|| corrupt(format!("entry {raw:?} leaves the rootfs")))?;
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { continue };
        let at = |what: &str| format!("{what} {rel:?} in {rootfs:?} (rootfs diff {diff:?})");
        if let Some(bad) = parent.components().find(|c| c.as_os_str().as_bytes().starts_with(WHITEOUT)) {
            return Err(corrupt(format!("entry {raw:?} has a reserved whiteout name {:?} as a directory", bad.as_os_str())));
        }
        let whiteout = whiteout_of(name).map_err(|why| corrupt(format!("entry {raw:?}: {why}")))?;
        let dir = open_in_root(&root, parent).io_context(|| at("open the directory of"))?;
        if whiteout == Some(Whiteout::Opaque) {
            clear(&dir).io_context(|| at("clear opaque directory of"))?;
            stats.deletions += 1;
            continue;
        }
        if let Some(Whiteout::Remove(gone)) = whiteout {
            remove(&dir, gone).io_context(|| at("delete (whiteout)"))?;
            stats.deletions += 1;
            continue;
        }
        let h = entry.header();
        let mode = Mode::from_bits_truncate(h.mode().map_err(|e| corrupt(e.to_string()))? & 0o7777);
        let uid = Some(Uid::from_raw(h.uid().map_err(|e| corrupt(e.to_string()))? as u32));
        let gid = Some(Gid::from_raw(h.gid().map_err(|e| corrupt(e.to_string()))? as u32));
        let mtime = TimeSpec::new(h.mtime().map_err(|e| corrupt(e.to_string()))? as i64, 0);
        let times = (TimeSpec::UTIME_OMIT, mtime);
        let nofollow = AtFlags::AT_SYMLINK_NOFOLLOW;
        let kind = h.entry_type();
        match kind {
            tar::EntryType::Directory => {
                match fstatat(&dir, name, nofollow) {
                    Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {}
                    Ok(_) => {
                        remove(&dir, name).io_context(|| at("replace"))?;
                        mkdirat(&dir, name, mode).io_context(|| at("mkdir"))?;
                    }
                    Err(Errno::ENOENT) => mkdirat(&dir, name, mode).io_context(|| at("mkdir"))?,
                    Err(e) => return Err(e).io_context(|| at("stat")),
                }
                fchownat(&dir, name, uid, gid, nofollow).io_context(|| at("chown"))?;
                fchmodat(&dir, name, mode, FchmodatFlags::FollowSymlink).io_context(|| at("chmod"))?;
                dirs.push((rel.clone(), mtime));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove(&dir, name).io_context(|| at("replace"))?;
                let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let fd = openat(&dir, name, flags, Mode::from_bits_truncate(0o600)).io_context(|| at("create"))?;
                let mut f = File::from(fd);
                stats.bytes += std::io::copy(&mut entry, &mut f).io_context(|| at("write"))?;
                fchown(&f, uid, gid).io_context(|| at("chown"))?;
                fchmod(&f, mode).io_context(|| at("chmod"))?;
                futimens(&f, &times.0, &times.1).io_context(|| at("set mtime of"))?;
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| corrupt(e.to_string()))?
                    .ok_or_else(|| corrupt(format!("link {raw:?} has no target")))?
                    .into_owned();
                remove(&dir, name).io_context(|| at("replace"))?;
                if kind == tar::EntryType::Symlink {
                    symlinkat(&target, &dir, name).io_context(|| at("symlink"))?;
                } else {
                    let target = inside(&target).ok_or_else(|| corrupt(format!("hard link {raw:?} points out of the rootfs")))?;
                    let (Some(tdir), Some(tname)) = (target.parent(), target.file_name()) else {
                        return Err(corrupt(format!("hard link {raw:?} to the root")));
                    };
                    let tdir = open_in_root(&root, tdir).io_context(|| at("open the link target's directory of"))?;
                    linkat(&tdir, tname, &dir, name, AtFlags::empty()).io_context(|| at("link"))?;
                }
                fchownat(&dir, name, uid, gid, nofollow).io_context(|| at("chown"))?;
                if kind == tar::EntryType::Symlink {
                    utimensat(&dir, name, &times.0, &times.1, UtimensatFlags::NoFollowSymlink).io_context(|| at("set mtime of"))?;
                }
            }
            tar::EntryType::Fifo | tar::EntryType::Char | tar::EntryType::Block => {
                let (sflag, dev) = match kind {
                    tar::EntryType::Fifo => (SFlag::S_IFIFO, 0),
                    k => {
                        let number = |n: std::io::Result<Option<u32>>| {
                            n.ok().flatten().ok_or_else(|| corrupt(format!("device {raw:?} has no valid device number")))
                        };
                        let (major, minor) = (number(h.device_major())?, number(h.device_minor())?);
                        let s = if k == tar::EntryType::Char { SFlag::S_IFCHR } else { SFlag::S_IFBLK };
                        (s, makedev(major.into(), minor.into()))
                    }
                };
                remove(&dir, name).io_context(|| at("replace"))?;
                mknodat(&dir, name, sflag, mode, dev).io_context(|| at("mknod"))?;
                fchownat(&dir, name, uid, gid, nofollow).io_context(|| at("chown"))?;
                fchmodat(&dir, name, mode, FchmodatFlags::FollowSymlink).io_context(|| at("chmod"))?;
                utimensat(&dir, name, &times.0, &times.1, UtimensatFlags::NoFollowSymlink).io_context(|| at("set mtime of"))?;
            }
            other => return Err(corrupt(format!("entry {raw:?} is a {other:?}, which a layer does not hold"))),
        }
        stats.entries += 1;
    }
    // Directory times last (writing into a directory changes its mtime).
    for (rel, mtime) in dirs.iter().rev() {
        if let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) {
            let dir = open_in_root(&root, parent).io_context(|| format!("open {parent:?} in {rootfs:?}"))?;
            utimensat(&dir, name, &TimeSpec::UTIME_OMIT, mtime, UtimensatFlags::NoFollowSymlink)
                .io_context(|| format!("set mtime of {rel:?} in {rootfs:?}"))?;
        }
    }
    Ok(stats)
}

/// What a `.wh.` name in a changeset means.
#[derive(Debug, PartialEq, Eq)]
enum Whiteout<'a> {
    /// `.wh..wh..opq`: the directory's lower contents are gone.
    Opaque,
    /// `.wh.<name>`: `<name>` is gone.
    Remove(&'a OsStr),
}

/// `None` for an ordinary name; a whiteout; or why the name is refused:
/// a whiteout must name one plain entry of its directory (never the
/// directory itself or its parent), and `.wh..wh.` names other than the
/// opaque marker are reserved.
fn whiteout_of(name: &OsStr) -> std::result::Result<Option<Whiteout<'_>>, String> {
    if name == OPAQUE {
        return Ok(Some(Whiteout::Opaque));
    }
    let Some(gone) = name.as_bytes().strip_prefix(WHITEOUT) else { return Ok(None) };
    if gone.is_empty() || gone == b"." || gone == b".." {
        return Err(format!("whiteout {name:?} names no entry of its directory"));
    }
    if gone.starts_with(WHITEOUT) {
        return Err(format!("{name:?} is a reserved whiteout name"));
    }
    Ok(Some(Whiteout::Remove(OsStr::from_bytes(gone))))
}

/// `path` as a path below the root: `/` and `.` dropped; `..` (or
/// anything else that is not a plain name) refused.
fn inside(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The directory `rel` of the rootfs, resolved as if the rootfs were `/`.
fn open_in_root(root: &OwnedFd, rel: &Path) -> nix::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, rel, how)
}

/// Removes `name` in `dir` (a directory with everything below it); absent
/// is fine.
fn remove<Fd: AsFd>(dir: Fd, name: &OsStr) -> nix::Result<()> {
    match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
            let sub = openat(&dir, name, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())?;
            clear(&sub)?;
            unlinkat(&dir, name, UnlinkatFlags::RemoveDir)
        }
        Ok(_) => unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir),
    }
}

/// Removes everything in `dir`.
fn clear<Fd: AsFd>(dir: Fd) -> nix::Result<()> {
    let mut d = nix::dir::Dir::openat(&dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let names: Vec<OsString> = d
        .iter()
        .filter_map(|e| e.ok())
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    for n in names {
        remove(&dir, &n)?;
    }
    Ok(())
}

/// Fuzzing entry (`fuzz/fuzz_targets/fuzz_rootfs_apply.rs`, and the corpus
/// replay in the tests): applies `data` as a changeset to a scratch rootfs
/// inside a scratch bundle (under `$TMPDIR`). Whatever `data` holds,
/// nothing outside the rootfs changes and nothing panics.
#[doc(hidden)]
pub fn fuzz_apply(data: &[u8]) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir().join(format!("torpor-fuzz-apply-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let (bundle, outside, diff) = (base.join("bundle"), base.join("outside"), base.join("diff.tar"));
    let rootfs = bundle.join("rootfs");
    let setup = std::fs::create_dir_all(rootfs.join("etc"))
        .and_then(|()| std::fs::write(rootfs.join("etc/kept"), b"k"))
        .and_then(|()| std::fs::write(bundle.join("config.json"), b"{}"))
        .and_then(|()| std::fs::write(&outside, b"outside"))
        .and_then(|()| std::fs::write(&diff, data));
    if let Err(e) = setup {
        let _ = std::fs::remove_dir_all(&base);
        panic!("fuzz scratch {base:?}: {e}");
    }
    let _ = apply(&diff, &rootfs);
    let names = |d: &Path| {
        let mut v: Vec<OsString> = std::fs::read_dir(d).map(|r| r.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        v.sort();
        v
    };
    let ok = names(&base) == ["bundle", "diff.tar", "outside"]
        && names(&bundle) == ["config.json", "rootfs"]
        && std::fs::read(&outside).ok().as_deref() == Some(&b"outside"[..])
        && std::fs::read(bundle.join("config.json")).ok().as_deref() == Some(&b"{}"[..])
        && std::fs::read(base.join("diff.tar")).ok().as_deref() == Some(data);
    let _ = std::fs::remove_dir_all(&base);
    assert!(ok, "the changeset changed something outside the rootfs");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn upper_dir_of_an_overlay_mount() {
        let opts = ["index=off", "workdir=/s/1/work", "upperdir=/s/1/fs", "lowerdir=/s/0/fs"];
        assert_eq!(upper_dir("overlay", opts), Some(PathBuf::from("/s/1/fs")));
        assert_eq!(upper_dir("bind", ["rbind", "rw"]), None);
        assert_eq!(upper_dir("overlay", ["lowerdir=/a:/b"]), None);
    }

    #[test]
    fn paths_stay_inside() {
        assert_eq!(inside(Path::new("/a/./b")), Some(PathBuf::from("a/b")));
        assert_eq!(inside(Path::new("a/../../etc")), None);
    }

    /// Capture of an upper dir (with a whiteout, needing root for mknod),
    /// applied to a "rootfs" that plays the lower layer.
    #[test]
    fn capture_then_apply_carries_files_links_and_deletions() {
        let t = tempfile::tempdir().unwrap();
        let (upper, rootfs, out) = (t.path().join("upper"), t.path().join("rootfs"), t.path().join(DIFF_FILE));
        std::fs::create_dir_all(upper.join("data/sub")).unwrap();
        std::fs::write(upper.join("data/sub/f"), b"hello").unwrap();
        std::fs::set_permissions(upper.join("data/sub/f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::hard_link(upper.join("data/sub/f"), upper.join("data/hard")).unwrap();
        symlink("sub/f", upper.join("data/link")).unwrap();
        // An overlay whiteout (mknod needs root, as the tests run).
        mknodat(nix::fcntl::AT_FDCWD, &upper.join("gone"), SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).unwrap();
        mknodat(nix::fcntl::AT_FDCWD, &upper.join("data/null"), SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(1, 3)).unwrap();
        // The lower layer: a tree the diff deletes, a file it keeps.
        std::fs::create_dir_all(rootfs.join("gone/deep")).unwrap();
        std::fs::write(rootfs.join("kept"), b"k").unwrap();

        let captured = capture(&upper, &out).unwrap();
        assert_eq!(captured.bytes, 5);
        assert_eq!(captured.deletions, 1);
        let applied = apply(&out, &rootfs).unwrap();
        assert_eq!(applied.bytes, 5);
        assert_eq!(std::fs::read(rootfs.join("data/sub/f")).unwrap(), b"hello");
        let md = std::fs::metadata(rootfs.join("data/sub/f")).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o640);
        assert_eq!(md.nlink(), 2);
        assert_eq!(std::fs::read_link(rootfs.join("data/link")).unwrap(), PathBuf::from("sub/f"));
        assert_eq!(std::fs::read(rootfs.join("data/link")).unwrap(), b"hello");
        assert!(!rootfs.join("gone").exists());
        assert!(rootfs.join("kept").exists());
        let null = std::fs::symlink_metadata(rootfs.join("data/null")).unwrap();
        assert!(null.file_type().is_char_device() && null.rdev() == makedev(1, 3), "{null:?}");
        // Deterministic: the same tree gives the same bytes.
        let again = t.path().join("again.tar");
        capture(&upper, &again).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    }

    #[test]
    fn a_symlink_in_the_rootfs_cannot_lead_a_write_out() {
        let t = tempfile::tempdir().unwrap();
        let (rootfs, host, diff) = (t.path().join("rootfs"), t.path().join("host"), t.path().join("d.tar"));
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        symlink(&host, rootfs.join("escape")).unwrap();
        let mut b = tar::Builder::new(File::create(&diff).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(1);
        b.append_data(&mut h, "escape/x", &b"x"[..]).unwrap();
        b.finish().unwrap();
        drop(b);
        // Resolved in the root, `escape` -> <host path> does not exist there.
        assert!(apply(&diff, &rootfs).is_err());
        assert!(!host.join("x").exists());
    }

    #[test]
    fn an_entry_climbing_out_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (rootfs, diff) = (t.path().join("rootfs"), t.path().join("d.tar"));
        std::fs::create_dir_all(&rootfs).unwrap();
        // tar's builder refuses `..`; write the name into the header directly.
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..7].copy_from_slice(b"../evil");
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        h.set_cksum();
        let mut b = tar::Builder::new(File::create(&diff).unwrap());
        b.append(&h, std::io::empty()).unwrap();
        b.finish().unwrap();
        drop(b);
        let e = apply(&diff, &rootfs).unwrap_err().to_string();
        assert!(e.contains("leaves the rootfs"), "{e}");
        assert!(!t.path().join("evil").exists());
    }

    /// A tar holding one empty regular file per name, written raw into
    /// the header (tar's builder would normalise some of them).
    fn raw_tar(path: &Path, names: &[&str]) {
        let mut b = tar::Builder::new(File::create(path).unwrap());
        for n in names {
            let mut h = tar::Header::new_gnu();
            h.as_gnu_mut().unwrap().name[..n.len()].copy_from_slice(n.as_bytes());
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(0);
            h.set_cksum();
            b.append(&h, std::io::empty()).unwrap();
        }
        b.finish().unwrap();
    }

    /// `.wh...` once removed `..` of the rootfs: the whole bundle.
    #[test]
    fn a_whiteout_cannot_name_its_directory_or_its_parent() {
        for bad in [".wh...", ".wh..", ".wh.", "sub/.wh...", "sub/.wh..", ".wh..wh.x", ".wh.d/f", "sub/.wh..wh..wh...opq"] {
            let t = tempfile::tempdir().unwrap();
            let bundle = t.path().join("bundle");
            let (rootfs, diff) = (bundle.join("rootfs"), t.path().join("d.tar"));
            std::fs::create_dir_all(rootfs.join("sub")).unwrap();
            std::fs::write(bundle.join("config.json"), b"{}").unwrap();
            std::fs::write(rootfs.join("kept"), b"k").unwrap();
            std::fs::write(rootfs.join("sub/kept"), b"k").unwrap();
            raw_tar(&diff, &[bad]);
            let e = apply(&diff, &rootfs).unwrap_err();
            assert!(matches!(e, Error::Corrupt(_)), "{bad}: {e}");
            assert!(bundle.join("config.json").exists(), "{bad}: the bundle was cleared");
            assert!(rootfs.join("kept").exists() && rootfs.join("sub/kept").exists(), "{bad}: the rootfs was cleared");
        }
        // An ordinary whiteout still deletes.
        let t = tempfile::tempdir().unwrap();
        let (rootfs, diff) = (t.path().join("rootfs"), t.path().join("d.tar"));
        std::fs::create_dir_all(rootfs.join("sub")).unwrap();
        std::fs::write(rootfs.join("sub/gone"), b"g").unwrap();
        raw_tar(&diff, &["sub/.wh.gone"]);
        assert_eq!(apply(&diff, &rootfs).unwrap().deletions, 1);
        assert!(!rootfs.join("sub/gone").exists() && rootfs.join("sub").exists());
    }

    /// A file named `.wh.*` would be applied as a deletion (of `..` for
    /// `.wh...`): the capture refuses it and names it.
    #[test]
    fn a_capture_refuses_a_file_named_like_a_whiteout() {
        for name in [".wh...", ".wh.data", ".wh..wh..opq"] {
            let t = tempfile::tempdir().unwrap();
            let (upper, out) = (t.path().join("upper"), t.path().join(DIFF_FILE));
            std::fs::create_dir_all(upper.join("d")).unwrap();
            std::fs::write(upper.join("d").join(name), b"precious").unwrap();
            let e = capture(&upper, &out).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("cannot be carried"), "{e}");
            assert!(!out.exists() && !t.path().join(format!("{DIFF_FILE}.tmp")).exists());
        }
    }

    /// The committed fuzz corpus (and any crasher kept there) replayed.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fuzz_rootfs_apply");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            fuzz_apply(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no corpus in {dir:?}");
    }
}
