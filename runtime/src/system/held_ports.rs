//! Held ports: while an actor is suspended, the shim holds its listening TCP
//! sockets in the pod's network namespace, on the address each was bound to
//! (a socket the actor bound to `127.0.0.1` or `::1` is held on loopback
//! only, never exposed on the pod's IP; `0.0.0.0` and `::` stay wildcards;
//! an IPv6-only `::` stays IPv6-only; IPv6 as IPv4). The first real
//! connection resumes the actor and is handed over to it; so is every
//! connection that arrives during the resume. Kubelet-style probes do not
//! wake the actor and do not fail: a bare TCP connect is accepted and
//! closed, an HTTP GET with `User-Agent: kube-probe/…` is answered `200 ok`.
//!
//! Handover: the held connections are proxied to the restored process,
//! connected from inside the pod's network namespace to the address the
//! actor listens on (its loopback for a wildcard listener), from the
//! client's own address and port: the upstream socket is transparent
//! (`IP_TRANSPARENT`, bound to the client's address), so the actor's
//! getpeername(2) gives the client, as while it runs (its getsockname(2)
//! gives its loopback, not the address the client dialed). The actor's
//! answers, from its loopback to the client's address, are delivered
//! locally to that socket by a routing rule in the pod's namespace (`from
//! 127.0.0.0/8` and `from ::1` → a table whose one route is `local` for
//! every address, see [`ROUTE_TABLE`]): nothing else can leave a pod from
//! loopback. Where that cannot work the actor sees the shim's address
//! instead: a client in the pod itself, an actor that listens on a pod
//! address only (the upstream would be the held connection's own address
//! pair), no routing rule (its insert failed), the freeze tier (no rule).
//!
//! The restore window: from the moment the shim's listeners close at a
//! handover until the restored process listens, a SYN to a held port finds
//! no socket. Once it was dropped and its client waited for a retransmit
//! (about 1 s; 35 of 50 clients connecting at once). Now a spare listener
//! of the shim takes it ([`Spare`]): a `mangle` rule sends a SYN to a held
//! port that no socket takes to the spare listener of its family
//! (`TPROXY`, on loopback, a port the kernel picked), whose connections
//! keep the address the client dialed, wait for the restore, and are
//! proxied as the held ones. Under it a pair of filter rules still drops
//! (not refuses) such a SYN where the TPROXY rule could not go in, so a
//! client racing the resume retransmits and is served. Each pair is
//! `-m socket --nowildcard` first (a SYN with a listening socket goes to
//! it), then TPROXY / DROP; iptables and, for IPv6 listeners, ip6tables.
//! The rules and the routing rule go in when the ports are held and come
//! out [`KEEP_RULES`] after the handover, both in the background: no
//! iptables or ip run on the resume's path (they cost it process spawns,
//! 15-40 ms), nor beside it while other actors of the node wake at the same
//! time. A suspend within that time holds the same ports with the rules
//! still in, and takes them over (with the spare listeners) instead of
//! inserting more. Meanwhile the restored listeners take their SYNs: only
//! an actor that closes a held port in the seconds after its resume sees a
//! new connection to it taken by the spare (and reset) instead of refused.
//! Rule changes are serialized, and the handover waits for them to be in.
//! The connections a listener's accept queue holds when it closes are
//! taken first (closing it would reset them), and so are those still being
//! classified: the handover never waits out a connection's probe window.
//!
//! Bounds: at most [`MAX_HELD`] connections are held (or being classified)
//! at a time, at most [`MAX_HELD_PER_CLIENT`] of them from one client
//! address; one over a bound is reset at once (RST) with a warning. A held
//! connection that sends nothing for [`HELD_IDLE_TIMEOUT`] and is not
//! handed over meanwhile is closed. An accept error (EMFILE, ENFILE,
//! ENOBUFS...) does not end a listener: it backs off and accepts again.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener as StdListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::error::{Error, IoContext, Result};
use crate::system::netns::{
    connect_in, connect_transparent_in, in_netns, ip_batch, listening_ports, remove_rules_later, restore_tools, v6_only_listeners,
    xtables_restore,
};

/// How long a new connection may stay silent before it counts as real
/// traffic (a server-speaks-first client). A TCP probe closes sooner.
const PROBE_WINDOW: Duration = Duration::from_millis(100);
/// Connections held (or being classified) at most, for one actor; more are
/// reset. Each costs the shim a socket and up to 4 KiB.
pub const MAX_HELD: usize = 512;
/// Connections one client address may have held (or being classified) at
/// most, of the [`MAX_HELD`]; more from it are reset, with a warning. A
/// quarter of the slots: one address (a client, or every client behind one
/// NAT: a node's SNAT of NodePort traffic) can never take all of them, so
/// at least three other sources still get theirs; and it is above what
/// one real client opens at a wake: a browser opens 6 connections per
/// host, a connection pool tens, the burst the bench measures 100 (from
/// one host).
pub const MAX_HELD_PER_CLIENT: usize = MAX_HELD / 4;
/// A held connection that sends nothing for this long and is not handed
/// over meanwhile is closed (its slot freed). Longer than any resume that
/// can succeed (a restore takes tens of milliseconds from local disk, a
/// cross-node one from the object store under a second at p99, a big
/// snapshot fetched a few seconds) and than the usual client timeouts for
/// a connect or a first answer (30 s for most HTTP clients and drivers),
/// so it never cuts a client that is still waiting for a wake that comes;
/// short enough that slots squatted by silent connections while a resume
/// keeps failing (retried with backoff up to 30 s) come back within a
/// minute.
pub const HELD_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// An accept error backs off this long at first, doubling up to
/// [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A handed-over connection's connect to the restored actor.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// `-m multiport` takes at most 15 ports per rule.
const MULTIPORT_MAX: usize = 15;
/// How long a port found in use is bound again before it counts as taken.
/// A listener just closed (the shim's own at a handover, a dumped actor's)
/// stays open in any child forked at that moment until its exec closes it:
/// the shim forks runc, CRIU and iptables from other threads.
const BIND_IN_USE_RETRY: Duration = Duration::from_millis(200);
/// What a failed removal of the SYN-drop rules is logged as.
const REMOVE_SYN_DROP: &str = "activation: remove the SYN drop rules";
/// The routing table and rule priority of the local delivery of the
/// actor's answers to a transparent proxy's upstream (see the module
/// doc): "tp" in ASCII, a number no CNI plugin or distribution uses; the
/// priority is after the `local` table's (0) and before `main`'s (32766).
const ROUTE_TABLE: u32 = 0x7470;
const ROUTE_PREF: u32 = 0x7470;
/// The flow information an IPv6 listener address carries when the
/// listener is IPv6-only (`IPV6_V6ONLY`): [`listeners_for`] marks it so
/// and [`Armed::arm`] holds it so. A bound listener's flow information
/// means nothing else (bind(2) ignores it).
const V6_ONLY_FLOWINFO: u32 = 0x7470;

/// Whether `a` is an IPv6 listener held IPv6-only (see [`V6_ONLY_FLOWINFO`]).
pub fn is_v6_only(a: &SocketAddr) -> bool {
    matches!(a, SocketAddr::V6(v6) if v6.flowinfo() == V6_ONLY_FLOWINFO)
}

/// `a` marked IPv6-only (an IPv4 address stays as it is).
pub fn v6_only(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(*v6.ip(), v6.port(), V6_ONLY_FLOWINFO, v6.scope_id())),
        v4 => v4,
    }
}

/// What to hold for an actor: the sockets it listens on (`pid`, in the
/// pod's network namespace), or, with `torpor.dev/activate-on`, the
/// declared ports: each on the addresses the actor listens on it, or on
/// `0.0.0.0` when it listens on it nowhere now. An IPv6 listener that is
/// IPv6-only is marked so ([`is_v6_only`]). Sorted, no duplicates.
pub fn listeners_for(pid: Option<i32>, declared: Option<&[u16]>) -> Vec<SocketAddr> {
    let mut live = pid.map(listening_ports).unwrap_or_default();
    // The table is the whole namespace's: this shim's spare listeners are
    // in it, and are never the actor's (held as the actor's, they were not
    // held — the spare has the address — and each suspend's listeners
    // differed from the last, so no hold took over the rules left in).
    {
        let spare = spare_addrs();
        live.retain(|a| !spare.contains(a));
    }
    if let Some(pid) = pid.filter(|_| live.iter().any(SocketAddr::is_ipv6)) {
        match v6_only_listeners(pid) {
            Ok(only) => {
                for a in live.iter_mut() {
                    if only.contains(a) {
                        *a = v6_only(*a);
                    }
                }
            }
            Err(e) => warn!(pid, "activation: which IPv6 listeners are IPv6-only is unknown (held dual-stack): {e}"),
        }
    }
    let mut out: Vec<SocketAddr> = match declared {
        None => live,
        Some(ports) => ports
            .iter()
            .flat_map(|&p| {
                let on: Vec<SocketAddr> = live.iter().filter(|a| a.port() == p).copied().collect();
                if on.is_empty() {
                    vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), p)]
                } else {
                    on
                }
            })
            .collect(),
    };
    out.sort_unstable();
    out.dedup();
    out
}

/// Where a handed-over connection to listener `listen` is proxied: the
/// same address, or the loopback of its family for a wildcard.
fn upstream_of(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(a) if a.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port()),
        IpAddr::V6(a) if a.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port()),
        _ => SocketAddr::new(listen.ip(), listen.port()),
    }
}

/// `a` with an IPv4-mapped IPv6 address given as the IPv4 one.
fn unmapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// Whether a listener bound to `listen` takes a connection to `local`
/// (its address and port, IPv4-mapped as IPv4).
fn takes(listen: &SocketAddr, local: &SocketAddr) -> bool {
    if listen.port() != local.port() {
        return false;
    }
    match (listen.ip(), local.ip()) {
        (l, a) if l == a => true,
        (IpAddr::V4(l), IpAddr::V4(_)) => l.is_unspecified(),
        (IpAddr::V6(l), IpAddr::V6(_)) => l.is_unspecified(),
        (IpAddr::V6(l), IpAddr::V4(_)) => l.is_unspecified() && !is_v6_only(listen),
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// Of the listeners `listen`, the one a connection to `local` came for: an
/// exact address first, then a wildcard.
fn listener_of(listen: &[SocketAddr], local: SocketAddr) -> Option<SocketAddr> {
    let local = unmapped(local);
    listen.iter().filter(|l| takes(l, &local)).max_by_key(|l| !l.ip().is_unspecified()).copied()
}

/// Families whose local delivery of answers to a transparent upstream is
/// in place in the namespace (the routing rule of [`ROUTE_TABLE`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Transparent {
    v4: bool,
    v6: bool,
}

/// The source and destination of a transparent upstream for a held
/// connection from `peer` to `local`, proxied to `to`; `None` where the
/// actor must see the shim instead: a client in the pod itself (loopback,
/// or the address it dialed: its own connection holds that address and
/// port), an actor listening on a pod address (its upstream would be the
/// held connection's own address pair), no routing rule for the family.
fn transparent_route(peer: SocketAddr, local: SocketAddr, to: SocketAddr, t: Transparent) -> Option<(SocketAddr, SocketAddr)> {
    let (peer, local) = (unmapped(peer), unmapped(local));
    if peer.ip().is_loopback() || peer.ip() == local.ip() || !to.ip().is_loopback() {
        return None;
    }
    let to = match (peer.ip(), to.ip()) {
        (IpAddr::V4(_), IpAddr::V6(_)) => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), to.port()),
        (IpAddr::V6(_), IpAddr::V4(_)) => return None,
        _ => to,
    };
    let routed = if to.is_ipv4() { t.v4 } else { t.v6 };
    routed.then_some((peer, to))
}

/// The ports of `listen` whose SYNs each family's rule drops: IPv4 for
/// IPv4 listeners and a dual-stack `::` (it takes IPv4 too), IPv6 for IPv6
/// listeners.
fn syn_drop_ports(listen: &[SocketAddr]) -> [(&'static str, Vec<u16>); 2] {
    let ports = |f: &dyn Fn(&SocketAddr) -> bool| {
        let mut p: Vec<u16> = listen.iter().filter(|a| f(a)).map(|a| a.port()).collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let v4 = ports(&|a| a.is_ipv4() || (a.ip().is_unspecified() && !is_v6_only(a)));
    let v6 = ports(&|a| a.is_ipv6());
    [("iptables", v4), ("ip6tables", v6)]
}

/// Of [`syn_drop_ports`], those whose SYNs go to a spare listener while
/// nothing listens: the ports the actor listens on beyond its loopback (a
/// port it listens on only on loopback is not reachable from outside).
fn spare_ports(listen: &[SocketAddr]) -> [Vec<u16>; 2] {
    let open: Vec<SocketAddr> = listen.iter().filter(|a| !a.ip().is_loopback()).copied().collect();
    let [(_, v4), (_, v6)] = syn_drop_ports(&open);
    [v4, v6]
}

/// Serializes the shim's changes to the SYN-drop rules and the routing
/// rule (one shim serves one pod). A removal is asked for only once the
/// insert it undoes is in (the hold's `rules_in`), so pairs never go
/// before they came.
static SYN_DROP_RULES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the SYN-drop rules stay in after a handover (see the module
/// doc): their removal waits out a burst of wake-ups on the node, and a
/// suspend within it takes them over.
const KEEP_RULES: Duration = Duration::from_secs(5);

/// What a hold put in a network namespace, to take out as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rules {
    listen: Vec<SocketAddr>,
    /// The spare listeners' ports that the SYNs of each family go to
    /// (TPROXY) while nothing listens, where that rule is in.
    spare: [Option<u16>; 2],
    /// The families whose routing rule this hold counts on.
    transparent: Transparent,
}

/// A SYN-drop pair left in after a handover: its namespace, rules, spare
/// listeners, and the number of the removal due for it.
struct Kept {
    netns: PathBuf,
    rules: Rules,
    spare: Option<Spare>,
    n: u64,
}

/// The SYN-drop pairs left in after a handover.
static KEPT_RULES: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());

fn kept_rules() -> std::sync::MutexGuard<'static, Vec<Kept>> {
    KEPT_RULES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Takes over the pair left in `netns` for exactly `listen` by a handover
/// (its removal is called off), with its spare listeners. A pair for other
/// listeners stays, and goes when due.
fn take_kept_rules(netns: &Path, listen: &[SocketAddr]) -> Option<(Rules, Option<Spare>)> {
    let mut kept = kept_rules();
    let i = kept.iter().position(|k| k.netns == netns && k.rules.listen == listen)?;
    let k = kept.swap_remove(i);
    Some((k.rules, k.spare))
}

/// Leaves the pair `rules` in `netns` for [`KEEP_RULES`], with its spare
/// listeners (still serving what they take), then takes it out unless a
/// hold took it over meanwhile (or the namespace is gone). Without a tokio
/// runtime it stays, with a warning ([`remove_rules_later`]).
fn keep_rules_then_remove(netns: PathBuf, rules: Rules, spare: Option<Spare>) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return remove_rules_later(netns, REMOVE_SYN_DROP, async {}, move |ns| async move { syn_drop_remove(&ns, &rules).await });
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    kept_rules().push(Kept { netns: netns.clone(), rules, spare, n });
    rt.spawn(async move {
        tokio::time::sleep(KEEP_RULES).await;
        let due = {
            let mut kept = kept_rules();
            let i = kept.iter().position(|k| k.netns == netns && k.n == n);
            i.map(|i| kept.swap_remove(i))
        };
        if let Some(k) = due {
            if netns.exists() {
                if let Err(e) = syn_drop_remove(&netns, &k.rules).await {
                    warn!("{REMOVE_SYN_DROP}: {e}");
                }
            }
            // The spare listeners close once nothing sends SYNs to them.
            drop(k.spare);
        }
    });
}

/// The `*-restore` input that inserts (or removes) the pairs of rules for
/// `ports`: per chunk of [`MULTIPORT_MAX`] ports, the first accepts a SYN
/// that has a listening socket, the second drops the rest; inserted at the
/// top, accept first. With a spare listener (`spare`: its address and
/// port; `spare_ports`: the ports it serves), a pair in the `mangle` table
/// first sends the SYNs to those ports that no socket takes to it
/// (`TPROXY`), so that they are accepted, not dropped. Not on loopback: the
/// shim's own proxy connects to the actor that way.
fn syn_drop_rules(ports: &[u16], insert: bool, spare: Option<(IpAddr, u16, &[u16])>) -> String {
    let (first, second) = if insert { ("-I {chain} 1", "-I {chain} 2") } else { ("-D {chain}", "-D {chain}") };
    let pair = |chain: &str, ports: &[u16], target: &str| {
        let mut out = String::new();
        for chunk in ports.chunks(MULTIPORT_MAX) {
            let list = chunk.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
            let syn = format!("! -i lo -p tcp --syn -m multiport --dports {list}");
            let (a, b) = (first.replace("{chain}", chain), second.replace("{chain}", chain));
            out.push_str(&format!("{a} {syn} -m socket --nowildcard -j ACCEPT\n{b} {syn} -j {target}\n"));
        }
        out
    };
    let mut rules = String::new();
    if let Some((ip, port, to)) = spare.filter(|(_, _, to)| !to.is_empty()) {
        rules.push_str("*mangle\n");
        rules.push_str(&pair("PREROUTING", to, &format!("TPROXY --on-port {port} --on-ip {ip}")));
        rules.push_str("COMMIT\n");
    }
    rules.push_str("*filter\n");
    rules.push_str(&pair("INPUT", ports, "DROP"));
    rules.push_str("COMMIT\n");
    rules
}

/// How many holds count on the routing rule of each namespace and family
/// (`false`: IPv4); changed under [`SYN_DROP_RULES`].
static ROUTE_USERS: std::sync::Mutex<Vec<(PathBuf, bool, usize)>> = std::sync::Mutex::new(Vec::new());

/// The `ip -batch` that adds (or removes) the routing rule of one family:
/// what the actor sends from its loopback address to a non-local address
/// (only ever the answers to a transparent upstream, which binds the
/// client's address: nothing else can leave the pod from loopback) is
/// delivered locally, to the shim's upstream socket.
fn route_batch(v6: bool, add: bool) -> String {
    let (from, all) = if v6 { ("::1/128", "::/0") } else { ("127.0.0.0/8", "0.0.0.0/0") };
    let (rule, route) = if add { ("add", "replace") } else { ("del", "del") };
    format!("rule {rule} from {from} lookup {ROUTE_TABLE} pref {ROUTE_PREF}\nroute {route} local {all} dev lo table {ROUTE_TABLE}\n")
}

/// Counts one more hold on the routing rule of `v6`'s family in `netns`,
/// adding it if it is the first: whether it is in.
async fn route_in(netns: &Path, v6: bool) -> bool {
    let users =
        |m: &mut Vec<(PathBuf, bool, usize)>| -> usize { m.iter().find(|(ns, f, _)| ns == netns && *f == v6).map_or(0, |(_, _, n)| *n) };
    let first = users(&mut lock_routes()) == 0;
    if first {
        let family = if v6 { "-6" } else { "-4" };
        let batch = route_batch(v6, true);
        if let Err(e) =
            ip_batch(netns, family, &batch, &["File exists"], "deliver the actor's answers to the shim's transparent proxy").await
        {
            warn!("activation: connections that arrive while the actor sleeps reach it from the shim's address, not the client's: {e}");
            return false;
        }
    }
    let mut m = lock_routes();
    match m.iter_mut().find(|(ns, f, _)| ns == netns && *f == v6) {
        Some((_, _, n)) => *n += 1,
        None => m.push((netns.to_path_buf(), v6, 1)),
    }
    true
}

/// Counts one hold less on the routing rule of `v6`'s family in `netns`,
/// removing it with the last.
async fn route_out(netns: &Path, v6: bool) -> Result<()> {
    let last = {
        let mut m = lock_routes();
        let Some(i) = m.iter().position(|(ns, f, _)| ns == netns && *f == v6) else { return Ok(()) };
        m[i].2 -= 1;
        let last = m[i].2 == 0;
        if last {
            m.swap_remove(i);
        }
        last
    };
    if !last {
        return Ok(());
    }
    let family = if v6 { "-6" } else { "-4" };
    let fine = ["No such file", "No such process", "Cannot find"];
    ip_batch(netns, family, &route_batch(v6, false), &fine, "remove the routing rule of the transparent proxy").await
}

fn lock_routes() -> std::sync::MutexGuard<'static, Vec<(PathBuf, bool, usize)>> {
    ROUTE_USERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Inserts the pairs of rules that drop (not refuse) a new connection to a
/// port of `listen` while nothing listens on it, or send it to the spare
/// listener of its family (`spare`: their ports) where there is one: one
/// transaction per family (`iptables-restore --noflush`), both at once, so
/// a pair is never half in; a family whose TPROXY pair is refused gets the
/// drop pair alone. Then the routing rule of each family (see
/// [`route_batch`]). What is in, to take out with [`syn_drop_remove`].
async fn syn_drop_insert(netns: &Path, listen: &[SocketAddr], spare: [Option<u16>; 2]) -> Rules {
    let _serial = SYN_DROP_RULES.lock().await;
    let what = "drop SYNs to the held ports";
    let [(t4, p4), (t6, p6)] = syn_drop_ports(listen);
    let [s4, s6] = spare_ports(listen);
    let v6_kernel = restore_tools().contains(&"ip6tables-restore");
    let change = |tool: &'static str, ports: Vec<u16>, spare: Option<(IpAddr, u16)>, to: Vec<u16>| async move {
        if ports.is_empty() {
            return None;
        }
        let restore = format!("{tool}-restore");
        if let Some((ip, port)) = spare {
            match xtables_restore(netns, &restore, &syn_drop_rules(&ports, true, Some((ip, port, &to))), what).await {
                Ok(()) => return Some(Some(port)),
                Err(e) => warn!(
                    "activation: new connections wait for a SYN retransmit (about 1 s), not for the restore, while the actor resumes: {e}"
                ),
            }
        }
        match xtables_restore(netns, &restore, &syn_drop_rules(&ports, true, None), what).await {
            Ok(()) => Some(None),
            Err(e) => {
                warn!("activation: new connections will be refused, not held, while the actor resumes: {e}");
                None
            }
        }
    };
    let sp4 = spare[0].map(|p| (IpAddr::V4(Ipv4Addr::LOCALHOST), p));
    let sp6 = spare[1].map(|p| (IpAddr::V6(Ipv6Addr::LOCALHOST), p));
    let p6 = if v6_kernel { p6 } else { Vec::new() };
    let (v4, v6) = tokio::join!(change(t4, p4.clone(), sp4, s4), change(t6, p6.clone(), sp6, s6));
    let transparent = Transparent { v4: !p4.is_empty() && route_in(netns, false).await, v6: !p6.is_empty() && route_in(netns, true).await };
    // What failed to go in is not taken out (the removal would fail).
    let mut kept: Vec<SocketAddr> = listen.to_vec();
    if v4.is_none() {
        kept.retain(|a| !(a.is_ipv4() || (a.ip().is_unspecified() && !is_v6_only(a))));
    }
    if v6.is_none() {
        kept.retain(|a| !a.is_ipv6());
    }
    Rules { listen: kept, spare: [v4.flatten(), v6.flatten()], transparent }
}

/// Takes out what [`syn_drop_insert`] put in (its `rules`).
async fn syn_drop_remove(netns: &Path, rules: &Rules) -> Result<()> {
    let _serial = SYN_DROP_RULES.lock().await;
    let what = "stop dropping SYNs to the held ports";
    let [(t4, p4), (t6, p6)] = syn_drop_ports(&rules.listen);
    let [s4, s6] = spare_ports(&rules.listen);
    let change = |tool: &'static str, ports: Vec<u16>, spare: Option<(IpAddr, u16)>, to: Vec<u16>| async move {
        if ports.is_empty() {
            return Ok(());
        }
        let spare = spare.map(|(ip, port)| (ip, port, to.as_slice()));
        xtables_restore(netns, &format!("{tool}-restore"), &syn_drop_rules(&ports, false, spare), what).await
    };
    let sp4 = rules.spare[0].map(|p| (IpAddr::V4(Ipv4Addr::LOCALHOST), p));
    let sp6 = rules.spare[1].map(|p| (IpAddr::V6(Ipv6Addr::LOCALHOST), p));
    let (v4, v6) = tokio::join!(change(t4, p4, sp4, s4), change(t6, p6, sp6, s6));
    let mut errors: Vec<String> = [v4, v6].into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect();
    for (v6, on) in [(false, rules.transparent.v4), (true, rules.transparent.v6)] {
        if on {
            if let Err(e) = route_out(netns, v6).await {
                errors.push(e.to_string());
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(errors.join("; ")))
    }
}

/// A connection held for the actor, with the bytes already read from it.
struct Held {
    stream: TcpStream,
    /// The listener it came in on.
    listen: SocketAddr,
    head: Vec<u8>,
    /// The client's address (IPv4-mapped as IPv4).
    client: IpAddr,
    /// When it last sent something (or was accepted), and how many bytes
    /// were waiting in its receive queue then.
    active: Instant,
    queued: usize,
}

impl Held {
    /// Whether it has sent nothing for `idle` (looked at now).
    fn idle(&mut self, idle: Duration) -> bool {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD into a c_int that lives for the call, on a socket we own.
        let rc = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::FIONREAD, &mut queued) };
        let queued = if rc < 0 { self.queued } else { queued.max(0) as usize };
        if queued != self.queued {
            self.queued = queued;
            self.active = Instant::now();
        }
        self.active.elapsed() >= idle
    }
}

/// The bounds of what one actor's held ports keep.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Connections held (or being classified) at most: [`MAX_HELD`].
    held: usize,
    /// Of them, from one client address: [`MAX_HELD_PER_CLIENT`].
    per_client: usize,
    /// [`HELD_IDLE_TIMEOUT`].
    idle: Duration,
}

const LIMITS: Limits = Limits { held: MAX_HELD, per_client: MAX_HELD_PER_CLIENT, idle: HELD_IDLE_TIMEOUT };

/// Listeners armed for one suspended actor.
pub struct Armed {
    netns: PathBuf,
    listen: Vec<SocketAddr>,
    stop: Option<oneshot::Sender<oneshot::Sender<Vec<Held>>>>,
    /// Whether the handover drops new SYNs while it runs (the shim's own
    /// listeners close; the actor's own, while frozen, stay open).
    drop_syns: bool,
    /// Told what went in when the SYN-drop rules asked for at the hold are
    /// in (or failed): the handover waits for it, so that their removal
    /// after it can never run before their insert.
    rules_in: Option<oneshot::Receiver<Rules>>,
    /// The listeners that take the SYNs while neither the shim's nor the
    /// restored actor's listen.
    spare: Option<Spare>,
}

/// A listening socket bound to `addr`; an IPv6 one is IPv6-only when
/// `v6_only` (an IPv4 listener on the same port is held beside it, or the
/// actor's was); `transparent` for a TPROXY target (see [`Spare`]).
fn bind(addr: SocketAddr, v6_only: bool, transparent: bool) -> std::io::Result<StdListener> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new socket this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let set = |level: libc::c_int, opt: libc::c_int| {
        let one: libc::c_int = 1;
        // SAFETY: a c_int option that lives for the call.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // As std's bind does: a port whose old connections linger in TIME_WAIT.
    set(libc::SOL_SOCKET, libc::SO_REUSEADDR)?;
    if addr.is_ipv6() && v6_only {
        set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)?;
    }
    if transparent {
        if addr.is_ipv4() {
            set(libc::SOL_IP, libc::IP_TRANSPARENT)?;
        } else {
            set(libc::SOL_IPV6, libc::IPV6_TRANSPARENT)?;
        }
    }
    // SAFETY: bind(2) and listen(2) on our socket, with a sockaddr of the
    // socket's family that lives for the call.
    let rc = unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_in).cast(), std::mem::size_of_val(&sa) as libc::socklen_t)
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                sa.sin6_scope_id = a.scope_id();
                libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_in6).cast(), std::mem::size_of_val(&sa) as libc::socklen_t)
            }
        }
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listen(2) on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 4096) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(StdListener::from(fd))
}

/// [`bind`], again every few milliseconds for up to `retry` while the port
/// is in use (see [`BIND_IN_USE_RETRY`]); any other error at once.
fn bind_retrying(addr: SocketAddr, v6_only: bool, retry: Duration) -> std::io::Result<StdListener> {
    let deadline = std::time::Instant::now() + retry;
    loop {
        match bind(addr, v6_only, false) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

/// The spare listeners of a hold: one per family, on loopback, on a port
/// the kernel picks, transparent (`IP_TRANSPARENT`), that a TPROXY rule
/// sends the SYNs to the held ports to while no socket listens on them:
/// from the moment the shim's listeners close at a handover until the
/// restored actor's listen. A connection they take keeps the address the
/// client dialed (TPROXY does not rewrite it), waits until the actor is
/// restored, and is then proxied to it as a held one is. They live as long
/// as the rules naming their ports.
struct Spare {
    /// Its listeners' addresses, in [`SPARE_ADDRS`] while it lives.
    addrs: Vec<SocketAddr>,
    /// `Some` once the actor listens again: how to reach it.
    ready: watch::Sender<Option<Transparent>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Spare {
    fn drop(&mut self) {
        self.task.abort();
        let mut all = spare_addrs();
        for a in &self.addrs {
            if let Some(i) = all.iter().position(|x| x == a) {
                all.swap_remove(i);
            }
        }
    }
}

/// The addresses of this shim's live spare listeners (in its pod's
/// network namespace), which [`listeners_for`] leaves out.
static SPARE_ADDRS: std::sync::Mutex<Vec<SocketAddr>> = std::sync::Mutex::new(Vec::new());

fn spare_addrs() -> std::sync::MutexGuard<'static, Vec<SocketAddr>> {
    SPARE_ADDRS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Spare {
    /// The spare listeners for `listen` in `netns` (none: a warning says
    /// why, and the SYNs are dropped while nothing listens, as before).
    /// At most `limit` of their connections wait at a time; more are reset.
    fn open(netns: &Path, listen: &[SocketAddr], limit: usize) -> Option<Spare> {
        let [v4, v6] = spare_ports(listen);
        let v6 = !v6.is_empty() && restore_tools().contains(&"ip6tables-restore");
        let want: Vec<SocketAddr> = [
            (!v4.is_empty()).then_some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)),
            v6.then_some(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if want.is_empty() {
            return None;
        }
        let bound = match in_netns(netns, move || want.iter().map(|a| bind(*a, true, true)).collect::<std::io::Result<Vec<_>>>()) {
            Ok(b) => b,
            Err(e) => {
                warn!(netns = ?netns, "activation: no spare listener (new connections wait for a SYN retransmit while the actor resumes): {e}");
                return None;
            }
        };
        let mut listeners = Vec::new();
        for l in bound {
            let (Ok(addr), Ok(l)) = (l.local_addr(), TcpListener::from_std(l)) else { continue };
            listeners.push((l, addr));
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|(_, a)| *a).collect();
        spare_addrs().extend(addrs.iter().copied());
        let (ready, ready_rx) = watch::channel(None);
        let task = tokio::spawn(serve_spare(netns.to_path_buf(), listen.to_vec(), listeners, ready_rx, limit));
        Some(Spare { addrs, ready, task })
    }

    /// Its listeners' ports, IPv4's then IPv6's, as the rules name them.
    fn ports(&self) -> [Option<u16>; 2] {
        let mut ports = [None, None];
        for a in &self.addrs {
            ports[usize::from(a.is_ipv6())] = Some(a.port());
        }
        ports
    }
}

/// Accepts on the spare listeners; each connection waits until `ready`,
/// then is proxied to the actor's listener it was for.
async fn serve_spare(
    netns: PathBuf,
    listen: Vec<SocketAddr>,
    listeners: Vec<(TcpListener, SocketAddr)>,
    ready: watch::Receiver<Option<Transparent>>,
    limit: usize,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<TcpStream>();
    let mut tasks = tokio::task::JoinSet::new();
    for (l, addr) in listeners {
        let tx = tx.clone();
        tasks.spawn(async move {
            let l = &l;
            accept_loop(addr, move || async move { l.accept().await.map(|(s, _)| s) }, tx).await;
        });
    }
    drop(tx);
    let waiting = Arc::new(AtomicUsize::new(0));
    let mut proxies = tokio::task::JoinSet::new();
    while let Some(s) = rx.recv().await {
        let Some(to) = s.local_addr().ok().and_then(|local| listener_of(&listen, local)) else {
            // Not a port of the actor's listeners (a SYN to another of the
            // pod's addresses, or to the spare's port itself).
            reset(s);
            continue;
        };
        if waiting.load(Ordering::Relaxed) >= limit {
            warn!(limit, "activation: too many connections waiting for the restored actor; resetting new ones");
            reset(s);
            continue;
        }
        waiting.fetch_add(1, Ordering::Relaxed);
        let (netns, mut ready, waiting) = (netns.clone(), ready.clone(), waiting.clone());
        proxies.spawn(async move {
            let t = ready.wait_for(Option::is_some).await.ok().and_then(|t| *t);
            waiting.fetch_sub(1, Ordering::Relaxed);
            let Some(t) = t else { return };
            if let Err(e) = proxy(&netns, s, to, Vec::new(), t).await {
                debug!("activation proxy (spare): {e}");
            }
        });
        while proxies.try_join_next().is_some() {}
    }
}

impl Armed {
    /// Binds `listen` (addresses and ports, from [`listeners_for`]) in
    /// `netns` and starts watching them. The first real connection sends
    /// one message on `wake`.
    pub fn arm(netns: &Path, listen: Vec<SocketAddr>, wake: mpsc::UnboundedSender<()>) -> Result<Armed> {
        Self::arm_bounded(netns, listen, wake, LIMITS)
    }

    fn arm_bounded(netns: &Path, listen: Vec<SocketAddr>, wake: mpsc::UnboundedSender<()>, limits: Limits) -> Result<Armed> {
        let addrs = listen.clone();
        // bind(2) does not block: a short-lived thread in the namespace.
        let bound = in_netns(netns, move || {
            Ok(addrs
                .iter()
                .map(|a| {
                    let v6_only = a.is_ipv6() && (is_v6_only(a) || addrs.iter().any(|b| b.is_ipv4() && b.port() == a.port()));
                    (*a, bind_retrying(*a, v6_only, BIND_IN_USE_RETRY))
                })
                .collect::<Vec<_>>())
        })?;
        // One address that cannot be bound (a link-local one without its
        // scope...) does not cost the others their activation.
        let mut listeners = Vec::new();
        let mut listen = Vec::new();
        let mut failed = Vec::new();
        for (a, r) in bound {
            match r.and_then(TcpListener::from_std) {
                Ok(l) => {
                    listeners.push((l, a));
                    listen.push(a);
                }
                Err(e) => failed.push(format!("{a}: {e}")),
            }
        }
        if listeners.is_empty() {
            return Err(Error::InvalidArgument(format!("no activation listener in {netns:?}: {}", failed.join("; "))));
        }
        if !failed.is_empty() {
            warn!(netns = ?netns, "activation: not held: {}", failed.join("; "));
        }
        Ok(Self::watching(netns, listeners, listen, wake, limits, true))
    }

    /// Watches listening sockets the caller already has (the frozen actor's
    /// own, see [`crate::lifecycle::freeze`]; non-blocking), with the same
    /// classification: probes are answered, a real connection wakes. No
    /// SYN-drop rule at the handover (the actor's listeners stay open);
    /// every listener is closed before [`Armed::begin_handover`] returns.
    pub fn arm_listeners(netns: &Path, listeners: Vec<(StdListener, SocketAddr)>, wake: mpsc::UnboundedSender<()>) -> Result<Armed> {
        let mut tokio_listeners = Vec::new();
        let mut listen = Vec::new();
        for (l, a) in listeners {
            let l = TcpListener::from_std(l).io_context(|| format!("watch the listener on {a}"))?;
            tokio_listeners.push((l, a));
            listen.push(a);
        }
        Ok(Self::watching(netns, tokio_listeners, listen, wake, LIMITS, false))
    }

    fn watching(
        netns: &Path,
        listeners: Vec<(TcpListener, SocketAddr)>,
        listen: Vec<SocketAddr>,
        wake: mpsc::UnboundedSender<()>,
        limits: Limits,
        drop_syns: bool,
    ) -> Armed {
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(watch(listeners, wake, stop_rx, limits));
        let mut spare = None;
        let rules_in = drop_syns.then(|| {
            let (done, rules_in) = oneshot::channel();
            if let Some((rules, kept_spare)) = take_kept_rules(netns, &listen) {
                // The pair the last handover left in covers these ports;
                // its spare listeners wait for the next restore again.
                if let Some(s) = &kept_spare {
                    s.ready.send_replace(None);
                }
                spare = kept_spare;
                let _ = done.send(rules);
                return rules_in;
            }
            spare = Spare::open(netns, &listen, limits.held);
            let ports = spare.as_ref().map_or([None, None], |s| s.ports());
            // In the background: the handover waits for it (see the module doc).
            let (ns, listen) = (netns.to_path_buf(), listen.clone());
            tokio::spawn(async move {
                let _ = done.send(syn_drop_insert(&ns, &listen, ports).await);
            });
            rules_in
        });
        info!(listen = ?listen, "activation armed");
        Armed { netns: netns.to_path_buf(), listen, stop: Some(stop_tx), drop_syns, rules_in, spare }
    }

    /// Nothing to wake any more (the suspended container was stopped): the
    /// listeners close, and the SYN-drop rules go once they are in (in the
    /// background; without a runtime, they stay, with a warning).
    pub fn release(mut self) {
        drop(self.stop.take());
        let spare = self.spare.take();
        let Some(rules_in) = self.rules_in.take() else { return };
        let (tx, rx) = oneshot::channel();
        let ready = async move {
            if let Ok(r) = rules_in.await {
                let _ = tx.send(r);
            }
        };
        remove_rules_later(self.netns.clone(), REMOVE_SYN_DROP, ready, move |ns| async move {
            let r = match rx.await {
                Ok(rules) => syn_drop_remove(&ns, &rules).await,
                Err(_) => Ok(()),
            };
            drop(spare);
            r
        });
    }

    /// Before the restore: new SYNs go to the spare listeners (or are
    /// dropped), the listeners are closed, and every connection accepted so
    /// far is kept for the handover.
    pub async fn begin_handover(mut self) -> Handover {
        let mut rules = None;
        if let Some(rules_in) = self.rules_in.take() {
            // The SYN-drop rules asked for when the ports were held are in.
            rules = rules_in.await.ok();
        }
        let mut held = Vec::new();
        if let Some(stop) = self.stop.take() {
            let (tx, rx) = oneshot::channel();
            if stop.send(tx).is_ok() {
                held = rx.await.unwrap_or_default();
            }
        }
        Handover {
            netns: self.netns.clone(),
            listen: self.listen.clone(),
            held,
            drop_syns: self.drop_syns,
            rules,
            spare: self.spare.take(),
        }
    }
}

/// Connections waiting for the restored actor.
pub struct Handover {
    netns: PathBuf,
    listen: Vec<SocketAddr>,
    held: Vec<Held>,
    drop_syns: bool,
    /// What the hold put in the namespace (`None`: nothing).
    rules: Option<Rules>,
    spare: Option<Spare>,
}

impl Handover {
    /// No connection is waiting.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// After the restore (or a failed one): new connections flow again, and
    /// the held ones (and those the spare listeners took) are proxied to
    /// the actor, from each client's own address where the routing rule is
    /// in.
    pub async fn finish(self) {
        let transparent = self.rules.as_ref().map(|r| r.transparent).unwrap_or_default();
        let n = self.held.len();
        for h in self.held {
            let netns = self.netns.clone();
            tokio::spawn(async move {
                if let Err(e) = proxy(&netns, h.stream, h.listen, h.head, transparent).await {
                    debug!("activation proxy: {e}");
                }
            });
        }
        if let Some(s) = &self.spare {
            s.ready.send_replace(Some(transparent));
        }
        if self.drop_syns {
            // The restored listeners take the SYNs now; the pair goes later.
            let rules = self.rules.unwrap_or_else(|| Rules { listen: self.listen.clone(), ..Rules::default() });
            keep_rules_then_remove(self.netns.clone(), rules, self.spare);
        }
        if n > 0 {
            info!(connections = n, "activation: connections handed over");
        }
    }
}

/// Proxies `stream` (a connection to the actor's listener `listen`, `head`
/// already read from it) to the restored actor: from the client's own
/// address where [`transparent_route`] allows it, from the shim's
/// otherwise (or when that connect fails).
async fn proxy(netns: &Path, mut stream: TcpStream, listen: SocketAddr, head: Vec<u8>, t: Transparent) -> Result<()> {
    let to = upstream_of(listen);
    let route = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) => transparent_route(peer, local, to, t),
        _ => None,
    };
    let mut upstream = match route {
        Some((from, to)) => match connect_transparent_in(netns, from, to, CONNECT_DEADLINE).await {
            Ok(s) => s,
            Err(e) => {
                debug!("activation proxy: from the shim's address: {e}");
                connect_in(netns, to, CONNECT_DEADLINE).await?
            }
        },
        None => connect_in(netns, to, CONNECT_DEADLINE).await?,
    };
    upstream.write_all(&head).await.io_context(|| "forward first bytes".into())?;
    tokio::io::copy_bidirectional(&mut stream, &mut upstream).await.io_context(|| "proxy".into())?;
    Ok(())
}

/// Accepts until the receiver is gone. An error (EMFILE...) backs off and
/// accepts again: a listener never ends on its own.
async fn accept_loop<T, F, Fut>(what: SocketAddr, mut accept: F, tx: mpsc::UnboundedSender<T>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        match accept().await {
            Ok(x) => {
                backoff = ACCEPT_BACKOFF_MIN;
                if tx.send(x).is_err() {
                    return;
                }
            }
            Err(e) => {
                if backoff == ACCEPT_BACKOFF_MIN {
                    warn!(listen = %what, "activation: accept failed, retrying: {e}");
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
}

/// The connections the kernel has completed on `l` and nobody accepted
/// yet, taken now (accept4(2), non-blocking) without waiting for the
/// runtime to see them: closing the listener would reset them.
fn accept_queued(l: &TcpListener) -> Vec<TcpStream> {
    let mut out = Vec::new();
    loop {
        // SAFETY: accept4(2) on our listening socket, no address asked for.
        let fd =
            unsafe { libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) };
        if fd < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ECONNABORTED) | Some(libc::EINTR) => continue,
                _ => return out,
            }
        }
        // SAFETY: fd is a new connected socket this function owns.
        let s = unsafe { std::net::TcpStream::from_raw_fd(fd) };
        if let Ok(s) = TcpStream::from_std(s) {
            out.push(s);
        }
    }
}

/// Resets `s` (RST, not FIN): a connection shed over the bound.
fn reset(s: TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a linger struct that lives for the call, on a socket we own.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// How often held connections are looked at for [`HELD_IDLE_TIMEOUT`].
fn idle_sweep(idle: Duration) -> Duration {
    (idle / 8).clamp(Duration::from_millis(10), Duration::from_secs(5))
}

/// Accepts on all listeners until told to stop; classifies each connection;
/// holds at most `limits.held` (classified or being classified), at most
/// `limits.per_client` of them from one client address, resets the rest;
/// closes a held connection silent for `limits.idle`.
async fn watch(
    listeners: Vec<(TcpListener, SocketAddr)>,
    wake: mpsc::UnboundedSender<()>,
    mut stop: oneshot::Receiver<oneshot::Sender<Vec<Held>>>,
    limits: Limits,
) {
    // One message per accepted connection: its client, and Some (hand
    // over) or None (a probe).
    let (held_tx, mut held_rx) = mpsc::unbounded_channel::<(IpAddr, Option<Held>)>();
    let (acc_tx, mut acc_rx) = mpsc::unbounded_channel::<(TcpStream, SocketAddr)>();
    let (quit, quit_rx) = watch::channel(false);
    let mut accept_tasks = Vec::new();
    for (l, addr) in listeners {
        let tx = acc_tx.clone();
        let mut quit = quit_rx.clone();
        accept_tasks.push(tokio::spawn(async move {
            {
                let (l, tx) = (&l, tx.clone());
                tokio::select! {
                    _ = accept_loop(addr, move || async move { l.accept().await.map(|(s, _)| (s, addr)) }, tx) => {}
                    _ = quit.wait_for(|q| *q) => {}
                }
            }
            // Before the listener closes (its queue would be reset).
            for s in accept_queued(&l) {
                let _ = tx.send((s, addr));
            }
        }));
    }
    drop(acc_tx);
    let mut pending = 0usize;
    let mut pending_from: HashMap<IpAddr, usize> = HashMap::new();
    let mut held: Vec<Held> = Vec::new();
    let mut shed = 0u64;
    let mut shed_clients: Vec<IpAddr> = Vec::new();
    let mut sweep = tokio::time::interval(idle_sweep(limits.idle));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether a connection from `client` has a slot: counts a shed one.
    let mut admit = |client: IpAddr, pending: usize, pending_from: &HashMap<IpAddr, usize>, held: &[Held], listen: SocketAddr| -> bool {
        if pending + held.len() >= limits.held {
            if shed == 0 {
                warn!(listen = %listen, limit = limits.held, "activation: too many connections held for the sleeping actor; resetting new ones");
            }
            shed += 1;
            return false;
        }
        let from = pending_from.get(&client).copied().unwrap_or(0) + held.iter().filter(|h| h.client == client).count();
        if from >= limits.per_client {
            if !shed_clients.contains(&client) {
                warn!(client = %client, listen = %listen, limit = limits.per_client, "activation: too many connections held from one client; resetting its new ones");
                shed_clients.push(client);
            }
            shed += 1;
            return false;
        }
        true
    };
    loop {
        tokio::select! {
            Some((s, listen)) = acc_rx.recv() => {
                let Ok(peer) = s.peer_addr() else { continue };
                let client = unmapped(peer).ip();
                if !admit(client, pending, &pending_from, &held, listen) {
                    reset(s);
                    continue;
                }
                pending += 1;
                *pending_from.entry(client).or_default() += 1;
                let (tx, wake, cut) = (held_tx.clone(), wake.clone(), quit_rx.clone());
                tokio::spawn(async move {
                    let h = match classify(s, listen, client, cut).await {
                        Classified::Real(h) => {
                            let _ = wake.send(());
                            Some(h)
                        }
                        Classified::Cut(h) => Some(h),
                        Classified::Probe => None,
                    };
                    let _ = tx.send((client, h));
                });
            }
            Some((client, h)) = held_rx.recv() => {
                pending -= 1;
                if let Some(n) = pending_from.get_mut(&client) {
                    *n -= 1;
                    if *n == 0 {
                        pending_from.remove(&client);
                    }
                }
                held.extend(h);
            }
            _ = sweep.tick() => {
                let before = held.len();
                held.retain_mut(|h| !h.idle(limits.idle));
                if held.len() < before {
                    info!(closed = before - held.len(), idle = ?limits.idle, "activation: held connections closed, silent and not handed over");
                }
            }
            reply = &mut stop => {
                // The listeners are closed (dropped with their tasks, each
                // after taking what its queue holds) before the reply: a
                // frozen actor's own ones must be, before it is thawed or
                // dumped.
                let _ = quit.send(true);
                for t in accept_tasks.drain(..) { let _ = t.await; }
                // Collect the connections still being classified: the
                // handover cut their classification short (see [`classify`]).
                while pending > 0 {
                    match held_rx.recv().await {
                        Some((_, h)) => { pending -= 1; held.extend(h); }
                        None => break,
                    }
                }
                // Connections accepted but not classified yet.
                while let Ok((s, listen)) = acc_rx.try_recv() {
                    let Ok(peer) = s.peer_addr() else { continue };
                    let client = unmapped(peer).ip();
                    if admit(client, 0, &HashMap::new(), &held, listen) {
                        held.push(Held { stream: s, listen, head: Vec::new(), client, active: Instant::now(), queued: 0 });
                    } else {
                        reset(s);
                    }
                }
                if shed > 0 {
                    warn!(shed, limit = limits.held, per_client = limits.per_client, "activation: connections reset over the bounds while the actor slept");
                }
                if let Ok(reply) = reply { let _ = reply.send(held); }
                return;
            }
        }
    }
}

/// What a new connection to a held port is.
enum Classified {
    /// Real traffic: it wakes the actor and is handed over.
    Real(Held),
    /// Not classified yet when the handover began (`quit`): handed over to
    /// the actor, which answers it whatever it is, without one more wake.
    Cut(Held),
    /// A probe, answered here (or a connection already gone).
    Probe,
}

/// Reads a new connection's first bytes, for at most [`PROBE_WINDOW`] or
/// until the handover begins (`quit`): a handover never waits for a
/// connection's window (a burst of server-speaks-first clients would hold
/// the restore back by up to one window each).
async fn classify(mut s: TcpStream, listen: SocketAddr, client: IpAddr, mut quit: watch::Receiver<bool>) -> Classified {
    let mut head = vec![0u8; 4096];
    let held = |s, head| Held { stream: s, listen, head, client, active: Instant::now(), queued: 0 };
    let read = {
        let read = tokio::time::timeout(PROBE_WINDOW, s.read(&mut head));
        tokio::select! {
            r = read => Some(r),
            // (a TcpStream read is cancel-safe: nothing read is lost)
            _ = quit.wait_for(|q| *q) => None,
        }
    };
    match read {
        None => Classified::Cut(held(s, Vec::new())),
        Some(Ok(Ok(0))) => Classified::Probe, // TCP connect probe: connected and closed
        Some(Ok(Ok(n))) => {
            head.truncate(n);
            if is_kube_probe(&head) {
                let _ =
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
                Classified::Probe
            } else {
                Classified::Real(held(s, head))
            }
        }
        Some(Ok(Err(_))) => Classified::Probe,
        // Silent: a client waiting for the server to speak first.
        Some(Err(_)) => Classified::Real(held(s, Vec::new())),
    }
}

fn is_kube_probe(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    text.starts_with("get ") && text.lines().any(|l| l.starts_with("user-agent: kube-probe/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::netns::iptables_in;
    use crate::system::netns::tests::TestNetns;

    #[test]
    fn recognises_kube_probes() {
        assert!(is_kube_probe(b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.31\r\n\r\n"));
        assert!(!is_kube_probe(b"GET /inc HTTP/1.1\r\nUser-Agent: curl/8\r\n\r\n"));
        assert!(!is_kube_probe(b"inc\n"));
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Once every listener was bound on 0.0.0.0: a socket the actor bound
    /// to loopback was exposed on the pod's IP while it slept.
    #[tokio::test]
    async fn listeners_are_held_on_the_address_the_actor_bound() {
        let ns = TestNetns::new();
        let listen = vec![
            addr("127.0.0.1:6060"),
            addr("0.0.0.0:8080"),
            addr("[::1]:6061"),
            addr("[::]:8081"),
            addr("0.0.0.0:8082"),
            addr("[::]:8082"),
        ];
        let (wake, _rx) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, listen.clone(), wake).unwrap();
        let mut want = listen.clone();
        // And the spare listeners, on loopback (see Spare).
        let spare = armed.spare.as_ref().expect("spare listeners").ports();
        want.extend(
            [
                spare[0].map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)),
                spare[1].map(|p| SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), p)),
            ]
            .into_iter()
            .flatten(),
        );
        want.sort_unstable();
        assert_eq!(listening_ports(ns.tid), want);
        drop(armed);
    }

    /// An address that cannot be bound costs only itself.
    #[tokio::test]
    async fn an_unbindable_address_does_not_cost_the_others() {
        let ns = TestNetns::new();
        let (wake, _rx) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![addr("127.0.0.1:6062"), addr("10.9.9.9:6063")], wake.clone()).unwrap();
        assert_eq!(armed.listen, vec![addr("127.0.0.1:6062")]);
        assert_eq!(listening_ports(ns.tid), vec![addr("127.0.0.1:6062")]);
        drop(armed);
        let e = Armed::arm(&ns.path, vec![addr("10.9.9.9:6063")], wake).err().expect("nothing bound");
        assert!(e.to_string().contains("10.9.9.9:6063"), "{e}");
    }

    #[test]
    fn declared_ports_use_the_actor_s_addresses() {
        // No pid: each declared port on the IPv4 wildcard.
        assert_eq!(listeners_for(None, Some(&[9090, 80])), vec![addr("0.0.0.0:80"), addr("0.0.0.0:9090")]);
        let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = lo.local_addr().unwrap().port();
        let got = listeners_for(Some(std::process::id() as i32), Some(&[port]));
        assert_eq!(got, vec![lo.local_addr().unwrap()]);
        assert_eq!(upstream_of(addr("0.0.0.0:80")), addr("127.0.0.1:80"));
        assert_eq!(upstream_of(addr("[::]:80")), addr("[::1]:80"));
        assert_eq!(upstream_of(addr("10.1.2.3:80")), addr("10.1.2.3:80"));
    }

    #[test]
    fn syn_drop_rules_are_one_transaction() {
        let ports: Vec<u16> = (1..=16).collect();
        let list: Vec<String> = (1..=15).map(|p| p.to_string()).collect();
        let syn = format!("! -i lo -p tcp --syn -m multiport --dports {}", list.join(","));
        assert_eq!(
            syn_drop_rules(&ports, true, None),
            format!(
                "*filter\n-I INPUT 1 {syn} -m socket --nowildcard -j ACCEPT\n-I INPUT 2 {syn} -j DROP\n\
                 -I INPUT 1 ! -i lo -p tcp --syn -m multiport --dports 16 -m socket --nowildcard -j ACCEPT\n\
                 -I INPUT 2 ! -i lo -p tcp --syn -m multiport --dports 16 -j DROP\nCOMMIT\n"
            )
        );
        assert_eq!(
            syn_drop_rules(&[80], false, None),
            "*filter\n-D INPUT ! -i lo -p tcp --syn -m multiport --dports 80 -m socket --nowildcard -j ACCEPT\n\
             -D INPUT ! -i lo -p tcp --syn -m multiport --dports 80 -j DROP\nCOMMIT\n"
        );
        // With a spare listener: its TPROXY pair first, in the same transaction.
        let syn = "! -i lo -p tcp --syn -m multiport --dports 80";
        assert_eq!(
            syn_drop_rules(&[80, 81], true, Some((IpAddr::V6(Ipv6Addr::LOCALHOST), 4000, &[80]))),
            format!(
                "*mangle\n-I PREROUTING 1 {syn} -m socket --nowildcard -j ACCEPT\n\
                 -I PREROUTING 2 {syn} -j TPROXY --on-port 4000 --on-ip ::1\nCOMMIT\n\
                 *filter\n-I INPUT 1 {syn},81 -m socket --nowildcard -j ACCEPT\n-I INPUT 2 {syn},81 -j DROP\nCOMMIT\n"
            )
        );
    }

    #[test]
    fn syn_drop_rules_cover_both_families_in_chunks() {
        let listen = vec![addr("127.0.0.1:1"), addr("[::1]:2"), addr("[::]:3"), v6_only(addr("[::]:4"))];
        let [(t4, v4), (t6, v6)] = syn_drop_ports(&listen);
        assert_eq!((t4, v4), ("iptables", vec![1, 3]));
        assert_eq!((t6, v6), ("ip6tables", vec![2, 3, 4]));
        // Loopback-only ports get no spare listener (they are not reachable).
        assert_eq!(spare_ports(&listen), [vec![3], vec![3, 4]]);
    }

    #[test]
    fn connections_are_matched_to_their_listener() {
        let listen = vec![addr("0.0.0.0:80"), addr("10.0.0.5:80"), addr("[::]:81"), v6_only(addr("[::]:82"))];
        assert_eq!(listener_of(&listen, addr("10.0.0.5:80")), Some(addr("10.0.0.5:80")));
        assert_eq!(listener_of(&listen, addr("10.0.0.6:80")), Some(addr("0.0.0.0:80")));
        assert_eq!(listener_of(&listen, addr("10.0.0.6:81")), Some(addr("[::]:81")), "dual-stack");
        assert_eq!(listener_of(&listen, addr("[::ffff:10.0.0.6]:81")), Some(addr("[::]:81")));
        assert_eq!(listener_of(&listen, addr("10.0.0.6:82")), None, "IPv6-only takes no IPv4");
        assert_eq!(listener_of(&listen, addr("[fd00::1]:82")), Some(v6_only(addr("[::]:82"))));
        assert_eq!(listener_of(&listen, addr("10.0.0.6:83")), None);
        assert_eq!(upstream_of(v6_only(addr("[::]:82"))), addr("[::1]:82"));
    }

    #[test]
    fn a_transparent_upstream_only_where_it_can_work() {
        let t = Transparent { v4: true, v6: true };
        let (c4, c6) = (addr("10.1.0.9:5000"), addr("[fd00::9]:5000"));
        assert_eq!(transparent_route(c4, addr("10.2.0.3:80"), addr("127.0.0.1:80"), t), Some((c4, addr("127.0.0.1:80"))));
        assert_eq!(transparent_route(c6, addr("[fd00::3]:80"), addr("[::1]:80"), t), Some((c6, addr("[::1]:80"))));
        // An IPv4 client of a dual-stack listener: to the IPv4 loopback.
        assert_eq!(
            transparent_route(addr("[::ffff:10.1.0.9]:5000"), addr("[::ffff:10.2.0.3]:80"), addr("[::1]:80"), t),
            Some((c4, addr("127.0.0.1:80")))
        );
        // A client in the pod, an actor on a pod address, no routing rule.
        assert_eq!(transparent_route(addr("127.0.0.1:5000"), addr("127.0.0.1:80"), addr("127.0.0.1:80"), t), None);
        assert_eq!(transparent_route(addr("10.2.0.3:5000"), addr("10.2.0.3:80"), addr("127.0.0.1:80"), t), None);
        assert_eq!(transparent_route(c4, addr("10.2.0.3:80"), addr("10.2.0.3:80"), t), None);
        assert_eq!(transparent_route(c4, addr("10.2.0.3:80"), addr("127.0.0.1:80"), Transparent { v4: false, v6: true }), None);
    }

    /// A connection is held, the SYN-drop rule goes in for IPv6 too, and the
    /// connection is handed over to the actor listening on `::1` again.
    #[tokio::test]
    async fn an_ipv6_connection_is_held_and_handed_over() {
        let ns = TestNetns::new();
        let listen = addr("[::1]:7070");
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![listen], wake).unwrap();
        let client = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        cw.write_all(b"hello").await.unwrap();
        woken.recv().await.unwrap();
        let handover = armed.begin_handover().await;
        let rules = iptables_in(&ns.path, "ip6tables", &["-S", "INPUT"]).await.unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        assert!(rules.contains("--dports 7070") && rules.contains("DROP"), "{rules}");
        assert!(rules.contains("-m socket --nowildcard -j ACCEPT"), "a SYN with a listener is accepted first: {rules}");
        // The restored actor listens again.
        let app = in_netns(&ns.path, move || bind_retrying(listen, false, BIND_IN_USE_RETRY)).unwrap();
        app.set_nonblocking(true).unwrap();
        let app = TcpListener::from_std(app).unwrap();
        handover.finish().await;
        let (mut conn, peer) = app.accept().await.unwrap();
        assert!(peer.ip().is_loopback(), "{peer}");
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        conn.write_all(b"world").await.unwrap();
        cr.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"world");
        // The rules stay for KEEP_RULES after the handover, then come out
        // in the background.
        let rules = iptables_in(&ns.path, "ip6tables", &["-S", "INPUT"]).await.unwrap();
        assert!(String::from_utf8_lossy(&rules.stdout).contains("--dports 7070"), "kept after the handover");
        assert!(wait_rules_gone(&ns.path, "ip6tables", "7070").await, "the SYN-drop rules are still there after the handover");
    }

    /// Whether no rule of `tool` in `netns` names `port` (polled; liveness
    /// bound only: KEEP_RULES and then some).
    async fn wait_rules_gone(netns: &Path, tool: &str, port: &str) -> bool {
        for _ in 0..600 {
            let rules = iptables_in(netns, tool, &["-S", "INPUT"]).await.unwrap();
            if !String::from_utf8_lossy(&rules.stdout).contains(port) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The ports held again soon after a handover take over the pair it
    /// left in: one pair, not two, and it goes after the next handover.
    #[tokio::test]
    async fn a_hold_soon_after_a_handover_takes_its_rules_over() {
        let ns = TestNetns::new();
        let listen = addr("127.0.0.1:7072");
        let (wake, _woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![listen], wake.clone()).unwrap();
        armed.begin_handover().await.finish().await;
        let armed = Armed::arm(&ns.path, vec![listen], wake).unwrap();
        let handover = armed.begin_handover().await;
        let rules = iptables_in(&ns.path, "iptables", &["-S", "INPUT"]).await.unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        assert_eq!(rules.matches("--dports 7072").count(), 2, "one pair (accept, drop): {rules}");
        assert!(take_kept_rules(&ns.path, &[listen]).is_none(), "taken over, not kept twice");
        handover.finish().await;
        assert!(wait_rules_gone(&ns.path, "iptables", "7072").await, "the SYN-drop rules are still there after the handover");
    }

    /// Once a hold failed ("Address already in use") when another thread
    /// had just forked: the child keeps a copy of a listener just closed
    /// until its exec.
    #[test]
    fn a_port_closed_elsewhere_a_moment_later_is_bound() {
        let other = StdListener::bind("127.0.0.1:0").unwrap();
        let listen = other.local_addr().unwrap();
        let e = bind_retrying(listen, false, Duration::ZERO).expect_err("the port is in use");
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE));
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(other);
        });
        // Liveness bound only: the port is free after 50 ms.
        let l = bind_retrying(listen, false, Duration::from_secs(60)).unwrap();
        assert_eq!(l.local_addr().unwrap(), listen);
        closer.join().unwrap();
    }

    /// Held connections are bounded: one over the bound is reset.
    #[tokio::test]
    async fn connections_over_the_bound_are_reset() {
        let ns = TestNetns::new();
        let listen = addr("127.0.0.1:7071");
        let (wake, mut woken) = mpsc::unbounded_channel();
        let _armed = Armed::arm_bounded(&ns.path, vec![listen], wake, Limits { held: 2, ..LIMITS }).unwrap();
        let mut kept = Vec::new();
        for _ in 0..2 {
            let mut c = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
            c.write_all(b"x").await.unwrap();
            woken.recv().await.unwrap();
            kept.push(c);
        }
        let mut over = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
        let mut buf = [0u8; 1];
        // Liveness bound only: without the bound it would be held forever.
        let r = tokio::time::timeout(Duration::from_secs(60), over.read(&mut buf)).await.expect("the connection over the bound was held");
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset));
    }

    /// Once the accept loop ended on its first error (EMFILE), leaving the
    /// port dead.
    #[tokio::test]
    async fn the_accept_loop_survives_errors() {
        let mut script = vec![
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            Err(std::io::Error::from_raw_os_error(libc::ENFILE)),
            Ok(1),
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            Ok(2),
        ]
        .into_iter();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(accept_loop(
            addr("127.0.0.1:1"),
            move || {
                let next = script.next();
                async move {
                    match next {
                        Some(r) => r,
                        None => std::future::pending().await,
                    }
                }
            },
            tx,
        ));
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        task.abort();
    }

    /// The proxy's connect does not block the shim's runtime: on a
    /// one-thread runtime, other work goes on while a connect hangs (its
    /// SYNs dropped).
    #[test]
    fn a_hanging_connect_does_not_block_the_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let ns = TestNetns::new();
            let out = iptables_in(&ns.path, "iptables", &["-A", "OUTPUT", "-p", "tcp", "--dport", "7072", "-j", "DROP"]).await.unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let connect = connect_in(&ns.path, addr("127.0.0.1:7072"), Duration::from_secs(600));
            let (tx, rx) = oneshot::channel();
            tokio::spawn(async move { tx.send(()).unwrap() });
            tokio::select! {
                r = connect => panic!("the connect ended first: {:?}", r.map(|_| ())),
                r = rx => r.unwrap(),
            }
        });
    }

    /// `ip ARGS` in `netns` (a test's namespace), through the reaper.
    async fn ip_out(netns: &Path, args: &[&str]) -> std::process::Output {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", netns.display())).arg("ip").args(args);
        crate::system::reaper::output(cmd, Duration::from_secs(60)).await.unwrap()
    }

    /// Runs `ip ARGS` in `netns`, asserting success.
    async fn ip_in(netns: &Path, args: &[&str]) {
        let out = ip_out(netns, args).await;
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A pod's namespace and a client's, joined by a veth pair: the pod is
    /// 10.99.0.1 and fd99::1, the client 10.99.0.2 and fd99::2 (the pod's
    /// SYN-drop and TPROXY rules apply to what comes in on its veth).
    async fn pod_and_client() -> (TestNetns, TestNetns) {
        let (pod, client) = (TestNetns::new(), TestNetns::new());
        let peer = client.path.display().to_string();
        ip_in(&pod.path, &["link", "add", "tpod", "type", "veth", "peer", "name", "tcli", "netns", &peer]).await;
        for (ns, dev, a4, a6) in [(&pod, "tpod", "10.99.0.1/24", "fd99::1/64"), (&client, "tcli", "10.99.0.2/24", "fd99::2/64")] {
            ip_in(&ns.path, &["addr", "add", a4, "dev", dev]).await;
            ip_in(&ns.path, &["-6", "addr", "add", a6, "dev", dev, "nodad"]).await;
            ip_in(&ns.path, &["link", "set", dev, "up"]).await;
        }
        (pod, client)
    }

    /// A connect from `ns` to `to` with the source address `from` (port
    /// picked by the kernel).
    async fn connect_from(ns: &Path, from: &str, to: SocketAddr) -> TcpStream {
        let from: IpAddr = from.parse().unwrap();
        let socket = in_netns(ns, move || {
            let s = if from.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }?;
            s.bind(SocketAddr::new(from, 0))?;
            Ok(s)
        })
        .unwrap();
        // Liveness bound only.
        tokio::time::timeout(Duration::from_secs(60), socket.connect(to)).await.expect("connect answered").unwrap()
    }

    /// The actor restored: it listens on `listen` in `netns` again.
    fn app_listens(netns: &Path, listen: SocketAddr) -> TcpListener {
        let app = in_netns(netns, move || bind_retrying(listen, listen.is_ipv6(), BIND_IN_USE_RETRY)).unwrap();
        app.set_nonblocking(true).unwrap();
        TcpListener::from_std(app).unwrap()
    }

    /// Whether no `ip rule` of the held ports' table is left in `netns`,
    /// waiting for it as
    /// [`wait_rules_gone`] does: it goes after the iptables rules
    /// (`syn_drop_remove`), so a check right after theirs raced it.
    async fn no_route_rule(netns: &Path) -> bool {
        'poll: for _ in 0..600 {
            for f in ["-4", "-6"] {
                let rules = String::from_utf8_lossy(&ip_out(netns, &[f, "rule", "show"]).await.stdout).into_owned();
                if rules.contains(&format!("lookup {ROUTE_TABLE}")) || rules.contains("lookup 29808") {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue 'poll;
                }
            }
            return true;
        }
        false
    }

    /// Once a connection that woke the actor reached it from 127.0.0.1:
    /// the actor sees each client's own address and port, IPv4 and IPv6;
    /// and nothing of the routing is left after.
    #[tokio::test]
    async fn a_held_connection_reaches_the_actor_from_the_client_s_address() {
        let (pod, client) = pod_and_client().await;
        let listen = vec![addr("0.0.0.0:7080"), addr("[::]:7080")];
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&pod.path, listen.clone(), wake).unwrap();
        let mut clients = Vec::new();
        for (from, to) in [("10.99.0.2", addr("10.99.0.1:7080")), ("fd99::2", addr("[fd99::1]:7080"))] {
            let mut c = connect_from(&client.path, from, to).await;
            c.write_all(b"hello").await.unwrap();
            woken.recv().await.unwrap();
            clients.push(c);
        }
        let handover = armed.begin_handover().await;
        let apps = [app_listens(&pod.path, listen[0]), app_listens(&pod.path, listen[1])];
        handover.finish().await;
        for (c, app) in clients.iter_mut().zip(&apps) {
            let (mut conn, peer) = app.accept().await.unwrap();
            assert_eq!(peer, c.local_addr().unwrap(), "the actor sees the client's own address and port");
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"hello");
            conn.write_all(b"world").await.unwrap();
            c.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"world");
        }
        assert!(wait_rules_gone(&pod.path, "iptables", "7080").await);
        assert!(wait_rules_gone(&pod.path, "ip6tables", "7080").await);
        assert!(no_route_rule(&pod.path).await, "the routing rule is left");
    }

    /// Once a SYN that came while neither the shim's listener nor the
    /// restored actor's was there was dropped, its client served only after
    /// a retransmit (about 1 s): now a spare listener takes it at once, and
    /// it is handed over, with its client's address, when the actor listens.
    #[tokio::test]
    async fn a_connection_during_the_restore_is_taken_at_once() {
        let (pod, client) = pod_and_client().await;
        let listen = vec![addr("[::]:7081")];
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&pod.path, listen.clone(), wake).unwrap();
        let mut first = connect_from(&client.path, "10.99.0.2", addr("10.99.0.1:7081")).await;
        first.write_all(b"1").await.unwrap();
        woken.recv().await.unwrap();
        let handover = armed.begin_handover().await;
        // The shim's listener is closed, the actor's not there yet: both
        // families are taken, not dropped (a dropped SYN would leave the
        // connect waiting until the actor listens below).
        let mut during = Vec::new();
        for (from, to) in [("10.99.0.2", addr("10.99.0.1:7081")), ("fd99::2", addr("[fd99::1]:7081"))] {
            let mut c = connect_from(&client.path, from, to).await;
            c.write_all(b"2").await.unwrap();
            during.push(c);
        }
        let app = {
            let a = in_netns(&pod.path, || bind_retrying(addr("[::]:7081"), false, BIND_IN_USE_RETRY)).unwrap();
            a.set_nonblocking(true).unwrap();
            TcpListener::from_std(a).unwrap()
        };
        handover.finish().await;
        let mut want: Vec<SocketAddr> = std::iter::once(&first).chain(&during).map(|c| unmapped(c.local_addr().unwrap())).collect();
        want.sort_unstable();
        let mut got = Vec::new();
        for _ in 0..3 {
            let (mut conn, peer) = app.accept().await.unwrap();
            let mut b = [0u8; 1];
            conn.read_exact(&mut b).await.unwrap();
            got.push(unmapped(peer));
        }
        got.sort_unstable();
        assert_eq!(got, want, "each with its client's address");
        assert!(wait_rules_gone(&pod.path, "iptables", "7081").await);
        assert!(wait_rules_gone(&pod.path, "ip6tables", "7081").await);
        let mangle = iptables_in(&pod.path, "iptables", &["-t", "mangle", "-S"]).await.unwrap();
        assert!(!String::from_utf8_lossy(&mangle.stdout).contains("TPROXY"), "{:?}", String::from_utf8_lossy(&mangle.stdout));
        assert!(no_route_rule(&pod.path).await, "the routing rule is left");
    }

    /// A connection still silent (being classified) when the handover
    /// begins is handed over with the others: the handover does not wait
    /// out its probe window, which would classify it real and wake the
    /// actor a second time.
    #[tokio::test]
    async fn a_connection_being_classified_at_the_handover_is_handed_over_at_once() {
        let (pod, client) = pod_and_client().await;
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&pod.path, vec![addr("0.0.0.0:7086")], wake).unwrap();
        let mut first = connect_from(&client.path, "10.99.0.2", addr("10.99.0.1:7086")).await;
        first.write_all(b"1").await.unwrap();
        woken.recv().await.unwrap();
        let silent = connect_from(&client.path, "10.99.0.2", addr("10.99.0.1:7086")).await;
        // Settle: the shim accepts it and starts its classification (well
        // within PROBE_WINDOW).
        tokio::time::sleep(PROBE_WINDOW / 5).await;
        let handover = armed.begin_handover().await;
        assert!(woken.try_recv().is_err(), "the silent connection was classified (its window waited out) and woke the actor again");
        let app = {
            let a = in_netns(&pod.path, || bind_retrying(addr("0.0.0.0:7086"), false, BIND_IN_USE_RETRY)).unwrap();
            a.set_nonblocking(true).unwrap();
            TcpListener::from_std(a).unwrap()
        };
        handover.finish().await;
        let mut want = vec![first.local_addr().unwrap(), silent.local_addr().unwrap()];
        want.sort_unstable();
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(app.accept().await.unwrap().1);
        }
        got.sort_unstable();
        assert_eq!(got, want, "both handed over, each from its client's address");
        assert!(wait_rules_gone(&pod.path, "iptables", "7086").await);
    }

    /// A spare listener of this shim is in the namespace's table, never in
    /// the actor's listeners (each suspend found the last one's spares and
    /// could not hold them: `activation: not held: 127.0.0.1:<port>`).
    #[test]
    fn a_spare_listener_is_not_the_actors() {
        let actor = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let spare = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (actor, spare) = (actor.local_addr().unwrap(), spare.local_addr().unwrap());
        let me = Some(std::process::id() as i32);
        assert!(listeners_for(me, None).contains(&spare));
        spare_addrs().push(spare);
        let found = listeners_for(me, None);
        spare_addrs().retain(|a| *a != spare);
        assert!(found.contains(&actor) && !found.contains(&spare), "{found:?}");
    }

    /// An IPv6-only listener of the actor is held IPv6-only: an IPv4
    /// connection is refused, as it is while the actor runs.
    #[tokio::test]
    async fn an_ipv6_only_listener_is_held_ipv6_only() {
        // Found IPv6-only in a live process.
        let only = bind(addr("[::1]:0"), true, false).unwrap();
        let dual = bind(addr("[::]:0"), false, false).unwrap();
        let found = listeners_for(Some(std::process::id() as i32), None);
        assert!(found.contains(&v6_only(only.local_addr().unwrap())), "{found:?}");
        assert!(found.contains(&dual.local_addr().unwrap()), "{found:?}");
        let ns = TestNetns::new();
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![v6_only(addr("[::]:7082"))], wake).unwrap();
        let e = connect_in(&ns.path, addr("127.0.0.1:7082"), CONNECT_DEADLINE).await.expect_err("an IPv4 connect is refused");
        assert!(e.to_string().contains("refused"), "{e}");
        let mut c = connect_in(&ns.path, addr("[::1]:7082"), CONNECT_DEADLINE).await.unwrap();
        c.write_all(b"x").await.unwrap();
        woken.recv().await.unwrap();
        armed.release();
    }

    /// One client cannot take more than its share of the slots: its
    /// connection over the bound is reset while another client's is held.
    #[tokio::test]
    async fn a_client_over_its_bound_is_reset_while_another_is_held() {
        let ns = TestNetns::new();
        let listen = addr("0.0.0.0:7083");
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm_bounded(&ns.path, vec![listen], wake, Limits { per_client: 2, ..LIMITS }).unwrap();
        let mut kept = Vec::new();
        for _ in 0..2 {
            let mut c = connect_from(&ns.path, "127.0.0.2", addr("127.0.0.1:7083")).await;
            c.write_all(b"x").await.unwrap();
            woken.recv().await.unwrap();
            kept.push(c);
        }
        let mut over = connect_from(&ns.path, "127.0.0.2", addr("127.0.0.1:7083")).await;
        let mut other = connect_from(&ns.path, "127.0.0.3", addr("127.0.0.1:7083")).await;
        other.write_all(b"y").await.unwrap();
        woken.recv().await.unwrap();
        let mut buf = [0u8; 1];
        // Liveness bound only: without the bound it would be held forever.
        let r = tokio::time::timeout(Duration::from_secs(60), over.read(&mut buf)).await.expect("the connection over the bound was held");
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset));
        let handover = armed.begin_handover().await;
        let mut clients: Vec<IpAddr> = handover.held.iter().map(|h| h.client).collect();
        clients.sort_unstable();
        assert_eq!(clients, ["127.0.0.2", "127.0.0.2", "127.0.0.3"].map(|a| a.parse::<IpAddr>().unwrap()));
        drop(handover);
    }

    /// A held connection that sends nothing is closed after the idle
    /// timeout; one that keeps sending is kept.
    #[tokio::test]
    async fn a_silent_held_connection_is_closed_after_the_idle_timeout() {
        let ns = TestNetns::new();
        let listen = addr("127.0.0.1:7084");
        let (wake, mut woken) = mpsc::unbounded_channel();
        let idle = Duration::from_millis(300);
        let armed = Armed::arm_bounded(&ns.path, vec![listen], wake, Limits { idle, ..LIMITS }).unwrap();
        let mut silent = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
        woken.recv().await.unwrap(); // silent: held after the probe window
        let mut talking = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
        talking.write_all(b"a").await.unwrap();
        woken.recv().await.unwrap();
        let mut buf = [0u8; 1];
        // Liveness bound only: without the timeout it would be held forever.
        let closed = async {
            loop {
                tokio::select! {
                    r = silent.read(&mut buf) => return r,
                    _ = tokio::time::sleep(idle / 3) => { talking.write_all(b"a").await.unwrap(); }
                }
            }
        };
        let r = tokio::time::timeout(Duration::from_secs(60), closed).await.expect("the silent connection was kept");
        assert_eq!(r.unwrap(), 0, "closed");
        let handover = armed.begin_handover().await;
        assert_eq!(handover.held.len(), 1, "the talking one is kept");
        drop(handover);
    }
}
