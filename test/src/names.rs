//! Names unique across tests, threads and test processes (pods, actors,
//! temp dirs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::POD_NAMESPACE;

/// A unique actor id in the test pods' namespace ([`POD_NAMESPACE`]):
/// an actor belongs to its pod's namespace.
pub fn actor_name(prefix: &str) -> String {
    format!("{POD_NAMESPACE}/{}", unique_name(prefix))
}

/// A name unique across tests, threads and test processes: `prefix-<pid>-<n>-<rand>`.
/// Lower-case, DNS-label safe, at most 63 characters.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let prefix: String = prefix.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(40).collect();
    format!("{prefix}-{}-{n}-{:x}", std::process::id(), nanos & 0xfffff)
}
