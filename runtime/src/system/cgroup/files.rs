//! The kernel's cgroup file formats: flat keyed files (`memory.stat`,
//! `cpu.stat`, `memory.events`, `cgroup.events`, `memory.oom_control`),
//! single values (`memory.current`, `cpuacct.usage`, `memory.max`), and pid
//! lists (`cgroup.procs`).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use crate::error::{Error, IoContext, Result};

/// v1 prints "no limit" as the page counter's maximum (2^63 rounded down
/// to a page); anything this large is no limit.
const V1_UNLIMITED: u64 = 1 << 62;

pub fn read(file: &Path) -> Result<String> {
    std::fs::read_to_string(file).io_context(|| format!("read {file:?}"))
}

pub fn write(file: &Path, value: &str) -> Result<()> {
    std::fs::write(file, value).io_context(|| format!("write {value:?} to {file:?}"))
}

/// A file whose contents do not parse as the kernel writes it.
pub fn malformed(file: &Path, why: impl Into<String>) -> Error {
    Error::Io { context: format!("parse {file:?}"), source: io::Error::new(io::ErrorKind::InvalidData, why.into()) }
}

/// `key value` lines; lines that are not a key and a number are skipped
/// (v1's memory.stat and v2's memory.stat both only hold numbers).
pub fn keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (k, v) = (it.next()?, it.next()?);
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The counter `key` of flat keyed file `file`.
pub fn counter(file: &Path, key: &str) -> Result<u64> {
    keyed(&read(file)?).get(key).copied().ok_or_else(|| malformed(file, format!("no {key} line")))
}

/// A file holding one number.
pub fn number(file: &Path) -> Result<u64> {
    let text = read(file)?;
    text.trim().parse().map_err(|_| malformed(file, format!("{:?} is not a number", text.trim())))
}

/// A limit: v2's `max` or v1's page-counter maximum are `None`.
pub fn limit(file: &Path) -> Result<Option<u64>> {
    let text = read(file)?;
    match text.trim() {
        "max" => Ok(None),
        t => {
            let n: u64 = t.parse().map_err(|_| malformed(file, format!("{t:?} is not a limit")))?;
            Ok((n < V1_UNLIMITED).then_some(n))
        }
    }
}

/// The pids of `cgroup.procs` (one a line).
pub fn pids(file: &Path) -> Result<Vec<i32>> {
    let text = read(file)?;
    text.split_whitespace().map(|p| p.parse::<i32>().map_err(|_| malformed(file, format!("{p:?} is not a pid")))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_parse_as_the_kernel_writes_them() {
        let v2_events = "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(v2_events).get("oom_kill"), Some(&1));
        assert_eq!(keyed(v2_events).get("max"), Some(&4));
        let v1_oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed(v1_oom).get("oom_kill"), Some(&2));
        assert!(keyed("").is_empty());
    }

    #[test]
    fn limits_and_numbers() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x");
        for (text, want) in [("max\n", None), ("9223372036854771712\n", None), ("268435456\n", Some(268435456))] {
            std::fs::write(&f, text).unwrap();
            assert_eq!(limit(&f).unwrap(), want, "{text:?}");
        }
        std::fs::write(&f, "abc\n").unwrap();
        assert!(matches!(number(&f), Err(Error::Io { .. })));
        std::fs::write(&f, "oom 0\n").unwrap();
        let e = counter(&f, "oom_kill").unwrap_err();
        assert!(e.to_string().contains("no oom_kill line"), "{e}");
        assert!(matches!(read(&d.path().join("absent")), Err(Error::Io { .. })));
    }
}
