//! A suspend: the request of the idle policy, of the actor itself, of
//! `torporctl` or the control API, and the stop of an actor with
//! `torpor.dev/on-stop: suspend`. With `torpor.dev/freeze-first: D` (not
//! on a stop), a RUNNING actor goes to FROZEN in the freeze tier first
//! (see [`super::freeze`]); otherwise, and for an actor already there, the
//! checkpoint ([`super::dump`]).

use std::time::Duration;

use tracing::{info, warn};

use crate::actor::record::{self, FreezeTier, Lifecycle, Record};
use crate::actor::report::{self, Op, Trigger};
use crate::error::{Error, Result};
use crate::lifecycle::{lock, Actor};

impl Actor {
    /// A suspend (the idle policy, the actor's request, `torporctl`): with
    /// `torpor.dev/freeze-first`, a RUNNING actor goes to the freeze tier
    /// first ([`crate::lifecycle::freeze`]) and one already there is
    /// checkpointed at once; otherwise the checkpoint. `trigger`: what
    /// asked for it (the daemon's metrics).
    pub async fn suspend(&self, trigger: Trigger) -> Result<Record> {
        if let Some(rec) = self.suspend_to_freeze_tier().await? {
            return Ok(rec);
        }
        self.checkpoint(None, trigger).await
    }

    /// The stop of app container `id` (SIGTERM) of an actor with
    /// `torpor.dev/on-stop: suspend`: the actor is suspended first (all its
    /// app containers), so that its containers then stop as suspended ones
    /// and its newest state is the snapshot the next pod restores — on this
    /// node or, once the lease is surrendered at the pod's removal (after
    /// the upload), on any other. A suspend that fails is logged and the
    /// stop goes on as a plain stop.
    pub async fn suspend_on_stop(&self, id: &str) {
        if !self.tasks.suspends_on_stop(id) {
            // A frozen process does not take the signal: an actor in the
            // freeze tier is thawed for its stop.
            if self.record().is_some_and(|r| r.in_freeze_tier()) {
                let thaw = report::triggered(&self.store, Op::Resume, Trigger::Stop, || self.record(), self.thaw_freeze_tier());
                if let Err(e) = thaw.await {
                    warn!(container = id, "thaw of the freeze tier for a stop: {e}");
                }
            }
            return;
        }
        // Not when the lease fence froze it: its state is no longer its own.
        let state = self.record().filter(|rec| rec.fenced.is_none()).map(|rec| rec.state);
        if !matches!(state, Some(Lifecycle::Running | Lifecycle::Frozen)) {
            return;
        }
        // A checkpoint, never the freeze tier: the pod is going away.
        match self.checkpoint(None, Trigger::Stop).await {
            Ok(rec) => info!(
                actor = rec.actor.as_str(),
                container = id,
                generation = rec.generation,
                "suspended on stop (torpor.dev/on-stop: suspend)"
            ),
            Err(e) => warn!(container = id, "suspend on stop failed, the container stops without it: {e}"),
        }
    }

    /// `torpor.dev/freeze-first` of the actor's containers (the longest, if
    /// they differ).
    fn freeze_first_window(&self) -> Option<Duration> {
        self.tasks.app_containers().iter().filter_map(|id| self.tasks.app_info(id).ok()).filter_map(|i| i.actor.freeze_first).max()
    }

    /// The suspend of an actor with `torpor.dev/freeze-first` (see the
    /// module doc): RUNNING → FROZEN in the freeze tier (`Some`); `None`
    /// when the suspend is a checkpoint (no window; already in the freeze
    /// tier: a suspend request there checkpoints at once; fenced).
    pub(crate) async fn suspend_to_freeze_tier(&self) -> Result<Option<Record>> {
        let Some(rec) = self.record() else { return Ok(None) };
        match suspend_plan(&rec, self.freeze_first_window()) {
            SuspendPlan::FreezeTier(window) => self.freeze_first(window).await.map(Some),
            SuspendPlan::Checkpoint => Ok(None),
        }
    }

    /// FROZEN in the freeze tier for `window`: persisted (with the
    /// window's end) before the freezer is touched; then the actor's own
    /// listeners are watched.
    async fn freeze_first(&self, window: Duration) -> Result<Record> {
        let _gate = self.gate.lock().await;
        let ids = self.tasks.app_containers();
        let tier = self.update(|rec| {
            if rec.state != Lifecycle::Running || rec.fenced.is_some() {
                return Err(Error::WrongState(format!("actor {} is {}, not RUNNING", rec.actor, rec.state)));
            }
            let tier = FreezeTier::starting(record::now_ms(), window);
            rec.state = Lifecycle::Frozen;
            rec.containers = ids.clone();
            rec.freeze_tier = Some(tier);
            rec.last_error = None;
            Ok(tier)
        })??;
        self.pause_all(&ids).await?;
        let watch = self.watch_frozen_listeners(&ids);
        *lock(&self.frozen_watch) = Some(watch);
        self.freeze_changed.notify_one();
        let rec = self.record().ok_or_else(super::no_actor)?;
        info!(actor = rec.actor.as_str(), window = ?window, until_ms = tier.until_ms, "actor frozen (freeze tier): checkpointed when the window ends");
        Ok(rec)
    }
}

/// What a suspend of the actor (not on a stop) does.
#[derive(Debug, PartialEq, Eq)]
enum SuspendPlan {
    /// RUNNING → FROZEN in the freeze tier for this window.
    FreezeTier(Duration),
    /// The checkpoint: no window; in the freeze tier already (a suspend
    /// request while frozen checkpoints at once); frozen otherwise (plain,
    /// fence); any other state (refused by the checkpoint).
    Checkpoint,
}

fn suspend_plan(rec: &Record, window: Option<Duration>) -> SuspendPlan {
    match window {
        Some(w) if rec.state == Lifecycle::Running && rec.fenced.is_none() => SuspendPlan::FreezeTier(w),
        _ => SuspendPlan::Checkpoint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_suspend_does() {
        let w = Some(Duration::from_secs(30));
        let mut rec = Record::new("ns/a".into());
        assert_eq!(suspend_plan(&rec, None), SuspendPlan::Checkpoint, "no freeze-first");
        assert_eq!(suspend_plan(&rec, w), SuspendPlan::FreezeTier(Duration::from_secs(30)));
        // In the freeze tier: a suspend request checkpoints at once.
        rec.state = Lifecycle::Frozen;
        rec.freeze_tier = Some(FreezeTier::starting(0, Duration::from_secs(30)));
        assert!(rec.in_freeze_tier());
        assert_eq!(suspend_plan(&rec, w), SuspendPlan::Checkpoint);
        // A plain freeze and a fence-freeze are checkpointed as before.
        rec.freeze_tier = None;
        assert_eq!(suspend_plan(&rec, w), SuspendPlan::Checkpoint);
        rec.fenced = Some("lease".into());
        assert_eq!(suspend_plan(&rec, w), SuspendPlan::Checkpoint);
        rec.state = Lifecycle::Running;
        assert_eq!(suspend_plan(&rec, w), SuspendPlan::Checkpoint, "a fenced record never enters the tier");
        for s in [Lifecycle::Suspending, Lifecycle::Suspended, Lifecycle::Resuming] {
            rec.state = s;
            rec.fenced = None;
            assert_eq!(suspend_plan(&rec, w), SuspendPlan::Checkpoint, "{s}");
        }
    }
}
