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
            cache: u(stat, &["cache"]),
            rss: u(stat, &["rss"]),
            rss_huge: u(stat, &["rss_huge"]),
            mapped_file: u(stat, &["mapped_file"]),
            pg_fault: u(stat, &["pgfault"]),
            pg_maj_fault: u(stat, &["pgmajfault"]),
            inactive_file: u(stat, &["inactive_file"]),
            active_file: u(stat, &["active_file"]),
            total_inactive_file: u(stat, &["total_inactive_file"]),
            total_active_file: u(stat, &["total_active_file"]),
            total_rss: u(stat, &["total_rss"]),
            total_cache: u(stat, &["total_cache"]),
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
}
