//! Times as the store keeps them: unix milliseconds, the bound every time
//! read from the object tier is checked against, and their text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub(crate) fn ms_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.min(MAX_UNIX_MS))
}

/// The last millisecond of year 9999 (UTC): the latest time RFC 3339 can
/// write. Every time read from the object tier (a lease's, a manifest's) is
/// refused past it when it is parsed.
pub const MAX_UNIX_MS: u64 = 253_402_300_799_999;

/// Is `ms` (unix ms, read from the object tier) a time the store takes:
/// `Err` names the field and the bound.
pub(crate) fn check_unix_ms(field: &str, ms: u64) -> std::result::Result<(), String> {
    if ms > MAX_UNIX_MS {
        return Err(format!("{field} is {ms} ms after the Unix epoch, past the end of year 9999 ({MAX_UNIX_MS})"));
    }
    Ok(())
}

/// A unix-ms time as RFC 3339 (milliseconds), for messages. Never panics:
/// a time past year 9999 is written as a number.
pub fn unix_ms_text(ms: u64) -> String {
    if ms > MAX_UNIX_MS {
        return format!("{ms} ms after the Unix epoch (past year 9999)");
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
