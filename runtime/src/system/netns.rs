//! The pod's network namespace, from the shim's side: which TCP ports the
//! actor listens on, running code or iptables inside the namespace, and the
//! network lock CRIU leaves behind after a dump.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, IoContext, Result};

/// TCP ports in LISTEN state in the network namespace of `pid`.
pub fn listening_ports(pid: i32) -> Vec<u16> {
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 && f[3] == "0A" {
                if let Some(port) = f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) {
                    ports.push(port);
                }
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Runs `f` on a thread that has entered the network namespace `netns`.
pub fn in_netns<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Result<T> {
    let ns = File::open(netns).io_context(|| format!("open network namespace {netns:?}"))?;
    let path = netns.to_path_buf();
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        f()
    })
    .join()
    .map_err(|_| Error::InvalidArgument(format!("thread in {path:?} panicked")))?
    .io_context(|| format!("in network namespace {:?}", netns))
}

/// Runs `iptables ARGS` (or ip6tables) in the network namespace `netns`,
/// through nsenter and the reaper (the shim reaps all its children).
pub async fn iptables_in(netns: &Path, tool: &str, args: &[&str]) -> Result<std::process::Output> {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.arg(format!("--net={}", netns.display())).arg(tool).arg("-w").args(args);
    crate::system::reaper::output(cmd).await
}

/// Removes the network lock CRIU leaves in the pod's network namespace
/// after a dump (its `CRIU` chain drops every packet until a restore): the
/// pod must stay reachable while suspended, for probes and activation.
pub async fn unlock_criu_network(netns: &Path) -> Result<()> {
    let mut errors = String::new();
    for tool in ["iptables", "ip6tables"] {
        for args in [
            &["-D", "INPUT", "-j", "CRIU"][..],
            &["-D", "OUTPUT", "-j", "CRIU"][..],
            &["-F", "CRIU"][..],
            &["-X", "CRIU"][..],
        ] {
            let o = iptables_in(netns, tool, args).await?;
            let err = String::from_utf8_lossy(&o.stderr);
            // A chain or rule that is not there is fine (nothing locked).
            if !o.status.success()
                && !err.contains("No chain")
                && !err.contains("does a matching rule exist")
                && !err.contains("Bad rule")
            {
                errors.push_str(&format!("{tool} {}: {}; ", args.join(" "), err.trim()));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("unlock the network after the dump: {errors}")))
    }
}

