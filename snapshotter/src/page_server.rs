//! The page server: CRIU's lazy-pages daemon asks it for the memory of a
//! process restored from a streamed checkout ([`torpor_store::stream`]).
//!
//! It listens on a unix socket beside the store API's (`pages.sock`, 0600
//! in a 0700 directory: root only; page contents are secrets). The shim
//! connects, names the checkout and the container in one line,
//!
//! ```text
//! torpor-pages/1 <lease> <container dir>\n      → ok\n | error <reason>\n
//! ```
//!
//! and hands the connection to `criu lazy-pages --page-server --ps-socket`.
//! From there the wire is CRIU's own page server protocol
//! (criu/page-xfer.c), as a dump-side `criu page-server --lazy-pages`
//! speaks it: 32-byte `page_server_iov` requests (`PS_IOV_GET` of
//! `nr_pages` from `vaddr` of task `dst_id`), each answered in order by
//! the same header with `PS_IOV_ADD_F` and the pages that can be served
//! from that address (up to the end of its run), then their bytes;
//! `PS_IOV_CLOSE` is answered by a 32-bit 0.
//!
//! When the stream fails, or a request names a page the snapshot does not
//! have, nothing more is answered and the connection is held until the
//! daemon closes it: closing it first would end the daemon, and a process
//! whose lazy-pages daemon is gone reads zeros where its pages were. The
//! shim learns of the failure from `WaitStream`, stops the processes, then
//! the daemon.

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use torpor_store::stream::Stream;
use torpor_store::Store;

/// The handshake's protocol name and version.
pub const HELLO: &str = "torpor-pages/1";

/// The socket's name beside the store API's.
pub const SOCKET_NAME: &str = "pages.sock";

const PS_IOV_ADD_F: u32 = 6;
const PS_IOV_GET: u32 = 7;
const PS_IOV_CLOSE: u32 = 0x1023;
const PS_IOV_FORCE_CLOSE: u32 = 0x1024;
const PS_CMD_BITS: u32 = 16;
const PE_PRESENT: u32 = 1 << 2;
/// `sizeof(struct page_server_iov)`: u32 cmd, 4 bytes of padding, u64 nr_pages, vaddr, dst_id.
const IOV_LEN: usize = 32;
/// The most pages one request may ask for (CRIU's lazy-pages daemon asks
/// for at most 4 MiB at a time).
const MAX_REQUEST_PAGES: u64 = 4096;
/// Requests answered ahead (their chunks are fetched meanwhile).
const PIPELINE: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Iov {
    cmd: u32,
    nr_pages: u64,
    vaddr: u64,
    dst_id: u64,
}

impl Iov {
    fn parse(b: &[u8; IOV_LEN]) -> Iov {
        let u64_at = |i: usize| u64::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7]]);
        Iov { cmd: u32::from_le_bytes([b[0], b[1], b[2], b[3]]), nr_pages: u64_at(8), vaddr: u64_at(16), dst_id: u64_at(24) }
    }

    fn bytes(&self) -> [u8; IOV_LEN] {
        let mut b = [0u8; IOV_LEN];
        b[0..4].copy_from_slice(&self.cmd.to_le_bytes());
        b[8..16].copy_from_slice(&self.nr_pages.to_le_bytes());
        b[16..24].copy_from_slice(&self.vaddr.to_le_bytes());
        b[24..32].copy_from_slice(&self.dst_id.to_le_bytes());
        b
    }
}

/// Serves page requests on `listener` until the task is dropped.
pub async fn serve(listener: UnixListener, store: Arc<Store>) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let store = store.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(conn, &store).await {
                        warn!("page server connection: {e}");
                    }
                });
            }
            Err(e) => {
                warn!("page server accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// The socket path of the page server beside the store API socket.
pub fn socket_beside(store_socket: &Path) -> std::path::PathBuf {
    store_socket.with_file_name(SOCKET_NAME)
}

async fn connection(conn: UnixStream, store: &Store) -> Result<(), String> {
    let (rd, mut wr) = conn.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = String::new();
    let hello = tokio::time::timeout(std::time::Duration::from_secs(10), (&mut rd).take(512).read_line(&mut line)).await;
    let (stream, dir) = match hello {
        Ok(Ok(_)) => match handshake(store, line.trim_end_matches('\n')) {
            Ok(v) => v,
            Err(why) => {
                let _ = wr.write_all(format!("error {why}\n").as_bytes()).await;
                return Err(format!("handshake refused: {why}"));
            }
        },
        Ok(Err(e)) => return Err(format!("handshake: {e}")),
        Err(_) => return Err("no handshake within 10 s".into()),
    };
    wr.write_all(b"ok\n").await.map_err(|e| format!("handshake answer: {e}"))?;
    debug!(lease = stream.lease(), dir = dir.as_str(), "page server connection");
    let (tx, rx) = tokio::sync::mpsc::channel(PIPELINE);
    let writer = tokio::spawn(answer(wr, rx));
    let mut held = false;
    loop {
        let mut b = [0u8; IOV_LEN];
        match rd.read_exact(&mut b).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("read request: {e}")),
        }
        if held {
            continue;
        }
        let iov = Iov::parse(&b);
        let reply = match iov.cmd & ((1 << PS_CMD_BITS) - 1) {
            PS_IOV_GET => match request(&stream, &dir, iov) {
                Ok(r) => r,
                Err(why) => {
                    stream.abandon(why);
                    Reply::Hold
                }
            },
            PS_IOV_CLOSE | PS_IOV_FORCE_CLOSE => Reply::Closed,
            other => {
                stream.abandon(format!("page server: unknown request {other:#x} from the lazy-pages daemon"));
                Reply::Hold
            }
        };
        held = matches!(reply, Reply::Hold);
        if tx.send(reply).await.is_err() {
            held = true;
        }
    }
    drop(tx);
    let _ = writer.await;
    Ok(())
}

enum Reply {
    Pages(Iov, tokio::task::JoinHandle<Result<Vec<u8>, String>>),
    Closed,
    /// Nothing more is answered (see the module doc).
    Hold,
}

fn handshake(store: &Store, line: &str) -> Result<(Arc<Stream>, String), String> {
    let mut words = line.split(' ');
    if words.next() != Some(HELLO) {
        return Err(format!("expected {HELLO:?} first"));
    }
    let (Some(lease), Some(dir), None) = (words.next(), words.next(), words.next()) else {
        return Err("expected a lease and a container directory".into());
    };
    let stream = store.stream(lease).ok_or_else(|| format!("no streamed checkout has lease {lease:?}"))?;
    Ok((stream, dir.to_string()))
}

/// A `PS_IOV_GET`: its pages located and their read started.
fn request(stream: &Arc<Stream>, dir: &str, iov: Iov) -> Result<Reply, String> {
    let pid = u32::try_from(iov.dst_id).map_err(|_| format!("page request for task {:#x}", iov.dst_id))?;
    if iov.nr_pages == 0 || iov.nr_pages > MAX_REQUEST_PAGES {
        return Err(format!("page request for {} pages (1..={MAX_REQUEST_PAGES})", iov.nr_pages));
    }
    let span = stream.locate(dir, pid, iov.vaddr, iov.nr_pages)?;
    stream.note_request(dir, pid, iov.vaddr, iov.nr_pages);
    let s = stream.clone();
    let head = Iov { cmd: (PE_PRESENT << PS_CMD_BITS) | PS_IOV_ADD_F, nr_pages: span.pages, ..iov };
    Ok(Reply::Pages(head, tokio::spawn(async move { s.read(span).await })))
}

/// Writes the replies in request order.
async fn answer(mut wr: tokio::net::unix::OwnedWriteHalf, mut rx: tokio::sync::mpsc::Receiver<Reply>) {
    while let Some(reply) = rx.recv().await {
        let r = match reply {
            Reply::Pages(head, read) => match read.await {
                Ok(Ok(data)) => match wr.write_all(&head.bytes()).await {
                    Ok(()) => wr.write_all(&data).await,
                    Err(e) => Err(e),
                },
                // The stream failed: it says why; hold the connection.
                Ok(Err(_)) | Err(_) => return,
            },
            Reply::Closed => wr.write_all(&0i32.to_le_bytes()).await,
            Reply::Hold => return,
        };
        if let Err(e) = r {
            debug!("page server write: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iov_layout_is_criu_s() {
        let iov = Iov { cmd: PS_IOV_GET, nr_pages: 3, vaddr: 0x7f00_0000_1000, dst_id: 42 };
        let b = iov.bytes();
        assert_eq!(b.len(), 32);
        assert_eq!(&b[0..4], &7u32.to_le_bytes());
        assert_eq!(&b[4..8], &[0; 4], "padding");
        assert_eq!(Iov::parse(&b), iov);
    }
}
