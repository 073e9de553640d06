//! A restore driven over CRIU's RPC (`criu swrk`) by the shim itself,
//! without `runc restore` in between, leaving runc's state as runc would
//! have: later `runc kill`, `delete`, `ps`, `exec`, `pause` and
//! `checkpoint` find the restored container as theirs.
//!
//! runc costs a resume about 15 ms and as much CPU besides CRIU's own
//! work (its start, a CRIU VERSION round trip, its cgroup and mount set-up,
//! its state written after): what it does for a restore is done here, as
//! runc 1.1 does it (`libcontainer` `Restore`, `criuSwrk`,
//! `criuApplyCgroups`, `criuNotifications`), from a **template** taken
//! right before the container's last dump ([`save_template`]): runc's
//! `state.json` of the running container (its libcontainer configuration,
//! cgroup paths) and the values of its cgroup files, which runc's
//! checkpoint removes with the cgroups.
//!
//! The template is in the container's bundle, root's alone. Without one
//! (the container's first restore on this node, a restore from another
//! node's snapshot or a clone's), with a terminal, OCI hooks, runc's
//! systemd cgroup driver or a cgroup namespace, the restore is runc's.
//!
//! The request is runc's: the rootfs bind-mounted on `criu-root` in runc's
//! state directory, CRIU's configuration file (`org.criu.config`), the
//! pod's network and PID namespaces inherited (`extRoot<NS>NS`), the
//! others joined, bind mounts, cgroup v1 mounts, masked paths and device
//! nodes mapped as external mounts, the stdio pipes of the dump inherited
//! (`descriptors.json`), CRIU in the container's cgroups (`cg_root`), the
//! restored tree a sibling of CRIU (so the shim's child), and runc's
//! `state.json` written on CRIU's `post-restore` notification, before the
//! processes run.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::Message;
use rust_criu::rust_criu_protobuf::rpc::{
    Cgroup_root, Criu_opts, Criu_req, Criu_req_type, Criu_resp, Ext_mount_map, Inherit_fd, Join_namespace,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{debug, warn};

use crate::error::{Error, IoContext, Result};
use crate::system::cgroup::{self, files};
use crate::system::runc::{ProcessStdio, RestoreFrom, FIRST_INHERITED_FD};
use crate::system::{criu, criu_launcher, mounts, reaper, resources};

/// The template's file in the bundle.
const TEMPLATE: &str = "torpor-restore-template.json";

/// The cgroup files a template carries, per controller, in the order they
/// are written back (a cpuset needs its CPUs and memory nodes before a
/// process joins; a CFS quota its period; memory+swap a memory limit under
/// it). Each is written only when the new cgroup's value differs.
const CGROUP_FILES: &[(&str, &[&str])] = &[
    ("cpuset", &["cpuset.cpus", "cpuset.mems"]),
    ("cpu", &["cpu.shares", "cpu.cfs_period_us", "cpu.cfs_quota_us"]),
    ("memory", &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.soft_limit_in_bytes", "memory.swappiness"]),
    ("pids", &["pids.max"]),
    ("blkio", &["blkio.weight"]),
    ("net_cls", &["net_cls.classid"]),
];

/// The files of [`CGROUP_FILES`] for controller `ctrl`, and the device
/// list of the devices controller.
fn carried_files(ctrl: &str) -> &'static [&'static str] {
    if ctrl == "devices" {
        return &["devices.list"];
    }
    CGROUP_FILES.iter().find(|(c, _)| *c == ctrl).map(|(_, f)| *f).unwrap_or(&[])
}

/// A hugetlb limit file (`hugetlb.<size>.limit_in_bytes`, or its `rsvd.`
/// twin).
fn is_hugetlb_limit(f: &str) -> bool {
    f.starts_with("hugetlb.") && f.ends_with(".limit_in_bytes") && !f.contains('/')
}

/// What a direct restore starts from (see the module doc).
#[derive(Debug, Serialize, Deserialize)]
pub struct Template {
    /// runc's `state.json` of the running container.
    state: Value,
    /// controller → (file → value): [`CGROUP_FILES`], hugetlb limits and
    /// `devices.list`.
    cgroup: BTreeMap<String, BTreeMap<String, String>>,
    /// The memory cgroup's OOM killer was disabled.
    #[serde(default)]
    oom_kill_disable: bool,
}

/// Takes the template of container `id` (runc state directory
/// `state_dir`) into `bundle`, before its dump. A template that cannot be
/// taken is removed (an old one would not match the dump): the restore is
/// then runc's.
pub fn save_template(state_dir: &Path, bundle: &Path) {
    if let Err(e) = try_save_template(state_dir, bundle) {
        warn!(bundle = %bundle.display(), "no template for a direct CRIU restore (the next restore is runc's): {e}");
        discard_template(bundle);
    }
}

fn try_save_template(state_dir: &Path, bundle: &Path) -> Result<()> {
    let file = state_dir.join("state.json");
    let state: Value = serde_json::from_slice(&std::fs::read(&file).io_context(|| format!("read {file:?}"))?)
        .map_err(|source| Error::Json { context: format!("parse {file:?}"), source })?;
    let mut cgroup = BTreeMap::new();
    let mut oom_kill_disable = false;
    for (ctrl, dir) in cgroup_paths(&state)? {
        let mut values = BTreeMap::new();
        let mut files: Vec<String> = carried_files(&ctrl).iter().map(|f| f.to_string()).collect();
        if ctrl == "hugetlb" {
            // One limit per huge page size (hugetlb.2MB.limit_in_bytes...).
            let entries = std::fs::read_dir(&dir).io_context(|| format!("list {dir:?}"))?;
            files.extend(entries.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|f| is_hugetlb_limit(f)));
        }
        for f in files {
            match std::fs::read_to_string(dir.join(&f)) {
                Ok(v) => {
                    values.insert(f, v);
                }
                // memsw without swap accounting, net_cls not mounted...
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).io_context(|| format!("read {:?}", dir.join(f))),
            }
        }
        if ctrl == "memory" {
            oom_kill_disable = files::counter(&dir.join("memory.oom_control"), "oom_kill_disable")? == 1;
        }
        cgroup.insert(ctrl, values);
    }
    let t = Template { state, cgroup, oom_kill_disable };
    let bytes = serde_json::to_vec(&t).map_err(|source| Error::Json { context: "encode the restore template".into(), source })?;
    write_private(&bundle.join(TEMPLATE), &bytes)
}

/// Removes the template of the container in `bundle`, if any.
fn discard_template(bundle: &Path) {
    let f = bundle.join(TEMPLATE);
    if let Err(e) = std::fs::remove_file(&f) {
        if e.kind() != std::io::ErrorKind::NotFound {
            warn!(file = %f.display(), "remove the restore template: {e}");
        }
    }
}

/// Writes `bytes` to `path` atomically, readable by root alone.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path))
        .io_context(|| format!("write {path:?}"));
    if written.is_err() {
        // A full disk leaves no half-written temporary behind.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Carries an update of the resources of the suspended container in
/// `bundle` (containerd's `Update`, [`resources::RuncUpdate`]) into its
/// template, if it has one: the cgroup values the direct restore writes
/// and runc's configuration in the state it leaves. An update the template
/// cannot carry (realtime CPU, CPU burst, unified values) removes it: the
/// restore is then runc's, from `config.json`, which has the update.
/// Returns whether a template was there and carries the update.
pub fn update_template(bundle: &Path, update: &resources::RuncUpdate) -> Result<bool> {
    let file = bundle.join(TEMPLATE);
    let bytes = match std::fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).io_context(|| format!("read {file:?}")),
    };
    let carried = serde_json::from_slice::<Template>(&bytes)
        .map_err(|e| format!("it does not parse: {e}"))
        .and_then(|mut t| t.apply(update).map(|()| t));
    match carried {
        Ok(t) => {
            let bytes = serde_json::to_vec(&t).map_err(|source| Error::Json { context: "encode the restore template".into(), source })?;
            write_private(&file, &bytes)?;
            Ok(true)
        }
        Err(why) => {
            warn!(file = %file.display(), "restore template removed (the next restore is runc's, from config.json): {why}");
            discard_template(bundle);
            Ok(false)
        }
    }
}

/// The template for a direct restore of container `id` in `bundle`, if
/// there is one it can be used for; `None` (the restore is runc's) with
/// the reason logged otherwise.
pub fn template_for(id: &str, bundle: &Path) -> Option<Template> {
    let file = bundle.join(TEMPLATE);
    let bytes = match std::fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn!(file = %file.display(), "read the restore template (the restore is runc's): {e}");
            return None;
        }
    };
    let checked = serde_json::from_slice::<Template>(&bytes)
        .map_err(|e| format!("does not parse: {e}"))
        .and_then(|t| t.check(id, bundle).map(|()| t));
    match checked {
        Ok(t) => Some(t),
        Err(why) => {
            warn!(file = %file.display(), "restore template not used (the restore is runc's): {why}");
            None
        }
    }
}

impl Template {
    fn config(&self) -> &Value {
        &self.state["config"]
    }

    /// Whether it is this container's and holds nothing the direct path
    /// leaves to runc.
    fn check(&self, id: &str, bundle: &Path) -> std::result::Result<(), String> {
        if self.state["id"].as_str() != Some(id) {
            return Err(format!("it is container {}'s, not {id}'s", self.state["id"]));
        }
        let c = self.config();
        let own_bundle = format!("bundle={}", bundle.display());
        if !c["labels"].as_array().is_some_and(|l| l.iter().any(|v| v.as_str() == Some(own_bundle.as_str()))) {
            return Err(format!("it is not of bundle {}", bundle.display()));
        }
        let rootfs = c["rootfs"].as_str().ok_or("no rootfs")?;
        if !Path::new(rootfs).is_absolute() {
            return Err(format!("rootfs {rootfs:?} is not absolute"));
        }
        if c["Hooks"].as_object().is_some_and(|h| h.values().any(|v| v.as_array().is_some_and(|a| !a.is_empty()))) {
            return Err("the container has OCI hooks".into());
        }
        if c["cgroups"]["Systemd"].as_bool() == Some(true) {
            return Err("runc drives its cgroups through systemd".into());
        }
        if self.namespaces().any(|(t, _)| t == "NEWCGROUP") {
            return Err("the container has a cgroup namespace".into());
        }
        for (_, p) in self.namespaces() {
            if !p.is_empty() && !Path::new(p).is_absolute() {
                return Err(format!("namespace path {p:?} is not absolute"));
            }
        }
        let paths = cgroup_paths(&self.state).map_err(|e| e.to_string())?;
        // The cgroup files carried are v1's; v2's limits and device
        // filter (eBPF) are left to runc.
        if !paths.iter().any(|(ctrl, _)| ctrl == "memory") {
            return Err("the container has no cgroup v1 memory controller (a cgroup v2 host)".into());
        }
        Ok(())
    }

    /// Takes `update` into the cgroup values and runc's configuration.
    fn apply(&mut self, update: &resources::RuncUpdate) -> std::result::Result<(), String> {
        for (ctrl, file, value) in resources::cgroup_v1_values(update)? {
            let Some(values) = self.cgroup.get_mut(ctrl) else {
                // a controller the container has no cgroup of (runc's
                // restore would not write it either)
                continue;
            };
            // memsw only where the kernel accounts swap (the file was read)
            if file == "memory.memsw.limit_in_bytes" && !values.contains_key(file) {
                continue;
            }
            values.insert(file.to_string(), value);
        }
        if let Some(cfg) = self.state["config"]["cgroups"].as_object_mut() {
            for (key, v) in resources::runc_config_values(update) {
                cfg.insert(key.to_string(), v);
            }
        }
        Ok(())
    }

    /// The configuration's namespaces: (type, path; empty when new).
    fn namespaces(&self) -> impl Iterator<Item = (&str, &str)> {
        self.config()["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| Some((n["type"].as_str()?, n["path"].as_str().unwrap_or(""))))
    }
}

/// The cgroup directories of a runc state, per controller (`""` is the
/// unified hierarchy of a hybrid host), each under `/sys/fs/cgroup`.
fn cgroup_paths(state: &Value) -> Result<Vec<(String, PathBuf)>> {
    let paths = state["cgroup_paths"].as_object().ok_or_else(|| Error::Corrupt("runc state without cgroup_paths".into()))?;
    paths
        .iter()
        .map(|(ctrl, p)| {
            let p = p.as_str().map(PathBuf::from).ok_or_else(|| Error::Corrupt(format!("cgroup path of {ctrl:?} is not a string")))?;
            let inside = p.starts_with("/sys/fs/cgroup") && p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !inside || p.components().count() < 5 {
                return Err(Error::Corrupt(format!("cgroup path {p:?} of {ctrl:?} is not a cgroup under /sys/fs/cgroup")));
            }
            Ok((ctrl.clone(), p))
        })
        .collect()
}

/// How a direct restore failed.
pub enum Failure {
    /// Before CRIU was asked to restore: nothing was restored, runc may
    /// restore instead (`stdio` was not used).
    Setup(Error, ProcessStdio),
    /// CRIU's restore failed (what it restored is gone, and what this
    /// restore set up).
    Restore(Error),
}

/// The restore from `from` of the container of template `t` (runc state
/// directory `state_dir`), with `stdio`: the restored init's pid, also
/// written to `pid_file`.
pub async fn restore(
    t: Template,
    state_dir: &Path,
    from: &RestoreFrom,
    pid_file: &Path,
    stdio: ProcessStdio,
) -> std::result::Result<i32, Failure> {
    let deadline = match reaper::deadline_from_env(crate::system::runc::CRIU_DEADLINE_ENV, crate::system::runc::CRIU_DEADLINE) {
        Ok(d) => d,
        Err(e) => return Err(Failure::Setup(e, stdio)),
    };
    let criu = match criu::check().await {
        Ok(c) => c.bin.clone(),
        Err(e) => return Err(Failure::Setup(e, stdio)),
    };
    let mut run = Run {
        state_dir: state_dir.to_path_buf(),
        made_state_dir: false,
        criu_root: None,
        cgroups: Vec::new(),
        made: Vec::new(),
        cgroups_path: t.config()["cgroups"]["path"].as_str().map(str::to_string),
    };
    let prepared = match run.prepare(&t, from) {
        Ok(p) => p,
        Err(e) => {
            run.undo(false).await;
            return Err(Failure::Setup(e, stdio));
        }
    };
    let result = run.exchange(&t, from, prepared, &criu, stdio, deadline).await;
    match result {
        Ok((pid, criu_ending)) => {
            // CRIU's own end (its answer, the cgroup yard it unmounts, its
            // exit) and criu-root's unmount are off the resume's path.
            let root = run.criu_root.take();
            let ending = tokio::spawn(async move {
                criu_ending.wait().await;
                unmount_root(root);
            });
            let mut endings = lock_endings();
            // Those done are dropped: a shim that restores and never
            // suspends again does not keep a handle per restore.
            endings.retain(|h| !h.is_finished());
            endings.push(ending);
            if let Err(e) = std::fs::write(pid_file, pid.to_string()) {
                warn!(file = %pid_file.display(), "write the restored init's pid file: {e}");
            }
            Ok(pid)
        }
        Err(e) => {
            run.undo(true).await;
            Err(Failure::Restore(e.context(&format!("CRIU restore from {}", from.image.display()))))
        }
    }
}

/// What a restore of the container with runc state directory `state_dir`
/// left when its shim died during it (the shim, not runc, held it): the
/// rootfs on `criu-root`, and the state directory while no state was
/// written. Run by the cleanup after a shim's death, and before a restore.
pub fn remove_leftovers(state_dir: &Path) {
    let root = state_dir.join("criu-root");
    if !root.exists() {
        return;
    }
    mounts::detach_under(state_dir);
    if let Err(e) = std::fs::remove_dir(&root) {
        warn!(dir = %root.display(), "remove the criu-root a killed restore left: {e}");
    }
    if !state_dir.join("state.json").exists() {
        if let Err(e) = std::fs::remove_dir_all(state_dir) {
            warn!(dir = %state_dir.display(), "remove the runc state directory a killed restore left: {e}");
        }
    }
}

/// What a direct restore set up, undone when it fails.
struct Run {
    state_dir: PathBuf,
    made_state_dir: bool,
    criu_root: Option<PathBuf>,
    /// The container's cgroup directories, one per hierarchy.
    cgroups: Vec<PathBuf>,
    /// Those of them made here.
    made: Vec<PathBuf>,
    /// Its cgroup (OCI cgroupsPath), for killing what a failed restore left.
    cgroups_path: Option<String>,
}

/// Opened for the request: directories and namespace files CRIU reads
/// through the shim's descriptors.
struct Prepared {
    images: File,
    work: File,
    /// Inherited namespaces, passed as 4, 5, ...
    namespaces: Vec<File>,
    opts: Criu_opts,
}

impl Run {
    /// runc's state directory, the rootfs on `criu-root`, the cgroups with
    /// their values, and the request's options (without the cgroup roots,
    /// known once CRIU joined them).
    fn prepare(&mut self, t: &Template, from: &RestoreFrom) -> Result<Prepared> {
        let c = t.config();
        if self.state_dir.join("state.json").exists() {
            return Err(Error::AlreadyExists(format!("runc state {:?} (a container runs under the id)", self.state_dir)));
        }
        // A restore of this container whose shim was killed during it.
        remove_leftovers(&self.state_dir);
        {
            use std::os::unix::fs::DirBuilderExt;
            let made = std::fs::DirBuilder::new().mode(0o711).create(&self.state_dir);
            match made {
                Ok(()) => self.made_state_dir = true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).io_context(|| format!("create {:?}", self.state_dir)),
            }
        }
        let rootfs = PathBuf::from(c["rootfs"].as_str().unwrap_or_default());
        let root = self.state_dir.join("criu-root");
        std::fs::create_dir(&root).io_context(|| format!("create {root:?}"))?;
        self.criu_root = Some(root.clone());
        nix::mount::mount(Some(&rootfs), &root, None::<&str>, nix::mount::MsFlags::MS_BIND | nix::mount::MsFlags::MS_REC, None::<&str>)
            .map_err(|source| Error::Sys { context: format!("bind {rootfs:?} on {root:?}"), source })?;
        self.make_cgroups(t)?;

        std::fs::create_dir_all(&from.work).io_context(|| format!("create {:?}", from.work))?;
        let images = File::open(&from.image).io_context(|| format!("open {:?}", from.image))?;
        let work = File::open(&from.work).io_context(|| format!("open {:?}", from.work))?;
        let mut opts = Criu_opts::new();
        opts.set_images_dir_fd(images.as_raw_fd());
        opts.set_work_dir_fd(work.as_raw_fd());
        opts.set_evasive_devices(true);
        opts.set_log_level(4);
        opts.set_log_file("restore.log".into());
        opts.set_rst_sibling(true);
        opts.set_root(root.to_string_lossy().into_owned());
        opts.set_manage_cgroups(true);
        opts.set_notify_scripts(true);
        opts.set_shell_job(false);
        opts.set_ext_unix_sk(false);
        opts.set_tcp_established(true);
        opts.set_file_locks(false);
        opts.set_empty_ns(libc::CLONE_NEWNET as u32);
        opts.set_orphan_pts_master(true);
        opts.set_auto_dedup(false);
        opts.set_lazy_pages(from.lazy);
        let labels: Vec<&str> = c["labels"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        match labels.iter().find_map(|l| l.strip_prefix("org.criu.config=")) {
            Some("") => {}
            Some(f) => opts.set_config_file(f.to_string()),
            None => opts.set_config_file("/etc/criu/runc.conf".into()),
        }
        let mut namespaces = Vec::new();
        for (ty, path) in t.namespaces() {
            if path.is_empty() {
                continue;
            }
            match ty {
                "NEWNET" | "NEWPID" => {
                    let key = if ty == "NEWNET" { "extRootNetNS" } else { "extRootPidNS" };
                    let f = File::open(path).io_context(|| format!("open the container's namespace {path:?}"))?;
                    let mut i = Inherit_fd::new();
                    i.set_key(key.into());
                    i.set_fd(4 + namespaces.len() as i32);
                    opts.inherit_fd.push(i);
                    namespaces.push(f);
                }
                other => {
                    let mut j = Join_namespace::new();
                    j.set_ns(ns_name(other)?.into());
                    j.set_ns_file(path.into());
                    opts.join_ns.push(j);
                }
            }
        }
        let mut ext = |key: &str, val: &str| {
            let mut m = Ext_mount_map::new();
            m.set_key(key.into());
            m.set_val(val.into());
            opts.ext_mnt.push(m);
        };
        for m in c["mounts"].as_array().into_iter().flatten() {
            let (Some(device), Some(source), Some(dest)) = (m["device"].as_str(), m["source"].as_str(), m["destination"].as_str()) else {
                return Err(Error::Corrupt(format!("mount {m} of the restore template lacks a device, source or destination")));
            };
            match device {
                "bind" => ext(&clean_destination(dest, &rootfs)?, source),
                "cgroup" => {
                    for (d, s) in cgroup_v1_binds(dest)? {
                        ext(&d, &s);
                    }
                }
                _ => {}
            }
        }
        if c["mask_paths"].as_array().is_some_and(|m| !m.is_empty()) {
            ext("/dev/null", "/dev/null");
        }
        for d in c["devices"].as_array().into_iter().flatten() {
            if let Some(p) = d["path"].as_str() {
                ext(&clean_destination(p, &rootfs)?, p);
            }
        }
        let fds_file = from.image.join("descriptors.json");
        let text = std::fs::read(&fds_file).io_context(|| format!("read {fds_file:?}"))?;
        let fds: Vec<String> =
            serde_json::from_slice(&text).map_err(|source| Error::Json { context: format!("parse {fds_file:?}"), source })?;
        for (n, key) in fds.iter().enumerate().take(3) {
            if key.contains("pipe:") {
                let mut i = Inherit_fd::new();
                i.set_key(key.clone());
                i.set_fd(n as i32);
                opts.inherit_fd.push(i);
            }
        }
        Ok(Prepared { images, work, namespaces, opts })
    }

    /// The container's cgroups, made with the values of the template (as
    /// runc's `Apply` and `Set` before a restore).
    fn make_cgroups(&mut self, t: &Template) -> Result<()> {
        let paths = cgroup_paths(&t.state)?;
        // cpuset first: CRIU cannot join one without CPUs.
        let order = |ctrl: &str| if ctrl == "cpuset" { 0 } else { 1 };
        let mut paths = paths;
        paths.sort_by_key(|(c, _)| order(c));
        for (ctrl, dir) in paths {
            if !dir.exists() {
                std::fs::create_dir(&dir).io_context(|| format!("create cgroup {dir:?}"))?;
                self.made.push(dir.clone());
            }
            self.cgroups.push(dir.clone());
            let Some(values) = t.cgroup.get(&ctrl) else { continue };
            let hugetlb = values.keys().filter(|f| ctrl == "hugetlb" && is_hugetlb_limit(f)).map(String::as_str);
            for f in carried_files(&ctrl).iter().copied().filter(|f| *f != "devices.list").chain(hugetlb) {
                let Some(want) = values.get(f) else { continue };
                let path = dir.join(f);
                if files::read(&path)?.trim() != want.trim() {
                    files::write(&path, want.trim())?;
                }
            }
            if ctrl == "devices" {
                if let Some(want) = values.get("devices.list") {
                    if files::read(&dir.join("devices.list"))? != *want {
                        files::write(&dir.join("devices.deny"), "a")?;
                        for rule in want.lines().filter(|l| !l.trim().is_empty()) {
                            files::write(&dir.join("devices.allow"), rule)?;
                        }
                    }
                }
            }
            if ctrl == "memory" && t.oom_kill_disable {
                files::write(&dir.join("memory.oom_control"), "1")?;
            }
        }
        Ok(())
    }

    /// Starts CRIU, puts it in the cgroups, sends the request and answers
    /// its notifications (runc's state written on `post-restore`) until
    /// the restored tasks run: the restored init's pid, and CRIU to wait
    /// for (it still answers the request and exits).
    async fn exchange(
        &mut self,
        t: &Template,
        from: &RestoreFrom,
        p: Prepared,
        criu: &Path,
        stdio: ProcessStdio,
        deadline: Duration,
    ) -> Result<(i32, CriuEnding)> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let started = Instant::now();
        let (client, server) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|source| Error::Sys { context: "socketpair for CRIU".into(), source })?;
        let mut cmd = std::process::Command::new(criu);
        cmd.args(["swrk", "3"]).stdin(stdio.stdin).stdout(stdio.stdout).stderr(stdio.stderr);
        // Not in the shim's process group (signals to it are not CRIU's).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let Prepared { images, work, namespaces, mut opts } = p;
        // The RPC socket as 3, the namespaces from 4, the inherited files
        // from FIRST_INHERITED_FD (as the CRIU configuration names them).
        let mut passed: Vec<Arc<OwnedFd>> = vec![Arc::new(server)];
        passed.extend(namespaces.into_iter().map(|f| Arc::new(OwnedFd::from(f))));
        let mut targets: Vec<i32> = (3..).take(passed.len()).collect();
        passed.extend(from.inherit.iter().map(|i| i.fd.clone()));
        targets.extend((FIRST_INHERITED_FD..).take(from.inherit.len()));
        reaper::pass_fds_at(&mut cmd, passed, targets);
        let mut sub = reaper::subscribe();
        reaper::tag(&mut cmd);
        let child = cmd.spawn().io_context(|| format!("spawn {} swrk", criu.display()))?;
        let criu_pid = child.id() as i32;
        drop(cmd); // our copies of its stdio and descriptors
        drop(child); // reaped by the reaper
        let talked = async {
            self.join_cgroups(criu_pid)?;
            for (ctrl, rel) in cgroup::controllers_of(Path::new(&format!("/proc/{criu_pid}/cgroup")))? {
                let mut r = Cgroup_root::new();
                r.set_ctrl(ctrl);
                r.set_path(Path::new("/").join(rel).to_string_lossy().into_owned());
                opts.cg_root.push(r);
            }
            let mut external = Vec::new();
            for n in 0..3 {
                let l = format!("/proc/{criu_pid}/fd/{n}");
                external.push(std::fs::read_link(&l).io_context(|| format!("read link {l}"))?.to_string_lossy().into_owned());
            }
            let mut req = Criu_req::new();
            req.set_type(Criu_req_type::RESTORE);
            req.opts = protobuf::MessageField::some(opts);
            let request = req.write_to_bytes().map_err(|e| Error::InvalidArgument(format!("encode CRIU's restore request: {e}")))?;
            let lazy = from.lazy_daemon.map(|pid| (from.work.join("lazy-pages.socket"), pid));
            let state = StateWriter { dir: self.state_dir.clone(), template: t.state.clone(), external };
            let until = started + deadline;
            let sock = client.try_clone().io_context(|| "duplicate the CRIU socket".into())?;
            tokio::task::spawn_blocking(move || talk(&sock, &request, lazy, &state, until))
                .await
                .map_err(|e| Error::InvalidArgument(format!("the CRIU exchange's thread: {e}")))?
        };
        let pid = match talked.await {
            Ok(pid) => pid,
            Err(e) => {
                drop(client);
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(criu_pid), nix::sys::signal::Signal::SIGKILL);
                let _ = tokio::time::timeout(Duration::from_secs(10), sub.wait_for(criu_pid)).await;
                return Err(e);
            }
        };
        let ending = CriuEnding {
            pid: criu_pid,
            exit: sub,
            held: (client, images, work),
            until: started + deadline,
            log: from.work.join("restore.log"),
        };
        Ok((pid, ending))
    }

    /// CRIU `pid` joins every cgroup of the container (runc's `Apply`).
    fn join_cgroups(&self, pid: i32) -> Result<()> {
        for dir in &self.cgroups {
            files::write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Undoes what the restore set up: what runs in the container's
    /// cgroups is killed (`restored`: CRIU may have left some), the cgroups
    /// made here and runc's state go.
    async fn undo(&mut self, restored: bool) {
        unmount_root(self.criu_root.take());
        if restored {
            if let Some(p) = &self.cgroups_path {
                crate::system::cgroup::kill_cgroup(p).await;
            }
        }
        for dir in self.made.iter().rev() {
            if let Err(e) = std::fs::remove_dir(dir) {
                warn!(cgroup = %dir.display(), "remove the cgroup of a failed restore: {e}");
            }
        }
        self.made.clear();
        let state = self.state_dir.join("state.json");
        if let Err(e) = std::fs::remove_file(&state) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(file = %state.display(), "remove runc's state of a failed restore: {e}");
            }
        }
        if self.made_state_dir {
            if let Err(e) = std::fs::remove_dir_all(&self.state_dir) {
                warn!(dir = %self.state_dir.display(), "remove runc's state directory of a failed restore: {e}");
            }
        }
    }
}

/// The background ends of this process's restores ([`CriuEnding`]).
static ENDINGS: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>> = std::sync::Mutex::new(Vec::new());

fn lock_endings() -> std::sync::MutexGuard<'static, Vec<tokio::task::JoinHandle<()>>> {
    ENDINGS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Until the CRIU of every restore done so far has exited and its
/// criu-root is unmounted: a CRIU still in a container's cgroups must not
/// meet that container's next dump (its freezer) or kill.
pub async fn wait_ended() {
    let pending: Vec<_> = std::mem::take(&mut *lock_endings());
    for h in pending {
        let _ = h.await;
    }
}

/// Whether a restore's CRIU may not have exited yet ([`wait_ended`]).
pub fn ending() -> bool {
    lock_endings().iter().any(|h| !h.is_finished())
}

/// `criu-root` goes: CRIU is done with it.
fn unmount_root(root: Option<PathBuf>) {
    let Some(root) = root else { return };
    if let Err(e) = nix::mount::umount2(&root, nix::mount::MntFlags::MNT_DETACH) {
        if e != nix::errno::Errno::EINVAL {
            warn!(dir = %root.display(), "unmount criu-root: {e}");
        }
    }
    if let Err(e) = std::fs::remove_dir(&root) {
        warn!(dir = %root.display(), "remove criu-root: {e}");
    }
}

/// A CRIU whose restored tasks run (its `post-resume` notification was
/// answered) and which is left to end: it answers the request, releases
/// its cgroup yard and exits. Its RPC socket and the image and work
/// directories it was given stay open until then.
struct CriuEnding {
    pid: i32,
    exit: reaper::Subscription,
    held: (OwnedFd, File, File),
    /// When it must have exited.
    until: Instant,
    log: PathBuf,
}

impl CriuEnding {
    /// Until CRIU has exited (killed at its deadline); what it should not
    /// have done is logged: the restored tasks already run.
    async fn wait(mut self) {
        let left = self.until.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        match tokio::time::timeout(left, self.exit.wait_for(self.pid)).await {
            Ok(0) => {}
            Ok(status) => {
                warn!(pid = self.pid, "criu swrk ended with status {status} after the tasks it restored were resumed (see {:?})", self.log)
            }
            Err(_) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGKILL);
                warn!(
                    pid = self.pid,
                    "criu swrk had not ended {left:?} after the tasks it restored were resumed; killed (see {:?})", self.log
                );
            }
        }
        drop(self.held);
    }
}

/// runc's `state.json` of the restored container, from the template.
struct StateWriter {
    dir: PathBuf,
    template: Value,
    /// What CRIU's stdio 0, 1, 2 are (`pipe:[N]`, `/dev/null`): the next
    /// checkpoint's `descriptors.json`.
    external: Vec<String>,
}

impl StateWriter {
    /// Written for the restored init `pid` (runc's `updateState`).
    fn write(&self, pid: i32) -> Result<()> {
        let state = restored_state(&self.template, pid, process_start(pid)?, &self.external, &rfc3339_now())?;
        let bytes = serde_json::to_vec(&state).map_err(|source| Error::Json { context: "encode runc's state".into(), source })?;
        write_private(&self.dir.join("state.json"), &bytes)
    }
}

/// The template's runc state for the restored init `pid` started at
/// `start` (clock ticks since boot): its pid, start time, creation time,
/// namespace paths and external descriptors.
fn restored_state(template: &Value, pid: i32, start: u64, external: &[String], created: &str) -> Result<Value> {
    let mut s = template.clone();
    s["init_process_pid"] = pid.into();
    s["init_process_start"] = start.into();
    s["created"] = created.into();
    s["external_descriptors"] = external.into();
    if let Some(paths) = s["namespace_paths"].as_object_mut() {
        for (ty, v) in paths.iter_mut() {
            // runc's state names /proc/<init>/ns/<name> for every type.
            let name = v.as_str().and_then(|p| p.rsplit_once("/ns/")).map(|(_, n)| n.to_string());
            let name = name.ok_or_else(|| Error::Corrupt(format!("namespace path of {ty} in the restore template: {v}")))?;
            *v = format!("/proc/{pid}/ns/{name}").into();
        }
    }
    Ok(s)
}

/// Field 22 of `/proc/<pid>/stat`: when the process started.
fn process_start(pid: i32) -> Result<u64> {
    let f = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&f).io_context(|| format!("read {f}"))?;
    // The command name (field 2) may hold anything but ends at the last ')'.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    rest.split_whitespace().nth(19).and_then(|v| v.parse().ok()).ok_or_else(|| Error::Corrupt(format!("{f} has no start time: {text:?}")))
}

/// Now, as Go's JSON encodes a UTC time (RFC 3339 with nanoseconds).
fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339(now.as_secs(), now.subsec_nanos())
}

fn rfc3339(secs: u64, nanos: u32) -> String {
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z", sod / 3600, sod % 3600 / 60, sod % 60)
}

/// The request/notification exchange with CRIU on `sock` (blocking, until
/// `until`): the restored init's pid. A lazy restore's request waits for
/// its daemon to listen (`lazy`: socket and daemon pid).
fn talk(sock: &OwnedFd, request: &[u8], lazy: Option<(PathBuf, i32)>, state: &StateWriter, until: Instant) -> Result<i32> {
    use nix::sys::socket::{recv, send, setsockopt, sockopt::ReceiveTimeout, MsgFlags};
    if let Some((socket, pid)) = lazy {
        criu_launcher::wait_listening(&socket, Some(pid));
    }
    send(sock.as_raw_fd(), request, MsgFlags::empty())
        .map_err(|source| Error::Sys { context: "send CRIU's restore request".into(), source })?;
    let mut restored = None;
    let mut buf = vec![0u8; 10 * 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Io {
                context: "CRIU did not answer within the restore's deadline".into(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline exceeded"),
            });
        }
        setsockopt(sock, ReceiveTimeout, &nix::sys::time::TimeVal::new(left.as_secs() as i64, left.subsec_micros() as i64))
            .map_err(|source| Error::Sys { context: "set the CRIU socket's timeout".into(), source })?;
        let n = match recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => continue, // the loop checks the deadline
            Err(source) => return Err(Error::Sys { context: "read CRIU's answer".into(), source }),
        };
        if n == 0 {
            return Err(Error::InvalidArgument("CRIU closed its socket before answering the restore (it died?)".into()));
        }
        if n == buf.len() {
            return Err(Error::InvalidArgument(format!("CRIU's answer is {n} bytes or more: too long")));
        }
        let resp =
            Criu_resp::parse_from_bytes(&buf[..n]).map_err(|e| Error::InvalidArgument(format!("CRIU's answer does not parse: {e}")))?;
        if !resp.success() {
            return Err(Error::InvalidArgument(format!("criu failed: type {:?} errno {}", resp.type_(), resp.cr_errno())));
        }
        match resp.type_() {
            Criu_req_type::NOTIFY => {
                let script = resp.notify.script().to_string();
                debug!(script = script.as_str(), "CRIU notification");
                match script.as_str() {
                    "post-restore" => {
                        let pid = resp.notify.pid();
                        if pid <= 0 {
                            return Err(Error::InvalidArgument(format!("CRIU's post-restore notification names pid {pid}")));
                        }
                        state.write(pid)?;
                        restored = Some(pid);
                    }
                    "orphan-pts-master" => {
                        return Err(Error::FailedPrecondition("the dump holds a terminal: only runc restores it".into()))
                    }
                    _ => {}
                }
                let mut ack = Criu_req::new();
                ack.set_type(Criu_req_type::NOTIFY);
                ack.set_notify_success(true);
                let bytes =
                    ack.write_to_bytes().map_err(|e| Error::InvalidArgument(format!("encode a CRIU notification's answer: {e}")))?;
                send(sock.as_raw_fd(), &bytes, MsgFlags::empty())
                    .map_err(|source| Error::Sys { context: "answer CRIU's notification".into(), source })?;
                // The restored tasks run: CRIU has nothing left that can
                // fail them (its answer to the request follows).
                if script == "post-resume" {
                    if let Some(pid) = restored {
                        return Ok(pid);
                    }
                }
            }
            Criu_req_type::RESTORE => {
                return restored.ok_or_else(|| Error::InvalidArgument("CRIU restored without a post-restore notification".into()));
            }
            other => return Err(Error::InvalidArgument(format!("CRIU answered a restore with {other:?}"))),
        }
    }
}

/// A cgroup v1 mount at `dest` in the container, as runc restores it: a
/// bind of each host hierarchy (at `dest/<name>`) from this process's own
/// cgroup there: (destination, source).
fn cgroup_v1_binds(dest: &str) -> Result<Vec<(String, String)>> {
    let own = cgroup::controllers_of(Path::new("/proc/self/cgroup"))?;
    let mut seen: BTreeMap<String, bool> = own.iter().filter(|(c, _)| !c.is_empty()).map(|(c, _)| (c.clone(), false)).collect();
    let mut binds = Vec::new();
    for m in mounts::mountinfo("/proc/self/mountinfo")?.into_iter().filter(|m| m.fstype == "cgroup") {
        let mut subsystems = Vec::new();
        for opt in m.super_options.split(',') {
            if let Some(s) = seen.get_mut(opt) {
                if !*s {
                    *s = true;
                    subsystems.push(opt.to_string());
                }
            }
        }
        let Some(first) = subsystems.first() else { continue };
        let Some((_, cg)) = own.iter().find(|(c, _)| c == first) else { continue };
        let rel = Path::new("/").join(cg).strip_prefix(&m.root).map(Path::to_path_buf).unwrap_or_default();
        let source = Path::new(&m.mount_point).join(rel);
        let base = Path::new(&m.mount_point).file_name().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default();
        binds.push((Path::new(dest).join(base).to_string_lossy().into_owned(), source.to_string_lossy().into_owned()));
        if seen.values().all(|s| *s) {
            break;
        }
    }
    Ok(binds)
}

/// A mount destination as CRIU's key: absolute in the container, without
/// the rootfs prefix, `.` and `..` resolved lexically inside it.
fn clean_destination(dest: &str, rootfs: &Path) -> Result<String> {
    let d = Path::new(dest).strip_prefix(rootfs).map(|r| Path::new("/").join(r)).unwrap_or_else(|_| PathBuf::from(dest));
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in d.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut out = PathBuf::from("/");
    out.extend(parts);
    out.to_str().map(str::to_string).ok_or_else(|| Error::Corrupt(format!("mount destination {dest:?} is not UTF-8")))
}

/// runc's namespace type → the name CRIU and /proc use.
fn ns_name(ty: &str) -> Result<&'static str> {
    Ok(match ty {
        "NEWNET" => "net",
        "NEWPID" => "pid",
        "NEWNS" => "mnt",
        "NEWIPC" => "ipc",
        "NEWUTS" => "uts",
        "NEWUSER" => "user",
        "NEWCGROUP" => "cgroup",
        "NEWTIME" => "time",
        other => return Err(Error::Corrupt(format!("namespace type {other:?} in the restore template"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_follows_the_restored_init() {
        let t = serde_json::json!({
            "id": "c", "init_process_pid": 10, "init_process_start": 5, "created": "x",
            "namespace_paths": {"NEWNET": "/proc/10/ns/net", "NEWPID": "/proc/10/ns/pid"},
            "external_descriptors": ["/dev/null"], "config": {"rootfs": "/r"}
        });
        let s = restored_state(&t, 42, 99, &["pipe:[7]".into(), "/dev/null".into(), "pipe:[8]".into()], "2026-12-05T00:00:00.000000000Z")
            .unwrap();
        assert_eq!(s["init_process_pid"], 42);
        assert_eq!(s["init_process_start"], 99);
        assert_eq!(s["namespace_paths"]["NEWNET"], "/proc/42/ns/net");
        assert_eq!(s["namespace_paths"]["NEWPID"], "/proc/42/ns/pid");
        assert_eq!(s["external_descriptors"][0], "pipe:[7]");
        assert_eq!(s["config"]["rootfs"], "/r");
        let bad = serde_json::json!({"namespace_paths": {"NEWNET": "net"}});
        assert!(restored_state(&bad, 1, 1, &[], "x").is_err());
    }

    #[test]
    fn time_is_formatted_as_go_does() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(1_796_464_409, 123_456_789), "2026-12-05T09:53:29.123456789Z");
        assert_eq!(rfc3339(951_782_400, 1), "2000-02-29T00:00:00.000000001Z");
    }

    #[test]
    fn destinations_stay_inside_the_container() {
        let r = Path::new("/b/rootfs");
        assert_eq!(clean_destination("/etc/hosts", r).unwrap(), "/etc/hosts");
        assert_eq!(clean_destination("/b/rootfs/dev/null", r).unwrap(), "/dev/null");
        assert_eq!(clean_destination("/../../etc/./x", r).unwrap(), "/etc/x");
    }

    #[test]
    fn an_update_while_suspended_is_carried_into_the_template() {
        let b = tempfile::tempdir().unwrap();
        let state = serde_json::json!({"id": "c", "cgroup_paths": {"memory": "/sys/fs/cgroup/memory/pod/c", "cpu": "/sys/fs/cgroup/cpu/pod/c"},
            "config": {"rootfs": "/b/rootfs", "cgroups": {"Systemd": false, "cpu_shares": 512, "memory": 134217728, "devices": []}}});
        let cgroup: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_value(serde_json::json!({
            "cpu": {"cpu.shares": "512\n", "cpu.cfs_period_us": "100000\n", "cpu.cfs_quota_us": "50000\n"},
            "memory": {"memory.limit_in_bytes": "134217728\n", "memory.soft_limit_in_bytes": "9223372036854771712\n"}
        }))
        .unwrap();
        let t = Template { state, cgroup, oom_kill_disable: false };
        std::fs::write(b.path().join(TEMPLATE), serde_json::to_vec(&t).unwrap()).unwrap();
        let u = resources::RuncUpdate::parse(
            br#"{"cpu":{"shares":10,"quota":50000,"period":100000},"memory":{"limit":134217728,"swap":134217728},"devices":[]}"#,
        )
        .unwrap();
        assert!(update_template(b.path(), &u).unwrap());
        let t: Template = serde_json::from_slice(&std::fs::read(b.path().join(TEMPLATE)).unwrap()).unwrap();
        assert_eq!(t.cgroup["cpu"]["cpu.shares"], "10");
        assert_eq!(t.cgroup["cpu"]["cpu.cfs_quota_us"], "50000");
        assert_eq!(t.cgroup["memory"]["memory.limit_in_bytes"], "134217728");
        assert!(!t.cgroup["memory"].contains_key("memory.memsw.limit_in_bytes"), "no swap accounting, no memsw");
        assert!(!t.cgroup.contains_key("cpuset"), "no cgroup of a controller the container had none of");
        assert_eq!(t.state["config"]["cgroups"]["cpu_shares"], 10);
        assert_eq!(t.state["config"]["cgroups"]["memory_swap"], 134217728);
        assert_eq!(t.state["config"]["cgroups"]["devices"], serde_json::json!([]), "the rest stays");

        // One it cannot carry: the template goes, the restore is runc's.
        let rt = resources::RuncUpdate::parse(br#"{"cpu":{"realtimeRuntime":1000}}"#).unwrap();
        assert!(!update_template(b.path(), &rt).unwrap());
        assert!(!b.path().join(TEMPLATE).exists());
        assert!(!update_template(b.path(), &u).unwrap(), "no template, nothing to carry");
    }

    #[test]
    fn templates_of_other_containers_or_with_hooks_are_refused() {
        let cg = "/sys/fs/cgroup/memory/pod/c";
        let state = |id: &str, hooks: Value| {
            serde_json::json!({"id": id, "cgroup_paths": {"memory": cg},
                "config": {"rootfs": "/b/rootfs", "labels": ["bundle=/b"], "Hooks": hooks, "cgroups": {"Systemd": false},
                    "namespaces": [{"type": "NEWNET", "path": "/proc/1/ns/net"}]}})
        };
        let t = |s| Template { state: s, cgroup: BTreeMap::new(), oom_kill_disable: false };
        assert!(t(state("c", Value::Null)).check("c", Path::new("/b")).is_ok());
        assert!(t(state("d", Value::Null)).check("c", Path::new("/b")).is_err());
        assert!(t(state("c", Value::Null)).check("c", Path::new("/other")).is_err());
        assert!(t(state("c", serde_json::json!({"prestart": [{"path": "/bin/true"}]}))).check("c", Path::new("/b")).is_err());
        let mut outside = state("c", Value::Null);
        outside["cgroup_paths"]["memory"] = "/sys/fs/cgroup/../../etc".into();
        assert!(t(outside).check("c", Path::new("/b")).is_err());
    }
}
