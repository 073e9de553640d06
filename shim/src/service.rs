//! The shim's process lifecycle: `start` (spawn or join the pod's shim),
//! `delete` (clean up after a dead shim) and the task service's creation.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::{publisher::RemotePublisher, spawn, ExitSignal, Shim};
use containerd_shim::protos::api::DeleteResponse;
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::types::introspection::{RuntimeInfo, RuntimeVersion};
use containerd_shim::{Config, Flags, StartOpts};
use tokio::sync::mpsc;
use torpor_runtime::{group_of, Runtime};
use tracing::info;

use crate::events::{timestamp, Events};
use crate::task::TaskService;

/// The logger of `delete`: containerd logs what the cleanup wrote to stderr
/// ("warnings while cleaning up dead shim"), and nothing else reaches it.
struct StderrLog;

impl StderrLog {
    fn install() {
        if log::set_boxed_logger(Box::new(StderrLog)).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
    }
}

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        eprintln!("torpor cleanup: {}: {}{}", r.level(), r.args(), crate::logging::key_values(r));
    }

    fn flush(&self) {}
}

pub struct Service {
    exit: Arc<ExitSignal>,
    id: String,
    namespace: String,
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Service { exit: Arc::new(ExitSignal::default()), id: args.id.clone(), namespace: args.namespace.clone() }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // containerd runs `start` in the bundle directory.
        let grouping = group_of(std::path::Path::new("."), &opts.id);
        // A container of a pod whose shim already serves (one started
        // through `start`, as `ctr c restore` of a CRI container does): that
        // shim's address, as runc-v2 answers. Spawned anyway, a second shim
        // process would set itself up (control socket, triggers) only to
        // find the address taken and exit, leaving its control socket.
        let running = opts.socket_address(&grouping);
        let address = if serving(&running) {
            info!(container = opts.id.as_str(), shim = grouping.as_str(), "grouped with the pod's running shim");
            running
        } else {
            spawn(opts, &grouping, Vec::new()).await?
        };
        containerd_shim::asynchronous::util::write_str_to_file("address", &address).await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        // The shim died (containerd runs this once per container it served):
        // kill what it left (its runc/CRIU children, the containers), settle
        // the actor's record (a complete checkpoint is kept for a restore
        // by identity), unmount the rootfs.
        StderrLog::install();
        let bundle = std::env::current_dir().map_err(|e| containerd_shim::Error::Other(format!("get bundle dir: {e}")))?;
        let shim = group_of(&bundle, &self.id);
        if crate::control::serving(&shim) {
            // containerd also runs this when it closes its connection for
            // one task of a shim that lives on (its start failed, say): that
            // container alone goes; the actor, its record, its lease and the
            // control socket are the live shim's.
            info!(container = self.id.as_str(), shim = shim.as_str(), "cleaning up one container of a shim that still serves its pod");
            torpor_runtime::container_gone(&self.namespace, &self.id, &bundle).await;
        } else {
            info!(container = self.id.as_str(), shim = shim.as_str(), "cleaning up after the shim died");
            torpor_runtime::after_shim_death(&self.namespace, &shim, &self.id, &bundle).await;
            crate::control::remove(&shim);
        }
        crate::task::unmount_bundle(&bundle);
        let pid = torpor_runtime::read_pid(&bundle.join("init.pid")).unwrap_or(0);
        Ok(DeleteResponse {
            pid: pid as u32,
            exit_status: 137,
            exited_at: Some(timestamp(std::time::SystemTime::now())).into(),
            ..Default::default()
        })
    }

    /// `-info`: who we are, and the OCI features of the runc we drive (as
    /// runc-v2 reports them), so containerd can check specs against them.
    fn runtime_info(runtime_id: &str, options: Option<&Any>) -> containerd_shim::Result<RuntimeInfo> {
        let runc = std::env::var_os("TORPOR_RUNC").unwrap_or_else(|| "runc".into());
        let out = std::process::Command::new(&runc)
            .arg("features")
            .output()
            .map_err(|e| containerd_shim::Error::Other(format!("run {runc:?} features: {e}")))?;
        if !out.status.success() {
            return Err(containerd_shim::Error::Other(format!(
                "{runc:?} features failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(RuntimeInfo {
            name: runtime_id.to_string(),
            version: MessageField::some(RuntimeVersion { version: env!("CARGO_PKG_VERSION").to_string(), ..Default::default() }),
            options: options.cloned().into(),
            features: MessageField::some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/features/Features".into(),
                value: out.stdout,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
        crate::control::remove(&self.id);
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let events = Events::start(publisher, self.namespace.clone());
        let (tx, rx) = mpsc::unbounded_channel();
        events.forward(rx);
        // Children carry the shim id: found and killed after a shim death.
        torpor_runtime::set_tag(&self.id);
        let runtime = Runtime::new(&self.namespace, tx);
        crate::control::serve(runtime.clone(), self.id.clone());
        runtime.start_triggers(&self.id);
        TaskService::new(runtime, events, self.exit.clone())
    }
}

/// Does a shim serve ttrpc at `address` (`unix://<path>`)? containerd's
/// `CanConnect` of runc-v2's `start`.
fn serving(address: &str) -> bool {
    address.strip_prefix("unix://").is_some_and(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
}
