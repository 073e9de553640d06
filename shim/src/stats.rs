//! A container's cgroup stats as containerd's cgroup v1 `Metrics`, the
//! type CRI reads container stats from.

use containerd_shim::protos::cgroups::metrics::{CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat, Throttle};
use containerd_shim::protos::protobuf::MessageField;
use torpor_runtime::system::cgroup::Counter;
use torpor_runtime::CgroupStats;

/// No limit, as containerd's cgroups library reports it.
const UNLIMITED: u64 = u64::MAX;

fn entry(c: &Counter) -> MessageField<MemoryEntry> {
    MessageField::some(MemoryEntry {
        limit: c.limit.unwrap_or(UNLIMITED),
        usage: c.usage,
        max: c.max,
        failcnt: c.failcnt,
        ..Default::default()
    })
}

/// containerd's cgroup v1 `Metrics` of a container's cgroup stats. On a
/// cgroup v2 host the v1 fields CRI reads are filled from their v2
/// counterparts: kubelet's working set is usage less `total_inactive_file`
/// (v2 `inactive_file`).
pub fn to_metrics(s: &CgroupStats) -> Metrics {
    let stat = |v1: &str, v2: &str| s.memory.stat.get(v1).or_else(|| s.memory.stat.get(v2)).copied().unwrap_or(0);
    let usage = Counter { usage: s.memory.usage, max: s.memory_max, limit: s.memory.limit, failcnt: s.memory_failcnt };
    Metrics {
        pids: MessageField::some(PidsStat { current: s.pids.current, limit: s.pids.limit.unwrap_or(0), ..Default::default() }),
        cpu: MessageField::some(CPUStat {
            usage: MessageField::some(CPUUsage {
                total: s.cpu.usage_ns,
                kernel: s.cpu_kernel_ns,
                user: s.cpu_user_ns,
                per_cpu: s.per_cpu_ns.clone(),
                ..Default::default()
            }),
            throttling: MessageField::some(Throttle {
                periods: s.cpu.periods,
                throttled_periods: s.cpu.throttled_periods,
                throttled_time: s.cpu.throttled_ns,
                ..Default::default()
            }),
            ..Default::default()
        }),
        memory: MessageField::some(MemoryStat {
            cache: stat("cache", "file"),
            rss: stat("rss", "anon"),
            rss_huge: stat("rss_huge", "anon_thp"),
            mapped_file: stat("mapped_file", "file_mapped"),
            pg_fault: stat("pgfault", "pgfault"),
            pg_maj_fault: stat("pgmajfault", "pgmajfault"),
            inactive_file: stat("inactive_file", "inactive_file"),
            active_file: stat("active_file", "active_file"),
            total_inactive_file: s.memory.inactive_file,
            total_active_file: stat("total_active_file", "active_file"),
            total_rss: s.memory.anon,
            total_cache: stat("total_cache", "file"),
            usage: entry(&usage),
            swap: entry(&s.swap),
            kernel: entry(&s.kernel),
            kernel_tcp: entry(&s.kernel_tcp),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use torpor_runtime::system::cgroup::{CpuStats, MemoryStats, Pids};

    fn stats(stat: &[(&str, u64)]) -> CgroupStats {
        CgroupStats {
            cpu: CpuStats { usage_ns: 100, periods: 4, throttled_periods: 2, throttled_ns: 9 },
            cpu_user_ns: 70,
            cpu_kernel_ns: 30,
            per_cpu_ns: vec![60, 40],
            memory: MemoryStats {
                usage: 512,
                limit: Some(1024),
                anon: 400,
                inactive_file: 12,
                stat: stat.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            },
            memory_max: 600,
            memory_failcnt: 3,
            swap: Counter { usage: 700, max: 800, limit: None, failcnt: 0 },
            pids: Pids { current: 3, limit: Some(10) },
            ..Default::default()
        }
    }

    #[test]
    fn maps_cgroup_v1_stats() {
        let m = to_metrics(&stats(&[("total_inactive_file", 12), ("total_rss", 400), ("rss", 390), ("cache", 100), ("pgfault", 5)]));
        assert_eq!((m.cpu.usage.total, m.cpu.usage.user, m.cpu.usage.kernel), (100, 70, 30));
        assert_eq!(m.cpu.usage.per_cpu, vec![60, 40]);
        assert_eq!((m.cpu.throttling.periods, m.cpu.throttling.throttled_periods, m.cpu.throttling.throttled_time), (4, 2, 9));
        assert_eq!((m.memory.usage.usage, m.memory.usage.limit, m.memory.usage.max, m.memory.usage.failcnt), (512, 1024, 600, 3));
        assert_eq!((m.memory.swap.usage, m.memory.swap.limit), (700, u64::MAX), "no limit reads as containerd's");
        assert_eq!((m.memory.total_inactive_file, m.memory.total_rss, m.memory.rss, m.memory.cache), (12, 400, 390, 100));
        assert_eq!(m.memory.pg_fault, 5);
        assert_eq!((m.pids.current, m.pids.limit), (3, 10));
    }

    /// cgroup v2: memory.stat's names (as recorded in
    /// runtime/tests/data/cgroup/v2-cgroupfs); the v1 fields CRI computes
    /// the working set from are filled from their v2 names.
    #[test]
    fn maps_cgroup_v2_stats() {
        let m = to_metrics(&stats(&[("anon", 4096), ("file", 8388608), ("file_mapped", 0), ("inactive_file", 1000), ("active_file", 7)]));
        assert_eq!((m.memory.rss, m.memory.cache, m.memory.total_cache), (4096, 8388608, 8388608));
        assert_eq!((m.memory.inactive_file, m.memory.total_active_file), (1000, 7));
    }

    #[test]
    fn a_suspended_containers_stats_are_zero() {
        let m = to_metrics(&CgroupStats::default());
        assert_eq!((m.cpu.usage.total, m.memory.usage.usage, m.pids.current), (0, 0, 0));
    }
}
