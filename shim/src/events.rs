//! Publishes task events to containerd, in order, from one queue.

use std::time::{Duration, SystemTime};

use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::protos::events::task::{TaskExit, TaskOOM};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::ttrpc::context::with_duration;
use tokio::sync::mpsc;
use torpor_runtime::Event;
use tracing::warn;

/// A queued event: its topic and message.
pub type Queued = (String, Box<dyn MessageDyn>);

/// Sender side of the queue, for the task service.
#[derive(Clone)]
pub struct Events {
    tx: mpsc::UnboundedSender<Queued>,
}

impl Events {
    /// Starts the publisher task.
    pub fn start(publisher: RemotePublisher, namespace: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
        tokio::spawn(async move {
            while let Some((topic, event)) = rx.recv().await {
                // As the Go shim: give containerd 5 s per event.
                if let Err(e) = publisher.publish(with_duration(Duration::from_secs(5)), &topic, &namespace, event).await {
                    warn!("publish {topic}: {e}");
                }
            }
        });
        Events { tx }
    }

    pub fn send<E: containerd_shim::event::Event + MessageDyn + 'static>(&self, e: E) {
        let topic = e.topic();
        let _ = self.tx.send((topic, Box::new(e)));
    }

    /// Forwards the runtime's exit and OOM events.
    pub fn forward(&self, mut rx: mpsc::UnboundedReceiver<Event>) {
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                match e {
                    Event::Exit { container_id, exec_id, pid, exit } => me.send(TaskExit {
                        container_id: container_id.clone(),
                        id: if exec_id.is_empty() { container_id } else { exec_id },
                        pid: pid as u32,
                        exit_status: exit.status,
                        exited_at: Some(timestamp(exit.at)).into(),
                        ..Default::default()
                    }),
                    Event::Oom { container_id } => me.send(TaskOOM { container_id, ..Default::default() }),
                }
            }
        });
    }
}

/// A protobuf timestamp.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32, ..Default::default() }
}
