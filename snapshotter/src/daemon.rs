//! The daemon: opens the snapshotter, serves its gRPC services on unix
//! sockets (one tokio runtime, one socket per service), and shuts down
//! cleanly on SIGTERM/SIGINT.
//!
//! Services:
//! - containerd's snapshots API (proxy plugin) on `snapshotter.address`;
//! - the snapshot store's API (ttrpc, [`crate::store_api`]) on `store.address`,
//!   over the tiered store ([`torpor_store`]) whose background uploads and
//!   evictions run on the same runtime;
//! - Prometheus metrics ([`crate::metrics`]) on `metrics_address` (TCP, when set).

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_snapshots::tonic::transport::server::Router;
use containerd_snapshots::tonic::transport::Server;
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::overlay::{Options, Overlay, OverlaySnapshotter};

/// Sets the process's umask to 077: files the daemon creates are 0600 and
/// directories 0700 unless created with explicit modes (the store sets its
/// own anyway; this covers what object_store's file:// tier and CRIU-side
/// helpers create).
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Makes sure `dir` (a socket's directory) exists: created 0700 when
/// missing. An existing one is never chmod-ed (its modes are the
/// operator's: /run/torpor may be shared, a 1777 directory is someone
/// else's); the socket itself is 0600 ([`bind_socket`]). Refused: a
/// directory that group or others may write to without the sticky bit
/// (they could replace the socket with their own).
pub fn private_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(md) => {
            if !md.is_dir() {
                return Err(Error::Daemon(format!("socket directory {} is not a directory", dir.display())));
            }
            let mode = md.permissions().mode() & 0o7777;
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                return Err(Error::Daemon(format!(
                    "socket directory {} is mode {mode:04o}: group or others may write to it without the sticky bit, so they could replace the socket; make it 0755 or 0700 (the daemon does not change an existing directory's modes)",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| Error::io("create directory", dir, e))
        }
        Err(e) => Err(Error::io("stat", dir, e)),
    }
}

/// Binds a unix socket at `path` (mode 0600, in a 0700 directory). A socket
/// left by a crashed daemon is replaced; one that still answers is not.
pub fn bind_socket(path: &Path) -> Result<UnixListener> {
    let dir = path.parent().ok_or_else(|| Error::Daemon(format!("socket path {} has no directory", path.display())))?;
    private_dir(dir)?;
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(Error::Daemon(format!("{} is in use: another torpor-snapshotter is serving it", path.display())));
            }
            warn!(path = %path.display(), "replacing stale socket");
            std::fs::remove_file(path).map_err(|e| Error::io("remove stale socket", path, e))?;
        }
        Ok(_) => return Err(Error::Daemon(format!("{} exists and is not a socket; not replacing it", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("stat", path, e)),
    }
    let l = UnixListener::bind(path).map_err(|e| Error::io("bind", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| Error::io("chmod 0600", path, e))?;
    Ok(l)
}

/// The store API's runtime, shut down without blocking when dropped (a
/// runtime dropped inside async code would panic).
struct ApiRuntime(Option<tokio::runtime::Runtime>);

impl ApiRuntime {
    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for ApiRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// One served socket.
struct Served {
    name: &'static str,
    path: PathBuf,
    task: JoinHandle<std::result::Result<(), String>>,
}

/// Serves `router` on `listener` until `stop` turns true; then stops
/// accepting and lets in-flight calls finish.
fn serve_on(name: &'static str, path: PathBuf, listener: UnixListener, router: Router, mut stop: watch::Receiver<bool>) -> Served {
    let incoming = UnixListenerStream::new(listener);
    let task = tokio::spawn(async move {
        let signal = async move {
            // a dropped sender counts as "stop" too
            let _ = stop.wait_for(|s| *s).await;
        };
        router.serve_with_incoming_shutdown(incoming, signal).await.map_err(|e| format!("{name} server: {e}"))
    });
    info!(service = name, socket = %path.display(), "serving");
    Served { name, path, task }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(cfg: Config) -> Result<()> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| Error::Daemon(format!("SIGTERM handler: {e}")))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| Error::Daemon(format!("SIGINT handler: {e}")))?;

    // The metrics port first: one in use stops the start before any
    // state is created.
    let metrics_listener = cfg.metrics_address.map(crate::metrics::http::bind).transpose()?;
    // Expedited RCU grace periods for the resumes, the node's own setting
    // back when this returns.
    let _rcu = if cfg.rcu_expedited { crate::rcu::expedite() } else { None };
    // CRIU's kernel cache, before the first suspend or resume needs it.
    tokio::spawn(crate::criu_cache::warm());
    // The restore path's programs, in memory for the daemon's life: the
    // task holds them until the runtime stops.
    let programs = cfg.resident_programs.clone();
    tokio::spawn(async move {
        let _held = crate::resident::lock_programs(&programs).await;
        std::future::pending::<()>().await
    });

    let root = cfg.root.clone();
    let opts = Options { mount_options: cfg.snapshotter.mount_options.clone(), upperdir_label: cfg.snapshotter.upperdir_label };
    let overlay = tokio::task::spawn_blocking(move || Overlay::open(&root, opts))
        .await
        .map_err(|e| Error::Daemon(format!("opening the snapshotter: {e}")))??;
    let snapshotter = OverlaySnapshotter::new(overlay);

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut served = Vec::new();

    let listener = bind_socket(&cfg.snapshotter.address)?;
    let router = Server::builder().add_service(containerd_snapshots::server(Arc::new(snapshotter.clone())));
    served.push(serve_on("snapshotter", cfg.snapshotter.address.clone(), listener, router, stop_rx.clone()));

    // The tiered snapshot store and its API (ttrpc: the shim's transport).
    let store_cfg = cfg.store_config();
    info!(root = %store_cfg.root.display(), remote = %store_cfg.remote_url, budget = store_cfg.local_budget_bytes, "opening the snapshot store");
    let store = torpor_store::Store::open(store_cfg).await.map_err(|e| Error::Daemon(format!("opening the snapshot store: {e}")))?;
    // The store API is served on a runtime of its own, with the lease
    // renewals: Confirm (the shims' lease fence) and renewals never wait
    // behind the data path (commits, fetches, uploads, whose database and
    // disk work can hold this runtime's threads). Store operations still
    // run here, on the data runtime.
    let api_rt = ApiRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("torpor-store-api")
            .enable_all()
            .build()
            .map_err(|e| Error::Daemon(format!("the store API's runtime: {e}")))?,
    ));
    let store_listener = bind_socket(&cfg.store.address)?.into_std().map_err(|e| Error::io("store API socket", &cfg.store.address, e))?;
    let metrics = crate::metrics::Metrics::new(Some(&store));
    // The page server (streamed checkouts' memory, for CRIU's lazy-pages
    // daemons), on the data runtime, beside the store API's socket.
    let pages_socket = crate::page_server::socket_beside(&cfg.store.address);
    let pages_listener = bind_socket(&pages_socket)?;
    let page_server = tokio::spawn(crate::page_server::serve(pages_listener, store.clone()));
    let service = crate::store_api::StoreService::with_data_runtime(store.clone(), cfg.store.gc_keep, tokio::runtime::Handle::current())
        .with_metrics(metrics.clone())
        .with_page_server(pages_socket.clone())
        .with_tenancy(cfg.tenancy.clone());
    let address = cfg.store.address.clone();
    let mut store_server = api_rt
        .handle()
        .spawn(async move {
            let listener = tokio::net::UnixListener::from_std(store_listener).map_err(|e| format!("{e}"))?;
            let mut server =
                torpor_api::ttrpc::asynchronous::Server::new().add_listener(listener.into()).register_service(service.into_service());
            server.start().await.map_err(|e| format!("{e}"))?;
            Ok::<_, String>(server)
        })
        .await
        .map_err(|e| Error::Daemon(format!("serving the store API: {e}")))?
        .map_err(|e| Error::Daemon(format!("serving the store API on {}: {e}", address.display())))?;
    store.run_leases_on(&api_rt.handle());
    let metrics_task = match metrics_listener {
        Some(l) => Some(crate::metrics::http::serve(l, metrics, stop_rx.clone())?),
        None => None,
    };
    info!(service = "store", socket = %cfg.store.address.display(), "serving");
    {
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.check_conditional_writes().await {
                warn!(error = %e, "could not check that the object tier honours conditional writes (it is unreachable): checked again at the next start");
            }
        });
    }
    let gc_task = cfg.store.gc_interval.map(|every| {
        let store = store.clone();
        let keep = cfg.store.gc_keep;
        tokio::spawn(async move {
            let start = tokio::time::Instant::now().checked_add(every).unwrap_or_else(tokio::time::Instant::now);
            let mut tick = tokio::time::interval_at(start, every);
            loop {
                tick.tick().await;
                let policy = torpor_store::GcPolicy { keep_newest: keep, ..Default::default() };
                match store.gc(policy).await {
                    Ok(r) => info!(removed = r.removed.len(), chunks = r.chunks_deleted, errors = r.errors.len(), "periodic gc"),
                    Err(e) => warn!(error = %e, "periodic gc failed"),
                }
            }
        })
    });

    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        warn!(error = %e, "could not notify systemd of readiness");
    }
    info!(root = %cfg.root.display(), "torpor-snapshotter ready");

    // Wait for a signal, or for a server to fail on its own.
    let mut failed: Option<String> = None;
    let names: Vec<&'static str> = served.iter().map(|s| s.name).collect();
    {
        let any_server = futures::future::select_all(served.iter_mut().map(|s| &mut s.task));
        tokio::select! {
            _ = sigterm.recv() => info!("SIGTERM: shutting down"),
            _ = sigint.recv() => info!("SIGINT: shutting down"),
            (res, idx, _) = any_server => {
                let msg = match res {
                    Ok(Ok(())) => "stopped unexpectedly".to_string(),
                    Ok(Err(e)) => e,
                    Err(e) => format!("panicked: {e}"),
                };
                failed = Some(format!("{} server {msg}", names.get(idx).copied().unwrap_or("a")));
            }
        }
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);

    // Stop accepting, drain in-flight calls (bounded by shutdown_timeout).
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now()
        .checked_add(cfg.shutdown_timeout)
        .unwrap_or_else(|| tokio::time::Instant::now() + crate::config::DEFAULT_SHUTDOWN_TIMEOUT);
    for s in served {
        if s.task.is_finished() {
            // already reported above (or finished cleanly)
        } else {
            let abort = s.task.abort_handle();
            match tokio::time::timeout_at(deadline, s.task).await {
                Ok(Ok(Ok(()))) => info!(service = s.name, "drained"),
                Ok(Ok(Err(e))) => {
                    error!(service = s.name, error = %e, "server failed while draining")
                }
                Ok(Err(e)) => error!(service = s.name, error = %e, "server task failed"),
                Err(_) => {
                    warn!(service = s.name, timeout = ?cfg.shutdown_timeout, "in-flight calls did not finish in time; closing anyway");
                    abort.abort();
                }
            }
        }
        match std::fs::remove_file(&s.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(socket = %s.path.display(), error = %e, "could not remove socket"),
        }
    }

    // The store API: stop accepting, let connections end, stop background work.
    if let Some(t) = gc_task {
        t.abort();
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    page_server.abort();
    if let Err(e) = store_server.shutdown().await {
        warn!(error = %e, "store API shutdown");
    }
    store.shutdown().await;
    drop(api_rt);
    for socket in [&cfg.store.address, &pages_socket] {
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(socket = %socket.display(), error = %e, "could not remove socket"),
        }
    }

    // Close the database: the last reference goes with the snapshotter
    // (calls still running after the timeout hold one until they end).
    let refs = Arc::strong_count(snapshotter.overlay());
    drop(snapshotter);
    if refs > 1 {
        warn!(still_in_use = refs - 1, "metadata database closes when the last call ends");
    }
    match failed {
        Some(msg) => Err(Error::Daemon(msg)),
        None => {
            info!("torpor-snapshotter stopped");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn socket_in_a_private_dir_replacing_only_stale_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sock = dir.join("s.sock");

        let l = bind_socket(&sock).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o755, "an existing directory is left as it is");
        assert_eq!(mode(&sock), 0o600);

        // a live socket is not taken over
        let e = bind_socket(&sock).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");

        // a stale one (its listener gone, the file left) is replaced
        drop(l);
        assert!(sock.exists());
        let _l = bind_socket(&sock).unwrap();

        // something else at the path is left alone
        let file = dir.join("plain");
        std::fs::write(&file, "x").unwrap();
        let e = bind_socket(&file).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");

        // a missing directory is created 0700
        let deep = tmp.path().join("a/b/c.sock");
        let _l2 = bind_socket(&deep).unwrap();
        assert_eq!(mode(deep.parent().unwrap()), 0o700);

        // a shared sticky directory (1777) is used and not chmod-ed
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let _l3 = bind_socket(&shared.join("s.sock")).unwrap();
        assert_eq!(mode(&shared), 0o1777);
        assert_eq!(mode(&shared.join("s.sock")), 0o600);

        // one others may write to without the sticky bit is refused, untouched
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = bind_socket(&open.join("s.sock")).unwrap_err();
        assert!(e.to_string().contains("sticky"), "{e}");
        assert_eq!(mode(&open), 0o777);
        assert!(!open.join("s.sock").exists());
    }
}
