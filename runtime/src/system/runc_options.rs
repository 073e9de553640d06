//! containerd's runtime options for the torpor runtime, as
//! containerd-shim-runc-v2 reads them (`runc.v1.Options`, from the CRI
//! config's `[...runtimes.torpor.options]`, sent with every Create): the
//! runc binary, its state root, the systemd cgroup driver, CRIU's path and
//! default work directory, and two create flags. The shim turns the wire
//! message into this; the task layer binds every container's runc to it.
//! Kept in the bundle (`torpor-runc-options.json`) so that the cleanup
//! after a shim's death drives the same runc.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

/// The file in a bundle that keeps the options its container was created with.
pub const FILE: &str = "torpor-runc-options.json";

/// Runtime options (all optional; empty means runc-v2's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuncOptions {
    /// `BinaryName`: the runc binary (default `$TORPOR_RUNC`, else `runc`).
    pub binary_name: Option<PathBuf>,
    /// `Root`: runc's state root; the namespace is a directory below it
    /// (default `/run/torpor/runc`).
    pub root: Option<PathBuf>,
    /// `SystemdCgroup`: `runc --systemd-cgroup` (cgroupsPath is
    /// `slice:prefix:name`).
    pub systemd_cgroup: bool,
    /// `CriuImagePath`: the image directory of a Checkpoint that names none.
    pub criu_image_path: Option<PathBuf>,
    /// `CriuWorkPath`: CRIU's work directory of a Checkpoint that names none.
    pub criu_work_path: Option<PathBuf>,
    /// `NoPivotRoot`: `runc create --no-pivot`.
    pub no_pivot_root: bool,
    /// `NoNewKeyring`: `runc create --no-new-keyring`.
    pub no_new_keyring: bool,
}

impl RuncOptions {
    /// Refuses paths that are not absolute (containerd's config gives
    /// absolute ones; a relative one would resolve against the bundle).
    pub fn validate(&self) -> Result<()> {
        for (name, p) in [("Root", &self.root), ("CriuImagePath", &self.criu_image_path), ("CriuWorkPath", &self.criu_work_path)] {
            if let Some(p) = p {
                if !p.is_absolute() {
                    return Err(Error::InvalidArgument(format!("runtime option {name} {p:?} is not an absolute path")));
                }
            }
        }
        if let Some(b) = &self.binary_name {
            if b.as_os_str().is_empty() {
                return Err(Error::InvalidArgument("runtime option BinaryName is empty".into()));
            }
        }
        Ok(())
    }

    /// Keeps the options in `bundle` (see the module doc).
    pub fn save(&self, bundle: &Path) -> Result<()> {
        let path = bundle.join(FILE);
        let json = serde_json::to_vec(self).map_err(|source| Error::Json { context: "encode runtime options".into(), source })?;
        std::fs::write(&path, json).io_context(|| format!("write {path:?}"))
    }

    /// The options `bundle`'s container was created with (defaults if it
    /// kept none: created by an older shim).
    pub fn load(bundle: &Path) -> Result<RuncOptions> {
        let path = bundle.join(FILE);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|source| Error::Json { context: format!("parse {path:?}"), source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RuncOptions::default()),
            Err(e) => Err(Error::Io { context: format!("read {path:?}"), source: e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip_through_the_bundle_and_are_checked() {
        let b = tempfile::tempdir().unwrap();
        assert_eq!(RuncOptions::load(b.path()).unwrap(), RuncOptions::default());
        let o = RuncOptions {
            binary_name: Some("/usr/bin/runc".into()),
            root: Some("/run/r".into()),
            systemd_cgroup: true,
            ..Default::default()
        };
        o.validate().unwrap();
        o.save(b.path()).unwrap();
        assert_eq!(RuncOptions::load(b.path()).unwrap(), o);
        let bad = RuncOptions { root: Some("relative".into()), ..Default::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("Root"));
    }
}
