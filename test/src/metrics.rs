//! The Prometheus metrics of a rig node's torpor-snapshotter
//! (`metrics_address` in its config, written by test/rig/up.sh): one GET,
//! the samples of the text exposition.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

/// `metrics_address` of a torpor-snapshotter, from its config file `path`.
#[track_caller]
pub fn address_in(path: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    text.lines()
        .find_map(|l| l.trim().strip_prefix("metrics_address"))
        .and_then(|v| v.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{path} sets no metrics_address (test/rig/up.sh writes it)"))
}

/// One HTTP/1.1 GET of `path` (the daemon closes the connection after its
/// answer): the status code and the body.
#[track_caller]
pub fn get(addr: &str, path: &str, accept: Option<&str>) -> (u16, String) {
    let mut c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to the metrics endpoint {addr}: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap_or_else(|e| panic!("read the answer of {addr}{path}: {e}"));
    let raw = String::from_utf8(raw).expect("the answer is UTF-8");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer from {addr}{path}: {raw:?}"));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status line of {head:?}"));
    let chunked = head.lines().any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    (code, if chunked { dechunk(body) } else { body.to_string() })
}

/// A chunked body, joined.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or_else(|e| panic!("chunk size {size:?}: {e}"));
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The samples of a text exposition: `name{labels}` -> value.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The samples of `addr`/metrics.
#[track_caller]
pub fn scrape(addr: &str) -> BTreeMap<String, f64> {
    let (code, body) = get(addr, "/metrics", None);
    assert_eq!(code, 200, "{body}");
    samples(&body)
}

/// A sample's value; 0 when not exposed (a counter not moved yet).
pub fn value(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}
