//! `torpor-agent`: torpor's node agent (one per node, in the torpor
//! DaemonSet). See the crate's docs and docs/ARCHITECTURE.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use torpor_agent::agent::{self, Config};
use torpor_agent::Error;

#[derive(Parser)]
#[command(name = "torpor-agent", version, about = "Suspend and resume this node's torpor pods from their torpor.dev/desired-state annotation")]
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
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Exit 0 if the agent's DaemonSet is gone or being deleted (the
    /// pod's preStop hook uninstalls torpor then), 1 if it stays (an
    /// upgrade), 2 if that cannot be told.
    DaemonsetGone,
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
    if let Some(Cmd::DaemonsetGone) = cli.command {
        return daemonset_gone(&cli);
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| Error::Io { what: "start the async runtime".into(), source })?;
    rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| Error::Config(e.to_string()))?;
        let cfg = Config { node: cli.node, socket_dir: cli.socket_dir, resync: Duration::from_secs(cli.resync_s.max(1)) };
        agent::run(client, cfg).await
    })
}

fn daemonset_gone(cli: &Cli) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let r = rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| Error::Config(e.to_string()))?;
        agent::daemonset_gone(client, &cli.namespace, &cli.daemonset).await
    });
    match r {
        Ok(true) => {
            tracing::info!("DaemonSet {}/{} is gone or being deleted", cli.namespace, cli.daemonset);
            ExitCode::SUCCESS
        }
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}
