//! FROZEN: every app container in the cgroup freezer; its memory stays, a
//! resume is a thaw ([`crate::lifecycle::resume`]).
//!
//! Three things freeze an actor, and the record tells them apart:
//!
//! - a plain freeze (`torporctl freeze`, the control API's Freeze);
//! - the lease fence (`fenced` says why; see [`crate::trigger::fence`]);
//! - the **freeze tier** (`freeze_tier`, with the window's end): a suspend of
//!   an actor with `torpor.dev/freeze-first: D` by the idle policy, the
//!   actor's request or `torporctl suspend`/the control API's Suspend (not a
//!   stop with `torpor.dev/on-stop: suspend`, which checkpoints at once: the
//!   pod is going away). A resume within D is a thaw — the fast path, no
//!   CRIU. The checkpoint (the normal suspend) comes at D's end
//!   ([`crate::trigger::policy`]'s window timer), at once on another
//!   suspend request, or early under memory pressure. A checkpoint that
//!   fails there leaves the actor thawed and RUNNING, the reason in
//!   `last_error`. No trigger of the freeze tier (window, pressure, its
//!   listeners) acts on a plain or a fence freeze.
//!
//! The freezer's steps (pause, thaw, the watch of the frozen actor's
//! listeners) are [`super::freezer`]'s; the freeze tier is entered by a
//! suspend ([`super::suspend`]) and left by a resume, a stop, or its
//! checkpoint (started by [`crate::trigger::policy`]).

use tracing::info;

use crate::actor::record::{Lifecycle, Record};
use crate::actor::report::{self, Op};
use crate::error::{Error, Result};
use crate::lifecycle::Actor;

impl Actor {
    /// FROZEN: all app containers in the cgroup freezer.
    pub async fn freeze(&self) -> Result<Record> {
        self.freeze_as(None).await
    }

    /// FROZEN, by the lease fence when `fenced` gives the reason. FROZEN
    /// is persisted first; a container that cannot be paused thaws the
    /// ones paused so far and leaves the actor RUNNING, with the reason.
    pub(crate) async fn freeze_as(&self, fenced: Option<String>) -> Result<Record> {
        let op = if fenced.is_some() { Op::FenceFreeze } else { Op::Freeze };
        report::operation(&self.store, op, || self.record(), self.freeze_unreported(fenced)).await
    }

    async fn freeze_unreported(&self, fenced: Option<String>) -> Result<Record> {
        let _gate = self.gate.lock().await;
        let ids = self.tasks.app_containers();
        self.update(|rec| {
            if rec.state != Lifecycle::Running {
                return Err(Error::WrongState(format!("actor {} is {}, not RUNNING", rec.actor, rec.state)));
            }
            rec.state = Lifecycle::Frozen;
            rec.containers = ids.clone();
            if let Some(why) = &fenced {
                rec.last_error = Some(why.clone());
            }
            rec.fenced = fenced.clone();
            rec.freeze_tier = None;
            Ok(())
        })??;
        self.pause_all(&ids).await?;
        let rec = self.record().ok_or_else(super::no_actor)?;
        info!(actor = rec.actor.as_str(), "actor frozen");
        Ok(rec)
    }
}
