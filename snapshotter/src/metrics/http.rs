//! The `/metrics` endpoint: a small HTTP/1.1 server (hyper) on
//! `metrics_address`.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections at once (more are
//! closed at once), headers within [`MAX_HEADER_BYTES`] read within
//! [`HEADER_TIMEOUT`], each connection closed after one response and cut
//! at [`CONNECTION_TIMEOUT`]; request bodies are never read. `GET` (or
//! `HEAD`) `/metrics` answers the exposition (OpenMetrics when the
//! `Accept` header asks for it, else the classic text format); any other
//! path is 404, any other method 405.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::{Format, Metrics};
use crate::error::{Error, Result};

pub const MAX_CONNECTIONS: usize = 16;
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// The path served.
pub const PATH: &str = "/metrics";

/// Binds `addr` (before anything else is created: a port in use is a
/// clear error at start).
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let l =
        std::net::TcpListener::bind(addr).map_err(|e| Error::Daemon(format!("metrics_address = \"{addr}\": cannot listen there: {e}")))?;
    l.set_nonblocking(true).map_err(|e| Error::Daemon(format!("metrics listener on {addr}: {e}")))?;
    Ok(l)
}

/// Serves `metrics` on `listener` until `stop` turns true.
pub fn serve(listener: std::net::TcpListener, metrics: Arc<Metrics>, mut stop: watch::Receiver<bool>) -> Result<JoinHandle<()>> {
    let addr = listener.local_addr().map_err(|e| Error::Daemon(format!("metrics listener: {e}")))?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| Error::Daemon(format!("metrics listener on {addr}: {e}")))?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    info!(address = %addr, path = PATH, "serving metrics");
    Ok(tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                r = listener.accept() => r,
            };
            let (stream, peer) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and the like: wait a little rather than spin.
                    warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                debug!(%peer, "metrics: too many connections, closing this one");
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req| answer(metrics.clone(), req));
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(MAX_HEADER_BYTES)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(%peer, error = %e, "metrics: connection"),
                    Err(_) => debug!(%peer, "metrics: connection cut after {CONNECTION_TIMEOUT:?}"),
                }
            });
        }
    }))
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

async fn answer(metrics: Arc<Metrics>, req: Request<Incoming>) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != PATH {
        return Ok(plain(StatusCode::NOT_FOUND, "not found: the metrics are at /metrics\n"));
    }
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
            r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
            return Ok(r);
        }
    };
    let format = Format::from_accept(req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()));
    // The store's collector reads its database: off the async threads.
    let encoded = tokio::task::spawn_blocking(move || metrics.encode(format)).await;
    let body = match encoded {
        Ok(Ok(b)) => b,
        Ok(Err(_)) | Err(_) => {
            warn!("metrics: encoding the exposition failed");
            return Ok(plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n"));
        }
    };
    let len = body.len();
    let mut r = Response::new(Full::new(if head { Bytes::new() } else { Bytes::from(body) }));
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(format.content_type()));
    if head {
        r.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(len));
    }
    Ok(r)
}
