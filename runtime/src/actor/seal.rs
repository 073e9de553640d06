//! The seal of a dump: what the suspend wrote, checked before a restore
//! uses it.
//!
//! After every container of the actor is dumped, and before the dump is
//! fsynced and the record says SUSPENDED, the suspend writes
//! `torpor-seal.json` at the root of the dump: every file with its size,
//! and the SHA-256 of every file but CRIU's page images (`pages-*.img`,
//! the process memory, checked by size: hashing them would cost the resume
//! a read of all memory; the store digests them at the commit and verifies
//! them at each checkout). The seal travels in the snapshot.
//!
//! A restore first checks its images against the seal ([`verify`]): a
//! missing, truncated, grown, swapped or planted file is refused naming
//! it, before CRIU reads anything (CRIU spins on a truncated pages image).
//! This covers what the store's manifest cannot: a view of a staging that
//! is not committed yet, and a snapshot whose contents were altered
//! consistently with its manifest. The seal comes from the bucket too, so
//! its paths are checked like any hostile input: relative, no `..`, no
//! symlinks followed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, IoContext, Result};

/// The seal's file name, at the root of a dump.
pub const SEAL_FILE: &str = "torpor-seal.json";

/// The seal format's version.
const VERSION: u32 = 1;

/// At most this many files in a dump (a seal claiming more is refused).
const MAX_FILES: usize = 100_000;

/// A seal file larger than this is refused unread.
const MAX_SEAL_BYTES: u64 = 16 << 20;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Seal {
    version: u32,
    /// Relative path → what it was at the dump.
    files: BTreeMap<String, Sealed>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Sealed {
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

/// Whether a file's contents are sealed by size only (CRIU's page images).
fn size_only(name: &str) -> bool {
    name.starts_with("pages-") && name.ends_with(".img")
}

/// Writes the seal of the dump at `root` (0600, not fsynced: the suspend
/// fsyncs the whole dump after it).
pub fn write(root: &Path) -> Result<()> {
    let mut files = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).io_context(|| format!("read {dir:?}"))? {
            let e = e.io_context(|| format!("read {dir:?}"))?;
            let path = e.path();
            let t = e.file_type().io_context(|| format!("stat {path:?}"))?;
            let rel = relative(root, &path)?;
            if t.is_dir() {
                todo.push(path);
            } else if t.is_file() && rel != SEAL_FILE {
                let name = e.file_name().to_string_lossy().into_owned();
                let size = e.metadata().io_context(|| format!("stat {path:?}"))?.len();
                let sha256 = if size_only(&name) { None } else { Some(sha256_of(&path)?) };
                files.insert(rel, Sealed { size, sha256 });
            } else if !t.is_file() {
                return Err(Error::FailedPrecondition(format!("the dump holds {path:?}, which is neither a file nor a directory")));
            }
        }
    }
    let json = serde_json::to_vec_pretty(&Seal { version: VERSION, files })
        .map_err(|source| Error::Json { context: "encode the dump's seal".into(), source })?;
    // Whole or not at all: a seal cut short by a full disk would make a
    // complete dump look corrupt.
    let (tmp, p) = (root.join(format!(".{SEAL_FILE}.tmp")), root.join(SEAL_FILE));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&json))
        .and_then(|()| std::fs::rename(&tmp, &p))
        .io_context(|| format!("write {p:?}"));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// What [`verify`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verified {
    /// Every sealed file is there as it was dumped; nothing else is.
    Sealed { files: usize },
    /// The dump has no seal (made by a torpor before seals): the store's
    /// manifest is all that was checked.
    Unsealed,
}

/// Checks the images at `root` against their seal (see the module doc).
/// An error names the first file that differs.
pub fn verify(root: &Path) -> Result<Verified> {
    let p = root.join(SEAL_FILE);
    let f = match open_regular(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Verified::Unsealed),
        Err(e) => return Err(corrupt(root, format!("its seal {SEAL_FILE} cannot be opened: {e}"))),
    };
    let len = f.metadata().io_context(|| format!("stat {p:?}"))?.len();
    if len > MAX_SEAL_BYTES {
        return Err(corrupt(root, format!("its seal is {len} bytes (at most {MAX_SEAL_BYTES})")));
    }
    let mut text = Vec::new();
    f.take(MAX_SEAL_BYTES).read_to_end(&mut text).io_context(|| format!("read {p:?}"))?;
    let seal: Seal = serde_json::from_slice(&text).map_err(|e| corrupt(root, format!("its seal is not valid: {e}")))?;
    if seal.version != VERSION {
        return Err(corrupt(root, format!("its seal has version {} (this torpor reads {VERSION})", seal.version)));
    }
    if seal.files.len() > MAX_FILES {
        return Err(corrupt(root, format!("its seal lists {} files (at most {MAX_FILES})", seal.files.len())));
    }
    for (rel, want) in &seal.files {
        check_relative(rel).map_err(|why| corrupt(root, format!("its seal names {rel:?}, {why}")))?;
        let path = root.join(rel);
        let f = open_regular(&path).map_err(|e| corrupt(root, format!("{rel}: {e}")))?;
        let size = f.metadata().io_context(|| format!("stat {path:?}"))?.size();
        if size != want.size {
            return Err(corrupt(root, format!("{rel} is {size} bytes, the dump wrote {}", want.size)));
        }
        if let Some(digest) = &want.sha256 {
            if sha256_of(&path)? != *digest {
                return Err(corrupt(root, format!("{rel} is not what the dump wrote (its SHA-256 differs)")));
            }
        }
    }
    // Nothing CRIU might read that the dump did not write.
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).io_context(|| format!("read {dir:?}"))? {
            let e = e.io_context(|| format!("read {dir:?}"))?;
            let path = e.path();
            let rel = relative(root, &path)?;
            let t = e.file_type().io_context(|| format!("stat {path:?}"))?;
            if t.is_dir() {
                todo.push(path);
            } else if rel != SEAL_FILE && !seal.files.contains_key(&rel) && !store_owned(&rel) {
                return Err(corrupt(root, format!("{rel} is not part of the dump")));
            }
        }
    }
    Ok(Verified::Sealed { files: seal.files.len() })
}

/// Files the snapshot store keeps in a snapshot's directory beside the dump.
fn store_owned(rel: &str) -> bool {
    rel == "manifest.json"
}

fn corrupt(root: &Path, why: String) -> Error {
    Error::FailedPrecondition(format!("the images at {root:?} are not the dump that was sealed: {why}"))
}

/// Opens `path` for reading without following a symlink in its last
/// component, refusing anything but a regular file.
fn open_regular(path: &Path) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

fn relative(root: &Path, path: &Path) -> Result<String> {
    let rel = path.strip_prefix(root).map_err(|_| Error::FailedPrecondition(format!("{path:?} is outside {root:?}")))?;
    rel.to_str().map(String::from).ok_or_else(|| Error::FailedPrecondition(format!("{path:?} is not UTF-8")))
}

/// A sealed path must stay below the dump's root.
fn check_relative(rel: &str) -> std::result::Result<(), &'static str> {
    let p = Path::new(rel);
    if rel.is_empty() || p.is_absolute() {
        return Err("which is not a relative path");
    }
    if p.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err("which leaves the dump's directory");
    }
    Ok(())
}

fn sha256_of(path: &Path) -> Result<String> {
    let mut f = open_regular(path).io_context(|| format!("open {path:?}"))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).io_context(|| format!("read {path:?}"))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("counter")).unwrap();
        std::fs::write(d.path().join("counter/core-1.img"), b"core").unwrap();
        std::fs::write(d.path().join("counter/pages-1.img"), vec![7u8; 8192]).unwrap();
        std::fs::write(d.path().join("counter/rootfs-diff.tar"), b"tar").unwrap();
        write(d.path()).unwrap();
        d
    }

    fn refused(d: &Path, needle: &str) {
        let e = verify(d).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }

    #[test]
    fn an_untouched_dump_verifies() {
        let d = dump();
        assert_eq!(verify(d.path()).unwrap(), Verified::Sealed { files: 3 });
        let mode = std::fs::metadata(d.path().join(SEAL_FILE)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_dump_without_a_seal_is_unsealed() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(verify(d.path()).unwrap(), Verified::Unsealed);
    }

    #[test]
    fn a_truncated_pages_image_is_refused_naming_it() {
        let d = dump();
        let f = std::fs::OpenOptions::new().write(true).open(d.path().join("counter/pages-1.img")).unwrap();
        f.set_len(4096).unwrap();
        refused(d.path(), "counter/pages-1.img is 4096 bytes, the dump wrote 8192");
    }

    #[test]
    fn a_changed_image_of_the_same_size_is_refused() {
        let d = dump();
        std::fs::write(d.path().join("counter/core-1.img"), b"CORE").unwrap();
        refused(d.path(), "counter/core-1.img is not what the dump wrote");
    }

    #[test]
    fn a_missing_or_planted_file_is_refused() {
        let d = dump();
        std::fs::write(d.path().join("counter/inventory.img"), b"x").unwrap();
        refused(d.path(), "counter/inventory.img is not part of the dump");
        std::fs::remove_file(d.path().join("counter/inventory.img")).unwrap();
        std::fs::remove_file(d.path().join("counter/rootfs-diff.tar")).unwrap();
        refused(d.path(), "counter/rootfs-diff.tar");
    }

    #[test]
    fn a_symlink_in_place_of_an_image_is_refused() {
        let d = dump();
        let p = d.path().join("counter/core-1.img");
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &p).unwrap();
        refused(d.path(), "counter/core-1.img");
    }

    #[test]
    fn a_hostile_seal_is_refused() {
        for (files, needle) in [
            (r#"{"../../etc/shadow":{"size":1}}"#, "leaves the dump's directory"),
            (r#"{"/etc/shadow":{"size":1}}"#, "not a relative path"),
            (r#"{"a/./b":{"size":1}}"#, "a/./b"),
        ] {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join(SEAL_FILE), format!(r#"{{"version":1,"files":{files}}}"#)).unwrap();
            refused(d.path(), needle);
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(SEAL_FILE), r#"{"version":9,"files":{}}"#).unwrap();
        refused(d.path(), "version 9");
        std::fs::write(d.path().join(SEAL_FILE), "not json").unwrap();
        refused(d.path(), "seal is not valid");
    }
}
