//! `containerd-shim-torpor-v1`: containerd's runtime v2 shim for torpor.
//!
//! containerd starts it (`start`), talks to it over ttrpc (the task service
//! in [`task`]), and cleans up after it (`delete`). One shim serves all
//! containers of a pod, grouped by the CRI sandbox id.

mod control;
mod error;
mod events;
mod logging;
mod service;
mod stats;
mod task;

/// containerd's runtime id for torpor.
pub const RUNTIME_ID: &str = "io.containerd.torpor.v1";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "-v" || a == "--version" || a == "-version") {
        println!("containerd-shim-torpor-v1:");
        println!("  Version:  {}", env!("CARGO_PKG_VERSION"));
        println!("  Runtime:  {RUNTIME_ID}");
        return;
    }
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
    // Exit now, as the Go shims do: dropping the runtime would wait for
    // worker threads still parked in blocking reads, and the shim would
    // outlive its last container.
    std::process::exit(0);
}
