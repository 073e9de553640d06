//! Everything containerd's `Stats` reports of a container, read from its
//! cgroup's files in the shim's own process: what `runc events --stats`
//! reads, without a runc process for each of containerd's requests (its CRI
//! collects every running container's stats once a second).
//!
//! | what | v2 (unified) | v1 |
//! | --- | --- | --- |
//! | CPU by mode | `cpu.stat` `user_usec`, `system_usec` | `cpuacct.stat` (clock ticks) |
//! | CPU by CPU | — | `cpuacct.usage_percpu` |
//! | memory peak, limit hits | `memory.peak`, `memory.events` `max` | `memory.max_usage_in_bytes`, `memory.failcnt` |
//! | swap | `memory.swap.current`, `memory.swap.max` | `memory.memsw.*` (memory + swap) |
//! | kernel memory | — | `memory.kmem.*`, `memory.kmem.tcp.*` |
//! | pids | `pids.current`, `pids.max` | the same |
//!
//! A file the kernel does not have (no swap accounting, a kernel without
//! kmem counters, no pids controller, the root's `pids.max`) reads as
//! zeros or no limit, as runc reports it.

use std::path::Path;

use super::{files, v2_cpu, Cgroup, CpuStats, MemoryStats};
use crate::error::{Error, Result};

/// A page counter (v1 `usage_in_bytes`, `max_usage_in_bytes`,
/// `limit_in_bytes`, `failcnt`), bytes; `limit` `None` for none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    pub usage: u64,
    pub max: u64,
    pub limit: Option<u64>,
    pub failcnt: u64,
}

/// The process count and its limit (`None` for none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pids {
    pub current: u64,
    pub limit: Option<u64>,
}

/// A cgroup's statistics: all zero for a container without processes
/// (a suspended actor's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub cpu: CpuStats,
    /// CPU time in user and kernel mode, ns.
    pub cpu_user_ns: u64,
    pub cpu_kernel_ns: u64,
    /// CPU time by CPU, ns (v1 only).
    pub per_cpu_ns: Vec<u64>,
    pub memory: MemoryStats,
    /// The memory counter's peak and how often the limit was hit.
    pub memory_max: u64,
    pub memory_failcnt: u64,
    /// v1: memory + swap (`memsw`); v2: swap alone.
    pub swap: Counter,
    pub kernel: Counter,
    pub kernel_tcp: Counter,
    pub pids: Pids,
}

impl Cgroup {
    /// Its statistics now.
    pub fn stats(&self) -> Result<Stats> {
        let memory = self.memory()?;
        let pids = self.pids()?;
        let s = match self {
            Cgroup::V2(d) => {
                // cpu.stat read once: the totals and the split by mode.
                let cpu_file = d.join("cpu.stat");
                let cpu_stat = files::keyed(&files::read(&cpu_file)?);
                let cpu = v2_cpu(&cpu_file, &cpu_stat)?;
                let usec = |k: &str| cpu_stat.get(k).copied().unwrap_or(0).saturating_mul(1000);
                let limit_hits = match present(files::read(&d.join("memory.events")))? {
                    Some(text) => files::keyed(&text).get("max").copied().unwrap_or(0),
                    None => 0,
                };
                let swap = match present(files::number(&d.join("memory.swap.current")))? {
                    Some(usage) => Counter { usage, limit: files::limit(&d.join("memory.swap.max"))?, ..Default::default() },
                    None => Counter::default(),
                };
                Stats {
                    cpu,
                    cpu_user_ns: usec("user_usec"),
                    cpu_kernel_ns: usec("system_usec"),
                    per_cpu_ns: Vec::new(),
                    memory,
                    memory_max: present(files::number(&d.join("memory.peak")))?.unwrap_or(0),
                    memory_failcnt: limit_hits,
                    swap,
                    kernel: Counter::default(),
                    kernel_tcp: Counter::default(),
                    pids,
                }
            }
            Cgroup::V1(_) => {
                let cpu = self.cpu()?;
                let acct = self.dir("cpuacct")?;
                let ticks = files::keyed(&files::read(&acct.join("cpuacct.stat"))?);
                let ns_per_tick = ns_per_clock_tick()?;
                let tick_ns = |k: &str| ticks.get(k).copied().unwrap_or(0).saturating_mul(ns_per_tick);
                let per_cpu_file = acct.join("cpuacct.usage_percpu");
                let per_cpu_ns = match present(files::read(&per_cpu_file))? {
                    Some(text) => per_cpu(&per_cpu_file, &text)?,
                    None => Vec::new(),
                };
                let mem = self.dir("memory")?;
                Stats {
                    cpu,
                    cpu_user_ns: tick_ns("user"),
                    cpu_kernel_ns: tick_ns("system"),
                    per_cpu_ns,
                    memory,
                    memory_max: files::number(&mem.join("memory.max_usage_in_bytes"))?,
                    memory_failcnt: files::number(&mem.join("memory.failcnt"))?,
                    swap: v1_counter(mem, "memory.memsw")?,
                    kernel: v1_counter(mem, "memory.kmem")?,
                    kernel_tcp: v1_counter(mem, "memory.kmem.tcp")?,
                    pids,
                }
            }
        };
        Ok(s)
    }

    /// `pids.current` and `pids.max`; zeros without a pids controller.
    fn pids(&self) -> Result<Pids> {
        let dir = match self.dir("pids") {
            Ok(d) => d,
            Err(Error::NotFound(_)) => return Ok(Pids::default()),
            Err(e) => return Err(e),
        };
        match present(files::number(&dir.join("pids.current")))? {
            // The root cgroup has no pids.max.
            Some(current) => Ok(Pids { current, limit: present(files::limit(&dir.join("pids.max")))?.flatten() }),
            None => Ok(Pids::default()),
        }
    }
}

/// v1 page counter `<prefix>.{usage_in_bytes,max_usage_in_bytes,limit_in_bytes,failcnt}`;
/// zeros when the kernel does not keep it.
fn v1_counter(dir: &Path, prefix: &str) -> Result<Counter> {
    let Some(usage) = present(files::number(&dir.join(format!("{prefix}.usage_in_bytes"))))? else {
        return Ok(Counter::default());
    };
    Ok(Counter {
        usage,
        max: files::number(&dir.join(format!("{prefix}.max_usage_in_bytes")))?,
        limit: files::limit(&dir.join(format!("{prefix}.limit_in_bytes")))?,
        failcnt: files::number(&dir.join(format!("{prefix}.failcnt")))?,
    })
}

/// `cpuacct.usage_percpu`: one ns counter a CPU, space separated.
fn per_cpu(file: &Path, text: &str) -> Result<Vec<u64>> {
    text.split_whitespace().map(|n| n.parse().map_err(|_| files::malformed(file, format!("{n:?} is not a CPU time")))).collect()
}

/// A read's value, or `None` when the file does not exist.
fn present<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Nanoseconds in one of `cpuacct.stat`'s clock ticks (`USER_HZ`).
fn ns_per_clock_tick() -> Result<u64> {
    use nix::unistd::{sysconf, SysconfVar};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => Ok(1_000_000_000 / hz as u64),
        Ok(_) => Err(Error::FailedPrecondition("sysconf(_SC_CLK_TCK) has no value".into())),
        Err(source) => Err(Error::Sys { context: "sysconf(_SC_CLK_TCK)".into(), source }),
    }
}
