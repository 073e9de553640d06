//! Small helpers every part of the store uses: random ids, a lock that
//! survives a panic of its holder, and blocking work off the async threads.

use std::sync::Mutex;

use crate::error::{Error, Result};

pub(crate) fn random_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(format!("blocking task: {e}")))?
}
