//! The restore steps a resume and an adoption share: one container
//! restored from its image directory, from disk (with lazy pages when they
//! are on, else in full) or streamed from the store's page server; the
//! `criu lazy-pages` daemons serving a restored actor's memory, the
//! checkout leases they pin, and the watch of a streamed checkout.
//!
//! Called by [`super::resume`], [`super::adopt`] and the rollback of
//! [`super::dump`]; calls nothing of theirs.

use std::path::Path;

use tracing::{debug, error, info, warn};

use crate::actor::record::{self, Lifecycle, Phase};
use crate::error::{Error, IoContext, Result, StoreErrorKind};
use crate::lifecycle::timing::Timing;
use crate::lifecycle::{lock, Actor};
use crate::system::runc::{InheritFd, RestoreFrom};
use crate::system::{criu_launcher, reaper};
use crate::task::ExitHold;

impl Actor {
    /// A checkout lease was released: drop it from the record.
    fn forget_lease(&self, lease: &str) {
        let _ = self.update_if(|rec| {
            if !rec.leases.iter().any(|l| l == lease) {
                return None;
            }
            rec.leases.retain(|l| l != lease);
            Some(())
        });
    }

    /// What the restore of container `id` from its image directory
    /// `image` (named after the container) inherits ([`super::links`]).
    pub(crate) fn link_fds_of_image(&self, id: &str, image: &Path) -> Result<Vec<InheritFd>> {
        self.link_fds(id, image_name(image)?, image)
    }

    /// `runc restore` of one suspended container from `image`: with lazy
    /// pages (memory served on demand over userfaultfd by a `criu
    /// lazy-pages` daemon, the rest prefetched in the background), falling
    /// back to a full restore when that cannot be used. CRIU's work
    /// directories are the shim's, outside the (read-only) snapshot.
    ///
    /// From a streamed checkout (`pages`), the daemon gets its pages from
    /// the store's page server, and there is no full restore to fall back
    /// to (the page images are not all local yet): a failure is the
    /// resume's.
    pub(crate) async fn restore_one(
        &self,
        dir: &record::Store,
        generation: u64,
        id: &str,
        image: &Path,
        pages: Option<PageSource<'_>>,
        t: &mut Timing,
    ) -> Result<i32> {
        let image = image.to_path_buf();
        let inherit = self.link_fds_of_image(id, &image)?;
        if let Some(pages) = pages {
            let work = dir.work_dir(generation, id, "lazy");
            let restored = self.restore_streamed(id, &image, &work, pages, inherit).await;
            t.mark("restore");
            return restored;
        }
        self.restore_from_disk(id, &image, &dir.work_dir(generation, id, "lazy"), &dir.work_dir(generation, id, "restore"), inherit, t)
            .await
            .map(|(pid, _)| pid)
    }

    /// Restore of container `id` from `image`, a directory on this node:
    /// with lazy pages when they are enabled (a `criu lazy-pages` daemon
    /// serves the memory on demand and copies the rest in the background,
    /// CRIU's work in `lazy_work`), else, or when that fails, in full
    /// (CRIU's work in `full_work`). Returns the pid and whether a daemon
    /// still reads `image`: it is done once the [`Actor::lazy`] handles
    /// are ([`Actor::release_when_served`]).
    pub(crate) async fn restore_from_disk(
        &self,
        id: &str,
        image: &Path,
        lazy_work: &Path,
        full_work: &Path,
        inherit: Vec<InheritFd>,
        t: &mut Timing,
    ) -> Result<(i32, bool)> {
        if self.config.lazy_pages {
            // With the CRIU launcher in front, CRIU waits for the daemon to
            // listen, while runc prepares the restore; else it is waited
            // for here.
            let overlapped = criu_launcher::in_front();
            let cmd = LazyDaemon::command(image, lazy_work);
            let started = if overlapped { LazyDaemon::spawn(cmd, lazy_work) } else { LazyDaemon::spawn_and_wait(cmd, lazy_work).await };
            t.mark("lazy_pages_start");
            match started {
                Ok(daemon) => {
                    let lazy_daemon = overlapped.then_some(daemon.pid);
                    let from = RestoreFrom {
                        image: image.to_path_buf(),
                        work: lazy_work.to_path_buf(),
                        lazy: true,
                        lazy_daemon,
                        inherit: inherit.clone(),
                    };
                    let restored = self.tasks.restore(id, &from).await;
                    t.mark("restore");
                    match restored {
                        Ok(pid) => {
                            lock(&self.lazy).push(daemon.finish(self.lazy_stop.subscribe()));
                            return Ok((pid, true));
                        }
                        Err(e) => {
                            warn!(container = id, "lazy-pages restore failed, restoring in full: {e}");
                            daemon.kill();
                        }
                    }
                }
                Err(e) => warn!(container = id, "no lazy pages ({e}): restoring in full"),
            }
        }
        let from = RestoreFrom { image: image.to_path_buf(), work: full_work.to_path_buf(), lazy: false, lazy_daemon: None, inherit };
        let restored = self.tasks.restore(id, &from).await;
        t.mark("restore");
        restored.map(|pid| (pid, false))
    }

    /// The checkout `lease` is released once the lazy-pages daemons are
    /// done with it (and, when it is streamed (`hold`: see
    /// [`PageSource::hold`]), once its stream ended: see
    /// [`Actor::watch_stream`]); the store's gc and retention remove the
    /// snapshot.
    pub(crate) fn release_when_served(&self, lease: String, hold: Option<ExitHold>) {
        if let Some(hold) = hold {
            self.watch_stream(lease.clone(), hold);
        }
        let pending: Vec<_> = std::mem::take(&mut *lock(&self.lazy));
        let me = self.clone();
        lock(&self.lazy).push(tokio::spawn(async move {
            for h in pending {
                let _ = h.await;
            }
            me.store.release_logged(&lease).await;
            me.forget_lease(&lease);
        }));
    }

    /// `runc restore --lazy-pages` of container `id` from `image` of a
    /// streamed checkout (`pages`), CRIU's work in `work`.
    pub(crate) async fn restore_streamed(
        &self,
        id: &str,
        image: &Path,
        work: &Path,
        pages: PageSource<'_>,
        inherit: Vec<InheritFd>,
    ) -> Result<i32> {
        let container_dir = image_name(image)?;
        // An init that dies of memory its stream failed to bring is not
        // reported as an exit before the stream's end says so.
        self.tasks.hold_init_exit(id, pages.hold)?;
        let mut daemon = LazyDaemon::start_streamed(image, work, pages, container_dir).await?;
        let from = RestoreFrom { image: image.to_path_buf(), work: work.to_path_buf(), lazy: true, lazy_daemon: None, inherit };
        let restore = self.tasks.restore(id, &from);
        tokio::pin!(restore);
        let pid = daemon.pid;
        // The daemon served everything and ended before the restore did.
        let mut served = false;
        let restored = tokio::select! {
            r = &mut restore => r,
            status = daemon.exit.wait_for(pid) => {
                if status == 0 {
                    // It served every page there was to serve lazily and
                    // ended (a small actor whose memory came in with the
                    // eager runs has none): runc's restore goes on.
                    debug!(container = id, "criu lazy-pages done before the end of the restore");
                    served = true;
                    restore.await
                } else {
                    return Err(self.stop_streamed_restore(id, restore, pages, work, status).await);
                }
            }
        };
        match restored {
            Ok(pid) => {
                if !served {
                    // A daemon that fails now leaves pages unserved, which
                    // the processes would read as zeros: they are killed at
                    // once (the failed stream then suspends the actor again).
                    lock(&self.lazy).push(daemon.finish_streamed(self.lazy_stop.subscribe(), self.cgroup_of(id)));
                }
                Ok(pid)
            }
            Err(e) => {
                if !served {
                    daemon.kill();
                }
                Err(e)
            }
        }
    }

    /// The lazy-pages daemon of a streamed restore failed (`status`) before
    /// the restore ended: its page server went away (CRIU's daemon does not
    /// outlive that), and the half-restored tasks would wait on their
    /// missing pages for ever, so they are killed and the restore fails.
    async fn stop_streamed_restore(
        &self,
        id: &str,
        restore: impl std::future::Future<Output = Result<i32>>,
        pages: PageSource<'_>,
        work: &Path,
        status: i32,
    ) -> Error {
        let why = format!(
            "criu lazy-pages ended with status {status} during the restore (its page server {} went away; see {:?})",
            pages.socket.display(),
            work.join("lazy-pages.log")
        );
        warn!(container = id, "{why}: the restore is stopped");
        if let Some(cg) = self.cgroup_of(id) {
            crate::system::cgroup::kill_cgroup(&cg).await;
        }
        if restore.await.is_ok() {
            let _ = self.tasks.unrestore(id).await;
        }
        Error::store(StoreErrorKind::Unavailable, why)
    }

    /// Watches the streamed checkout `lease` the actor was just restored
    /// from: once it is all local, the phases say when; when it fails, the
    /// restored processes are stopped before their lazy-pages daemons (a
    /// process whose daemon is gone would read zeros for its missing
    /// pages) and the actor is SUSPENDED again, its snapshot intact in the
    /// object tier, with the reason. Suspends wait for it like for the
    /// daemons. The exits of the restored inits wait for it too (`hold`,
    /// dropped once the processes are stopped, or the stream is done).
    fn watch_stream(&self, lease: String, hold: ExitHold) {
        let me = self.clone();
        lock(&self.lazy).push(tokio::spawn(async move {
            let _hold = hold;
            match me.store.wait_stream(&lease).await {
                Ok(done) => {
                    info!(
                        lease = lease.as_str(),
                        ms = done.done_ms,
                        ready_ms = done.ready_ms,
                        first_page_ms = done.first_page_ms,
                        bytes = done.fetched_bytes,
                        chunks = done.chunks,
                        pages_served = done.pages_served,
                        pages_waited = done.pages_waited,
                        working_set_chunks = done.working_set_chunks,
                        "streamed checkout complete: the snapshot is local"
                    );
                    let _ = me.update_if(|r| {
                        for (name, ms) in [
                            ("stream.ready_at", done.ready_ms),
                            ("stream.first_page_at", done.first_page_ms),
                            ("stream.done_at", done.done_ms),
                        ] {
                            r.last_resume_phases.retain(|p| p.name != name);
                            r.last_resume_phases.push(Phase { name: name.to_string(), us: ms.saturating_mul(1000) });
                        }
                        None::<()>
                    });
                }
                Err(e) => me.stream_failed(&lease, e).await,
            }
        }));
    }

    /// The cgroup (OCI cgroupsPath) app container `id` was restored into.
    fn cgroup_of(&self, id: &str) -> Option<String> {
        self.record().and_then(|r| r.cgroups.get(id).cloned())
    }

    /// See [`Actor::watch_stream`].
    async fn stream_failed(&self, lease: &str, why: Error) {
        let why = why.context("streaming its memory from the object tier after the restore");
        warn!(lease, "the restored actor is stopped and SUSPENDED again: {why}");
        let rec = match self.record() {
            Some(r) if r.state == Lifecycle::Running && r.leases.iter().any(|l| l == lease) => r,
            _ => return,
        };
        // Restored into a new pod (by identity, or a clone), it was never
        // suspended here: the ports to hold for its next trigger are those
        // its restored processes listen on, read before they are stopped.
        let target = lock(&self.held_target).is_none().then(|| self.activation_target(&rec.containers));
        for id in &rec.containers {
            if !self.tasks.is_suspended(id) {
                if let Err(e) = self.tasks.unrestore(id).await {
                    warn!(actor = rec.actor.as_str(), container = id.as_str(), "stop of the restored container after a failed stream: {e}");
                }
            }
        }
        self.lazy_stop.send_modify(|n| *n += 1);
        let _gate = self.gate.lock().await;
        let saved = self.update(|r| {
            r.state = Lifecycle::Suspended;
            r.last_error = Some(why.to_string());
            // Restored by identity (a new pod): its snapshot is the one it
            // was adopted from.
            if r.snapshot.is_none() {
                r.snapshot = r.restore_snapshot.clone();
            }
        });
        if let Err(e) = saved {
            warn!(actor = rec.actor.as_str(), "SUSPENDED after a failed stream, but the record could not be saved: {e}");
        }
        match target {
            Some((Some(netns), ports)) if !ports.is_empty() => self.hold_ports(netns, ports),
            _ => self.rearm_held_ports(),
        }
    }

    /// Waits until every lazy-pages daemon has served all its pages (a
    /// process with pages still missing cannot be dumped again), and every
    /// CRIU of a restore has exited (`criu_restore::wait_ended`).
    pub(crate) async fn wait_lazy_daemons(&self) {
        let pending: Vec<_> = std::mem::take(&mut *lock(&self.lazy));
        for h in pending {
            let _ = h.await;
        }
        crate::system::criu_restore::wait_ended().await;
    }
}

/// How long after a restore its lazy-pages daemon waits before it
/// prefetches the pages no fault asked for (from the local tier, or from
/// the store's page server for a streamed checkout, whose own background
/// fetch waits `stream_background_delay`):
/// `$TORPOR_LAZY_PREFETCH_DELAY_MS` (0 to 60000), [`PREFETCH_DELAY`] if
/// unset. Faults are served meanwhile: a node waking many actors at once
/// spends its CPU on their restores and first answers, not on copying the
/// memory of those already answered.
const PREFETCH_DELAY_ENV: &str = "TORPOR_LAZY_PREFETCH_DELAY_MS";
const PREFETCH_DELAY: std::time::Duration = std::time::Duration::from_millis(1000);
/// How `criu lazy-pages` is told the delay (scripts/criu-patches: CRIU
/// without the patch ignores it and prefetches at once).
const CRIU_PREFETCH_DELAY_ENV: &str = "CRIU_LAZY_PAGES_PREFETCH_DELAY_MS";

/// [`PREFETCH_DELAY_ENV`], read once; an invalid value is logged and the
/// default used.
fn prefetch_delay() -> std::time::Duration {
    static DELAY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| match std::env::var(PREFETCH_DELAY_ENV) {
        Err(std::env::VarError::NotPresent) => PREFETCH_DELAY,
        v => parse_prefetch_delay(v.as_deref().unwrap_or("(not unicode)")).unwrap_or_else(|| {
            error!("${PREFETCH_DELAY_ENV}={v:?}: expected a whole number of milliseconds from 0 to 60000; using {PREFETCH_DELAY:?}");
            PREFETCH_DELAY
        }),
    })
}

fn parse_prefetch_delay(v: &str) -> Option<std::time::Duration> {
    reaper::whole_number_in(v, 0..=60_000).map(std::time::Duration::from_millis)
}

/// Where a streamed checkout's memory comes from: the store's page server
/// and the checkout's lease.
#[derive(Clone, Copy)]
pub(crate) struct PageSource<'a> {
    pub socket: &'a Path,
    pub lease: &'a str,
    /// Held until the stream ended (see [`Actor::watch_stream`]), or the
    /// restore failed: the restored inits' exits wait for it.
    pub hold: &'a ExitHold,
}

/// How long a lazy-pages daemon may take to serve all of a restored
/// container's memory (it prefetches the rest in the background).
const LAZY_DEADLINE: std::time::Duration = crate::system::runc::CRIU_DEADLINE;

/// A `criu lazy-pages` daemon serving one container's memory.
struct LazyDaemon {
    pid: i32,
    exit: reaper::Subscription,
}

impl LazyDaemon {
    /// `criu lazy-pages` for `image`, logging in `work`.
    fn command(image: &Path, work: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new("criu");
        cmd.arg("lazy-pages")
            .arg("--images-dir")
            .arg(image)
            .arg("--work-dir")
            .arg(work)
            // -v3: the log says when the background transfer starts.
            .args(["--log-file", "lazy-pages.log", "-v3"])
            .env(CRIU_PREFETCH_DELAY_ENV, prefetch_delay().as_millis().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        cmd
    }

    /// Spawns the daemon `cmd` (to listen in `work`, which is created).
    fn spawn(mut cmd: std::process::Command, work: &Path) -> Result<LazyDaemon> {
        std::fs::create_dir_all(work).io_context(|| format!("create {work:?}"))?;
        // A socket left by an earlier daemon (killed with its restore) would
        // pass for this one's before it listens: CRIU's connect is refused.
        let socket = work.join("lazy-pages.socket");
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e).io_context(|| format!("remove the stale {socket:?}")),
            _ => {}
        }
        let exit = reaper::subscribe();
        reaper::tag(&mut cmd);
        let child = cmd.spawn().io_context(|| "spawn criu lazy-pages".into())?;
        let pid = child.id() as i32;
        drop(child); // reaped by the reaper
        Ok(LazyDaemon { pid, exit })
    }

    /// Spawns the daemon `cmd` and waits until it listens in `work`.
    async fn spawn_and_wait(cmd: std::process::Command, work: &Path) -> Result<LazyDaemon> {
        let mut daemon = Self::spawn(cmd, work)?;
        let pid = daemon.pid;
        let socket = work.join("lazy-pages.socket");
        // Looked for every millisecond (it takes a few): the restore waits on it.
        for _ in 0..2000 {
            if socket.exists() {
                return Ok(daemon);
            }
            if let Ok(Some(e)) = tokio::time::timeout(std::time::Duration::from_millis(1), daemon.exit.next()).await {
                if e.pid == pid {
                    return Err(Error::InvalidArgument(format!(
                        "criu lazy-pages exited with {} (see {:?})",
                        e.status,
                        work.join("lazy-pages.log")
                    )));
                }
            }
        }
        daemon.kill();
        Err(Error::InvalidArgument("criu lazy-pages did not start listening".into()))
    }

    /// Starts a daemon that gets its pages from the store's page server
    /// (a streamed checkout): the connection is made and named here, then
    /// handed to CRIU (`--page-server --ps-socket`).
    async fn start_streamed(image: &Path, work: &Path, pages: PageSource<'_>, container_dir: &str) -> Result<LazyDaemon> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let refused =
            |why: String| Error::store(StoreErrorKind::Unavailable, format!("the store's page server ({}): {why}", pages.socket.display()));
        let mut conn = tokio::net::UnixStream::connect(pages.socket).await.map_err(|e| refused(format!("connect: {e}")))?;
        conn.write_all(format!("torpor-pages/1 {} {container_dir}\n", pages.lease).as_bytes())
            .await
            .map_err(|e| refused(format!("handshake: {e}")))?;
        let mut line = String::new();
        {
            let mut rd = tokio::io::BufReader::new(&mut conn);
            match tokio::time::timeout(std::time::Duration::from_secs(10), rd.read_line(&mut line)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(refused(format!("handshake: {e}"))),
                Err(_) => return Err(refused("no answer to the handshake within 10 s".into())),
            }
        }
        if line.trim_end() != "ok" {
            return Err(refused(format!("refused: {}", line.trim_end())));
        }
        let conn = conn.into_std().io_context(|| "page server connection".into())?;
        conn.set_nonblocking(false).io_context(|| "page server connection".into())?;
        let fd = std::os::fd::OwnedFd::from(conn);
        let mut cmd = Self::command(image, work);
        cmd.args(["--page-server", "--ps-socket", "3"]);
        reaper::pass_fds(&mut cmd, vec![fd], 3);
        Self::spawn_and_wait(cmd, work).await
    }

    /// A task that ends when the daemon has served every page and exited,
    /// when it was killed at [`LAZY_DEADLINE`] (a daemon that never exits
    /// would keep the next suspend waiting; the restored process then
    /// faults on the pages it still lacks, which CRIU reports), or when
    /// `stop` changes (its processes were stopped: a failed stream).
    fn finish(self, stop: tokio::sync::watch::Receiver<u64>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            self.wait_served(stop).await;
        })
    }

    /// [`LazyDaemon::finish`] of a streamed restore's daemon: when it fails
    /// (its page server went away), the processes of `cgroup` are killed.
    fn finish_streamed(self, stop: tokio::sync::watch::Receiver<u64>, cgroup: Option<String>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let pid = self.pid;
            if let Some(status) = self.wait_served(stop).await.filter(|s| *s != 0) {
                warn!(pid, status, "criu lazy-pages of a streamed restore failed before it served every page: its processes are killed");
                if let Some(cg) = cgroup {
                    crate::system::cgroup::kill_cgroup(&cg).await;
                }
            }
        })
    }

    /// Its exit status if it ended by itself; `None` if it was killed.
    async fn wait_served(mut self, mut stop: tokio::sync::watch::Receiver<u64>) -> Option<i32> {
        let pid = self.pid;
        tokio::select! {
            r = tokio::time::timeout(LAZY_DEADLINE, self.exit.wait_for(pid)) => {
                if let Ok(status) = r {
                    return Some(status);
                }
                warn!(pid, deadline = ?LAZY_DEADLINE, "criu lazy-pages did not finish serving its pages in time: killed");
            }
            _ = stop.changed() => debug!(pid, "criu lazy-pages stopped: its processes were"),
        }
        self.kill();
        let _ = self.exit.wait_for(pid).await;
        None
    }

    fn kill(&self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// The container name an image directory is named after.
pub(super) fn image_name(image: &Path) -> Result<&str> {
    image.file_name().and_then(|n| n.to_str()).ok_or_else(|| Error::FailedPrecondition(format!("image directory {image:?} has no name")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn prefetch_delay_is_whole_milliseconds_up_to_a_minute() {
        assert_eq!(parse_prefetch_delay("0"), Some(Duration::ZERO));
        assert_eq!(parse_prefetch_delay("1000"), Some(Duration::from_secs(1)));
        assert_eq!(parse_prefetch_delay("60000"), Some(Duration::from_secs(60)));
        for bad in ["", "60001", "-1", "1.5", "1s", " 5", "99999999999999999999999"] {
            assert_eq!(parse_prefetch_delay(bad), None, "{bad:?}");
        }
    }
}
