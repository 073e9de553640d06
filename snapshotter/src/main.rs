//! `torpor-snapshotter`: containerd proxy snapshotter and snapshot store daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use torpor_snapshotter::config::{self, Config, Overrides};

#[derive(Debug, Parser)]
#[command(name = "torpor-snapshotter", version, about = "torpor node daemon: containerd proxy snapshotter (overlayfs) and snapshot store")]
struct Args {
    /// Config file (TOML). Without this flag /etc/torpor/snapshotter.toml is
    /// read if it exists; a file given here must exist.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// State directory (metadata database, snapshots); overrides `root`.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Socket containerd connects to; overrides `snapshotter.address`.
    #[arg(long, value_name = "SOCKET")]
    address: Option<PathBuf>,
    /// Log filter: error, warn, info, debug, trace, or per module
    /// (`torpor_snapshotter=debug,info`); overrides `log_level`.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

fn init_logging(filter: &str) {
    // Under systemd (journald on stderr) the journal adds its own timestamps.
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(filter);
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).with_target(false);
    if journald {
        b.without_time().init();
    } else {
        b.init();
    }
}

fn main() -> ExitCode {
    // Everything the daemon creates (stagings CRIU dumps into, snapshot
    // copies, the file:// object tier, sockets) is root's alone: snapshots
    // hold process memory.
    torpor_snapshotter::daemon::private_umask();
    let args = Args::parse();
    let overrides = Overrides { root: args.root, address: args.address, log_level: args.log_level };
    let cfg = match Config::load(args.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("torpor-snapshotter: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&cfg.log_level);
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %args.config.as_deref().unwrap_or(std::path::Path::new(config::DEFAULT_CONFIG)).display(),
        root = %cfg.root.display(),
        socket = %cfg.snapshotter.address.display(),
        "torpor-snapshotter starting"
    );
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("torpor-snapshotter").build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the tokio runtime");
            return ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(torpor_snapshotter::daemon::run(cfg));
    // Calls still running on the blocking pool get a short grace.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "torpor-snapshotter failed");
            ExitCode::FAILURE
        }
    }
}
