//! The mounts of an active snapshot or view, built exactly as containerd's
//! overlay snapshotter builds them (`plugins/snapshots/overlay`, `mounts`):
//!
//! - no parent: a bind mount of the snapshot's own `fs` (`rw`, or `ro` for a view);
//! - a view on a single layer: a read-only bind mount of that layer's `fs`;
//! - otherwise overlayfs, `lowerdir` = the parents' `fs`, nearest first, and for
//!   an active snapshot `upperdir`/`workdir` = its own `fs`/`work`, followed by
//!   the configured overlay options.

use std::path::{Path, PathBuf};

use containerd_snapshots::api::types::Mount;

use super::meta::{Kind, Snapshot};

/// `<root>/snapshots/<id>/fs`: the snapshot's upper (its changes).
pub fn upper_path(root: &Path, id: u64) -> PathBuf {
    root.join("snapshots").join(id.to_string()).join("fs")
}

/// `<root>/snapshots/<id>/work`: overlayfs' work dir (active snapshots only).
pub fn work_path(root: &Path, id: u64) -> PathBuf {
    root.join("snapshots").join(id.to_string()).join("work")
}

/// The mounts of `s`; `options` are the overlay mount options (e.g. `index=off`).
pub fn mounts(root: &Path, s: &Snapshot, options: &[String]) -> Vec<Mount> {
    if s.parent_ids.is_empty() {
        let ro = if s.kind == Kind::View { "ro" } else { "rw" };
        return vec![Mount {
            r#type: "bind".into(),
            source: upper_path(root, s.id).display().to_string(),
            target: String::new(),
            options: vec![ro.into(), "rbind".into()],
        }];
    }
    let mut opts = Vec::new();
    if s.kind == Kind::Active {
        opts.push(format!("workdir={}", work_path(root, s.id).display()));
        opts.push(format!("upperdir={}", upper_path(root, s.id).display()));
    } else if s.parent_ids.len() == 1 {
        return vec![Mount {
            r#type: "bind".into(),
            source: upper_path(root, s.parent_ids[0]).display().to_string(),
            target: String::new(),
            options: vec!["ro".into(), "rbind".into()],
        }];
    }
    let lower: Vec<String> = s.parent_ids.iter().map(|id| upper_path(root, *id).display().to_string()).collect();
    opts.push(format!("lowerdir={}", lower.join(":")));
    opts.extend(options.iter().cloned());
    vec![Mount { r#type: "overlay".into(), source: "overlay".into(), target: String::new(), options: opts }]
}

/// The overlay options containerd adds by itself: `index=off` when the
/// kernel knows the option (so that a layer can be shared by overlays
/// mounted with different lowers).
pub fn default_overlay_options(configured: &[String]) -> Vec<String> {
    let mut opts = configured.to_vec();
    let has_index = opts.iter().any(|o| o == "index" || o.starts_with("index="));
    if !has_index && Path::new("/sys/module/overlay/parameters/index").exists() {
        opts.push("index=off".into());
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: u64, kind: Kind, parents: &[u64]) -> Snapshot {
        Snapshot { id, kind, parent_ids: parents.to_vec() }
    }

    #[test]
    fn no_parent_is_a_bind_mount() {
        let root = Path::new("/r");
        let m = mounts(root, &snap(1, Kind::Active, &[]), &["index=off".into()]);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].r#type, "bind");
        assert_eq!(m[0].source, "/r/snapshots/1/fs");
        assert_eq!(m[0].options, vec!["rw", "rbind"]);
        let m = mounts(root, &snap(1, Kind::View, &[]), &[]);
        assert_eq!(m[0].options, vec!["ro", "rbind"]);
    }

    #[test]
    fn view_of_one_layer_is_a_readonly_bind_of_the_layer() {
        let m = mounts(Path::new("/r"), &snap(5, Kind::View, &[2]), &["index=off".into()]);
        assert_eq!(m[0].r#type, "bind");
        assert_eq!(m[0].source, "/r/snapshots/2/fs");
        assert_eq!(m[0].options, vec!["ro", "rbind"]);
    }

    #[test]
    fn active_on_parents_is_overlay_nearest_first() {
        let m = mounts(Path::new("/r"), &snap(7, Kind::Active, &[3, 2, 1]), &["index=off".into()]);
        assert_eq!(m[0].r#type, "overlay");
        assert_eq!(m[0].source, "overlay");
        assert_eq!(
            m[0].options,
            vec![
                "workdir=/r/snapshots/7/work",
                "upperdir=/r/snapshots/7/fs",
                "lowerdir=/r/snapshots/3/fs:/r/snapshots/2/fs:/r/snapshots/1/fs",
                "index=off",
            ]
        );
        let m = mounts(Path::new("/r"), &snap(7, Kind::Active, &[3]), &[]);
        assert_eq!(m[0].options, vec!["workdir=/r/snapshots/7/work", "upperdir=/r/snapshots/7/fs", "lowerdir=/r/snapshots/3/fs",]);
    }

    #[test]
    fn view_on_several_layers_is_a_lower_only_overlay() {
        let m = mounts(Path::new("/r"), &snap(9, Kind::View, &[4, 3]), &[]);
        assert_eq!(m[0].r#type, "overlay");
        assert_eq!(m[0].options, vec!["lowerdir=/r/snapshots/4/fs:/r/snapshots/3/fs"]);
    }

    #[test]
    fn index_option_is_not_doubled() {
        let o = default_overlay_options(&["index=on".into()]);
        assert_eq!(o, vec!["index=on"]);
    }
}
