//! Pod networking: the host reaches an actor on its pod IP.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Shutdown};
use torpor_tests::*;

#[test]
fn host_reaches_counter_on_pod_ip() {
    let pod = Pod::run("net");
    let id = pod.start_actor("counter", &["counter", "--port", "8080"]);
    wait_container_state(&id, "CONTAINER_RUNNING");

    let ip = pod.ip();
    let parsed: IpAddr = ip.parse().unwrap_or_else(|e| panic!("pod IP {ip:?}: {e}"));
    assert!(parsed.is_ipv4(), "{ip}");

    let stream = connect_with_retry(&format!("{ip}:8080"));
    stream.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut w = stream;
    let mut line = String::new();
    for want in ["1", "2"] {
        w.write_all(b"inc\n").unwrap();
        line.clear();
        reader.read_line(&mut line).expect("counter answers");
        assert_eq!(line.trim(), want, "counter reply");
    }
    w.write_all(b"get\n").unwrap();
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "2");
    let _ = w.shutdown(Shutdown::Both);

    // a second connection sees the same counter (same process, state kept)
    let mut s2 = connect_with_retry(&format!("{ip}:8080"));
    s2.set_read_timeout(Some(LIVENESS)).unwrap();
    s2.write_all(b"inc\n").unwrap();
    let mut r2 = BufReader::new(s2.try_clone().unwrap());
    line.clear();
    r2.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "3");
}

#[test]
fn pods_get_distinct_ips_and_reach_each_other() {
    let a = Pod::run("neta");
    let b = Pod::run("netb");
    let ca = a.start_actor("counter", &["counter", "--port", "8080"]);
    let cb = b.start_actor("main", &["sleep"]);
    wait_container_state(&ca, "CONTAINER_RUNNING");
    wait_container_state(&cb, "CONTAINER_RUNNING");
    let (ipa, ipb) = (a.ip(), b.ip());
    assert_ne!(ipa, ipb);
    // from pod b to pod a over the bridge (busybox wget in the actor image,
    // HTTP GET /inc on the counter's port)
    let _ = connect_with_retry(&format!("{ipa}:8080"));
    let out = crictl(&[
        "exec",
        "-s",
        &cb,
        "/bin/wget",
        "-q",
        "-O",
        "-",
        &format!("http://{ipa}:8080/inc"),
    ]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "1", "{out}");
}
