//! `kubectl-torpor`, the kubectl plugin (`kubectl torpor ...`): status,
//! suspend, resume, freeze and snapshots of torpor pods through the API
//! server, and the uninstall of torpor from the nodes. The kubeconfig as
//! kubectl loads it: `--kubeconfig`, else `$KUBECONFIG`, else
//! `~/.kube/config`, else in-cluster; `--context`, `--cluster`, `--user`
//! pick within it, and the namespace is `-n`, else the context's.
//!
//! Exit codes: 0 done, 1 failed, 2 usage, 3 not found, 4 refused (by
//! torpor, or by the API server: 401/403).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use torpor_agent::install;
use torpor_agent::plugin::{self, Selection};
use torpor_agent::state::Desired;
use torpor_agent::Error;

#[derive(Parser)]
#[command(name = "kubectl-torpor", version, about = "Suspend, resume and inspect torpor pods through the Kubernetes API")]
struct Cli {
    /// The kubeconfig (else $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context (else its current-context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The kubeconfig cluster (else the context's).
    #[arg(long, global = true)]
    cluster: Option<String>,
    /// The kubeconfig user (else the context's).
    #[arg(long, global = true)]
    user: Option<String>,
    /// The namespace (else the kubeconfig context's; `uninstall`: torpor's, torpor-system).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// A label selector (e.g. app=web).
    #[arg(short = 'l', long, global = true)]
    selector: Option<String>,
    /// Output: a table, a wide table, JSON or YAML.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

#[derive(Subcommand)]
enum Command {
    /// The state of torpor pods (the agent's label, condition and annotations).
    Status { pods: Vec<String> },
    /// Suspend pods (sets torpor.dev/desired-state=suspended) and wait for it.
    Suspend(Change),
    /// Resume pods (sets torpor.dev/desired-state=running) and wait for it.
    Resume(Change),
    /// Freeze pods in memory (sets torpor.dev/desired-state=frozen) and wait for it.
    Freeze(Change),
    /// The snapshot in the node's store of each pod's actor.
    Snapshots { pods: Vec<String> },
    /// Uninstall torpor from every node before deleting its objects
    /// (`kubectl delete -k`; the Helm chart's pre-delete hook runs this):
    /// refuses while torpor pods exist; then the DaemonSet selects no node
    /// and each node pod's preStop hook removes torpor from its node.
    Uninstall {
        /// torpor's DaemonSet (in -n, default torpor-system).
        #[arg(long, default_value = "torpor-node")]
        daemonset: String,
        /// Also remove each node's snapshot store and data (the actors'
        /// process-memory snapshots); default: left on disk, and the node
        /// pod's log says where.
        #[arg(long)]
        wipe: bool,
        /// Uninstall even while torpor pods exist (their shims lose their runtime).
        #[arg(long)]
        force: bool,
        /// Seconds to wait for the nodes.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
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
            ExitCode::from(e.exit_code())
        }
    }
}

fn options(cli: &Cli) -> kube::config::KubeConfigOptions {
    kube::config::KubeConfigOptions { context: cli.context.clone(), cluster: cli.cluster.clone(), user: cli.user.clone() }
}

async fn client(cli: &Cli) -> Result<kube::Client, Error> {
    let opts = options(cli);
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &opts).await.map_err(|e| Error::Config(e.to_string()))?
        }
        None => match kube::Config::from_kubeconfig(&opts).await {
            Ok(c) => c,
            // no kubeconfig: in-cluster (as kubectl), unless one was picked within it
            Err(e) if opts.context.is_some() || opts.cluster.is_some() || opts.user.is_some() => return Err(Error::Config(e.to_string())),
            Err(e) => kube::Config::incluster().map_err(|ic| Error::Config(format!("no kubeconfig ({e}) and not in a cluster ({ic})")))?,
        },
    };
    kube::Client::try_from(config).map_err(|e| Error::Config(e.to_string()))
}

async fn run(cli: Cli) -> Result<(), Error> {
    let client = client(&cli).await?;
    if let Command::Uninstall { daemonset, wipe, force, timeout } = &cli.command {
        let ns = cli.namespace.clone().unwrap_or_else(|| "torpor-system".into());
        let done = install::uninstall(&client, &ns, daemonset, *wipe, *force, Duration::from_secs(*timeout)).await?;
        println!(
            "torpor uninstalled from {} node(s){}: {}; now delete its objects (kubectl delete -k, or helm uninstall)",
            done.nodes.len(),
            if *wipe { ", their data removed" } else { " (their data is left on disk: see each node pod's log)" },
            done.nodes.join(", ")
        );
        return Ok(());
    }
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
        Command::Freeze(c) => (Some((Desired::Frozen, c)), c.pods.clone(), false),
        Command::Uninstall { .. } => return Ok(()),
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
        Output::Yaml => print!("{}", plugin::to_yaml(&serde_json::Value::Array(rows))),
        Output::Table if snapshots => print!("{}", plugin::snapshots_table(&rows)),
        Output::Wide => print!("{}", plugin::status_table_wide(&rows)),
        Output::Table => print!("{}", plugin::status_table(&rows)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_flags_parse_anywhere_in_the_line() {
        let cli = Cli::try_parse_from(["kubectl-torpor", "freeze", "web", "--context", "prod", "-n", "shop", "-o", "yaml"]).unwrap();
        assert_eq!(cli.context.as_deref(), Some("prod"));
        assert_eq!(cli.namespace.as_deref(), Some("shop"));
        assert_eq!(cli.output, Output::Yaml);
        assert!(matches!(cli.command, Command::Freeze(ref c) if c.pods == ["web"]));
        let o = options(&cli);
        assert_eq!(o.context.as_deref(), Some("prod"));
        let cli = Cli::try_parse_from(["kubectl-torpor", "-A", "status", "-o", "wide"]).unwrap();
        assert!(cli.all_namespaces);
        assert_eq!(cli.output, Output::Wide);
        assert!(Cli::try_parse_from(["kubectl-torpor", "status", "-o", "xml"]).is_err());
        let cli = Cli::try_parse_from(["kubectl-torpor", "uninstall", "--wipe"]).unwrap();
        assert!(matches!(cli.command, Command::Uninstall { wipe: true, force: false, .. }));
    }

    #[test]
    fn errors_have_distinct_exit_codes() {
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(Error::Refused("x".into()).exit_code(), 4);
        assert_eq!(Error::Wait("x".into()).exit_code(), 1);
        let api = |code: u16| Error::Kube {
            what: "get pod".into(),
            source: kube::Error::Api(
                serde_json::from_value(serde_json::json!({"status": "Failure", "message": "m", "reason": "r", "code": code})).unwrap(),
            ),
        };
        assert_eq!(api(404).exit_code(), 3);
        assert_eq!(api(403).exit_code(), 4);
        assert_eq!(api(401).exit_code(), 4);
        assert_eq!(api(500).exit_code(), 1);
    }
}
