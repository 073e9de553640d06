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
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// Directory of the shims' control sockets.
    #[arg(long, env = torpor_api::control::SOCKET_DIR_ENV, default_value = torpor_api::control::SOCKET_DIR)]
    socket_dir: PathBuf,
    /// Seconds between two looks at every actor (state changes made by
    /// other triggers, such as a request waking an actor, show then).
    #[arg(long, env = "TORPOR_AGENT_RESYNC_S", default_value_t = 5)]
    resync_s: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("TORPOR_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
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
