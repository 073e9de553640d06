//! A suite of real software, as a platform team runs it, through kubectl:
//! Debian's PostgreSQL 15, Redis 7 and nginx 1.22, packed into local images
//! by test/images/workloads/build.sh, each in a pod of RuntimeClass torpor
//! as its non-root user (in namespaces that enforce the `restricted` Pod
//! Security Standard), with probes and resources, suspended and resumed by
//! the `torpor.dev/desired-state` annotation (torpor-agent), its data
//! checked with its own client before and after; PostgreSQL's main
//! process is also killed and kubelet's new container comes back with the
//! committed rows. A Redis container of a pod the agent acted on is
//! re-created by kubelet after a crash (cold, with the agent's annotations)
//! and after a stop while suspended (from its snapshot).
//!
//! Run by test/rig/run-tests.sh with the cluster up, one test at a time
//! (`test/rig/run-tests.sh --test workloads`). Each test works in its own
//! namespace, deleted by a guard also on panic.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use torpor_tests::cluster::*;
use torpor_tests::workload::*;

/// A pod of RuntimeClass torpor: one container `name` of `image` as user
/// `uid`, with `probe` as its readiness (every 2 s) and liveness (every
/// 5 s) probe, a volume `data` at `mount`, and `extra` merged into the
/// container.
fn server_pod(name: &str, image: &str, uid: u32, probe: Value, mount: &str, extra: Value) -> String {
    let (pod_sc, container_sc) = non_root(uid);
    let mut container = json!({
        "name": name,
        "image": image,
        "imagePullPolicy": "Never",
        "securityContext": container_sc,
        "readinessProbe": probe.as_object().cloned().map(|mut o| {
            o.insert("periodSeconds".into(), json!(2));
            o.insert("failureThreshold".into(), json!(3));
            Value::Object(o)
        }),
        "livenessProbe": probe.as_object().cloned().map(|mut o| {
            o.insert("periodSeconds".into(), json!(5));
            o.insert("failureThreshold".into(), json!(3));
            o.insert("timeoutSeconds".into(), json!(5));
            Value::Object(o)
        }),
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "volumeMounts": [{"name": "data", "mountPath": mount}],
    });
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            container[k] = v.clone();
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "runtimeClassName": "torpor",
            // no cluster DNS here
            "dnsPolicy": "Default",
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 30,
            "securityContext": pod_sc,
            "containers": [container],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    })
    .to_string()
}

/// A new namespace enforcing the `restricted` Pod Security Standard, the
/// RuntimeClass, and torpor-agent on both nodes.
fn setup(prefix: &str) -> (Namespace, Agents) {
    let ns = Namespace::new(prefix);
    enforce_restricted(&ns);
    runtime_class();
    (ns, Agents::start())
}

/// Every process of the container runs as `user` (and there are `min` or more).
#[track_caller]
fn all_run_as(procs: &[(u32, String, String)], user: &str, min: usize) {
    assert!(procs.len() >= min, "at least {min} processes: {procs:?}");
    assert!(procs.iter().all(|(_, u, _)| u == user), "every process runs as {user}: {procs:?}");
}

fn pids(procs: &[(u32, String, String)]) -> BTreeSet<u32> {
    procs.iter().map(|(p, _, _)| *p).collect()
}

// ------------------------------------------------------------- PostgreSQL

/// `psql -c SQL` in the pod as user postgres over its unix socket; the
/// rows, unaligned and tuples only (`-XAtq`). Must succeed.
#[track_caller]
fn psql(ns: &Namespace, pod: &str, sql: &str) -> String {
    exec(ns, pod, &["psql", "-h", "/tmp", "-U", "postgres", "-d", "postgres", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .trim()
        .to_string()
}

/// Waits until the server takes queries (a new postmaster recovers first).
#[track_caller]
fn wait_psql(ns: &Namespace, pod: &str) {
    wait_until(&format!("{}/{pod} answers queries", ns.name), LIVENESS, || {
        let out = ns.kubectl(&["exec", pod, "--", "psql", "-h", "/tmp", "-U", "postgres", "-XAtq", "-c", "select 1"]);
        (out.success() && out.stdout.trim() == "1").then_some(())
    });
}

/// The pod's SysV shared memory segments (`/proc/sysvipc/shm` in the
/// container: its IPC namespace, the pod's): (key, id, attached processes).
#[track_caller]
fn sysv_segments(ns: &Namespace, pod: &str) -> Vec<(String, String, u64)> {
    exec(ns, pod, &["cat", "/proc/sysvipc/shm"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.to_string(), f.get(1)?.to_string(), f.get(6)?.parse().ok()?))
        })
        .collect()
}

/// Total size in kB of the postmaster's shared mappings (`s` in
/// /proc/1/maps: shared_buffers and the rest of its shared memory).
#[track_caller]
fn shared_kib(ns: &Namespace, pod: &str) -> u64 {
    exec(ns, pod, &["cat", "/proc/1/maps"])
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|perm| perm.ends_with('s')))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?) / 1024)
        })
        .sum()
}

/// PostgreSQL 15 as user postgres (uid 101, fsGroup, restricted
/// namespace): a postmaster and its helper processes sharing
/// shared_buffers. Rows committed before a SIGKILL of the postmaster are
/// there after kubelet's new container recovers; rows written before a
/// suspend by annotation are read after the resume by annotation, by the
/// same postmaster (its start time) with its shared memory (the
/// cumulative statistics, which PostgreSQL 15 keeps there, did not start
/// again from zero), and a new write commits.
#[test]
fn postgres_as_non_root_recovers_its_rows_after_a_crash() {
    postgres(false);
}

/// With a suspend and resume by annotation after the crash's recovery.
/// PostgreSQL's postmaster keeps a SysV shared memory segment (its
/// interlock) in the pod's IPC namespace: the resume failed while the
/// dump left it there (CRIU recreates it, `File exists`); it is the same
/// segment (key and id), attached again, after the resume.
#[test]
fn postgres_as_non_root_keeps_its_rows_across_a_crash_and_a_suspend() {
    postgres(true);
}

/// Without `suspend`: up to the crash's recovery and a write after it.
fn postgres(suspend: bool) {
    let (ns, _agents) = setup("wl-postgres");
    let pod = "postgres";
    let probe = json!({"tcpSocket": {"port": 5432}});
    let extra = json!({"ports": [{"containerPort": 5432}], "args": ["-c", "shared_buffers=32MB"]});
    ns.apply(&server_pod(pod, POSTGRES_IMAGE, POSTGRES_UID, probe, "/var/lib/postgresql/data", extra));
    let p = ns.wait_ready(pod);
    assert_eq!(restarts(&p), 0);
    wait_psql(&ns, pod);
    assert_eq!(exec(&ns, pod, &["id", "-u"]).trim(), POSTGRES_UID.to_string(), "the container runs as postgres");
    all_run_as(&processes(&ns, pod), "postgres", 5);
    assert!(shared_kib(&ns, pod) >= 32 * 1024, "the postmaster maps its 32 MiB of shared_buffers shared");

    psql(&ns, pod, "create table notes (id int primary key, body text not null)");
    psql(&ns, pod, "insert into notes select i, md5(i::text) from generate_series(1, 1000) i");
    let sum = psql(&ns, pod, "select count(*), sum(id), md5(string_agg(body, ',' order by id)) from notes");

    // a crash: the postmaster SIGKILLed; kubelet starts a new container,
    // which recovers from the WAL on the pod's volume
    let started = psql(&ns, pod, "select pg_postmaster_start_time()");
    kill_main_process(&p);
    wait_restarted(&ns, pod, 1);
    wait_psql(&ns, pod);
    assert_ne!(psql(&ns, pod, "select pg_postmaster_start_time()"), started, "a new postmaster");
    assert_eq!(
        psql(&ns, pod, "select count(*), sum(id), md5(string_agg(body, ',' order by id)) from notes"),
        sum,
        "committed rows survive the crash"
    );
    all_run_as(&processes(&ns, pod), "postgres", 5);

    // rows written before the suspend
    psql(&ns, pod, "insert into notes select i, md5(i::text) from generate_series(1001, 1500) i");
    let sum = psql(&ns, pod, "select count(*), sum(id), md5(string_agg(body, ',' order by id)) from notes");
    assert!(sum.starts_with("1500|"), "{sum}");
    let started = psql(&ns, pod, "select pg_postmaster_start_time()");
    let commits_before: u64 =
        psql(&ns, pod, "select xact_commit from pg_stat_database where datname = 'postgres'").parse().expect("xact_commit");
    let procs = processes(&ns, pod);
    let shared = shared_kib(&ns, pod);
    let segments = sysv_segments(&ns, pod);
    assert!(segments.iter().any(|(_, _, n)| *n > 0), "the postmaster's SysV segment, attached: {segments:?}");

    if suspend {
        suspend_by_annotation(&ns, pod);
        assert!(pod_is_ready(&ns.pod(pod)), "Ready while suspended (kubelet's TCP probes are answered)");
        resume_by_annotation(&ns, pod);
    }

    assert_eq!(
        psql(&ns, pod, "select count(*), sum(id), md5(string_agg(body, ',' order by id)) from notes"),
        sum,
        "rows written before the suspend"
    );
    assert_eq!(psql(&ns, pod, "select pg_postmaster_start_time()"), started, "the same postmaster, restored");
    let commits_after: u64 =
        psql(&ns, pod, "select xact_commit from pg_stat_database where datname = 'postgres'").parse().expect("xact_commit");
    assert!(commits_after >= commits_before, "statistics in shared memory kept: {commits_after} commits now, {commits_before} before");
    let after = processes(&ns, pod);
    assert_eq!(pids(&after), pids(&procs), "the same processes: {after:?} vs {procs:?}");
    assert_eq!(shared_kib(&ns, pod), shared, "the same shared mappings");
    let attached = |v: &[(String, String, u64)]| {
        v.iter().filter(|(_, _, n)| *n > 0).map(|(k, id, _)| (k.clone(), id.clone())).collect::<BTreeSet<_>>()
    };
    let after = sysv_segments(&ns, pod);
    assert_eq!(attached(&after), attached(&segments), "the same SysV segments, attached again: {after:?} vs {segments:?}");
    psql(&ns, pod, "insert into notes values (1501, 'after the resume')");
    assert_eq!(psql(&ns, pod, "select body from notes where id = 1501"), "after the resume");
    assert_eq!(psql(&ns, pod, "select count(*) from notes"), "1501");
    let p = ns.pod(pod);
    assert!(pod_is_ready(&p));
    assert_eq!(restarts(&p), 1, "the crash's restart only");
}

// ------------------------------------------------------------------ Redis

/// Redis 7 as user redis (uid 999, restricted namespace) with its keys in
/// memory (and an append-only file on the pod's volume). Two connections
/// from the node stay open across a suspend and resume by annotation: a
/// client's (the same server-side client after: CLIENT ID) and a
/// subscriber's (a message published after the resume reaches it). Then,
/// suspended again, the kept client connection's next command wakes it.
#[test]
fn redis_as_non_root_serves_its_keys_and_kept_connections() {
    redis(false);
}

#[test]
fn redis_keeps_its_keys_and_client_connections_across_a_suspend() {
    redis(true);
}

/// The Redis pod (its TCP readiness probe, as uid REDIS_UID, `/data` on
/// a volume), once ready: its name and `ip:6379`.
fn redis_pod(ns: &Namespace) -> (&'static str, String) {
    let pod = "redis";
    let probe = json!({"tcpSocket": {"port": 6379}});
    let extra = json!({"ports": [{"containerPort": 6379}]});
    ns.apply(&server_pod(pod, REDIS_IMAGE, REDIS_UID, probe, "/data", extra));
    let p = ns.wait_ready(pod);
    (pod, format!("{}:6379", pod_ip(&p)))
}

/// Without `suspend`: the same checks with no suspend between them.
fn redis(suspend: bool) {
    let (ns, _agents) = setup("wl-redis");
    let (pod, addr) = redis_pod(&ns);
    assert_eq!(exec(&ns, pod, &["id", "-u"]).trim(), REDIS_UID.to_string());
    all_run_as(&processes(&ns, pod), "redis", 1);

    let mut client = Redis::connect(&addr);
    for i in 0..200 {
        assert_eq!(client.cmd(&["SET", &format!("key:{i}"), &format!("value {i}")]), Resp::Simple("OK".into()));
    }
    assert_eq!(client.cmd(&["INCRBY", "counter", "41"]), Resp::Int(41));
    let id = client.cmd(&["CLIENT", "ID"]);
    assert!(matches!(id, Resp::Int(_)), "{id:?}");
    let mut subscriber = Redis::connect(&addr);
    assert_eq!(subscriber.cmd(&["SUBSCRIBE", "news"]), Resp::Array(Some(vec![bulk("subscribe"), bulk("news"), Resp::Int(1)])));

    if suspend {
        suspend_by_annotation(&ns, pod);
        assert!(pod_is_ready(&ns.pod(pod)), "Ready while suspended");
        resume_by_annotation(&ns, pod);
    }

    // the kept connections, used after the resume
    assert_eq!(client.cmd(&["CLIENT", "ID"]), id, "the same client connection, the same client in the server");
    assert_eq!(client.cmd(&["DBSIZE"]), Resp::Int(201));
    for i in (0..200).step_by(7) {
        assert_eq!(client.cmd(&["GET", &format!("key:{i}")]), bulk(&format!("value {i}")));
    }
    assert_eq!(client.cmd(&["INCR", "counter"]), Resp::Int(42));
    let mut publisher = Redis::connect(&addr);
    assert_eq!(publisher.cmd(&["PUBLISH", "news", "after the resume"]), Resp::Int(1), "the subscriber is still subscribed");
    assert_eq!(subscriber.read(), Resp::Array(Some(vec![bulk("message"), bulk("news"), bulk("after the resume")])));

    // suspended again: the kept connection's next command wakes the server
    drop(publisher);
    if suspend {
        suspend_by_annotation(&ns, pod);
    }
    assert_eq!(client.cmd(&["GET", "counter"]), bulk("42"), "a command on the kept connection wakes it");
    wait_label(&ns, pod, "running");
    assert_eq!(node_of(&ns.pod(pod)).actor_state(&ns.actor(pod)), "RUNNING");
    assert_eq!(client.cmd(&["CLIENT", "ID"]), id);
    let p = ns.pod(pod);
    assert!(pod_is_ready(&p));
    assert_eq!(restarts(&p), 0);
}

/// Redis' `run_id` (INFO server): random at each start of the server,
/// kept by a restore.
#[track_caller]
fn run_id(client: &mut Redis) -> String {
    let info = match client.cmd(&["INFO", "server"]) {
        Resp::Bulk(Some(text)) => text,
        other => panic!("INFO server: {other:?}"),
    };
    info.lines().find_map(|l| l.strip_prefix("run_id:")).unwrap_or_else(|| panic!("no run_id in INFO server: {info}")).trim().to_string()
}

/// The torpor annotations on the pod (the agent's among them).
fn torpor_annotations(p: &Value) -> BTreeSet<String> {
    p["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .filter(|k| k.starts_with("torpor.dev/"))
        .collect()
}

/// Issue 37, item 3, through kubelet: a non-root container (Redis, uid
/// 999) of a pod that the agent has acted on (its `applied-state` and
/// `applied-result` annotations on the pod, passed to the shim by
/// containerd at every create) is re-created by kubelet after its server
/// is SIGKILLed: a new server (a new run_id) with the keys of its
/// append-only file, the actor RUNNING. Then, suspended by the agent, its
/// container is stopped (`crictl stop`, as kubelet stops a container whose
/// liveness probe fails) and kubelet re-creates it: the new container
/// starts from the actor's snapshot (the run_id of the suspended server,
/// a key it held only in memory), and the agent's label follows the actor.
#[test]
fn redis_restarts_after_the_agent_acted_and_comes_back_from_its_snapshot() {
    let (ns, _agents) = setup("wl-restart");
    let (pod, addr) = redis_pod(&ns);
    let mut client = Redis::connect(&addr);
    assert_eq!(client.cmd(&["SET", "kept", "in the append-only file"]), Resp::Simple("OK".into()));
    let first = run_id(&mut client);

    // the agent acts on the pod: a suspend and a resume
    suspend_by_annotation(&ns, pod);
    resume_by_annotation(&ns, pod);
    assert_eq!(run_id(&mut client), first, "the same server after the resume");
    drop(client);
    let p = ns.pod(pod);
    let written = torpor_annotations(&p);
    for k in [DESIRED, APPLIED_STATE, APPLIED_RESULT] {
        assert!(written.contains(k), "the agent's {k} on the pod: {written:?}");
    }

    // a crash: kubelet re-creates the container with those annotations
    kill_main_process(&p);
    let p = wait_restarted(&ns, pod, 1);
    let addr = format!("{}:6379", pod_ip(&p));
    let mut client = Redis::connect(&addr);
    let second = run_id(&mut client);
    assert_ne!(second, first, "a new server after the crash");
    assert_eq!(client.cmd(&["GET", "kept"]), bulk("in the append-only file"), "the new server read its append-only file");
    assert_eq!(node_of(&p).actor_state(&ns.actor(pod)), "RUNNING");
    all_run_as(&processes(&ns, pod), "redis", 1);

    // suspended by the agent, its container stopped and re-created by
    // kubelet: it comes back from the snapshot
    assert_eq!(client.cmd(&["CONFIG", "SET", "appendonly", "no"]), Resp::Simple("OK".into()));
    assert_eq!(client.cmd(&["SET", "only-in-memory", "since the crash"]), Resp::Simple("OK".into()));
    drop(client);
    suspend_by_annotation(&ns, pod);
    let p = ns.pod(pod);
    let node = node_of(&p);
    let cid = container_id(&p);
    let out = node.crictl(&["stop", &cid]);
    assert!(out.success(), "crictl stop {cid} (suspended): {out}");
    let p = wait_restarted(&ns, pod, 2);
    assert_ne!(container_id(&p), cid, "a new container");
    let mut client = Redis::connect(&format!("{}:6379", pod_ip(&p)));
    assert_eq!(run_id(&mut client), second, "the suspended server, restored from its snapshot");
    assert_eq!(client.cmd(&["GET", "only-in-memory"]), bulk("since the crash"));
    assert_eq!(client.cmd(&["GET", "kept"]), bulk("in the append-only file"));
    let state = node.actor_state(&ns.actor(pod));
    assert_eq!(state, "RUNNING", "the actor runs its restored container");
    wait_label(&ns, pod, "running");
    all_run_as(&processes(&ns, pod), "redis", 1);
    let p = ns.pod(pod);
    assert!(pod_is_ready(&p));
    assert_eq!(restarts(&p), 2);
}

// ------------------------------------------------------------------ nginx

/// nginx as user nginx (uid 101, restricted namespace): its master and two
/// workers, all unprivileged, serve a file written to the pod's volume
/// before a suspend by annotation after the resume, from the same
/// processes, and a file written after it.
#[test]
fn nginx_as_non_root_serves_files_from_its_volume() {
    nginx(false);
}

#[test]
fn nginx_as_non_root_serves_a_file_written_before_a_suspend() {
    nginx(true);
}

/// Without `suspend`: the same checks with no suspend between them.
fn nginx(suspend: bool) {
    let (ns, _agents) = setup("wl-nginx");
    let pod = "nginx";
    let probe = json!({"httpGet": {"path": "/healthz", "port": 8080}});
    let extra = json!({"ports": [{"containerPort": 8080}]});
    ns.apply(&server_pod(pod, NGINX_IMAGE, NGINX_UID, probe, "/srv/www", extra));
    let p = ns.wait_ready(pod);
    let addr = format!("{}:8080", pod_ip(&p));
    let procs = processes(&ns, pod);
    all_run_as(&procs, "nginx", 3);
    assert_eq!(procs.iter().filter(|(_, _, c)| c.contains("master process")).count(), 1, "one master: {procs:?}");
    assert_eq!(procs.iter().filter(|(_, _, c)| c.contains("worker process")).count(), 2, "two workers: {procs:?}");

    let token = unique("written-before-the-suspend");
    exec(&ns, pod, &["sh", "-c", &format!("echo {token} > /srv/www/before.txt")]);
    let get = |path: &str| wait_until(&format!("GET {path} at {addr}"), LIVENESS, || http_get(&addr, path).ok());
    assert_eq!(get("/before.txt"), (200, format!("{token}\n")));

    if suspend {
        suspend_by_annotation(&ns, pod);
        assert!(pod_is_ready(&ns.pod(pod)), "Ready while suspended (kubelet's HTTP probes are answered)");
        resume_by_annotation(&ns, pod);
    }

    assert_eq!(get("/before.txt"), (200, format!("{token}\n")), "the file written before the suspend");
    let after = processes(&ns, pod);
    assert_eq!(pids(&after), pids(&procs), "the same master and workers: {after:?} vs {procs:?}");
    exec(&ns, pod, &["sh", "-c", "echo written after > /srv/www/after.txt"]);
    assert_eq!(get("/after.txt"), (200, "written after\n".to_string()));
    assert_eq!(get("/missing.txt").0, 404);
    let p = ns.pod(pod);
    assert!(pod_is_ready(&p));
    assert_eq!(restarts(&p), 0);
}
