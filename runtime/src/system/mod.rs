//! System drivers: the commands and kernel interfaces the runtime drives.
//! Nothing here knows about actors or containerd; nothing imports a layer
//! above (`oci`, `task`, `actor`, `lifecycle`, `trigger`).
//!
//! - [`reaper`]: the one SIGCHLD reaper every child process goes through;
//! - [`runc`]: the runc (and, through it, CRIU) command driver, bound to
//!   containerd's runtime options ([`runc_options`]);
//! - [`criu`]: the CRIU version check;
//! - [`criu_launcher`]: the `criu` runc runs, in front of the real one
//!   (answers its VERSION requests);
//! - [`criu_restore`]: a restore driven over CRIU's RPC without runc, into
//!   runc's state;
//! - [`cgroup`]: a container's cgroup on v1 or v2, under either runc driver:
//!   OOM kills, memory and CPU use, the freezer, killing what is left;
//! - [`resources`]: an update's resources (containerd's `Update`) kept
//!   for a suspended container: its `config.json`, its restore template;
//! - [`stdio`]: containerd's FIFOs ↔ a process's pipes or pty;
//! - [`rootfs`]: a container's rootfs changes as an OCI layer changeset;
//! - [`tmpfs`]: the container's own tmpfs mounts, carried beside CRIU's
//!   images instead of by CRIU's tar;
//! - [`netns`]: ports, iptables and CRIU's network lock in the pod's netns;
//! - [`held_ports`]: listeners held for a sleeping actor, probes answered,
//!   connections handed over;
//! - [`sleeping_connections`]: a sleeping actor's TCP connections, kept
//!   (their packets dropped, never reset) and watched (they wake it);
//! - [`heap`]: the process's own allocator, kept small while actors sleep;
//! - [`mounts`]: mountinfo, and mounts a killed CRIU left below a
//!   directory, detached;
//! - [`pidfd`]: another process's open files, taken through its pidfd;
//! - [`sysv_ipc`]: the SysV IPC objects a dump left in the pod's IPC
//!   namespace, removed (the restore creates them anew);
//! - [`unix_links`]: unix connections between the containers of a pod;
//! - [`writeback`]: a dump's files handed to the disk while CRIU writes them.

pub mod activity;
pub mod cgroup;
pub mod criu;
pub mod criu_launcher;
pub mod criu_restore;
pub mod heap;
pub mod held_ports;
pub mod mounts;
pub mod netns;
pub mod pidfd;
pub mod reaper;
pub mod resources;
pub mod rootfs;
pub mod runc;
pub mod runc_options;
pub mod sleeping_connections;
pub mod stdio;
pub mod sysv_ipc;
pub mod tmpfs;
pub mod unix_links;
pub mod writeback;
