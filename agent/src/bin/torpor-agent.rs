//! `torpor-agent`: torpor's node agent (one per node, in the torpor
//! DaemonSet). See the crate's docs and docs/ARCHITECTURE.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use torpor_agent::agent::{self, Config};
use torpor_agent::install::{self, Intent};
use torpor_agent::resize::Floors;
use torpor_agent::Error;

#[derive(Parser)]
#[command(
    name = "torpor-agent",
    version,
    about = "Suspend and resume this node's torpor pods from their torpor.dev/desired-state annotation"
)]
struct Cli {
    /// This node's name (from the downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node: String,
    /// The namespace of the agent's DaemonSet (from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "torpor-system")]
    namespace: String,
    /// The agent's DaemonSet.
    #[arg(long, env = "TORPOR_DAEMONSET", default_value = "torpor-node")]
    daemonset: String,
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Directory of the shims' control sockets.
    #[arg(long, env = torpor_api::control::SOCKET_DIR_ENV, default_value = torpor_api::control::SOCKET_DIR)]
    socket_dir: PathBuf,
    /// Seconds between two looks at every actor (state changes made by
    /// other triggers, such as a request waking an actor, show then).
    #[arg(long, env = "TORPOR_AGENT_RESYNC_S", default_value_t = 5)]
    resync_s: u64,
    /// Lower the CPU and memory requests of pods whose actor is suspended
    /// (pods/resize), so the scheduler can use what they do not; they are
    /// restored when the actor wakes. `false`: requests are left as they
    /// are (lowered ones are still restored).
    #[arg(long, env = "TORPOR_AGENT_SHRINK", default_value_t = true, action = clap::ArgAction::Set)]
    shrink: bool,
    /// The CPU request a suspended actor's container keeps (a Kubernetes quantity).
    #[arg(long, env = "TORPOR_AGENT_CPU_FLOOR", default_value = torpor_agent::resize::Floors::CPU)]
    cpu_floor: String,
    /// The memory request a suspended actor's container keeps (a Kubernetes quantity).
    #[arg(long, env = "TORPOR_AGENT_MEMORY_FLOOR", default_value = torpor_agent::resize::Floors::MEMORY)]
    memory_floor: String,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9465) at
    /// /metrics; empty: not served.
    #[arg(long, env = "TORPOR_AGENT_METRICS_ADDRESS", default_value = "")]
    metrics_address: String,
    /// Seconds a woken actor's requests back may stay pending for lack of
    /// room (kubelet's PodResizePending) before a pod with
    /// `torpor.dev/on-no-room: move` is moved: suspended, and deleted for
    /// its controller to create it again where it fits.
    #[arg(long, env = "TORPOR_AGENT_MOVE_AFTER_S", default_value_t = 10)]
    move_after_s: u64,
}

/// The node pod's install steps (deploy/kubernetes/image/node.sh). Exit
/// codes: 0 done, 2 the API could not tell or refused (the caller fails
/// closed), 1 otherwise.
#[derive(clap::Subcommand)]
enum Cmd {
    /// Wait until the kubelet reports the runtime handler, then label this
    /// node torpor.dev/ready=true (the RuntimeClass's nodeSelector).
    NodeReady {
        #[arg(long, default_value = "torpor")]
        handler: String,
        #[arg(long, default_value_t = 300)]
        timeout_s: u64,
    },
    /// Remove this node's torpor.dev/ready label.
    NodeUnready,
    /// Print what this node pod's preStop is to do: `stay` (an upgrade, a
    /// restart), `uninstall` or `uninstall wipe` (the DaemonSet is gone or
    /// no longer selects this node). Any API error (401/403 too): exit 2.
    UninstallIntent,
    /// Print this node's pods of RuntimeClass torpor, one a line.
    TorporPods,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One TLS crypto provider for the kube client, whatever else the
    // workspace enables in rustls.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("TORPOR_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Some(cmd) = &cli.command {
        return step(&cli, cmd);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Error> {
    if cli.node.is_empty() {
        return Err(Error::Usage("--node (NODE_NAME) is empty".into()));
    }
    let shrink = match cli.shrink {
        true => Some(Floors::new(&cli.cpu_floor, &cli.memory_floor).map_err(Error::Usage)?),
        false => None,
    };
    let metrics_address =
        match cli.metrics_address.trim() {
            "" => None,
            a => Some(a.parse::<std::net::SocketAddr>().map_err(|e| {
                Error::Usage(format!("--metrics-address (TORPOR_AGENT_METRICS_ADDRESS) {a:?}: not an address and port: {e}"))
            })?),
        };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| Error::Io { what: "start the async runtime".into(), source })?;
    rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| Error::Config(e.to_string()))?;
        let cfg = Config {
            node: cli.node,
            socket_dir: cli.socket_dir,
            resync: Duration::from_secs(cli.resync_s.max(1)),
            shrink,
            metrics_address,
            move_after: Duration::from_secs(cli.move_after_s),
        };
        agent::run(client, cfg).await
    })
}

fn step(cli: &Cli, cmd: &Cmd) -> ExitCode {
    if cli.node.is_empty() {
        tracing::error!("--node (NODE_NAME) is empty");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let node = cli.node.as_str();
    let r = rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| Error::Config(e.to_string()))?;
        match cmd {
            Cmd::NodeReady { handler, timeout_s } => {
                install::label_ready(&client, node, handler, Duration::from_secs(*timeout_s)).await?;
                tracing::info!(node, "the kubelet reports the runtime handler {handler}: labelled {}=true", install::READY);
            }
            Cmd::NodeUnready => {
                install::unlabel(&client, node).await?;
                tracing::info!(node, "removed the label {}", install::READY);
            }
            Cmd::UninstallIntent => match install::intent(&client, &cli.namespace, &cli.daemonset, node).await? {
                Intent::Stay => println!("stay"),
                Intent::Uninstall { wipe: false } => println!("uninstall"),
                Intent::Uninstall { wipe: true } => println!("uninstall wipe"),
            },
            Cmd::TorporPods => {
                for p in install::torpor_pods(&client, Some(node)).await? {
                    println!("{p}");
                }
            }
        }
        Ok::<(), Error>(())
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}
