//! Converts `runc events --stats` output into containerd's cgroup v1
//! `Metrics`, the type CRI reads container stats from.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat, Throttle,
};
use containerd_shim::protos::protobuf::MessageField;
use serde_json::Value;

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_u64().unwrap_or(0)
}

/// A v1 `memory.stat` counter, or on cgroup v2 (where runc's `raw` is v2's
/// memory.stat) the v2 counter that holds the same: kubelet's working set
/// is usage less `total_inactive_file` (v2 `inactive_file`).
fn stat_of(stat: &Value, v1: &str, v2: &str) -> u64 {
    if stat.get(v1).is_some() {
        u(stat, &[v1])
    } else {
        u(stat, &[v2])
    }
}

fn entry(v: &Value) -> MessageField<MemoryEntry> {
    MessageField::some(MemoryEntry {
        limit: u(v, &["limit"]),
        usage: u(v, &["usage"]),
        max: u(v, &["max"]),
        failcnt: u(v, &["failcnt"]),
        ..Default::default()
    })
}

/// `raw` is runc's `{"type":"stats","data":{...}}` event.
pub fn to_metrics(raw: &Value) -> Metrics {
    let d = &raw["data"];
    let cpu = &d["cpu"];
    let mem = &d["memory"];
    let stat = &mem["raw"];
    let percpu = cpu["usage"]["percpu"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    Metrics {
        pids: MessageField::some(PidsStat {
            current: u(d, &["pids", "current"]),
            limit: u(d, &["pids", "limit"]),
            ..Default::default()
        }),
        cpu: MessageField::some(CPUStat {
            usage: MessageField::some(CPUUsage {
                total: u(cpu, &["usage", "total"]),
                kernel: u(cpu, &["usage", "kernel"]),
                user: u(cpu, &["usage", "user"]),
                per_cpu: percpu,
                ..Default::default()
            }),
            throttling: MessageField::some(Throttle {
                periods: u(cpu, &["throttling", "periods"]),
                throttled_periods: u(cpu, &["throttling", "throttled_periods"]),
                throttled_time: u(cpu, &["throttling", "throttled_time"]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        memory: MessageField::some(MemoryStat {
            cache: stat_of(stat, "cache", "file"),
            rss: stat_of(stat, "rss", "anon"),
            rss_huge: u(stat, &["rss_huge"]),
            mapped_file: stat_of(stat, "mapped_file", "file_mapped"),
            pg_fault: u(stat, &["pgfault"]),
            pg_maj_fault: u(stat, &["pgmajfault"]),
            inactive_file: u(stat, &["inactive_file"]),
            active_file: u(stat, &["active_file"]),
            total_inactive_file: stat_of(stat, "total_inactive_file", "inactive_file"),
            total_active_file: stat_of(stat, "total_active_file", "active_file"),
            total_rss: stat_of(stat, "total_rss", "anon"),
            total_cache: stat_of(stat, "total_cache", "file"),
            usage: entry(&mem["usage"]),
            swap: entry(&mem["swap"]),
            kernel: entry(&mem["kernel"]),
            kernel_tcp: entry(&mem["kernelTCP"]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_runc_stats() {
        let raw: Value = serde_json::from_str(
            r#"{"type":"stats","id":"c","data":{
                "cpu":{"usage":{"total":100,"percpu":[60,40],"kernel":30,"user":70},"throttling":{}},
                "memory":{"usage":{"limit":1024,"usage":512,"max":600,"failcnt":0},
                          "raw":{"total_inactive_file":12,"rss":400}},
                "pids":{"current":3,"limit":10}}}"#,
        )
        .unwrap();
        let m = to_metrics(&raw);
        assert_eq!(m.cpu.usage.total, 100);
        assert_eq!(m.cpu.usage.per_cpu, vec![60, 40]);
        assert_eq!(m.memory.usage.usage, 512);
        assert_eq!(m.memory.total_inactive_file, 12);
        assert_eq!(m.pids.current, 3);
    }

    /// cgroup v2: runc's `raw` is v2's memory.stat (as recorded in
    /// runtime/tests/data/cgroup/v2-cgroupfs); the v1 fields CRI computes
    /// the working set from are filled from their v2 names.
    #[test]
    fn maps_runc_stats_of_cgroup_v2() {
        let raw: Value = serde_json::from_str(
            r#"{"type":"stats","id":"c","data":{
                "memory":{"usage":{"limit":268435456,"usage":8429568},
                          "raw":{"anon":4096,"file":8388608,"file_mapped":0,"inactive_file":1000,"active_file":7,"shmem":8388608}}}}"#,
        )
        .unwrap();
        let m = to_metrics(&raw);
        assert_eq!(m.memory.usage.usage, 8429568);
        assert_eq!(m.memory.total_inactive_file, 1000);
        assert_eq!(m.memory.total_active_file, 7);
        assert_eq!((m.memory.rss, m.memory.total_rss), (4096, 4096));
        assert_eq!((m.memory.cache, m.memory.total_cache), (8388608, 8388608));
    }
}
