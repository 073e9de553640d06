//! The lease fence: a running actor stops running when this node can no
//! longer show that it holds the actor's lease.
//!
//! The node's daemon renews the lease in the object tier; another node may
//! take the actor over once it expires. A node cut off from the object tier
//! (or whose daemon hangs) cannot renew, so its copy of the actor must stop
//! before the lease can expire. Every [`POLL`] (sooner when the last answer
//! runs out sooner) the shim asks its daemon to confirm the lease
//! ([`crate::actor::store_client::SnapshotStore::confirm`]), which answers with the
//! time until which the actor may run without asking again (the lease's
//! expiry less a third of `lease_ttl`, the margin for clock skew); a
//! confirmation is not waited for past that time. The actor is frozen
//! (FROZEN, `fenced` giving the reason) when the lease is known lost (another
//! node took it over), or when no answer came and that time has passed. A
//! frozen process writes nothing and answers nothing, yet keeps its memory:
//! when the lease can be confirmed again (the object tier came back and
//! nobody took the actor), it is thawed; when it was lost, it stays frozen
//! until its pod is removed. Resumes and thaws confirm the lease first too
//! ([`crate::lifecycle::Actor::resume`]), and their answer counts as the
//! last one: a daemon that restarts right after a resume does not freeze
//! the actor while that answer holds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{debug, info, warn};

use crate::actor::report::Trigger;
use crate::actor::Lifecycle;
use crate::error::{Error, StoreErrorKind};
use crate::lifecycle::Actor;

/// How often a running actor's lease is confirmed, at most; more often
/// when the last answer runs out sooner (half of the time it has left).
pub const POLL: Duration = Duration::from_secs(2);
const MIN_POLL: Duration = Duration::from_millis(100);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Confirms the lease of shim `group`'s actor every [`POLL`].
pub fn start(actor: &Actor, group: String) {
    let actor = actor.clone();
    tokio::spawn(async move {
        loop {
            // Asked again well before the last answer runs out (every
            // POLL once it has: suspended, or frozen by the fence).
            let now = now_ms();
            let left = actor.lease_valid_until().filter(|t| *t > now).map_or(POLL, |t| Duration::from_millis((t - now) / 2));
            tokio::time::sleep(left.clamp(MIN_POLL, POLL)).await;
            pass(&actor, &group).await;
        }
    });
}

/// One confirmation. A missing answer is judged by the last confirmation
/// of any kind: a resume's or a thaw's counts as much as the fence's own
/// (a daemon restarting right after a resume does not freeze the actor
/// while the resume's answer holds).
async fn pass(actor: &Actor, group: &str) {
    let Some(rec) = actor.status() else { return };
    crate::actor::report::heartbeat(&actor.store, &rec);
    let fenced = rec.fenced.is_some() && rec.state == Lifecycle::Frozen;
    if rec.state != Lifecycle::Running && !fenced {
        // Not running: a resume or thaw confirms the lease first.
        return;
    }
    let valid_until = actor.lease_valid_until();
    // No waiting on an answer past the time the last one gave.
    let confirm = actor.confirm_lease(&rec.actor, group);
    let answer = match valid_until {
        Some(t) if !fenced => {
            let left = Duration::from_millis(t.saturating_sub(now_ms()));
            tokio::time::timeout(left, confirm).await.unwrap_or_else(|_| {
                Err(Error::store(StoreErrorKind::Unavailable, "no answer from the snapshot store before the last confirmation ran out"))
            })
        }
        _ => confirm.await,
    };
    match answer {
        Ok(None) => {}
        Ok(Some(_)) => {
            if fenced {
                match actor.resume(Trigger::Fence).await {
                    Ok(_) => info!(actor = rec.actor.as_str(), "lease confirmed again: actor thawed"),
                    Err(e) => warn!(actor = rec.actor.as_str(), "lease confirmed again, but the thaw failed: {e}"),
                }
            }
        }
        Err(e) if fenced => {
            debug!(actor = rec.actor.as_str(), "actor stays frozen: {e}");
        }
        Err(e) => {
            let lost = e.is_store(StoreErrorKind::LeaseLost);
            // No answer yet at all: nothing shows the lease (fencing is
            // undone by the next confirmation).
            let lapsed = valid_until.is_none_or(|t| now_ms() >= t);
            if !lost && !lapsed {
                warn!(
                    actor = rec.actor.as_str(),
                    valid_until = valid_until.unwrap_or(0),
                    "could not confirm the actor's lease (the actor runs on until it lapses): {e}"
                );
                return;
            }
            let why = if lost {
                format!("frozen by the lease fence: {e}")
            } else {
                format!("frozen by the lease fence: the lease could not be confirmed before it lapsed ({e})")
            };
            warn!(actor = rec.actor.as_str(), "{why}");
            if let Err(fe) = actor.freeze_as(Some(why)).await {
                warn!(actor = rec.actor.as_str(), "the lease fence could not freeze the actor: {fe}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::pass;
    use crate::actor::report::Trigger;
    use crate::actor::Lifecycle;
    use crate::lifecycle::tests::rig;

    /// A resume whose restore outlasts the validity of the lease
    /// confirmation it began with: the fence's next pass leaves the
    /// RUNNING actor running (it froze it at once: the last answer had run
    /// out, so the pass waited for none; test/vm/README.md).
    #[tokio::test]
    async fn the_pass_after_a_slow_resume_leaves_the_actor_running() {
        let r = rig(&["c1"]).await;
        r.suspended_with(Duration::from_millis(400), Duration::from_millis(300)).await;
        assert_eq!(r.actor.resume(Trigger::Api).await.unwrap().state, Lifecycle::Running);
        pass(&r.actor, "shim-1").await;
        let rec = r.rec();
        assert_eq!(rec.state, Lifecycle::Running, "{rec:?}");
        assert!(rec.fenced.is_none());
        // A lost lease is still acted on.
        r.store_fails_confirm();
        pass(&r.actor, "shim-1").await;
        assert_eq!(r.rec().state, Lifecycle::Frozen);
    }
}
