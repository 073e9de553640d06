//! The containerd task service (containerd.task.v3.Task): each request is
//! checked, mapped onto [`torpor_runtime::Runtime`], and the
//! matching task event is published.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::protos::api::{
    CheckpointTaskRequest, CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse, DeleteRequest,
    DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest, PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest,
    ShutdownRequest, StartRequest, StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest, WaitRequest,
    WaitResponse,
};
use containerd_shim::protos::events::task::{
    TaskCheckpointed, TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskIO, TaskPaused, TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use containerd_shim::protos::shim::oci::{CheckpointOptions, ProcessDetails};
use containerd_shim::protos::shim_async::Task;
use containerd_shim::protos::ttrpc::{self, r#async::TtrpcContext, Code};
use containerd_shim::protos::types::task::{ProcessInfo, Status as TaskStatus};
use torpor_runtime::{wait_exit, CheckpointOpts, CreateRequest, RuncOptions, Runtime, Status, StdioConfig};
use tracing::{info, warn};

use crate::error::IntoTtrpc;
use crate::events::{timestamp, Events};
use crate::stats;

pub struct TaskService {
    runtime: Runtime,
    events: Events,
    exit: Arc<ExitSignal>,
}

impl TaskService {
    pub fn new(runtime: Runtime, events: Events, exit: Arc<ExitSignal>) -> Self {
        TaskService { runtime, events, exit }
    }
}

fn status(code: Code, msg: impl Into<String>) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg.into()))
}

fn task_status(s: Status) -> TaskStatus {
    match s {
        Status::Created => TaskStatus::CREATED,
        Status::Running => TaskStatus::RUNNING,
        Status::Paused => TaskStatus::PAUSED,
        Status::Stopped => TaskStatus::STOPPED,
    }
}

/// containerd's runtime options for this container (see [`crate::options`]).
fn runc_options(req: &CreateTaskRequest) -> ttrpc::Result<RuncOptions> {
    crate::options::runtime_options(req.options.as_ref()).ttrpc()
}

/// Mounts the rootfs containerd prepared into `bundle/rootfs`.
async fn mount_rootfs(req: &CreateTaskRequest, bundle: &Path) -> ttrpc::Result<()> {
    let target = bundle.join("rootfs");
    for m in &req.rootfs {
        containerd_shim::asynchronous::util::mount_rootfs(m, &target)
            .await
            .map_err(|e| status(Code::UNKNOWN, format!("mount rootfs of {}: {e}", req.id)))?;
    }
    Ok(())
}

/// Unmounts the container's rootfs, and whatever a killed CRIU left
/// mounted in the bundle's CRIU work directory (its cgroup yard).
pub(crate) fn unmount_bundle(bundle: &Path) {
    let rootfs = bundle.join("rootfs");
    if let Err(e) = containerd_shim::mount::umount_recursive(rootfs.to_str(), 0) {
        warn!("unmount {rootfs:?}: {e}");
    }
    torpor_runtime::system::mounts::detach_under(bundle);
}

#[async_trait]
impl Task for TaskService {
    async fn create(&self, _ctx: &TtrpcContext, req: CreateTaskRequest) -> ttrpc::Result<CreateTaskResponse> {
        info!(id = req.id.as_str(), bundle = req.bundle.as_str(), "create");
        if !req.parent_checkpoint.is_empty() {
            return Err(status(
                Code::UNIMPLEMENTED,
                "restore from a parent (incremental) checkpoint is not supported: this kernel has no soft-dirty tracking",
            ));
        }
        let bundle = PathBuf::from(&req.bundle);
        mount_rootfs(&req, &bundle).await?;
        let stdio =
            StdioConfig { stdin: req.stdin.clone(), stdout: req.stdout.clone(), stderr: req.stderr.clone(), terminal: req.terminal };
        let created = self
            .runtime
            .create(CreateRequest {
                id: req.id.clone(),
                bundle: bundle.clone(),
                stdio,
                checkpoint: (!req.checkpoint.is_empty()).then(|| PathBuf::from(&req.checkpoint)),
                runc_options: runc_options(&req)?,
                rootfs_upper: req.rootfs.iter().find_map(|m| torpor_runtime::upper_dir(&m.type_, m.options.iter().map(String::as_str))),
            })
            .await;
        let pid = match created {
            Ok(pid) => pid,
            Err(e) => {
                unmount_bundle(&bundle);
                warn!(id = req.id.as_str(), "create failed: {e}");
                return Err(crate::error::to_ttrpc(e));
            }
        };
        self.events.send(TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            io: MessageField::some(TaskIO {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
                ..Default::default()
            }),
            checkpoint: req.checkpoint.clone(),
            pid: pid as u32,
            ..Default::default()
        });
        Ok(CreateTaskResponse { pid: pid as u32, ..Default::default() })
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        let pid = self.runtime.start(&req.id, &req.exec_id).await.ttrpc()?;
        if req.exec_id.is_empty() {
            self.events.send(TaskStart { container_id: req.id.clone(), pid: pid as u32, ..Default::default() });
        } else {
            self.events.send(TaskExecStarted {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                pid: pid as u32,
                ..Default::default()
            });
        }
        Ok(StartResponse { pid: pid as u32, ..Default::default() })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        let s = self.runtime.state(&req.id, &req.exec_id).await.ttrpc()?;
        Ok(StateResponse {
            id: if s.exec_id.is_empty() { s.id } else { s.exec_id.clone() },
            bundle: s.bundle.to_string_lossy().into_owned(),
            pid: s.pid as u32,
            status: task_status(s.status).into(),
            stdin: s.stdio.stdin,
            stdout: s.stdio.stdout,
            stderr: s.stdio.stderr,
            terminal: s.stdio.terminal,
            exit_status: s.exit.map(|e| e.status).unwrap_or(0),
            exited_at: s.exit.map(|e| timestamp(e.at)).into(),
            exec_id: s.exec_id,
            ..Default::default()
        })
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        let bundle = self.runtime.state(&req.id, "").await.ttrpc()?.bundle;
        let (pid, exit) = self.runtime.delete(&req.id, &req.exec_id).await.ttrpc()?;
        if req.exec_id.is_empty() {
            unmount_bundle(&bundle);
            self.events.send(TaskDelete {
                container_id: req.id.clone(),
                pid: pid as u32,
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            });
        }
        Ok(DeleteResponse { pid: pid as u32, exit_status: exit.status, exited_at: Some(timestamp(exit.at)).into(), ..Default::default() })
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        let pids = self.runtime.pids(&req.id).await.ttrpc()?;
        let mut processes = Vec::with_capacity(pids.len());
        for (pid, exec_id) in pids {
            let mut info = ProcessInfo { pid: pid as u32, ..Default::default() };
            if let Some(exec_id) = exec_id {
                let details = ProcessDetails { exec_id, ..Default::default() };
                let value = details.write_to_bytes().map_err(|e| status(Code::INTERNAL, format!("encode process details: {e}")))?;
                info.info = MessageField::some(Any {
                    type_url: "types.containerd.io/containerd.runc.v1.ProcessDetails".into(),
                    value,
                    ..Default::default()
                });
            }
            processes.push(info);
        }
        Ok(PidsResponse { processes, ..Default::default() })
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        self.runtime.pause(&req.id).await.ttrpc()?;
        self.events.send(TaskPaused { container_id: req.id, ..Default::default() });
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        self.runtime.resume(&req.id).await.ttrpc()?;
        self.events.send(TaskResumed { container_id: req.id, ..Default::default() });
        Ok(Empty::new())
    }

    async fn checkpoint(&self, _ctx: &TtrpcContext, req: CheckpointTaskRequest) -> ttrpc::Result<Empty> {
        let o = match req.options.as_ref() {
            Some(any) if !any.value.is_empty() => CheckpointOptions::parse_from_bytes(&any.value)
                .map_err(|e| status(Code::INVALID_ARGUMENT, format!("checkpoint options ({}): {e}", any.type_url)))?,
            _ => CheckpointOptions::default(),
        };
        let bundle = self.runtime.state(&req.id, "").await.ttrpc()?.bundle;
        // The runtime options' CRIU directories stand in for those the
        // request does not name, as under runc-v2.
        let defaults = RuncOptions::load(&bundle).map_err(crate::error::to_ttrpc)?;
        let image = match (o.image_path.as_str(), req.path.as_str(), &defaults.criu_image_path) {
            ("", "", Some(p)) => p.to_string_lossy().into_owned(),
            ("", p, _) => p.to_string(),
            (p, _, _) => p.to_string(),
        };
        if image.is_empty() {
            return Err(status(Code::INVALID_ARGUMENT, "checkpoint needs an image path"));
        }
        let image = &image;
        // As runc-v2: a work dir given by the caller is kept, ours is removed.
        let (work, temporary) = match (o.work_path.as_str(), &defaults.criu_work_path) {
            ("", Some(p)) => (p.join(&req.id), false),
            ("", None) => (bundle.join("criu-work"), true),
            (p, _) => (PathBuf::from(p), false),
        };
        let opts = CheckpointOpts {
            exit: o.exit,
            open_tcp: o.open_tcp,
            external_unix_sockets: o.external_unix_sockets,
            terminal: o.terminal,
            file_locks: o.file_locks,
            empty_namespaces: o.empty_namespaces.clone(),
            cgroups_mode: o.cgroups_mode.clone(),
            image_path: PathBuf::from(image),
            work_path: work.clone(),
            external: Vec::new(),
            // CRIU locks the network itself, as under runc-v2.
            network_locked: false,
        };
        info!(id = req.id.as_str(), image = image.as_str(), exit = o.exit, "checkpoint");
        let r = self.runtime.checkpoint(&req.id, opts).await;
        if temporary {
            let _ = std::fs::remove_dir_all(&work);
        }
        r.ttrpc()?;
        self.events.send(TaskCheckpointed { container_id: req.id, checkpoint: image.clone(), ..Default::default() });
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> ttrpc::Result<Empty> {
        self.runtime.kill(&req.id, &req.exec_id, req.signal, req.all).await.ttrpc()?;
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        let spec = req.spec.as_ref().ok_or_else(|| status(Code::INVALID_ARGUMENT, "exec request without a process spec"))?;
        // The spec is an OCI Process in JSON; runc reads it as is, with the
        // terminal flag containerd sent.
        let mut process: serde_json::Value = serde_json::from_slice(&spec.value)
            .map_err(|e| status(Code::INVALID_ARGUMENT, format!("exec process spec is not JSON: {e}")))?;
        process["terminal"] = serde_json::Value::Bool(req.terminal);
        let json = serde_json::to_vec(&process).map_err(|e| status(Code::INTERNAL, format!("encode exec process spec: {e}")))?;
        let stdio =
            StdioConfig { stdin: req.stdin.clone(), stdout: req.stdout.clone(), stderr: req.stderr.clone(), terminal: req.terminal };
        self.runtime.exec(&req.id, &req.exec_id, &json, stdio).await.ttrpc()?;
        self.events.send(TaskExecAdded { container_id: req.id, exec_id: req.exec_id, ..Default::default() });
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        self.runtime.resize_pty(&req.id, &req.exec_id, req.width, req.height).await.ttrpc()?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        if req.stdin {
            self.runtime.close_io(&req.id, &req.exec_id).await.ttrpc()?;
        }
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        let resources = req.resources.as_ref().ok_or_else(|| status(Code::INVALID_ARGUMENT, "update request without resources"))?;
        self.runtime.update(&req.id, &resources.value).await.ttrpc()?;
        Ok(Empty::new())
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        let rx = self.runtime.exit_watch(&req.id, &req.exec_id).await.ttrpc()?;
        let exit = wait_exit(rx).await.ok_or_else(|| status(Code::NOT_FOUND, format!("process {}/{} is gone", req.id, req.exec_id)))?;
        Ok(WaitResponse { exit_status: exit.status, exited_at: Some(timestamp(exit.at)).into(), ..Default::default() })
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        let raw = self.runtime.stats(&req.id).await.ttrpc()?;
        let metrics = stats::to_metrics(&raw);
        let value = metrics.write_to_bytes().map_err(|e| status(Code::INTERNAL, format!("encode metrics: {e}")))?;
        Ok(StatsResponse {
            stats: MessageField::some(Any { type_url: "io.containerd.cgroups.v1.Metrics".into(), value, ..Default::default() }),
            ..Default::default()
        })
    }

    async fn connect(&self, _ctx: &TtrpcContext, req: ConnectRequest) -> ttrpc::Result<ConnectResponse> {
        let task_pid = self.runtime.init_pid(&req.id).await.unwrap_or(0);
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: task_pid as u32,
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> ttrpc::Result<Empty> {
        // One shim serves the whole pod: it exits only when no container is left.
        if self.runtime.is_empty().await {
            info!("no containers left: shutting down");
            self.exit.signal();
        }
        Ok(Empty::new())
    }
}
