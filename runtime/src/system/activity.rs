//! What counts as activity in the pod's network namespace for the idle
//! policy (`torpor.dev/idle-after`, [`crate::trigger::policy`]), so that
//! kubelet's probes do not keep an actor awake while a real client, even
//! one on the node itself (the address kubelet probes from), still does.
//!
//! Counted, in the pod's network namespace, on every interface but `lo`,
//! in both directions:
//!
//! - any packet that is not TCP (UDP, ICMP...), but IPv6 neighbour
//!   discovery and multicast listener messages (the link's upkeep, which
//!   kubelet's own connections cause);
//! - a TCP packet that carries payload (at least 4 bytes: a keepalive's
//!   byte does not count) of a connection whose initiator sent payload
//!   first, and which is not an HTTP probe. A TCP probe is a connect and a
//!   close: no payload. A server that speaks first (a greeting) to a
//!   connection that never sends is not counted either (a TCP probe of
//!   such a server). A connection is an HTTP probe when its initiator's
//!   first payload carries `User-Agent: kube-probe/` (kubelet's HTTP
//!   probes); the connection is marked (`CONNMARK`) so that its later
//!   packets (the answer, the close) are skipped too.
//!
//! Not recognised (counted as activity): gRPC probes (their user agent is
//! HPACK-encoded), HTTPS probes (encrypted), an HTTP probe that sets its
//! own `User-Agent` header, a probe request split over several segments,
//! IPv6 packets with extension headers before TCP. Exec probes cost CPU
//! only (the policy's other half).
//!
//! **Rules** (`iptables-restore`, IPv4 and IPv6 alike): a
//! [`CHAIN`] chain in the `mangle` table, jumped to from `INPUT` (`! -i lo`)
//! and `OUTPUT` (`! -o lo`) (`mangle`, so that no `ACCEPT` of the filter
//! table can hide a packet), that only marks connections and logs; it
//! never drops or accepts. A counted packet is logged to the NFLOG group
//! [`NFLOG_GROUP`] at most once a second per rule (`-m limit`, no payload
//! copied: `--nflog-size 0`), and the shim listens to that group on one
//! netlink socket per actor ([`Watch`]): counting spawns no process.
//!
//! [`Activity`] keeps them in place for an actor: installed in the
//! background once it runs with `idle-after`, checked again after a resume
//! and installed again where they are lost, removed when the actor goes.
//! Where the kernel lacks a match the rules need (`string`, `u32`,
//! `connmark`, `conntrack`, `limit`, `NFLOG`), installing fails and the
//! caller falls back to counting packets, with a warning naming why.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::ULogMessage;
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner};
use tokio::io::unix::AsyncFd;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::system::netns::{self, in_netns, iptables_in, restore_tools, xtables_restore};

/// The NFLOG group the activity rules log to, in the pod's network
/// namespace (a pod has one shim, one actor; the sleeping connections'
/// group is [`crate::system::sleeping_connections::NFLOG_GROUP`]).
pub const NFLOG_GROUP: u16 = 0x7471;
/// The chain of the rules, in the `mangle` table.
pub const CHAIN: &str = "TORPOR-ACTIVITY";
/// Connection mark bit: an HTTP probe (`User-Agent: kube-probe/`).
const PROBE_MARK: u32 = 0x1000_0000;
/// Connection mark bit: its initiator sent payload, and it is no probe.
const CLIENT_MARK: u32 = 0x2000_0000;
/// The user agent of kubelet's HTTP probes (`kube-probe/<major>.<minor>`).
const PROBE_AGENT: &str = "User-Agent: kube-probe/";
/// ICMPv6 types of the link's upkeep, not activity: multicast listener
/// query, report, done, report v2 (130-132, 143), router and neighbour
/// discovery and redirect (133-137).
const ICMPV6_UPKEEP: [u8; 9] = [130, 131, 132, 133, 134, 135, 136, 137, 143];

/// The jumps to [`CHAIN`] (as `iptables -S` prints them, after `-A `).
const JUMPS: [&str; 2] = ["INPUT ! -i lo -j TORPOR-ACTIVITY", "OUTPUT ! -o lo -j TORPOR-ACTIVITY"];

/// A `u32` test (offsets from the network header) true when the TCP
/// segment carries at least 4 bytes of payload: the 4 bytes after the TCP
/// header can be read. IPv6: the TCP header right after the fixed header.
fn payload_test(v6: bool) -> &'static str {
    if v6 {
        "52>>26&0x3C@40=0:0xFFFFFFFF"
    } else {
        "0>>22&0x3C@12>>26&0x3C@0=0:0xFFFFFFFF"
    }
}

/// The rules of [`CHAIN`] for one family (`v6`: IPv6), as
/// `iptables-restore` lines (`-A ...`).
pub fn chain_rules(v6: bool) -> String {
    let payload = format!("-m u32 --u32 \"{}\"", payload_test(v6));
    let log = format!("-m limit --limit 1/sec --limit-burst 1 -j NFLOG --nflog-group {NFLOG_GROUP} --nflog-size 0");
    let both = PROBE_MARK | CLIENT_MARK;
    let mut r = String::new();
    // An HTTP probe: the first payload its initiator sends names kubelet.
    r.push_str(&format!(
        "-A {CHAIN} -p tcp -m conntrack --ctdir ORIGINAL -m connmark --mark 0x0/{both:#x} -m string --algo bm --icase --string \"{PROBE_AGENT}\" -j CONNMARK --set-xmark {PROBE_MARK:#x}/{PROBE_MARK:#x}\n"
    ));
    r.push_str(&format!("-A {CHAIN} -m connmark --mark {PROBE_MARK:#x}/{PROBE_MARK:#x} -j RETURN\n"));
    // A client (or the actor as one) sent payload: the connection is used.
    r.push_str(&format!(
        "-A {CHAIN} -p tcp -m conntrack --ctdir ORIGINAL -m connmark --mark 0x0/{CLIENT_MARK:#x} {payload} -j CONNMARK --set-xmark {CLIENT_MARK:#x}/{CLIENT_MARK:#x}\n"
    ));
    r.push_str(&format!("-A {CHAIN} -p tcp -m connmark --mark {CLIENT_MARK:#x}/{CLIENT_MARK:#x} {payload} {log}\n"));
    r.push_str(&format!("-A {CHAIN} -p tcp -j RETURN\n"));
    if v6 {
        for t in ICMPV6_UPKEEP {
            r.push_str(&format!("-A {CHAIN} -p ipv6-icmp -m icmp6 --icmpv6-type {t} -j RETURN\n"));
        }
    }
    r.push_str(&format!("-A {CHAIN} {log}\n"));
    r
}

/// What `iptables -t mangle -S` shows of the rules.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Present {
    chain: bool,
    /// How many of each of [`JUMPS`].
    jumps: [usize; 2],
}

impl Present {
    fn of(listing: &str) -> Present {
        let mut p = Present::default();
        for line in listing.lines().map(str::trim) {
            if line == format!("-N {CHAIN}") {
                p.chain = true;
            }
            for (i, j) in JUMPS.iter().enumerate() {
                if line.strip_prefix("-A ") == Some(*j) {
                    p.jumps[i] += 1;
                }
            }
        }
        p
    }

    /// Whether the rules are in whole (the chain cannot go while jumped to).
    fn whole(&self) -> bool {
        self.chain && self.jumps == [1, 1]
    }
}

/// The `iptables-restore` input that makes `present` whole: the chain
/// created or flushed and filled, each jump there once.
fn install_input(present: Present, v6: bool) -> String {
    let mut r = format!("*mangle\n:{CHAIN} - [0:0]\n");
    for (i, j) in JUMPS.iter().enumerate() {
        match present.jumps[i] {
            0 => {
                let (chain, rest) = j.split_once(' ').unwrap_or((j, ""));
                r.push_str(&format!("-I {chain} 1 {rest}\n"));
            }
            n => {
                for _ in 1..n {
                    r.push_str(&format!("-D {j}\n"));
                }
            }
        }
    }
    r.push_str(&chain_rules(v6));
    r.push_str("COMMIT\n");
    r
}

/// The `iptables-restore` input that takes out what `present` shows, or
/// `None` when nothing is there.
fn removal_input(present: Present) -> Option<String> {
    if !present.chain && present.jumps == [0, 0] {
        return None;
    }
    let mut r = String::from("*mangle\n");
    for (i, j) in JUMPS.iter().enumerate() {
        for _ in 0..present.jumps[i] {
            r.push_str(&format!("-D {j}\n"));
        }
    }
    if present.chain {
        r.push_str(&format!("-F {CHAIN}\n-X {CHAIN}\n"));
    }
    r.push_str("COMMIT\n");
    Some(r)
}

/// The list tool of an `iptables-restore` family tool.
fn list_tool(restore: &str) -> &'static str {
    if restore.starts_with("ip6") {
        "ip6tables"
    } else {
        "iptables"
    }
}

/// What of the rules is in `netns` for the family of `restore`.
async fn present(netns: &Path, restore: &str) -> Result<Present> {
    let tool = list_tool(restore);
    let o = iptables_in(netns, tool, &["-t", "mangle", "-S"]).await?;
    if !o.status.success() {
        return Err(Error::InvalidArgument(format!(
            "list the mangle table in {netns:?}: {tool}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    Ok(Present::of(&String::from_utf8_lossy(&o.stdout)))
}

/// Puts the rules in `netns` (IPv4, and IPv6 where the kernel has it),
/// whole and once, whatever of them is there already; a family that has
/// them whole is left alone. An error (a match the kernel lacks) names the
/// tool and what it said; the rules of a family that failed are not in.
pub async fn install(netns: &Path) -> Result<()> {
    for &tool in restore_tools() {
        let p = present(netns, tool).await?;
        if p.whole() {
            continue;
        }
        xtables_restore(netns, tool, &install_input(p, tool.starts_with("ip6")), "put in the idle policy's activity rules").await?;
    }
    Ok(())
}

/// Whether the rules are in `netns` whole, in every family.
pub async fn installed(netns: &Path) -> Result<bool> {
    for &tool in restore_tools() {
        if !present(netns, tool).await?.whole() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Takes the rules out of `netns`, in both families; nothing there is fine.
pub async fn remove(netns: &Path) -> Result<()> {
    let mut results = Vec::new();
    for &tool in restore_tools() {
        results.push(match present(netns, tool).await {
            Ok(p) => match removal_input(p) {
                Some(input) => xtables_restore(netns, tool, &input, "take out the idle policy's activity rules").await,
                None => Ok(()),
            },
            Err(e) => Err(e),
        });
    }
    netns::removal_outcome(results)
}

/// The shim's listener of [`NFLOG_GROUP`] in a pod's network namespace:
/// counts the logged packets. Ends when dropped (its socket is closed, the
/// group unbound).
pub struct Watch {
    task: tokio::task::JoinHandle<()>,
    count: Arc<AtomicU64>,
    alive: Arc<AtomicBool>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// Binds [`NFLOG_GROUP`] in `netns` (a netlink socket keeps the
    /// namespace it was made in) and starts counting.
    pub fn start(netns: &Path) -> Result<Watch> {
        let socket = in_netns(netns, || crate::system::sleeping_connections::bind_nflog_group(NFLOG_GROUP))?;
        // SAFETY: the netlink socket owns its fd, which stays open and the
        // same until the socket is dropped with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(socket, tokio::io::Interest::READABLE) }
            .map_err(|e| Error::Io { context: "watch the activity NFLOG group".into(), source: e.into_parts().1 })?;
        let count = Arc::new(AtomicU64::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let (n, live) = (count.clone(), alive.clone());
        let task = tokio::spawn(async move {
            let mut buf = Vec::with_capacity(16 * 1024);
            loop {
                let mut ready = match fd.readable().await {
                    Ok(r) => r,
                    Err(e) => {
                        warn!("the idle policy's activity watch ends (packets are counted instead): {e}");
                        live.store(false, Ordering::Release);
                        return;
                    }
                };
                buf.clear();
                match ready.try_io(|s| s.get_ref().recv(&mut buf, 0)) {
                    Ok(Ok(len)) => {
                        let logged = packets_in(&buf[..len]);
                        if logged > 0 {
                            n.fetch_add(logged, Ordering::AcqRel);
                        }
                    }
                    // Messages were lost: some packet came.
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        n.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(Err(e)) => {
                        warn!("the idle policy's activity watch ends (packets are counted instead): {e}");
                        live.store(false, Ordering::Release);
                        return;
                    }
                    Err(_would_block) => continue,
                }
            }
        });
        Ok(Watch { task, count, alive })
    }

    /// The activity seen so far (a number that grows with it), or `None`
    /// once the watch has ended.
    pub fn count(&self) -> Option<u64> {
        self.alive.load(Ordering::Acquire).then(|| self.count.load(Ordering::Acquire))
    }
}

/// How many logged packets a batch of netlink messages holds (what does
/// not parse ends the count: the kernel's messages are trusted, not
/// required).
fn packets_in(mut bytes: &[u8]) -> u64 {
    let mut n = 0;
    while !bytes.is_empty() {
        let Ok(msg) = <NetlinkMessage<NetfilterMessage>>::deserialize(bytes) else { return n.max(1) };
        if let NetlinkPayload::InnerMessage(NetfilterMessage { inner: NetfilterMessageInner::ULog(ULogMessage::Packet(_)), .. }) =
            msg.payload
        {
            n += 1;
        }
        let len = msg.header.length as usize;
        if len == 0 || len > bytes.len() {
            return n;
        }
        bytes = &bytes[len..];
    }
    n
}

/// A network namespace's identity (the nsfs inode), which a path to it
/// does not give: a restore into a new pod has a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NetnsId {
    dev: u64,
    ino: u64,
}

impl NetnsId {
    fn of(netns: &Path) -> Option<NetnsId> {
        std::fs::metadata(netns).ok().map(|m| NetnsId { dev: m.dev(), ino: m.ino() })
    }
}

/// How an actor's activity is counted in its namespace.
enum Counting {
    /// The rules are being put in.
    Installing,
    Rules(Watch),
    /// The rules could not be put in (why): packets are counted.
    Packets(String),
}

struct Current {
    netns: PathBuf,
    id: NetnsId,
    counting: Counting,
}

#[derive(Default)]
struct State {
    current: Option<Current>,
    /// A background step (install, check, removal) is under way.
    busy: bool,
}

/// The activity rules of one actor, kept in step with where it runs (see
/// the module doc). Every change is made in the background; [`Activity::count`]
/// tells what is counted meanwhile.
#[derive(Clone, Default)]
pub struct Activity {
    state: Arc<Mutex<State>>,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Activity {
    pub fn new() -> Activity {
        Activity::default()
    }

    /// Keeps the rules in `want` (the actor's pod network namespace), or
    /// nowhere (`None`: the actor went, or has no `idle-after` any more);
    /// with `recheck` (after a resume) the rules in place are checked and
    /// put in again where lost. Returns at once: the work is done in the
    /// background, one step at a time (a call while one runs is skipped:
    /// the next poll calls again).
    pub fn keep(&self, want: Option<&Path>, recheck: bool) {
        let want = want.and_then(|p| NetnsId::of(p).map(|id| (p.to_path_buf(), id)));
        let mut st = lock(&self.state);
        if st.busy {
            return;
        }
        let same = match (&st.current, &want) {
            (Some(c), Some((_, id))) => c.id == *id,
            (None, None) => true,
            _ => false,
        };
        if same {
            let Some(c) = st.current.as_ref().filter(|c| recheck && matches!(c.counting, Counting::Rules(_))) else { return };
            let netns = c.netns.clone();
            st.busy = true;
            drop(st);
            let this = self.clone();
            self.spawn(async move {
                match installed(&netns).await {
                    Ok(true) => {}
                    Ok(false) => match install(&netns).await {
                        Ok(()) => info!(netns = ?netns, "the idle policy's activity rules were lost: put in again"),
                        Err(e) => this.fall_back(format!("the activity rules were lost and cannot be put in again: {e}")),
                    },
                    Err(e) => warn!(netns = ?netns, "check the idle policy's activity rules: {e}"),
                }
                lock(&this.state).busy = false;
            });
            return;
        }
        let old = st.current.take();
        st.current = want.as_ref().map(|(netns, id)| Current { netns: netns.clone(), id: *id, counting: Counting::Installing });
        st.busy = true;
        drop(st);
        let this = self.clone();
        self.spawn(async move {
            if let Some(old) = old {
                let had_rules = !matches!(old.counting, Counting::Packets(_));
                drop(old.counting); // the watch first: its group unbound
                                    // A namespace that is gone took its rules along.
                if had_rules && NetnsId::of(&old.netns) == Some(old.id) {
                    if let Err(e) = remove(&old.netns).await {
                        warn!(netns = ?old.netns, "take out the idle policy's activity rules: {e}");
                    }
                }
            }
            if let Some((netns, _)) = want {
                let counting = match install(&netns).await {
                    Ok(()) => match Watch::start(&netns) {
                        Ok(w) => {
                            debug!(netns = ?netns, "idle policy: probes do not count as activity");
                            Counting::Rules(w)
                        }
                        Err(e) => {
                            if let Err(e) = remove(&netns).await {
                                warn!(netns = ?netns, "take out the idle policy's activity rules: {e}");
                            }
                            Counting::Packets(format!("no listener of the activity rules' NFLOG group: {e}"))
                        }
                    },
                    Err(e) => {
                        // A failure may leave a family's rules in.
                        if let Err(e) = remove(&netns).await {
                            warn!(netns = ?netns, "take out the idle policy's activity rules: {e}");
                        }
                        Counting::Packets(format!("the activity rules cannot be put in: {e}"))
                    }
                };
                if let Counting::Packets(why) = &counting {
                    warn!(netns = ?netns, "idle policy: every packet counts as activity, kubelet's probes too: {why}");
                }
                let mut st = lock(&this.state);
                if let Some(c) = st.current.as_mut() {
                    c.counting = counting;
                }
            }
            lock(&this.state).busy = false;
        });
    }

    /// Runs the background step `f` (which ends by clearing `busy`) on
    /// the tokio runtime; without one, nothing is done.
    fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(f);
            }
            Err(e) => {
                warn!("the idle policy's activity rules: no runtime: {e}");
                lock(&self.state).busy = false;
            }
        }
    }

    /// Falls back to counting packets in the namespace in place (`why`).
    fn fall_back(&self, why: String) {
        warn!("idle policy: every packet counts as activity, kubelet's probes too: {why}");
        if let Some(c) = lock(&self.state).current.as_mut() {
            c.counting = Counting::Packets(why);
        }
    }

    /// The activity counted by the rules so far (a number that grows with
    /// it), or `None` when the rules do not count (yet, or at all: count
    /// packets).
    pub fn count(&self) -> Option<u64> {
        match &lock(&self.state).current {
            Some(Current { counting: Counting::Rules(w), .. }) => w.count(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
    use std::time::Duration;

    use super::*;
    use crate::system::netns::tests::TestNetns;

    #[test]
    fn the_rules_skip_probes_and_count_payload_and_other_protocols() {
        let v4 = chain_rules(false);
        let lines: Vec<&str> = v4.lines().collect();
        assert_eq!(
            lines[0],
            "-A TORPOR-ACTIVITY -p tcp -m conntrack --ctdir ORIGINAL -m connmark --mark 0x0/0x30000000 -m string --algo bm --icase --string \"User-Agent: kube-probe/\" -j CONNMARK --set-xmark 0x10000000/0x10000000"
        );
        assert_eq!(lines[1], "-A TORPOR-ACTIVITY -m connmark --mark 0x10000000/0x10000000 -j RETURN", "a probe's packets are skipped");
        assert!(
            lines[2].contains("--ctdir ORIGINAL") && lines[2].contains("-m u32 --u32 \"0>>22&0x3C@12>>26&0x3C@0=0:0xFFFFFFFF\""),
            "{v4}"
        );
        assert!(lines[2].ends_with("-j CONNMARK --set-xmark 0x20000000/0x20000000"), "{v4}");
        let log = format!("-m limit --limit 1/sec --limit-burst 1 -j NFLOG --nflog-group {NFLOG_GROUP} --nflog-size 0");
        assert!(
            lines[3].starts_with("-A TORPOR-ACTIVITY -p tcp -m connmark --mark 0x20000000/0x20000000 -m u32") && lines[3].ends_with(&log),
            "{v4}"
        );
        assert_eq!(lines[4], "-A TORPOR-ACTIVITY -p tcp -j RETURN", "other TCP packets are no activity");
        assert_eq!(lines[5], format!("-A TORPOR-ACTIVITY {log}"), "the rest (not TCP) is");
        assert_eq!(lines.len(), 6);
        assert!(!v4.contains("DROP") && !v4.contains("ACCEPT"), "the rules only count: {v4}");

        let v6 = chain_rules(true);
        assert!(v6.contains("-m u32 --u32 \"52>>26&0x3C@40=0:0xFFFFFFFF\""), "{v6}");
        for t in ["133", "134", "135", "136", "137", "143"] {
            assert!(v6.contains(&format!("-p ipv6-icmp -m icmp6 --icmpv6-type {t} -j RETURN")), "{t}: {v6}");
        }
        assert!(v6.trim_end().ends_with(&log), "{v6}");
    }

    #[test]
    fn install_and_removal_inputs_make_the_rules_whole_once() {
        let listing = "-P INPUT ACCEPT\n-N TORPOR-ACTIVITY\n-A INPUT ! -i lo -j TORPOR-ACTIVITY\n\
                       -A OUTPUT ! -o lo -j TORPOR-ACTIVITY\n-A OUTPUT ! -o lo -j TORPOR-ACTIVITY\n-A TORPOR-ACTIVITY -j RETURN\n";
        let p = Present::of(listing);
        assert_eq!(p, Present { chain: true, jumps: [1, 2] });
        assert!(!p.whole());
        let fix = install_input(p, false);
        assert!(fix.starts_with("*mangle\n:TORPOR-ACTIVITY - [0:0]\n-D OUTPUT ! -o lo -j TORPOR-ACTIVITY\n"), "{fix}");
        assert!(!fix.contains("-I "), "{fix}");
        assert!(fix.ends_with("COMMIT\n"));
        let fresh = install_input(Present::default(), true);
        assert!(fresh.contains("-I INPUT 1 ! -i lo -j TORPOR-ACTIVITY\n-I OUTPUT 1 ! -o lo -j TORPOR-ACTIVITY\n"), "{fresh}");
        assert!(fresh.contains("icmpv6"), "{fresh}");
        assert!(Present::of("-N TORPOR-ACTIVITY\n-A INPUT ! -i lo -j TORPOR-ACTIVITY\n-A OUTPUT ! -o lo -j TORPOR-ACTIVITY\n").whole());
        // A jump of another chain is not ours.
        assert_eq!(Present::of("-A INPUT -i lo -j TORPOR-ACTIVITY\n").jumps, [0, 0]);

        assert_eq!(removal_input(Present::default()), None, "nothing to take out");
        assert_eq!(
            removal_input(p).unwrap(),
            "*mangle\n-D INPUT ! -i lo -j TORPOR-ACTIVITY\n-D OUTPUT ! -o lo -j TORPOR-ACTIVITY\n-D OUTPUT ! -o lo -j TORPOR-ACTIVITY\n-F TORPOR-ACTIVITY\n-X TORPOR-ACTIVITY\nCOMMIT\n"
        );
    }

    /// `ip ARGS` in `netns` (a test's namespace), asserting success.
    async fn ip_in(netns: &Path, args: &[&str]) {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", netns.display())).arg("ip").args(args);
        let out = crate::system::reaper::output(cmd, Duration::from_secs(60)).await.unwrap();
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A pod's namespace and a client's (the node's, where kubelet probes
    /// from), joined by a veth pair: the pod is 10.98.0.1 and fd98::1, the
    /// client 10.98.0.2 and fd98::2.
    async fn pod_and_client() -> (TestNetns, TestNetns) {
        let (pod, client) = (TestNetns::new(), TestNetns::new());
        let peer = client.path.display().to_string();
        ip_in(&pod.path, &["link", "add", "apod", "type", "veth", "peer", "name", "acli", "netns", &peer]).await;
        for (ns, dev, a4, a6) in [(&pod, "apod", "10.98.0.1/24", "fd98::1/64"), (&client, "acli", "10.98.0.2/24", "fd98::2/64")] {
            ip_in(&ns.path, &["addr", "add", a4, "dev", dev]).await;
            ip_in(&ns.path, &["-6", "addr", "add", a6, "dev", dev, "nodad"]).await;
            ip_in(&ns.path, &["link", "set", dev, "up"]).await;
        }
        (pod, client)
    }

    /// The rules of both families in `netns`, as `-S` lists them.
    async fn listing(netns: &Path) -> String {
        let mut all = String::new();
        for tool in ["iptables", "ip6tables"] {
            let o = iptables_in(netns, tool, &["-t", "mangle", "-S"]).await.unwrap();
            assert!(o.status.success(), "{tool} -S: {}", String::from_utf8_lossy(&o.stderr));
            all.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        all
    }

    /// A server in the pod: on each connection, answers whatever it reads
    /// with an HTTP response (nothing read: just closes); on `greet`'s
    /// port, speaks first.
    fn serve(netns: &Path, addr: SocketAddr, greet: bool) {
        let l = in_netns(netns, move || TcpListener::bind(addr)).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                if greet {
                    let _ = s.write_all(b"220 hello, this server speaks first\r\n");
                }
                let mut b = [0u8; 4096];
                if let Ok(n) = s.read(&mut b) {
                    if n > 0 {
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
                    }
                }
            }
        });
    }

    /// What a client in `netns` does to `to`.
    #[derive(Debug, Clone, Copy)]
    enum Client {
        /// A TCP probe: connect and close.
        Connect,
        /// kubelet's HTTP probe.
        ProbeGet,
        /// A real client's request.
        Get,
        /// A TCP probe of a server that speaks first: connect, read, close.
        ConnectReadGreeting,
        /// A UDP datagram.
        Udp,
    }

    fn act(netns: &Path, to: SocketAddr, what: Client) {
        in_netns(netns, move || {
            match what {
                Client::Udp => {
                    let bind: SocketAddr = if to.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
                    UdpSocket::bind(bind)?.send_to(b"ping", SocketAddr::new(to.ip(), 9999))?;
                }
                other => {
                    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(30))?;
                    s.set_read_timeout(Some(Duration::from_secs(30)))?;
                    let mut answer = Vec::new();
                    let host = to.to_string();
                    match other {
                        Client::ProbeGet => {
                            let req = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n");
                            s.write_all(req.as_bytes())?;
                            s.read_to_end(&mut answer)?;
                            assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&answer));
                        }
                        Client::Get => {
                            s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: curl/8.0\r\n\r\n").as_bytes())?;
                            s.read_to_end(&mut answer)?;
                            assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&answer));
                        }
                        Client::ConnectReadGreeting => {
                            let mut line = [0u8; 64];
                            let n = s.read(&mut line)?;
                            assert!(line[..n].starts_with(b"220 "), "the greeting");
                        }
                        _ => {}
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    }

    /// Whether `what` done from `client` to `to` counts as activity: the
    /// count of `w` grows. Each case starts with a token in the rules'
    /// limit (1/s), so that a packet counted would be logged.
    async fn counted(w: &Watch, client: &Path, to: SocketAddr, what: Client) -> bool {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let before = w.count().expect("the watch runs");
        let ns = client.to_path_buf();
        tokio::task::spawn_blocking(move || act(&ns, to, what)).await.unwrap();
        // NFLOG sends each message at once (threshold 1): a counted packet
        // is there in well under the time waited here.
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if w.count().expect("the watch runs") != before {
                return true;
            }
        }
        false
    }

    /// In a private pod netns with a client netns on a veth (as the node
    /// is to a pod): a TCP probe, an HTTP probe and a TCP probe of a
    /// server that speaks first are no activity; a plain request, a UDP
    /// datagram and the pod's own outbound request are; IPv4 and IPv6.
    /// Installed twice, the rules are there once; removed, nothing is left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_are_no_activity_and_clients_are() {
        let (pod, client) = pod_and_client().await;
        install(&pod.path).await.unwrap();
        install(&pod.path).await.unwrap();
        let rules = listing(&pod.path).await;
        assert_eq!(rules.matches("-A INPUT ! -i lo -j TORPOR-ACTIVITY").count(), 2, "once per family: {rules}");
        assert_eq!(rules.matches("-A OUTPUT ! -o lo -j TORPOR-ACTIVITY").count(), 2, "once per family: {rules}");
        assert!(installed(&pod.path).await.unwrap());
        let w = Watch::start(&pod.path).unwrap();

        for (ip, greet_ip) in [("10.98.0.1:8080", "10.98.0.1:8081"), ("[fd98::1]:8080", "[fd98::1]:8081")] {
            let (to, greeter): (SocketAddr, SocketAddr) = (ip.parse().unwrap(), greet_ip.parse().unwrap());
            serve(&pod.path, to, false);
            serve(&pod.path, greeter, true);
            // The first contact of a family (neighbour discovery) included.
            assert!(!counted(&w, &client.path, to, Client::Connect).await, "{ip}: a TCP probe is no activity");
            assert!(!counted(&w, &client.path, to, Client::ProbeGet).await, "{ip}: an HTTP probe (and its answer) is no activity");
            assert!(
                !counted(&w, &client.path, greeter, Client::ConnectReadGreeting).await,
                "{greet_ip}: a TCP probe of a server that speaks first is none"
            );
            assert!(counted(&w, &client.path, to, Client::Get).await, "{ip}: a client's request is activity");
            assert!(!counted(&w, &client.path, to, Client::ProbeGet).await, "{ip}: an HTTP probe after a client is still none");
            assert!(counted(&w, &client.path, to, Client::Udp).await, "{ip}: a UDP datagram is activity");
        }
        // The actor's own request to a server outside is activity.
        let outside: SocketAddr = "10.98.0.2:8082".parse().unwrap();
        serve(&client.path, outside, false);
        assert!(counted(&w, &pod.path, outside, Client::Get).await, "the pod's outbound request is activity");

        drop(w);
        remove(&pod.path).await.unwrap();
        let rules = listing(&pod.path).await;
        assert!(!rules.contains("TORPOR-ACTIVITY"), "nothing left: {rules}");
        remove(&pod.path).await.unwrap();
        assert!(!installed(&pod.path).await.unwrap());
    }

    /// Waits until `f` holds (liveness bound only).
    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..600 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: not within a minute");
    }

    /// [`Activity`] puts the rules in in the background and counts through
    /// them, puts them in again when a resume finds them lost, and takes
    /// them out when the actor goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_actor_s_rules_are_kept_in_step() {
        let (pod, client) = pod_and_client().await;
        let a = Activity::new();
        assert_eq!(a.count(), None, "nothing counted by rules before they are in");
        a.keep(Some(&pod.path), false);
        until("the rules counting", || a.count().is_some()).await;
        assert!(installed(&pod.path).await.unwrap());

        // Lost (as in a namespace that lost them): a recheck puts them in.
        let o = iptables_in(&pod.path, "iptables", &["-t", "mangle", "-D", "INPUT", "!", "-i", "lo", "-j", CHAIN]).await.unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(!installed(&pod.path).await.unwrap());
        a.keep(Some(&pod.path), true);
        until("the recheck done", || !lock(&a.state).busy).await;
        assert!(installed(&pod.path).await.unwrap(), "put in again");
        let to: SocketAddr = "10.98.0.1:8080".parse().unwrap();
        serve(&pod.path, to, false);
        let before = a.count().unwrap();
        let ns = client.path.clone();
        tokio::task::spawn_blocking(move || act(&ns, to, Client::Get)).await.unwrap();
        until("a request counted", || a.count().unwrap() != before).await;

        // The actor goes: the rules go.
        a.keep(None, false);
        assert_eq!(a.count(), None);
        until("the removal done", || !lock(&a.state).busy).await;
        let rules = listing(&pod.path).await;
        assert!(!rules.contains("TORPOR-ACTIVITY"), "nothing left: {rules}");
    }
}
