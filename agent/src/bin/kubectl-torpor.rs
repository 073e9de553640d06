//! `kubectl-torpor`, the kubectl plugin (`kubectl torpor ...`): status,
//! suspend, resume and snapshots of torpor pods, through the API server
//! (kubeconfig as kubectl finds it: `--kubeconfig`, `$KUBECONFIG`, `~/.kube/config`).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use torpor_agent::plugin::{self, Selection};
use torpor_agent::state::Desired;
use torpor_agent::Error;

#[derive(Parser)]
#[command(name = "kubectl-torpor", version, about = "Suspend, resume and inspect torpor pods through the Kubernetes API")]
struct Cli {
    /// The kubeconfig (else $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    /// The namespace (else the kubeconfig context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// A label selector (e.g. app=web).
    #[arg(short = 'l', long, global = true)]
    selector: Option<String>,
    /// Output: a table, or JSON.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// The state of torpor pods (the agent's label, condition and annotations).
    Status { pods: Vec<String> },
    /// Suspend pods (sets torpor.dev/desired-state=suspended) and wait for it.
    Suspend(Change),
    /// Resume pods (sets torpor.dev/desired-state=running) and wait for it.
    Resume(Change),
    /// The snapshot in the node's store of each pod's actor.
    Snapshots { pods: Vec<String> },
}

#[derive(clap::Args)]
struct Change {
    pods: Vec<String>,
    /// How long to wait for the node agent, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Only ask; do not wait.
    #[arg(long)]
    no_wait: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One TLS crypto provider for the kube client, whatever else the
    // workspace enables in rustls.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubectl-torpor: start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubectl-torpor: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn client(cli: &Cli) -> Result<kube::Client, Error> {
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Config(e.to_string()))?
        }
        None => kube::Config::infer().await.map_err(|e| Error::Config(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| Error::Config(e.to_string()))
}

async fn run(cli: Cli) -> Result<(), Error> {
    let client = client(&cli).await?;
    let mut sel = Selection {
        names: Vec::new(),
        namespace: cli.namespace.clone(),
        all_namespaces: cli.all_namespaces,
        selector: cli.selector.clone(),
    };
    let (change, names, snapshots) = match &cli.command {
        Command::Status { pods } => (None, pods.clone(), false),
        Command::Snapshots { pods } => (None, pods.clone(), true),
        Command::Suspend(c) => (Some((Desired::Suspended, c)), c.pods.clone(), false),
        Command::Resume(c) => (Some((Desired::Running, c)), c.pods.clone(), false),
    };
    sel.names = names;
    if change.is_some() && sel.names.is_empty() && sel.selector.is_none() && !sel.all_namespaces {
        return Err(Error::Usage("name the pods, or select them with -l or -A".into()));
    }
    let mut pods = plugin::pods(&client, &sel).await?;
    if let Some((d, c)) = change {
        if pods.is_empty() {
            return Err(Error::Usage("no torpor pod selected".into()));
        }
        plugin::request(&client, &pods, d).await?;
        if !c.no_wait {
            pods = plugin::wait(&client, &pods, d, Duration::from_secs(c.timeout)).await?;
        }
    }
    let rows: Vec<_> = pods.iter().map(plugin::status_json).collect();
    match cli.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows).unwrap_or_default()),
        Output::Table if snapshots => print!("{}", plugin::snapshots_table(&rows)),
        Output::Table => print!("{}", plugin::status_table(&rows)),
    }
    Ok(())
}
