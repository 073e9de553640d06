//! Local-tier file operations: atomic writes, fsync, scanning a staging tree
//! into manifest entries, verifying a tree against its manifest.
//!
//! Everything the store creates on the local tier is root's alone (a
//! snapshot is process memory): directories 0700 ([`DIR_MODE`]), files 0600
//! ([`FILE_MODE`]), whatever the process's umask. The manifest keeps the
//! modes the writer gave its files; the copies on disk do not carry them.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::chunk::{chunk_file, sha256_hex, xxh3_hex};
use crate::config::ChunkingConfig;
use crate::error::{Error, Result};
use crate::manifest::{Entry, EntryKind, Manifest};

/// The mode of every directory the store creates or commits.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file the store writes or commits.
pub const FILE_MODE: u32 = 0o600;

fn dir_builder() -> fs::DirBuilder {
    use std::os::unix::fs::DirBuilderExt;
    let mut b = fs::DirBuilder::new();
    b.mode(DIR_MODE);
    b
}

/// Create one directory, mode 0700.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    dir_builder().create(dir)
}

/// Make `dir` exist with mode 0700 (created with its missing parents, or
/// tightened when it exists with other modes): the store's own roots.
pub fn private_root(dir: &Path) -> Result<()> {
    create_dir_all_durable(dir)?;
    let mode = fs::metadata(dir).map_err(|e| Error::io("stat", dir, e))?.permissions().mode() & 0o7777;
    if mode != DIR_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE)).map_err(|e| Error::io("chmod 0700", dir, e))?;
    }
    Ok(())
}

/// Set every directory of the tree at `root` (itself included) to 0700 and
/// every file to 0600 (a staging about to be committed: what the writer
/// created has the writer's modes). Blocking.
pub fn make_tree_private(root: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(root).map_err(|e| Error::io("stat", root, e))?;
    let mode = if meta.is_dir() { DIR_MODE } else { FILE_MODE };
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.permissions().mode() & 0o7777 != mode {
        fs::set_permissions(root, fs::Permissions::from_mode(mode)).map_err(|e| Error::io("chmod", root, e))?;
    }
    if meta.is_dir() {
        let rd = fs::read_dir(root).map_err(|e| Error::io("list", root, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("list", root, e))?;
            make_tree_private(&entry.path())?;
        }
    }
    Ok(())
}

/// fsync a directory (makes renames/creations in it durable).
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("fsync directory", dir, e))
}

/// Write `bytes` to `path` atomically: tmp file, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().ok_or_else(|| Error::Internal(format!("{} has no parent", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(&tmp).map_err(|e| Error::io("create", &tmp, e))?
    };
    // An older tmp file left with other modes keeps them through O_CREAT.
    f.set_permissions(fs::Permissions::from_mode(FILE_MODE)).map_err(|e| Error::io("chmod", &tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io("write", &tmp, e))?;
    f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| Error::io("rename into place", path, e))?;
    fsync_dir(dir)
}

/// Create `dir` and any missing parents, fsyncing each directory whose entries changed.
pub fn create_dir_all_durable(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_all_durable(parent)?;
    }
    match create_private_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("create directory", dir, e)),
    }
    if let Some(parent) = dir.parent() {
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Rename `path` into `trash` (atomic: the tree is either whole at its place or
/// gone from it); it is deleted there in the background, paced
/// (`trash`). Missing `path` is fine.
pub fn remove_tree(path: &Path, trash: &Path) -> Result<()> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let target = trash.join(format!("{:x}", fastrand::u128(..)));
    fs::rename(path, &target).map_err(|e| Error::io("move to trash", path, e))?;
    if let Some(parent) = path.parent() {
        fsync_dir(parent)?;
    }
    crate::trash::delete_later(target);
    Ok(())
}

/// A copy of the tree at `src` made of hard links (directories recreated,
/// files linked, symlinks copied) at `dst`, which must not exist.
pub fn link_tree(src: &Path, dst: &Path) -> Result<()> {
    create_private_dir(dst).map_err(|e| Error::io("create", dst, e))?;
    let rd = fs::read_dir(src).map_err(|e| Error::io("list", src, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io("list", src, e))?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let ft = entry.file_type().map_err(|e| Error::io("stat", &from, e))?;
        if ft.is_dir() {
            link_tree(&from, &to)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&from).map_err(|e| Error::io("read link", &from, e))?;
            std::os::unix::fs::symlink(&target, &to).map_err(|e| Error::io("create symlink", &to, e))?;
        } else {
            fs::hard_link(&from, &to).map_err(|e| Error::io("hard link", &to, e))?;
        }
    }
    Ok(())
}

/// Delete everything inside `dir` (not `dir` itself).
pub fn clear_dir(dir: &Path) -> Result<()> {
    let rd = fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io("list", dir, e))?;
        let p = entry.path();
        let ft = entry.file_type().map_err(|e| Error::io("stat", &p, e))?;
        // The trash emptier of this process may be deleting it too.
        let removed = if ft.is_dir() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io("remove", &p, e)),
            _ => {}
        }
    }
    Ok(())
}

/// Walk a staging tree: directories and regular files only (anything else is
/// refused), sorted by relative path. Returns (relative path, kind, mode, size).
pub fn scan_tree(root: &Path) -> Result<Vec<(String, EntryKind, u32, u64)>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, EntryKind, u32, u64)>) -> Result<()> {
        let rd = fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let p = entry.path();
            let meta = fs::symlink_metadata(&p).map_err(|e| Error::io("stat", &p, e))?;
            let rel = p
                .strip_prefix(root)
                .ok()
                .and_then(|r| r.to_str())
                .ok_or_else(|| Error::UnsupportedFile { path: p.clone(), kind: "non-UTF-8 name".into() })?
                .to_string();
            if rel == crate::manifest::MANIFEST_FILE {
                return Err(Error::UnsupportedFile { path: p, kind: "name reserved for the store's manifest".into() });
            }
            let mode = meta.mode() & 0o7777;
            let ft = meta.file_type();
            if ft.is_dir() {
                out.push((rel, EntryKind::Dir, mode, 0));
                walk(root, &p, out)?;
            } else if ft.is_file() {
                out.push((rel, EntryKind::File, mode, meta.len()));
            } else {
                let kind = if ft.is_symlink() { "symbolic link" } else { "special file (device, socket or fifo)" };
                return Err(Error::UnsupportedFile { path: p, kind: kind.into() });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn workers() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).clamp(1, 8)
}

/// Chunk and digest every file of a staging tree (files in parallel), fsync
/// every file and directory, and return the manifest entries. Blocking.
pub fn build_entries(root: &Path, chunking: &ChunkingConfig) -> Result<Vec<Entry>> {
    let scanned = scan_tree(root)?;
    let entries: Vec<Mutex<Option<Entry>>> = scanned
        .iter()
        .map(|(path, kind, mode, _)| {
            Mutex::new((*kind == EntryKind::Dir).then(|| Entry {
                path: path.clone(),
                kind: EntryKind::Dir,
                mode: *mode,
                size: 0,
                chunks: vec![],
            }))
        })
        .collect();
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..workers() {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((rel, kind, mode, _)) = scanned.get(i) else { break };
                if *kind != EntryKind::File {
                    continue;
                }
                let p = root.join(rel);
                let res = chunk_file(&p, chunking).and_then(|(size, chunks)| {
                    File::open(&p).and_then(|f| f.sync_all()).map_err(|e| Error::io("fsync", &p, e))?;
                    Ok(Entry { path: rel.clone(), kind: EntryKind::File, mode: *mode, size, chunks })
                });
                match res {
                    Ok(e) => *entries[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(e),
                    Err(e) => {
                        first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    for (rel, kind, _, _) in scanned.iter().rev() {
        if *kind == EntryKind::Dir {
            fsync_dir(&root.join(rel))?;
        }
    }
    fsync_dir(root)?;
    entries
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).ok_or_else(|| Error::Internal("entry not chunked".into())))
        .collect()
}

/// What the files of a local copy look like to `stat` (per file of the
/// manifest: device, inode, size, mtime and ctime to the nanosecond). Any
/// write, truncation, replacement or `chmod` changes it; ctime cannot be
/// set back from userspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<FileStat>);

/// One file's device, inode, size, and (seconds, nanoseconds) of its mtime
/// and ctime.
type FileStat = (u64, u64, u64, (i64, i64), (i64, i64));

/// The [`Fingerprint`] of the files of `m` under `root`.
pub fn fingerprint(root: &Path, m: &Manifest) -> std::io::Result<Fingerprint> {
    let mut out = Vec::new();
    for e in m.entries.iter().filter(|e| e.kind == EntryKind::File) {
        let st = fs::symlink_metadata(root.join(&e.path))?;
        out.push((st.dev(), st.ino(), st.len(), (st.mtime(), st.mtime_nsec()), (st.ctime(), st.ctime_nsec())));
    }
    Ok(Fingerprint(out))
}

/// Verify the files of a local snapshot tree against its manifest: every file
/// present with its size, every chunk's checksum (chunks hashed in parallel):
/// its XXH3-128 when the manifest has one, else its sha256.
/// Returns the first mismatch as text naming the file. Blocking.
pub fn verify_tree(root: &Path, m: &Manifest) -> std::result::Result<(), String> {
    let mut files = Vec::new();
    let mut jobs = Vec::new();
    for e in &m.entries {
        let p = root.join(&e.path);
        let meta = fs::symlink_metadata(&p).map_err(|err| format!("{}: {err}", e.path))?;
        match e.kind {
            EntryKind::Dir if !meta.is_dir() => return Err(format!("{} is not a directory", e.path)),
            EntryKind::File if !meta.is_file() => return Err(format!("{} is not a regular file", e.path)),
            EntryKind::File if meta.len() != e.size => {
                return Err(format!("file {} is {} bytes, the manifest says {}", e.path, meta.len(), e.size))
            }
            EntryKind::File => {
                let f = File::open(&p).map_err(|err| format!("open {}: {err}", e.path))?;
                let fi = files.len();
                files.push((f, e));
                let mut off = 0u64;
                for c in &e.chunks {
                    jobs.push((fi, off, c));
                    off += c.size as u64;
                }
            }
            EntryKind::Dir => {}
        }
    }
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..workers() {
            s.spawn(|| {
                let mut buf = Vec::new();
                loop {
                    if failed.lock().map(|f| f.is_some()).unwrap_or(true) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((fi, off, c)) = jobs.get(i) else { break };
                    let (f, e) = &files[*fi];
                    buf.resize(c.size as usize, 0);
                    let res = f.read_exact_at(&mut buf, *off).map_err(|err| format!("read {} at {off}: {err}", e.path)).and_then(|()| {
                        let ok = match &c.xxh3 {
                            Some(x) => xxh3_hex(&buf) == *x,
                            None => sha256_hex(&buf) == c.digest,
                        };
                        if ok {
                            Ok(())
                        } else {
                            Err(format!("file {} bytes {}..{} do not match chunk sha256:{}", e.path, off, off + c.size as u64, c.digest))
                        }
                    });
                    if let Err(msg) = res {
                        if let Ok(mut f) = failed.lock() {
                            f.get_or_insert(msg);
                        }
                        break;
                    }
                }
            });
        }
    });
    match failed.into_inner() {
        Ok(None) => Ok(()),
        Ok(Some(msg)) => Err(msg),
        Err(_) => Err("verification worker panicked".to_string()),
    }
}

/// Read `len` bytes at `offset` of `path`. Blocking.
pub fn read_range(path: &Path, offset: u64, len: u32) -> Result<Vec<u8>> {
    let f = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, offset).map_err(|e| Error::io("read", path, e))?;
    Ok(buf)
}

/// Create the directories and (sized, empty) files of `m` under `root`.
pub fn materialize_skeleton(root: &Path, m: &Manifest) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for e in &m.entries {
        let p = root.join(&e.path);
        match e.kind {
            EntryKind::Dir => dir_builder().recursive(true).create(&p).map_err(|err| Error::io("create directory", &p, err))?,
            EntryKind::File => {
                if let Some(parent) = p.parent() {
                    dir_builder().recursive(true).create(parent).map_err(|err| Error::io("create directory", parent, err))?;
                }
                let f = {
                    use std::os::unix::fs::OpenOptionsExt;
                    OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(&p).map_err(|err| Error::io("create", &p, err))?
                };
                f.set_len(e.size).map_err(|err| Error::io("set length", &p, err))?;
            }
        }
        files.push(p);
    }
    Ok(files)
}

/// Set the store's modes (0700 directories, 0600 files: not the manifest's,
/// see the module docs), fsync every file and directory of a materialized tree.
pub fn finish_tree(root: &Path, m: &Manifest) -> Result<()> {
    for e in m.entries.iter().rev() {
        let p = root.join(&e.path);
        let f = File::open(&p).map_err(|err| Error::io("open", &p, err))?;
        let mode = if e.kind == EntryKind::Dir { DIR_MODE } else { FILE_MODE };
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(|err| Error::io("chmod", &p, err))?;
        f.sync_all().map_err(|err| Error::io("fsync", &p, err))?;
    }
    fs::set_permissions(root, fs::Permissions::from_mode(DIR_MODE)).map_err(|err| Error::io("chmod", root, err))?;
    fsync_dir(root)
}

pub(crate) fn remove_file_if_present(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", p, e)),
    }
}
