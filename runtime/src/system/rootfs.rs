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
//!
//! A sparse file is archived by its data only, as a GNU sparse entry in
//! the POSIX (PAX) format 1.0 — the format GNU tar writes and Go's
//! `archive/tar` (containerd, the OCI tools) reads back transparently as a
//! regular file: PAX records `GNU.sparse.major=1`, `GNU.sparse.minor=0`,
//! `GNU.sparse.name` (the real path) and `GNU.sparse.realsize` (its
//! apparent size), then a ustar regular entry whose data is the sparse map
//! (decimal numbers, one a line: the count, then offset and length of each
//! data extent, padded to a 512-byte block) followed by the extents' bytes.
//! The data extents are the file system's (`SEEK_DATA` / `SEEK_HOLE`).
//! The apply writes each extent at its offset and sets the file's length:
//! the holes come back as holes. `truncate -s 4T` in a container costs a
//! few blocks of the archive, not 4 TiB of the node's disk.
//!
//! A capture is bounded ([`CaptureLimits`]): past its byte cap or its
//! deadline it stops, removes what it wrote and fails with
//! [`CaptureExceeded`], naming the file it was at; the suspend then rolls
//! back and the actor runs on. An apply writes no more file data than the
//! archive holds (holes and apparent sizes cost no blocks), so a changeset
//! from the object tier cannot expand beyond its own size; a sparse map
//! is checked (sorted, inside the file, adding up to the entry's data, at
//! most [`MAX_SPARSE_EXTENTS`] extents) before anything is written, and
//! old-GNU sparse entries (type `S`, which the tar reader would expand to
//! their full size) and other sparse versions are refused.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmod, fchmodat, fstatat, futimens, makedev, mkdirat, mknodat, utimensat};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
use tracing::debug;

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

/// Default of [`CaptureLimits::max_bytes`]: 1 GiB.
///
/// The changeset is written beside CRIU's images at every suspend, kept in
/// the snapshot store and (for restore by identity, on this node or
/// another) carried through the object tier and applied before the
/// restore: it is on the resume path, whose goal is milliseconds. A
/// container's writable layer is scratch space (state that matters belongs
/// on a volume); 1 GiB is far beyond what the workloads torpor suspends
/// write there (a few MiB of caches and temp files), bounded enough that a
/// container cannot take a meaningful share of a node's disk (typically
/// 50-200 GiB, shared by every tenant's images, logs and snapshots) with
/// one suspend, and copied in 1-10 s on the disks nodes have (100 MB/s to
/// 1 GB/s).
pub const DEFAULT_CAPTURE_MAX_BYTES: u64 = 1 << 30;

/// Default of [`CaptureLimits::deadline`]: 60 s.
///
/// The containers are dumped and frozen meanwhile (their clients wait), so
/// a capture should end in seconds: 1 GiB at the 125 MB/s baseline of a
/// small cloud volume is about 9 s. The deadline bounds what the byte cap
/// does not: a tree of millions of small or empty files (each a few
/// syscalls and a 512-byte header), a disk that has become slow or hangs.
/// 60 s is six times the slow-disk case, and below the minutes after which
/// an operator or a controller would call the suspend stuck.
pub const DEFAULT_CAPTURE_DEADLINE: Duration = Duration::from_secs(60);

/// Environment variable of the shim overriding [`DEFAULT_CAPTURE_MAX_BYTES`]
/// (a whole number of bytes, at least 1; until node configuration carries it).
pub const CAPTURE_MAX_BYTES_ENV: &str = "TORPOR_ROOTFS_CAPTURE_MAX_BYTES";

/// Environment variable of the shim overriding [`DEFAULT_CAPTURE_DEADLINE`]
/// (whole seconds, 1 to 86400).
pub const CAPTURE_DEADLINE_ENV: &str = "TORPOR_ROOTFS_CAPTURE_DEADLINE_SECONDS";

/// The most data extents one sparse file may have in a changeset (16 MiB
/// of map in memory at the apply). A capture merges the extents of a file
/// fragmented beyond it (the holes between them archived as zeros, counted
/// against the byte cap); an apply refuses a map with more.
pub const MAX_SPARSE_EXTENTS: usize = 1 << 20;

/// Bounds of one [`capture`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLimits {
    /// The most bytes the archive may hold: file data (a sparse file's data
    /// extents only) with the tar headers and sparse maps around it. What
    /// the capture can take of the node's disk.
    pub max_bytes: u64,
    /// The most wall-clock time the whole capture may take.
    pub deadline: Duration,
}

impl Default for CaptureLimits {
    fn default() -> CaptureLimits {
        CaptureLimits { max_bytes: DEFAULT_CAPTURE_MAX_BYTES, deadline: DEFAULT_CAPTURE_DEADLINE }
    }
}

impl CaptureLimits {
    /// No bound (the container's own tmpfs mounts, bounded by their size
    /// and the container's memory limit: [`capture_mount`]).
    pub const UNBOUNDED: CaptureLimits = CaptureLimits { max_bytes: u64::MAX, deadline: Duration::MAX };

    /// The defaults, or [`CAPTURE_MAX_BYTES_ENV`] and
    /// [`CAPTURE_DEADLINE_ENV`] from the shim's environment; a value that
    /// is not valid is an error naming it.
    pub fn from_env() -> Result<CaptureLimits> {
        let max_bytes = match std::env::var(CAPTURE_MAX_BYTES_ENV) {
            Err(std::env::VarError::NotPresent) => DEFAULT_CAPTURE_MAX_BYTES,
            v => v.ok().and_then(|v| crate::system::reaper::whole_number_in(&v, 1..=u64::MAX)).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "${CAPTURE_MAX_BYTES_ENV}={:?}: expected a whole number of bytes, at least 1",
                    std::env::var_os(CAPTURE_MAX_BYTES_ENV).unwrap_or_default()
                ))
            })?,
        };
        let deadline = crate::system::reaper::deadline_from_env(CAPTURE_DEADLINE_ENV, DEFAULT_CAPTURE_DEADLINE)?;
        Ok(CaptureLimits { max_bytes, deadline })
    }
}

/// A capture stopped by one of its [`CaptureLimits`]. `path` is the file
/// it was at, as a path inside the rootfs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureExceeded {
    /// The archive would have held `reached` bytes (at least), over `max`.
    #[error(
        "the rootfs changes would take at least {reached} bytes with {path:?} (file data, sparse files by their data only, \
         and archive headers), over the capture's cap of {max} bytes: delete large files from the container's writable \
         layer, or keep them on a volume, to suspend it"
    )]
    Bytes { path: PathBuf, max: u64, reached: u64 },
    /// The capture had run `reached`, past `deadline`.
    #[error("the capture of the rootfs changes ran {reached:?}, past its deadline of {deadline:?}, at {path:?}")]
    Deadline { path: PathBuf, deadline: Duration, reached: Duration },
}

/// Why a [`capture`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Refused: past a limit.
    #[error(transparent)]
    Exceeded(#[from] CaptureExceeded),
    /// Anything else (I/O, a file the changeset cannot carry...).
    #[error(transparent)]
    Failed(#[from] Error),
}

impl From<CaptureError> for Error {
    /// A limit refuses the suspend: a failed precondition of it.
    fn from(e: CaptureError) -> Error {
        match e {
            CaptureError::Exceeded(x) => Error::FailedPrecondition(x.to_string()),
            CaptureError::Failed(e) => e,
        }
    }
}

/// Writes the overlay upper directory `upper` as a layer changeset to `out`
/// (a temporary file, fsynced, renamed into place), within `limits`. The
/// container must not run meanwhile (after its dump). The archive is
/// deterministic for the same tree: unchanged files give the same bytes,
/// which the store deduplicates. On any failure nothing is left at `out`
/// nor at its temporary name.
pub fn capture(upper: &Path, out: &Path, limits: &CaptureLimits) -> std::result::Result<DiffStats, CaptureError> {
    capture_tree(upper, out, None, limits)
}

/// Writes the tree of the mount at `root` to `out` as [`capture`] does,
/// without crossing into the mounts below it: a mount point is archived
/// as an empty directory (or an empty file, for a file bind mount), so
/// that the mounts can be made on it again. Used for the container's own
/// tmpfs mounts ([`crate::system::tmpfs`]); nothing may write to the tree
/// meanwhile (the container is frozen). Sparse files are archived sparse;
/// no [`CaptureLimits`] (the tmpfs's size bounds it).
pub fn capture_mount(root: &Path, out: &Path) -> Result<DiffStats> {
    let dev = std::fs::symlink_metadata(root).io_context(|| format!("stat {root:?}"))?.dev();
    Ok(capture_tree(root, out, Some(dev), &CaptureLimits::UNBOUNDED)?)
}

fn capture_tree(upper: &Path, out: &Path, one_fs: Option<u64>, limits: &CaptureLimits) -> std::result::Result<DiffStats, CaptureError> {
    let started = Instant::now();
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = File::create(&tmp).io_context(|| format!("create {tmp:?}"))?;
    let mut w = Capture {
        upper,
        tar: tar::Builder::new(Budget { inner: BufWriter::new(file), written: 0, limits: *limits, started, tripped: None }),
        links: HashMap::new(),
        stats: DiffStats::default(),
        one_fs,
    };
    let walked = w.walk(Path::new(""));
    let Capture { mut tar, stats, .. } = w;
    let written = walked.and_then(|()| {
        // The end-of-archive blocks are not the tree's: never refused.
        tar.get_mut().limits = CaptureLimits::UNBOUNDED;
        let file =
            tar.into_inner().and_then(|b| b.inner.into_inner().map_err(|e| e.into_error())).io_context(|| format!("write {tmp:?}"))?;
        file.sync_all().io_context(|| format!("fsync {tmp:?}"))?;
        Ok(())
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).io_context(|| format!("rename {tmp:?} to {out:?}"))?;
    Ok(stats)
}

/// The archive's writer: counts what is written and refuses a write past
/// the byte cap or the deadline (and remembers which).
struct Budget<W> {
    inner: W,
    written: u64,
    limits: CaptureLimits,
    started: Instant,
    tripped: Option<Trip>,
}

/// The limit a capture went past, and what it reached.
#[derive(Debug, Clone, Copy)]
enum Trip {
    Bytes(u64),
    Deadline(Duration),
}

impl<W> Budget<W> {
    /// The limit `more` bytes now would go past.
    fn check(&self, more: u64) -> Option<Trip> {
        let reached = self.written.saturating_add(more);
        if reached > self.limits.max_bytes {
            return Some(Trip::Bytes(reached));
        }
        let spent = self.started.elapsed();
        (spent >= self.limits.deadline).then_some(Trip::Deadline(spent))
    }
}

impl<W: Write> Write for Budget<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(trip) = self.check(buf.len() as u64) {
            self.tripped = Some(trip);
            return Err(std::io::Error::other("the rootfs capture's limits are reached"));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct Capture<'a> {
    upper: &'a Path,
    tar: tar::Builder<Budget<BufWriter<File>>>,
    /// Hard links: (dev, inode) → the first path archived.
    links: HashMap<(u64, u64), PathBuf>,
    stats: DiffStats,
    /// The device of the one file system walked ([`capture_mount`]).
    one_fs: Option<u64>,
}

/// Name of the ustar header of a sparse entry (GNU tar's
/// `GNUSparseFile.%p/%f`): what a reader that does not know the format
/// extracts; the real name is in `GNU.sparse.name`.
const SPARSE_PLACEHOLDER_DIR: &str = "GNUSparseFile.0";

impl Capture<'_> {
    /// `rel` as the path the container sees.
    fn in_rootfs(rel: &Path) -> PathBuf {
        Path::new("/").join(rel)
    }

    fn exceeded(&self, rel: &Path, trip: Trip) -> CaptureError {
        let path = Self::in_rootfs(rel);
        let limits = self.tar.get_ref().limits;
        match trip {
            Trip::Bytes(reached) => CaptureExceeded::Bytes { path, max: limits.max_bytes, reached },
            Trip::Deadline(reached) => CaptureExceeded::Deadline { path, deadline: limits.deadline, reached },
        }
        .into()
    }

    /// The deadline, checked at `rel`.
    fn on_time(&self, rel: &Path) -> std::result::Result<(), CaptureError> {
        match self.tar.get_ref().check(0) {
            Some(trip) => Err(self.exceeded(rel, trip)),
            None => Ok(()),
        }
    }

    /// The result of writing `rel` (at `path`) to the archive: a refusal
    /// of the writer is the limit it went past.
    fn archived<T>(&self, rel: &Path, path: &Path, r: std::io::Result<T>) -> std::result::Result<T, CaptureError> {
        r.map_err(|source| match self.tar.get_ref().tripped {
            Some(trip) => self.exceeded(rel, trip),
            None => Error::Io { context: format!("archive {path:?}"), source }.into(),
        })
    }

    fn walk(&mut self, rel: &Path) -> std::result::Result<(), CaptureError> {
        self.on_time(rel)?;
        let dir = self.upper.join(rel);
        let mut names = std::fs::read_dir(&dir)
            .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<Vec<OsString>>>())
            .io_context(|| format!("read directory {dir:?}"))?;
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            self.on_time(&rel)?;
            let path = self.upper.join(&rel);
            let md = std::fs::symlink_metadata(&path).io_context(|| format!("stat {path:?}"))?;
            let ft = md.file_type();
            let mount_point = self.one_fs.is_some_and(|dev| dev != md.dev());
            if name.as_bytes().starts_with(WHITEOUT) {
                return Err(Error::FailedPrecondition(format!(
                    "{path:?}: a file whose name starts with \".wh.\" cannot be carried in a rootfs diff \
                     (OCI layers reserve the prefix for deletions); rename or remove it to suspend the container"
                ))
                .into());
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
                        ))
                        .into());
                    }
                }
            }
            let mut h = tar::Header::new_gnu();
            set_metadata(&mut h, &md);
            if mount_point {
                // Kept, empty: what is mounted on it is not this tree's.
                if ft.is_dir() || ft.is_file() {
                    h.set_entry_type(if ft.is_dir() { tar::EntryType::Directory } else { tar::EntryType::Regular });
                    let r = self.tar.append_data(&mut h, &rel, std::io::empty());
                    self.archived(&rel, &path, r)?;
                    self.stats.entries += 1;
                }
                continue;
            }
            if ft.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                let r = self.tar.append_data(&mut h, &rel, std::io::empty());
                self.archived(&rel, &path, r)?;
                if is_opaque(&path)? {
                    self.marker(&rel.join(OPAQUE))?;
                }
                self.walk(&rel)?;
            } else if ft.is_file() {
                if md.nlink() > 1 {
                    if let Some(first) = self.links.get(&(md.dev(), md.ino())) {
                        h.set_entry_type(tar::EntryType::Link);
                        let r = self.tar.append_link(&mut h, &rel, first);
                        self.archived(&rel, &path, r)?;
                        self.stats.entries += 1;
                        continue;
                    }
                    self.links.insert((md.dev(), md.ino()), rel.clone());
                }
                self.file(&rel, &path, &md, h)?;
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&path).io_context(|| format!("readlink {path:?}"))?;
                h.set_entry_type(tar::EntryType::Symlink);
                let r = self.tar.append_link(&mut h, &rel, target);
                self.archived(&rel, &path, r)?;
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
                    let io = |source| Error::Io { context: format!("archive {path:?}"), source };
                    h.set_device_major(libc::major(dev)).map_err(io)?;
                    h.set_device_minor(libc::minor(dev)).map_err(io)?;
                }
                let r = self.tar.append_data(&mut h, &rel, std::io::empty());
                self.archived(&rel, &path, r)?;
            } else {
                // A socket: its listener (CRIU) binds it again at restore.
                debug!(path = ?path, "rootfs diff: socket skipped");
                continue;
            }
            self.stats.entries += 1;
        }
        Ok(())
    }

    /// A regular file: its data extents, checked against the byte cap
    /// before any is written; one extent covering the file is an ordinary
    /// entry, anything else a sparse one.
    fn file(&mut self, rel: &Path, path: &Path, md: &std::fs::Metadata, mut h: tar::Header) -> std::result::Result<(), CaptureError> {
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).io_context(|| format!("open {path:?}"))?;
        let size = md.len();
        let budget = self.tar.get_ref();
        let left = budget.limits.max_bytes.saturating_sub(budget.written);
        let mut timed_out = None;
        let extents = data_extents(&f, size, left, || {
            timed_out = budget.check(0).filter(|t| matches!(t, Trip::Deadline(_)));
            timed_out.is_some()
        })
        .io_context(|| format!("find the data of {path:?}"))?;
        if let Some(trip) = timed_out {
            return Err(self.exceeded(rel, trip));
        }
        let data: u64 = extents.iter().map(|e| e.1).sum();
        let dense = extents.is_empty() && size == 0 || extents == [(0, size)];
        let map = if dense { Vec::new() } else { sparse_map(&extents, size) };
        let reached = budget.written.saturating_add(map.len() as u64).saturating_add(data);
        if reached > budget.limits.max_bytes {
            return Err(self.exceeded(rel, Trip::Bytes(reached)));
        }
        let content = ExtentReader { file: &f, extents: &extents, at: 0, done: 0 };
        if dense {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(size);
            let r = self.tar.append_data(&mut h, rel, content);
            self.archived(rel, path, r)?;
        } else {
            let realsize = size.to_string();
            let records: [(&str, &[u8]); 4] = [
                ("GNU.sparse.major", b"1"),
                ("GNU.sparse.minor", b"0"),
                ("GNU.sparse.name", rel.as_os_str().as_bytes()),
                ("GNU.sparse.realsize", realsize.as_bytes()),
            ];
            let r = self.tar.append_pax_extensions(records);
            self.archived(rel, path, r)?;
            let mut sh = tar::Header::new_ustar();
            set_metadata(&mut sh, md);
            sh.set_entry_type(tar::EntryType::Regular);
            sh.set_size(map.len() as u64 + data);
            let base = rel.file_name().map(|n| n.as_bytes()).filter(|n| n.len() <= 80).unwrap_or(b"file");
            let mut placeholder = PathBuf::from(SPARSE_PLACEHOLDER_DIR);
            placeholder.push(OsStr::from_bytes(base));
            let r = self.tar.append_data(&mut sh, &placeholder, std::io::Cursor::new(map).chain(content));
            self.archived(rel, path, r)?;
        }
        self.stats.bytes += data;
        Ok(())
    }

    /// An empty regular file: a whiteout or an opaque marker.
    fn marker(&mut self, rel: &Path) -> std::result::Result<(), CaptureError> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        let r = self.tar.append_data(&mut h, rel, std::io::empty());
        self.archived(rel, rel, r)?;
        self.stats.deletions += 1;
        Ok(())
    }
}

/// Mode, owner and mtime of an entry.
fn set_metadata(h: &mut tar::Header, md: &std::fs::Metadata) {
    h.set_mode(md.mode() & 0o7777);
    h.set_uid(md.uid().into());
    h.set_gid(md.gid().into());
    h.set_mtime(md.mtime().max(0) as u64);
    h.set_size(0);
}

/// The data extents (offset, length) of the first `size` bytes of `f`, in
/// order, from the file system (`SEEK_DATA` / `SEEK_HOLE`; a file system
/// without them reports the whole file as data). Stops once they hold more
/// than `budget` bytes (the capture is refused then) or when `late` says
/// the deadline passed. Beyond [`MAX_SPARSE_EXTENTS`] extents, neighbours
/// are merged (the hole between them becomes data).
fn data_extents(f: &File, size: u64, budget: u64, mut late: impl FnMut() -> bool) -> std::io::Result<Vec<(u64, u64)>> {
    use nix::unistd::{lseek, Whence};
    let mut extents: Vec<(u64, u64)> = Vec::new();
    let (mut off, mut data) = (0u64, 0u64);
    let at = |o: u64| i64::try_from(o).map_err(|_| std::io::Error::other(format!("offset {o} out of range")));
    while off < size && data <= budget && !late() {
        let start = match lseek(f, at(off)?, Whence::SeekData) {
            Ok(s) => s as u64,
            Err(Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if start >= size {
            break;
        }
        let end = (lseek(f, at(start)?, Whence::SeekHole)? as u64).min(size);
        if end <= start {
            return Err(std::io::Error::other(format!("the file changed during the capture (no data at {start})")));
        }
        match extents.last_mut() {
            Some(last) if last.0 + last.1 == start => last.1 += end - start,
            _ => extents.push((start, end - start)),
        }
        if extents.len() > MAX_SPARSE_EXTENTS {
            extents = extents.chunks(2).map(|p| (p[0].0, p[p.len() - 1].0 + p[p.len() - 1].1 - p[0].0)).collect();
            data = extents.iter().map(|e| e.1).sum();
        } else {
            data += end - start;
        }
        off = end;
    }
    Ok(extents)
}

/// The sparse map of a PAX 1.0 sparse entry: the number of extents, then
/// each one's offset and length, one decimal number a line, padded with
/// NULs to a block. A file that ends in a hole ends with an empty extent
/// at its size (as GNU tar writes it).
fn sparse_map(extents: &[(u64, u64)], size: u64) -> Vec<u8> {
    let tail = extents.last().is_none_or(|&(o, l)| o + l < size);
    let mut map = format!("{}\n", extents.len() + usize::from(tail)).into_bytes();
    for (o, l) in extents.iter().chain(tail.then_some(&(size, 0))) {
        map.extend_from_slice(format!("{o}\n{l}\n").as_bytes());
    }
    map.resize(map.len().div_ceil(BLOCK) * BLOCK, 0);
    map
}

const BLOCK: usize = 512;

/// Reads `extents` of `file` one after the other, exactly their lengths: a
/// file that shrank meanwhile is an error, not a short entry.
struct ExtentReader<'a> {
    file: &'a File,
    extents: &'a [(u64, u64)],
    at: usize,
    done: u64,
}

impl Read for ExtentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(&(offset, len)) = self.extents.get(self.at) {
            if self.done == len {
                (self.at, self.done) = (self.at + 1, 0);
                continue;
            }
            if buf.is_empty() {
                return Ok(0);
            }
            let want = (len - self.done).min(buf.len() as u64) as usize;
            let n = self.file.read_at(&mut buf[..want], offset + self.done)?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank during the capture"));
            }
            self.done += n as u64;
            return Ok(n);
        }
        Ok(0)
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
        let sparse = sparse_of(&mut entry).map_err(|why| corrupt(format!("entry {:?}: {why}", entry.path().unwrap_or_default())))?;
        let raw = match &sparse {
            Some(s) => s.name.clone(),
            None => entry.path().map_err(|e| corrupt(e.to_string()))?.into_owned(),
        };
        let rel = inside(&raw).ok_or_else(|| corrupt(format!("entry {raw:?} leaves the rootfs")))?;
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { continue };
        let at = |what: &str| format!("{what} {rel:?} in {rootfs:?} (rootfs diff {diff:?})");
        if let Some(bad) = parent.components().find(|c| c.as_os_str().as_bytes().starts_with(WHITEOUT)) {
            return Err(corrupt(format!("entry {raw:?} has a reserved whiteout name {:?} as a directory", bad.as_os_str())));
        }
        let whiteout = whiteout_of(name).map_err(|why| corrupt(format!("entry {raw:?}: {why}")))?;
        if sparse.is_some() && (whiteout.is_some() || entry.header().entry_type() != tar::EntryType::Regular) {
            return Err(corrupt(format!("entry {raw:?}: only a regular file can be a sparse entry")));
        }
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
                stats.bytes += match &sparse {
                    None => std::io::copy(&mut entry, &mut f).io_context(|| at("write"))?,
                    Some(s) => {
                        let size = entry.size();
                        write_sparse(
                            &mut entry,
                            size,
                            &mut f,
                            s.realsize,
                            |why| corrupt(format!("sparse entry {raw:?}: {why}")),
                            || at("write"),
                        )?
                    }
                };
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

/// A PAX 1.0 GNU sparse entry (see the module doc).
#[derive(Debug)]
struct Sparse {
    /// `GNU.sparse.name`: the file's path.
    name: PathBuf,
    /// `GNU.sparse.realsize`: its apparent size.
    realsize: u64,
}

/// The sparse entry `entry` is, from its PAX records: `None` for an entry
/// without `GNU.sparse.*` records; an error for another sparse version or
/// a record missing or invalid.
fn sparse_of<R: Read>(entry: &mut tar::Entry<'_, R>) -> std::result::Result<Option<Sparse>, String> {
    let Some(records) = entry.pax_extensions().map_err(|e| e.to_string())? else { return Ok(None) };
    let (mut major, mut minor, mut name, mut realsize) = (None, None, None, None);
    let mut any = false;
    for r in records {
        let r = r.map_err(|e| format!("PAX records: {e}"))?;
        let Some(key) = r.key_bytes().strip_prefix(b"GNU.sparse.") else { continue };
        any = true;
        let slot = match key {
            b"major" => &mut major,
            b"minor" => &mut minor,
            b"name" => &mut name,
            b"realsize" => &mut realsize,
            other => {
                return Err(format!(
                    "PAX record GNU.sparse.{} is not of the sparse format 1.0 (the only one a changeset holds)",
                    String::from_utf8_lossy(other)
                ))
            }
        };
        *slot = Some(r.value_bytes().to_vec());
    }
    if !any {
        return Ok(None);
    }
    if major.as_deref() != Some(b"1") || minor.as_deref() != Some(b"0") {
        return Err("a GNU sparse entry of a version other than 1.0".into());
    }
    let name = name.filter(|n| !n.is_empty()).ok_or("a sparse entry without GNU.sparse.name")?;
    let realsize = realsize
        .and_then(|v| std::str::from_utf8(&v).ok().and_then(|v| decimal(v.as_bytes())))
        .ok_or("a sparse entry without a valid GNU.sparse.realsize")?;
    Ok(Some(Sparse { name: PathBuf::from(OsString::from_vec(name)), realsize }))
}

/// A decimal number that fits a file offset (`0` to `i64::MAX`).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse::<u64>().ok().filter(|n| i64::try_from(*n).is_ok())
}

/// Writes the data of a sparse entry (`size` bytes: its map, then its
/// extents) into `f`, each extent at its offset, and sets `f`'s length
/// to `realsize`: the holes stay holes. The map is read and checked
/// whole before anything is written. Returns the bytes of data written.
fn write_sparse(
    entry: &mut impl Read,
    size: u64,
    f: &mut File,
    realsize: u64,
    corrupt: impl Fn(String) -> Error,
    at: impl Fn() -> String,
) -> Result<u64> {
    // The map: numbers, each ended by a newline, in whole blocks.
    let (mut numbers, mut count, mut map_bytes) = (Vec::new(), None::<u64>, 0u64);
    let mut token: Vec<u8> = Vec::new();
    let mut block = [0u8; BLOCK];
    while count.is_none_or(|n| (numbers.len() as u64) < 2 * n) {
        if map_bytes + BLOCK as u64 > size {
            return Err(corrupt(format!("its sparse map runs past its {size} bytes")));
        }
        entry.read_exact(&mut block).map_err(|e| corrupt(format!("its sparse map: {e}")))?;
        map_bytes += BLOCK as u64;
        for &b in &block {
            if count.is_some_and(|n| numbers.len() as u64 == 2 * n) {
                break;
            }
            if b == 0 {
                return Err(corrupt("its sparse map ends before the extents it counts".into()));
            }
            if b != b'\n' {
                token.push(b);
                if token.len() > 19 {
                    return Err(corrupt("its sparse map holds a number too long or a byte that is not a digit".into()));
                }
                continue;
            }
            let n = decimal(&token)
                .ok_or_else(|| corrupt(format!("its sparse map holds {:?}, not a number", String::from_utf8_lossy(&token))))?;
            token.clear();
            match count {
                None if n as usize > MAX_SPARSE_EXTENTS => {
                    return Err(corrupt(format!(
                        "its sparse map has {n} extents, more than the {MAX_SPARSE_EXTENTS} a changeset may hold"
                    )));
                }
                None => count = Some(n),
                Some(_) => numbers.push(n),
            }
        }
    }
    // Sorted, apart, inside the file, and exactly the entry's data.
    let (mut end, mut data) = (0u64, 0u64);
    for pair in numbers.chunks_exact(2) {
        let (offset, len) = (pair[0], pair[1]);
        let stop = offset.checked_add(len).filter(|s| *s <= realsize);
        match stop {
            Some(stop) if offset >= end => (end, data) = (stop, data + len),
            _ => {
                return Err(corrupt(format!(
                    "its sparse map has an extent at {offset} of {len} bytes out of order or past its size {realsize}"
                )))
            }
        }
    }
    if map_bytes + data != size {
        return Err(corrupt(format!("its sparse map and its extents take {} bytes, not its {size}", map_bytes + data)));
    }
    for pair in numbers.chunks_exact(2) {
        let (offset, len) = (pair[0], pair[1]);
        if len == 0 {
            continue;
        }
        f.seek(SeekFrom::Start(offset)).io_context(&at)?;
        let copied = std::io::copy(&mut entry.by_ref().take(len), f).io_context(&at)?;
        if copied != len {
            return Err(corrupt(format!("its extent at {offset} has {copied} bytes, not {len}")));
        }
    }
    f.set_len(realsize).io_context(&at)?;
    Ok(data)
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

        let captured = capture(&upper, &out, &CaptureLimits::default()).unwrap();
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
        capture(&upper, &again, &CaptureLimits::default()).unwrap();
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
            let e = capture(&upper, &out, &CaptureLimits::default()).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("cannot be carried"), "{e}");
            assert!(!out.exists() && !t.path().join(format!("{DIFF_FILE}.tmp")).exists());
        }
    }

    const TIB: u64 = 1 << 40;

    /// A file of `size` bytes with `parts` written at their offsets, holes
    /// everywhere else.
    fn sparse_file(path: &Path, size: u64, parts: &[(u64, &[u8])]) {
        let f = File::create(path).unwrap();
        for (at, bytes) in parts {
            f.write_all_at(bytes, *at).unwrap();
        }
        f.set_len(size).unwrap();
    }

    fn read_at(path: &Path, at: u64, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        File::open(path).unwrap().read_exact_at(&mut buf, at).unwrap();
        buf
    }

    /// `truncate -s 4T` in a container: a tiny archive, and back as a
    /// sparse file of the same size and data.
    #[test]
    fn a_4tib_sparse_file_captures_small_and_applies_back_sparse() {
        let t = tempfile::tempdir().unwrap();
        let (upper, rootfs, out) = (t.path().join("upper"), t.path().join("rootfs"), t.path().join(DIFF_FILE));
        std::fs::create_dir_all(upper.join("var/tmp")).unwrap();
        std::fs::create_dir_all(&rootfs).unwrap();
        let middle: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        // Data at the start, in the middle and at the end; a file ending in
        // a hole; a file that is all hole.
        sparse_file(&upper.join("var/tmp/x"), 4 * TIB, &[(0, b"head"), (TIB + 1, &middle), (4 * TIB - 4, b"tail")]);
        sparse_file(&upper.join("var/tmp/ends-in-a-hole"), 4 * TIB, &[(0, b"only")]);
        sparse_file(&upper.join("var/tmp/all-hole"), 4 * TIB, &[]);
        std::fs::write(upper.join("var/tmp/dense"), b"dense").unwrap();

        let captured = capture(&upper, &out, &CaptureLimits::default()).unwrap();
        let archive = std::fs::metadata(&out).unwrap().len();
        assert!(archive < 256 * 1024, "the archive holds the data only: {archive} bytes");
        // The data extents are whole file system blocks.
        assert!(captured.bytes >= 4 + 10_000 + 4 + 4 + 5 && captured.bytes < 64 * 1024, "{captured:?}");

        let applied = apply(&out, &rootfs).unwrap();
        assert_eq!(applied.bytes, captured.bytes);
        let x = rootfs.join("var/tmp/x");
        let md = std::fs::metadata(&x).unwrap();
        assert_eq!(md.len(), 4 * TIB);
        assert!(md.blocks() * 512 < 1024 * 1024, "applied sparse, not as zeros: {} blocks", md.blocks());
        assert_eq!(read_at(&x, 0, 4), b"head");
        assert_eq!(read_at(&x, TIB + 1, middle.len()), middle);
        assert_eq!(read_at(&x, 4 * TIB - 4, 4), b"tail");
        assert_eq!(read_at(&x, 2 * TIB, 8), [0; 8], "a hole reads as zeros");
        for (name, data) in [("ends-in-a-hole", &b"only"[..]), ("all-hole", b"")] {
            let p = rootfs.join("var/tmp").join(name);
            let md = std::fs::metadata(&p).unwrap();
            assert_eq!(md.len(), 4 * TIB, "{name}");
            assert!(md.blocks() * 512 < 1024 * 1024, "{name}: {} blocks", md.blocks());
            assert_eq!(read_at(&p, 0, data.len()), data, "{name}");
        }
        assert_eq!(std::fs::read(rootfs.join("var/tmp/dense")).unwrap(), b"dense");
        // Deterministic too.
        let again = t.path().join("again.tar");
        capture(&upper, &again, &CaptureLimits::default()).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    }

    /// The entry is the standard PAX 1.0 sparse format: GNU tar reads the
    /// real name and size from it (Go's archive/tar, containerd's, too).
    /// (tar is waited for through the reaper, as every child in this
    /// crate's tests: a std `wait` races the reaper's `waitpid(-1)` of
    /// tests running beside it and can get ECHILD.)
    #[tokio::test]
    async fn gnu_tar_reads_the_sparse_entry() {
        let tar = |args: &[&std::ffi::OsStr]| {
            let mut cmd = std::process::Command::new("tar");
            cmd.args(args);
            crate::system::reaper::output(cmd, std::time::Duration::from_secs(120))
        };
        let Ok(v) = tar(&["--version".as_ref()]).await else {
            eprintln!("skipped: no tar on this machine");
            return;
        };
        assert!(String::from_utf8_lossy(&v.stdout).contains("GNU tar"), "GNU tar expected: {v:?}");
        let t = tempfile::tempdir().unwrap();
        let (upper, into, out) = (t.path().join("upper"), t.path().join("into"), t.path().join(DIFF_FILE));
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::create_dir_all(&into).unwrap();
        sparse_file(&upper.join("d/s"), TIB, &[(4096 * 3, b"abc")]);
        capture(&upper, &out, &CaptureLimits::default()).unwrap();
        let x = tar(&["-xf".as_ref(), out.as_os_str(), "-C".as_ref(), into.as_os_str()]).await.unwrap();
        assert!(x.status.success(), "{x:?}");
        let md = std::fs::metadata(into.join("d/s")).unwrap();
        assert_eq!(md.len(), TIB);
        assert_eq!(read_at(&into.join("d/s"), 4096 * 3, 3), b"abc");
        assert!(!into.join(SPARSE_PLACEHOLDER_DIR).exists(), "GNU tar used GNU.sparse.name");
    }

    /// No trace left by a refused capture.
    fn nothing_written(t: &Path) {
        assert!(!t.join(DIFF_FILE).exists());
        assert!(!t.join(format!("{DIFF_FILE}.tmp")).exists());
    }

    #[test]
    fn over_the_byte_cap_the_capture_is_refused_naming_the_file() {
        let t = tempfile::tempdir().unwrap();
        let (upper, out) = (t.path().join("upper"), t.path().join(DIFF_FILE));
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/a-small"), b"small").unwrap();
        std::fs::write(upper.join("d/big"), vec![7u8; 64 * 1024]).unwrap();
        // Sparse: its data only counts.
        sparse_file(&upper.join("d/c-sparse"), 4 * TIB, &[(TIB, b"x")]);
        let limits = CaptureLimits { max_bytes: 32 * 1024, ..CaptureLimits::default() };
        let e = capture(&upper, &out, &limits).unwrap_err();
        match &e {
            CaptureError::Exceeded(CaptureExceeded::Bytes { path, max, reached }) => {
                assert_eq!(path, Path::new("/d/big"));
                assert_eq!(*max, 32 * 1024);
                assert!(*reached > 64 * 1024, "{e}");
            }
            other => panic!("not a byte cap refusal: {other}"),
        }
        let text = e.to_string();
        assert!(text.contains("\"/d/big\"") && text.contains("32768"), "{text}");
        assert!(matches!(Error::from(e), Error::FailedPrecondition(_)));
        nothing_written(t.path());
        // Without the big file it fits (the 4 TiB sparse one included).
        std::fs::remove_file(upper.join("d/big")).unwrap();
        capture(&upper, &out, &limits).unwrap();
        assert!(std::fs::metadata(&out).unwrap().len() <= 32 * 1024 + 1024);
    }

    /// Headers count too: many empty files cannot fill a disk either.
    #[test]
    fn headers_count_against_the_byte_cap() {
        let t = tempfile::tempdir().unwrap();
        let (upper, out) = (t.path().join("upper"), t.path().join(DIFF_FILE));
        std::fs::create_dir_all(&upper).unwrap();
        for i in 0..100 {
            std::fs::write(upper.join(format!("f{i:03}")), b"").unwrap();
        }
        let limits = CaptureLimits { max_bytes: 10 * 1024, ..CaptureLimits::default() };
        match capture(&upper, &out, &limits).unwrap_err() {
            CaptureError::Exceeded(CaptureExceeded::Bytes { path, max, reached }) => {
                assert!(path.to_str().is_some_and(|p| p.starts_with("/f0")), "{path:?}");
                assert_eq!(max, 10 * 1024);
                assert!(reached > max);
            }
            other => panic!("not a byte cap refusal: {other}"),
        }
        nothing_written(t.path());
    }

    #[test]
    fn past_the_deadline_the_capture_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (upper, out) = (t.path().join("upper"), t.path().join(DIFF_FILE));
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/f"), b"f").unwrap();
        let limits = CaptureLimits { deadline: Duration::ZERO, ..CaptureLimits::default() };
        let e = capture(&upper, &out, &limits).unwrap_err();
        match &e {
            CaptureError::Exceeded(CaptureExceeded::Deadline { path, deadline, .. }) => {
                assert_eq!(path, Path::new("/"));
                assert_eq!(*deadline, Duration::ZERO);
            }
            other => panic!("not a deadline refusal: {other}"),
        }
        assert!(e.to_string().contains("past its deadline of 0ns"), "{e}");
        nothing_written(t.path());
    }

    #[test]
    fn limits_from_the_environment() {
        // (The only test that sets these variables.)
        std::env::remove_var(CAPTURE_MAX_BYTES_ENV);
        std::env::remove_var(CAPTURE_DEADLINE_ENV);
        assert_eq!(CaptureLimits::from_env().unwrap(), CaptureLimits::default());
        std::env::set_var(CAPTURE_MAX_BYTES_ENV, "4096");
        std::env::set_var(CAPTURE_DEADLINE_ENV, "5");
        assert_eq!(CaptureLimits::from_env().unwrap(), CaptureLimits { max_bytes: 4096, deadline: Duration::from_secs(5) });
        std::env::set_var(CAPTURE_MAX_BYTES_ENV, "1GiB");
        let e = CaptureLimits::from_env().unwrap_err().to_string();
        assert!(e.contains(CAPTURE_MAX_BYTES_ENV) && e.contains("1GiB"), "{e}");
        std::env::remove_var(CAPTURE_MAX_BYTES_ENV);
        std::env::remove_var(CAPTURE_DEADLINE_ENV);
    }

    /// A PAX sparse entry as a hostile writer would make it: its records,
    /// its map text (padded to a block here) and its data.
    fn pax_sparse_tar(path: &Path, records: &[(&str, &str)], map: &str, data: &[u8], size: Option<u64>) {
        let mut b = tar::Builder::new(File::create(path).unwrap());
        b.append_pax_extensions(records.iter().map(|(k, v)| (*k, v.as_bytes()))).unwrap();
        let mut body = map.as_bytes().to_vec();
        body.resize(body.len().div_ceil(BLOCK) * BLOCK, 0);
        body.extend_from_slice(data);
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(size.unwrap_or(body.len() as u64));
        b.append_data(&mut h, "GNUSparseFile.0/x", &body[..]).unwrap();
        b.finish().unwrap();
    }

    fn sparse_records(realsize: &str) -> Vec<(&'static str, String)> {
        vec![
            ("GNU.sparse.major", "1".into()),
            ("GNU.sparse.minor", "0".into()),
            ("GNU.sparse.name", "x".into()),
            ("GNU.sparse.realsize", realsize.into()),
        ]
    }

    /// A changeset from the bucket cannot make the apply write more than it
    /// holds: every sparse map that does not add up is refused before a
    /// byte is written, and old-GNU sparse entries (which the tar reader
    /// would expand to their full size) are refused.
    #[test]
    fn a_hostile_sparse_entry_is_refused() {
        let four_t = (4 * TIB).to_string();
        // What, the PAX records, the map, the data, the entry's size if not theirs.
        type Case<'a> = (&'a str, Vec<(&'a str, String)>, String, Vec<u8>, Option<u64>);
        let cases: Vec<Case> = vec![
            ("an extent past the size", sparse_records("10"), "1\n8\n4\n".into(), b"abcd".to_vec(), None),
            ("overlapping extents", sparse_records(&four_t), "2\n0\n4\n2\n4\n".into(), b"abcdefgh".to_vec(), None),
            ("extents out of order", sparse_records(&four_t), "2\n100\n4\n0\n4\n".into(), b"abcdefgh".to_vec(), None),
            ("more data listed than held", sparse_records(&four_t), "1\n0\n4096\n".into(), b"abcd".to_vec(), None),
            ("less data listed than held", sparse_records(&four_t), "1\n0\n2\n".into(), b"abcd".to_vec(), None),
            ("a count beyond the limit", sparse_records(&four_t), "1000000000000\n0\n4\n".into(), b"abcd".to_vec(), None),
            ("a map that ends early", sparse_records(&four_t), "3\n0\n1\n".into(), Vec::new(), None),
            ("an entry shorter than its map", sparse_records(&four_t), "1\n0\n4\n".into(), b"abcd".to_vec(), Some(100)),
            ("not a number", sparse_records(&four_t), "1\n0x10\n4\n".into(), b"abcd".to_vec(), None),
            ("a number too long", sparse_records(&four_t), "1\n99999999999999999999\n4\n".into(), b"abcd".to_vec(), None),
            ("a size past a file offset", sparse_records("18446744073709551615"), "0\n".into(), Vec::new(), None),
            (
                "a 0.1 sparse map",
                vec![
                    ("GNU.sparse.major", "0".into()),
                    ("GNU.sparse.minor", "1".into()),
                    ("GNU.sparse.name", "x".into()),
                    ("GNU.sparse.map", "0,4".into()),
                    ("GNU.sparse.size", four_t.clone()),
                ],
                String::new(),
                b"abcd".to_vec(),
                None,
            ),
            (
                "no name",
                vec![("GNU.sparse.major", "1".into()), ("GNU.sparse.minor", "0".into()), ("GNU.sparse.realsize", four_t.clone())],
                "0\n".into(),
                Vec::new(),
                None,
            ),
            (
                "a whiteout",
                vec![
                    ("GNU.sparse.major", "1".into()),
                    ("GNU.sparse.minor", "0".into()),
                    ("GNU.sparse.name", ".wh.kept".into()),
                    ("GNU.sparse.realsize", "1".into()),
                ],
                "0\n".into(),
                Vec::new(),
                None,
            ),
        ];
        for (what, records, map, data, size) in cases {
            let t = tempfile::tempdir().unwrap();
            let (rootfs, diff) = (t.path().join("rootfs"), t.path().join("d.tar"));
            std::fs::create_dir_all(&rootfs).unwrap();
            std::fs::write(rootfs.join("kept"), b"k").unwrap();
            let records: Vec<(&str, &str)> = records.iter().map(|(k, v)| (*k, v.as_str())).collect();
            pax_sparse_tar(&diff, &records, &map, &data, size);
            let e = apply(&diff, &rootfs).unwrap_err();
            eprintln!("{what}: {e}");
            assert!(matches!(e, Error::Corrupt(_)), "{what}: {e}");
            let x = rootfs.join("x");
            assert!(std::fs::metadata(&x).map_or(true, |m| m.len() == 0 && m.blocks() == 0), "{what}: {x:?} was written");
            assert!(rootfs.join("kept").exists(), "{what}");
        }
    }

    /// An old-GNU sparse entry claiming 4 TiB: refused, not expanded.
    #[test]
    fn an_old_gnu_sparse_entry_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (rootfs, diff) = (t.path().join("rootfs"), t.path().join("d.tar"));
        std::fs::create_dir_all(&rootfs).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_path("big").unwrap();
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_mode(0o644);
        h.set_size(1);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.set_real_size(4 * TIB);
        gnu.sparse[0].set_offset(4 * TIB - 1);
        gnu.sparse[0].set_length(1);
        h.set_cksum();
        let mut b = tar::Builder::new(File::create(&diff).unwrap());
        b.append(&h, &b"x"[..]).unwrap();
        b.finish().unwrap();
        drop(b);
        let e = apply(&diff, &rootfs).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
        assert!(!rootfs.join("big").exists());
    }

    /// A valid sparse entry written by another tool (no trailing empty
    /// extent, a map spanning blocks) applies.
    #[test]
    fn a_sparse_map_of_many_extents_applies() {
        let t = tempfile::tempdir().unwrap();
        let (rootfs, diff) = (t.path().join("rootfs"), t.path().join("d.tar"));
        std::fs::create_dir_all(&rootfs).unwrap();
        let n = 200u64;
        let mut map = format!("{n}\n");
        for i in 0..n {
            map.push_str(&format!("{}\n1\n", i * 1_000_000));
        }
        assert!(map.len() > BLOCK);
        let data: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
        let records = sparse_records(&(n * 1_000_000).to_string());
        let records: Vec<(&str, &str)> = records.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pax_sparse_tar(&diff, &records, &map, &data, None);
        let applied = apply(&diff, &rootfs).unwrap();
        assert_eq!(applied.bytes, n);
        let x = rootfs.join("x");
        assert_eq!(std::fs::metadata(&x).unwrap().len(), n * 1_000_000);
        assert_eq!(read_at(&x, 199 * 1_000_000, 1), [b'a' + (199 % 26) as u8]);
        assert_eq!(read_at(&x, 1, 1), [0]);
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
