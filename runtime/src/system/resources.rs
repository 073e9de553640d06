//! A container's resources as containerd's `Update` gives them (an OCI
//! `LinuxResources` JSON document, what kubelet's in-place resize sends
//! through CRI's UpdateContainerResources), kept for a container that has
//! no process to apply them to: a suspended one.
//!
//! runc-v2 hands the document to `runc update`, which takes a fixed set of
//! fields from it ([`RuncUpdate`]: memory limit, reservation and swap; CPU
//! shares, quota, period, realtime, burst, cpus and mems; the pids limit;
//! the blkio weight; v2's unified map) and leaves every other field, and
//! every field it is not given, as it was. A suspended container has no runc
//! container (its checkpoint removed it, and its cgroups): the same fields
//! are written into the bundle's `config.json` ([`merge_into_spec`]: what a
//! restore by runc, or a cold start, creates the container from) and into
//! the cgroup v1 values of the restore template ([`cgroup_v1_values`]: what
//! the shim's own restore writes into the new cgroups), so the restored
//! container runs with them.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The fields of a `LinuxResources` document that `runc update` applies,
/// by group (`memory`, `cpu`, `pids`, `blockIO`); `unified` is a map.
const RUNC_FIELDS: &[(&str, &[&str])] = &[
    ("memory", &["limit", "reservation", "swap"]),
    ("cpu", &["shares", "quota", "burst", "period", "realtimeRuntime", "realtimePeriod", "cpus", "mems"]),
    ("pids", &["limit"]),
    ("blockIO", &["weight"]),
];

/// What an update asks, reduced to what `runc update` applies (fields that
/// are absent or null are not part of it).
#[derive(Debug, Clone, PartialEq)]
pub struct RuncUpdate(Map<String, Value>);

impl RuncUpdate {
    /// Parses containerd's `Update` document. Not JSON, or not an object:
    /// an invalid argument (as runc's own parse error would be).
    pub fn parse(resources_json: &[u8]) -> Result<RuncUpdate> {
        let v: Value = serde_json::from_slice(resources_json)
            .map_err(|e| Error::InvalidArgument(format!("the update's resources are not an OCI LinuxResources JSON document: {e}")))?;
        let Value::Object(all) = v else {
            return Err(Error::InvalidArgument("the update's resources are not a JSON object".into()));
        };
        let mut kept = Map::new();
        for (group, fields) in RUNC_FIELDS {
            let Some(Value::Object(g)) = all.get(*group) else { continue };
            let taken: Map<String, Value> =
                fields.iter().filter_map(|f| g.get(*f).filter(|v| !v.is_null()).map(|v| (f.to_string(), v.clone()))).collect();
            if !taken.is_empty() {
                kept.insert(group.to_string(), Value::Object(taken));
            }
        }
        if let Some(Value::Object(u)) = all.get("unified") {
            if !u.is_empty() {
                kept.insert("unified".into(), Value::Object(u.clone()));
            }
        }
        Ok(RuncUpdate(kept))
    }

    /// Nothing that runc would apply.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The field `group.field`, if the update has it.
    pub fn get(&self, group: &str, field: &str) -> Option<&Value> {
        self.0.get(group)?.get(field)
    }

    fn int(&self, group: &str, field: &str) -> Option<i64> {
        self.get(group, field).and_then(|v| v.as_i64().or_else(|| v.as_u64().map(|u| u.min(i64::MAX as u64) as i64)))
    }

    fn string(&self, group: &str, field: &str) -> Option<&str> {
        self.get(group, field).and_then(Value::as_str)
    }
}

/// Writes `update` into an OCI spec's `linux.resources` (field by field,
/// as `runc update` changes a running container: what the update does not
/// name stays). A spec without `linux` gets one.
pub fn merge_into_spec(spec: &mut Value, update: &RuncUpdate) -> Result<()> {
    let Some(root) = spec.as_object_mut() else {
        return Err(Error::InvalidArgument("config.json is not a JSON object".into()));
    };
    let linux = object_entry(root, "linux")?;
    let resources = object_entry(linux, "resources")?;
    for (group, fields) in &update.0 {
        let Value::Object(fields) = fields else { continue };
        let target = object_entry(resources, group)?;
        for (f, v) in fields {
            target.insert(f.clone(), v.clone());
        }
    }
    Ok(())
}

fn object_entry<'a>(m: &'a mut Map<String, Value>, k: &str) -> Result<&'a mut Map<String, Value>> {
    let e = m.entry(k.to_string()).or_insert_with(|| Value::Object(Map::new()));
    if e.is_null() {
        *e = Value::Object(Map::new());
    }
    e.as_object_mut().ok_or_else(|| Error::InvalidArgument(format!("config.json: {k:?} is not a JSON object")))
}

/// The cgroup v1 values of `update`, as runc's cgroupfs driver writes them
/// (`libcontainer/cgroups/fs`: a zero or empty value is not written):
/// controller → [(file, value)]. Err names a field a restore template does
/// not carry (realtime CPU, CPU burst, v2's unified map): the restore is
/// then left to runc.
pub fn cgroup_v1_values(update: &RuncUpdate) -> std::result::Result<Vec<(&'static str, &'static str, String)>, String> {
    for (g, f) in [("cpu", "realtimeRuntime"), ("cpu", "realtimePeriod"), ("cpu", "burst")] {
        if update.int(g, f).is_some_and(|v| v != 0) {
            return Err(format!("{g}.{f} is not carried by a restore template"));
        }
    }
    if update.0.contains_key("unified") {
        return Err("unified (cgroup v2) values are not carried by a restore template".into());
    }
    let mut out = Vec::new();
    let mut int = |g: &str, f: &str, ctrl: &'static str, file: &'static str| {
        if let Some(v) = update.int(g, f).filter(|v| *v != 0) {
            out.push((ctrl, file, v.to_string()));
        }
    };
    int("cpu", "shares", "cpu", "cpu.shares");
    int("cpu", "period", "cpu", "cpu.cfs_period_us");
    int("cpu", "quota", "cpu", "cpu.cfs_quota_us");
    int("memory", "limit", "memory", "memory.limit_in_bytes");
    int("memory", "swap", "memory", "memory.memsw.limit_in_bytes");
    int("memory", "reservation", "memory", "memory.soft_limit_in_bytes");
    int("blockIO", "weight", "blkio", "blkio.weight");
    if let Some(v) = update.int("pids", "limit").filter(|v| *v != 0) {
        out.push(("pids", "pids.max", if v > 0 { v.to_string() } else { "max".into() }));
    }
    for (f, file) in [("cpus", "cpuset.cpus"), ("mems", "cpuset.mems")] {
        if let Some(v) = update.string("cpu", f).filter(|v| !v.is_empty()) {
            out.push(("cpuset", file, v.to_string()));
        }
    }
    Ok(out)
}

/// The keys of runc's own configuration (`state.json`'s
/// `config.cgroups`, libcontainer's `Resources`) that `update` changes,
/// with their new values.
pub fn runc_config_values(update: &RuncUpdate) -> Vec<(&'static str, Value)> {
    let pairs: &[(&str, &str, &'static str)] = &[
        ("memory", "limit", "memory"),
        ("memory", "reservation", "memory_reservation"),
        ("memory", "swap", "memory_swap"),
        ("cpu", "shares", "cpu_shares"),
        ("cpu", "quota", "cpu_quota"),
        ("cpu", "period", "cpu_period"),
        ("cpu", "cpus", "cpuset_cpus"),
        ("cpu", "mems", "cpuset_mems"),
        ("pids", "limit", "pids_limit"),
        ("blockIO", "weight", "blkio_weight"),
    ];
    pairs.iter().filter_map(|(g, f, key)| Some((*key, update.get(g, f)?.clone()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What containerd's CRI sends for a kubelet resize of a container with
    /// requests cpu 10m, memory 4Mi and limits cpu 500m, memory 128Mi.
    fn cri_update() -> Vec<u8> {
        serde_json::to_vec(&json!({
            "devices": [{"allow": false, "access": "rwm"}],
            "memory": {"limit": 134217728, "swap": 134217728},
            "cpu": {"shares": 10, "quota": 50000, "period": 100000, "cpus": "", "mems": ""},
            "hugepageLimits": [{"pageSize": "2MB", "limit": 0}],
            "unified": {}
        }))
        .unwrap()
    }

    #[test]
    fn only_what_runc_update_applies_is_kept() {
        let u = RuncUpdate::parse(&cri_update()).unwrap();
        assert_eq!(
            u.0,
            json!({
                "memory": {"limit": 134217728, "swap": 134217728},
                "cpu": {"shares": 10, "quota": 50000, "period": 100000, "cpus": "", "mems": ""}
            })
            .as_object()
            .unwrap()
            .clone(),
            "devices, hugepage limits and an empty unified map are not runc update's"
        );
        assert!(RuncUpdate::parse(b"{}").unwrap().is_empty());
        assert!(RuncUpdate::parse(br#"{"memory":{"limit":null}}"#).unwrap().is_empty(), "null is absent");
        for bad in [&b"not json"[..], b"[1]", b""] {
            let e = RuncUpdate::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
    }

    #[test]
    fn the_spec_takes_the_update_field_by_field() {
        let mut spec = json!({
            "ociVersion": "1.2.0",
            "linux": {"resources": {
                "devices": [{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
                "memory": {"limit": 134217728, "swap": 134217728, "reservation": 1},
                "cpu": {"shares": 512, "quota": 50000, "period": 100000}
            }, "cgroupsPath": "/kubepods/x"}
        });
        let u = RuncUpdate::parse(
            &serde_json::to_vec(&json!({"cpu": {"shares": 10}, "memory": {"limit": 268435456, "swap": 268435456}, "devices": []})).unwrap(),
        )
        .unwrap();
        merge_into_spec(&mut spec, &u).unwrap();
        let r = &spec["linux"]["resources"];
        assert_eq!(r["cpu"], json!({"shares": 10, "quota": 50000, "period": 100000}));
        assert_eq!(r["memory"], json!({"limit": 268435456, "swap": 268435456, "reservation": 1}));
        assert_eq!(r["devices"].as_array().map(Vec::len), Some(2), "the device rules stay");
        assert_eq!(spec["linux"]["cgroupsPath"], "/kubepods/x");

        let mut bare = json!({"ociVersion": "1.2.0", "linux": {"resources": null}});
        merge_into_spec(&mut bare, &u).unwrap();
        assert_eq!(bare["linux"]["resources"]["cpu"]["shares"], 10);
        assert!(merge_into_spec(&mut json!([]), &u).is_err());
        assert!(merge_into_spec(&mut json!({"linux": 3}), &u).is_err());
    }

    #[test]
    fn cgroup_v1_values_are_runcs() {
        let u = RuncUpdate::parse(&cri_update()).unwrap();
        assert_eq!(
            cgroup_v1_values(&u).unwrap(),
            [
                ("cpu", "cpu.shares", "10".to_string()),
                ("cpu", "cpu.cfs_period_us", "100000".to_string()),
                ("cpu", "cpu.cfs_quota_us", "50000".to_string()),
                ("memory", "memory.limit_in_bytes", "134217728".to_string()),
                ("memory", "memory.memsw.limit_in_bytes", "134217728".to_string()),
            ],
            "empty cpus and mems are not written"
        );
        let u = RuncUpdate::parse(br#"{"memory":{"limit":-1,"reservation":4194304},"pids":{"limit":-1},"blockIO":{"weight":300},"cpu":{"cpus":"0-1","quota":-1}}"#).unwrap();
        assert_eq!(
            cgroup_v1_values(&u).unwrap(),
            [
                ("cpu", "cpu.cfs_quota_us", "-1".to_string()),
                ("memory", "memory.limit_in_bytes", "-1".to_string()),
                ("memory", "memory.soft_limit_in_bytes", "4194304".to_string()),
                ("blkio", "blkio.weight", "300".to_string()),
                ("pids", "pids.max", "max".to_string()),
                ("cpuset", "cpuset.cpus", "0-1".to_string()),
            ]
        );
        for not_carried in [r#"{"cpu":{"realtimeRuntime":950000}}"#, r#"{"cpu":{"burst":1000}}"#, r#"{"unified":{"memory.high":"1000"}}"#] {
            let u = RuncUpdate::parse(not_carried.as_bytes()).unwrap();
            assert!(cgroup_v1_values(&u).is_err(), "{not_carried}");
        }
        let zero_rt = RuncUpdate::parse(br#"{"cpu":{"realtimeRuntime":0,"shares":2}}"#).unwrap();
        assert_eq!(cgroup_v1_values(&zero_rt).unwrap(), [("cpu", "cpu.shares", "2".to_string())]);
    }

    #[test]
    fn runc_config_keys() {
        let u = RuncUpdate::parse(&cri_update()).unwrap();
        let keys: Vec<_> = runc_config_values(&u).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["memory", "memory_swap", "cpu_shares", "cpu_quota", "cpu_period", "cpuset_cpus", "cpuset_mems"]);
    }
}
