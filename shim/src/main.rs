//! `containerd-shim-torpor-v1`: containerd's runtime v2 shim for torpor.
//!
//! containerd starts it (`start`), talks to it over ttrpc (the task service
//! in [`task`]), and cleans up after it (`delete`). One shim serves all
//! containers of a pod, grouped by the CRI sandbox id.

mod control;
mod error;
mod events;
mod logging;
mod options;
mod service;
mod stats;
mod task;

/// containerd's runtime id for torpor.
pub const RUNTIME_ID: &str = "io.containerd.torpor.v1";

/// Tokio worker threads: a shim's work is I/O and waiting on runc and
/// CRIU, whatever the node's core count (the default, one per core, costs
/// every shim of a large node dozens of threads).
const WORKER_THREADS: usize = 2;
/// glibc malloc arenas: one per allocating thread by default, each keeping
/// freed memory of its own for as long as the pod lives.
const MALLOC_ARENAS: i32 = 2;
/// An idle blocking-pool thread (file I/O) exits after this.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(2);

fn main() {
    // Started by runc as `criu` (see torpor_runtime::system::criu_launcher).
    if torpor_runtime::system::criu_launcher::invoked() {
        torpor_runtime::system::criu_launcher::main();
    }
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "-v" || a == "--version" || a == "-version") {
        println!("containerd-shim-torpor-v1:");
        println!("  Version:  {}", env!("CARGO_PKG_VERSION"));
        println!("  Runtime:  {RUNTIME_ID}");
        return;
    }
    // Before any thread exists.
    torpor_runtime::system::heap::limit_arenas(MALLOC_ARENAS);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("containerd-shim-torpor-v1: start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    rt.block_on(serve());
    // Exit now, as the Go shims do: dropping the runtime would wait for
    // worker threads still parked in blocking reads, and the shim would
    // outlive its last container.
    std::process::exit(0);
}

async fn serve() {
    // What torpor writes (actor records, CRIU's images and logs through
    // runc, work directories) is root's alone. Container processes get
    // their spec's umask (0022 unless it says otherwise: see
    // torpor_runtime::oci::spec::pin_umask, applied with the rest of torpor's
    // changes to an app container's bundle).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    logging::init();
    let config = containerd_shim::Config {
        // The runtime crate owns the SIGCHLD reaper: it must see runc's and
        // the containers' exits in one place.
        no_reaper: true,
        ..Default::default()
    };
    containerd_shim::asynchronous::run::<service::Service>(RUNTIME_ID, Some(config)).await;
}
