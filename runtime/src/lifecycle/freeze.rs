//! FROZEN: every app container in the cgroup freezer; its memory stays, a
//! resume is a thaw ([`crate::lifecycle::resume`]).

use tracing::info;

use crate::actor::record::{Lifecycle, Record};
use crate::actor::report::{self, Op};
use crate::error::{Error, Result};
use crate::lifecycle::Actor;
use crate::task::Status;

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
            Ok(())
        })??;
        let mut paused: Vec<String> = Vec::new();
        for id in &ids {
            if self.tasks.status(id) != Some(Status::Running) {
                continue;
            }
            if let Err(e) = self.tasks.pause(id).await {
                for p in &paused {
                    let _ = self.tasks.resume(p).await;
                }
                let actor = self.update(|rec| {
                    rec.state = Lifecycle::Running;
                    rec.fenced = None;
                    rec.last_error = Some(format!("freeze failed: {e}"));
                    rec.actor.clone()
                })?;
                return Err(e.context(&format!("freeze of actor {actor}")));
            }
            paused.push(id.clone());
        }
        let rec = self.record().ok_or_else(super::no_actor)?;
        info!(actor = rec.actor.as_str(), "actor frozen");
        Ok(rec)
    }
}
