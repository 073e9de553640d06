//! The agent's Prometheus metrics (`prometheus-client`), served on
//! `--metrics-address` (off unless set) at `/metrics`, as the node
//! daemon serves its own (docs/METRICS.md): the resizes of sleeping
//! actors' requests (issue 42).
//!
//! Labels are low-cardinality: every value is one of a fixed set, never a
//! pod or an actor.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// The reasons a resize up is not done yet (label `reason` of
/// `torpor_agent_requests_not_restored`), always all exported.
pub const PENDING_REASONS: [&str; 5] = ["deferred", "infeasible", "in_progress", "error", "waiting"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResizeLabels {
    direction: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The agent's metrics.
pub struct Metrics {
    registry: Registry,
    resizes: Family<ResizeLabels, Counter>,
    left_alone: Family<ReasonLabels, Counter>,
    shrunk: Gauge,
    released_memory: Gauge<f64, AtomicU64>,
    released_cpu: Gauge<f64, AtomicU64>,
    not_restored: Family<ReasonLabels, Gauge>,
    moves: Family<OutcomeLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The numbers of this node's pods at one moment (gauges).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Density {
    /// Pods whose requests are lowered now.
    pub shrunk: i64,
    /// Requests given back: memory bytes, CPU cores.
    pub released_memory_bytes: f64,
    pub released_cpu_cores: f64,
    /// Pods whose actor is awake and whose requests are not granted back
    /// yet, by reason (one of [`PENDING_REASONS`]).
    pub not_restored: Vec<(&'static str, i64)>,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::default();
        let resizes = Family::<ResizeLabels, Counter>::default();
        registry.register(
            "torpor_agent_resizes",
            "Resizes of pods' requests through pods/resize: direction shrink (the actor suspended) or grow (awake again), outcome ok or failed (the API server refused)",
            resizes.clone(),
        );
        for direction in ["shrink", "grow"] {
            for outcome in ["ok", "failed"] {
                let _ = resizes.get_or_create(&ResizeLabels { direction, outcome });
            }
        }
        let left_alone = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "torpor_agent_shrink_skipped",
            "Suspended actors' pods whose requests were left as they are (once per pod and agent start), by reason: guaranteed, pod_level_resources, restart_policy, bad_annotation",
            left_alone.clone(),
        );
        let shrunk = Gauge::default();
        registry.register(
            "torpor_agent_pods_shrunk",
            "This node's pods whose requests the agent holds lowered while their actor sleeps",
            shrunk.clone(),
        );
        let released_memory = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "torpor_agent_released_memory_request_bytes",
            "Memory requests given back to the scheduler by this node's sleeping actors",
            released_memory.clone(),
        );
        let released_cpu = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "torpor_agent_released_cpu_request_cores",
            "CPU requests given back to the scheduler by this node's sleeping actors",
            released_cpu.clone(),
        );
        let not_restored = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "torpor_agent_requests_not_restored",
            "This node's pods whose actor is awake but whose requests kubelet has not granted back yet, by reason: deferred, infeasible (PodResizePending), in_progress, error (PodResizeInProgress), waiting (kubelet has not taken the resize yet)",
            not_restored.clone(),
        );
        for reason in PENDING_REASONS {
            let _ = not_restored.get_or_create(&ReasonLabels { reason });
        }
        let moves = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "torpor_agent_moves",
            "Awake actors with no room for their requests on this node and torpor.dev/on-no-room: move, by outcome: moved (suspended, their pod deleted for its controller to create again), failed (the suspend or the delete failed), refused (the pod has no controller, or a bad value)",
            moves.clone(),
        );
        for outcome in ["moved", "failed", "refused"] {
            let _ = moves.get_or_create(&OutcomeLabels { outcome });
        }
        Arc::new(Metrics { registry, resizes, left_alone, shrunk, released_memory, released_cpu, not_restored, moves })
    }

    /// A resize (`shrink`, `grow`) that the API server took (`ok`) or refused.
    pub fn resize(&self, direction: &'static str, ok: bool) {
        self.resizes.get_or_create(&ResizeLabels { direction, outcome: if ok { "ok" } else { "failed" } }).inc();
    }

    /// A move (`moved`, `failed`, `refused`: see [`crate::moves`]).
    pub fn moved(&self, outcome: &'static str) {
        self.moves.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// A pod left alone (see [`crate::resize::LeftAlone::label`]).
    pub fn left_alone(&self, reason: &'static str) {
        self.left_alone.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn set_density(&self, d: &Density) {
        self.shrunk.set(d.shrunk);
        self.released_memory.set(d.released_memory_bytes);
        self.released_cpu.set(d.released_cpu_cores);
        for reason in PENDING_REASONS {
            let n = d.not_restored.iter().filter(|(r, _)| *r == reason).map(|(_, n)| n).sum();
            self.not_restored.get_or_create(&ReasonLabels { reason }).set(n);
        }
    }

    /// The exposition: OpenMetrics when `openmetrics`, else the classic text format.
    pub fn encode(&self, openmetrics: bool) -> std::result::Result<String, std::fmt::Error> {
        let mut out = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        }
        Ok(out)
    }
}

const MAX_CONNECTIONS: usize = 16;
const MAX_HEADER_BYTES: usize = 16 * 1024;
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
const PATH: &str = "/metrics";

/// Binds `addr` (at start: a port in use is a clear error then).
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|source| Error::Io { what: format!("--metrics-address {addr}: cannot listen there"), source })?;
    l.set_nonblocking(true).map_err(|source| Error::Io { what: format!("metrics listener on {addr}"), source })?;
    Ok(l)
}

/// Serves `metrics` on `listener` in the background (as the node daemon's
/// endpoint: at most 16 connections, headers within 16 KiB and 5 s, one
/// answer per connection, cut after 30 s; GET or HEAD /metrics, else 404
/// or 405).
pub fn serve(listener: std::net::TcpListener, metrics: Arc<Metrics>) -> Result<()> {
    let addr = listener.local_addr().map_err(|source| Error::Io { what: "metrics listener".into(), source })?;
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|source| Error::Io { what: format!("metrics listener on {addr}"), source })?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tracing::info!(address = %addr, path = PATH, "serving metrics");
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "metrics: too many connections, closing this one");
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
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics: connection"),
                    Err(_) => tracing::debug!(%peer, "metrics: connection cut after {CONNECTION_TIMEOUT:?}"),
                }
            });
        }
    });
    Ok(())
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
    let openmetrics = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').any(|p| p.trim().starts_with("application/openmetrics-text")));
    let Ok(body) = metrics.encode(openmetrics) else {
        return Ok(plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n"));
    };
    let len = body.len();
    let mut r = Response::new(Full::new(if head { Bytes::new() } else { Bytes::from(body) }));
    let ct =
        if openmetrics { "application/openmetrics-text; version=1.0.0; charset=utf-8" } else { "text/plain; version=0.0.4; charset=utf-8" };
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(ct));
    if head {
        r.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(len));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn resizes_and_density_are_exposed() {
        let m = Metrics::new();
        let text = m.encode(false).unwrap();
        assert_eq!(sample(&text, r#"torpor_agent_resizes_total{direction="shrink",outcome="ok"}"#), Some(0.0), "{text}");
        assert_eq!(sample(&text, r#"torpor_agent_requests_not_restored{reason="deferred"}"#), Some(0.0), "{text}");
        m.resize("shrink", true);
        m.resize("grow", false);
        m.left_alone("guaranteed");
        m.moved("moved");
        m.set_density(&Density {
            shrunk: 3,
            released_memory_bytes: 1.5e9,
            released_cpu_cores: 1.47,
            not_restored: vec![("deferred", 1), ("infeasible", 1), ("deferred", 1)],
        });
        let text = m.encode(false).unwrap();
        assert_eq!(sample(&text, r#"torpor_agent_resizes_total{direction="shrink",outcome="ok"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"torpor_agent_resizes_total{direction="grow",outcome="failed"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"torpor_agent_shrink_skipped_total{reason="guaranteed"}"#), Some(1.0));
        assert_eq!(sample(&text, "torpor_agent_pods_shrunk"), Some(3.0));
        assert_eq!(sample(&text, r#"torpor_agent_moves_total{outcome="moved"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"torpor_agent_moves_total{outcome="refused"}"#), Some(0.0));
        assert_eq!(sample(&text, "torpor_agent_released_memory_request_bytes"), Some(1.5e9));
        assert_eq!(sample(&text, "torpor_agent_released_cpu_request_cores"), Some(1.47));
        assert_eq!(sample(&text, r#"torpor_agent_requests_not_restored{reason="deferred"}"#), Some(2.0));
        assert_eq!(sample(&text, r#"torpor_agent_requests_not_restored{reason="waiting"}"#), Some(0.0));
        m.set_density(&Density::default());
        let text = m.encode(true).unwrap();
        assert!(text.ends_with("# EOF\n"), "OpenMetrics");
        assert_eq!(sample(&text, r#"torpor_agent_requests_not_restored{reason="deferred"}"#), Some(0.0), "gone when the pods are");
    }

    #[tokio::test]
    async fn the_endpoint_serves_metrics_and_404s_other_paths() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        serve(l, Metrics::new()).unwrap();
        let ask = |req: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("torpor_agent_pods_shrunk"), "{ok}");
        assert!(ask("GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.starts_with("HTTP/1.1 404"));
        assert!(ask("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").await.starts_with("HTTP/1.1 405"));
        assert!(bind(addr).is_err(), "a port in use is an error at start");
    }
}
