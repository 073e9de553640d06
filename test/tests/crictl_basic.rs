//! The kubelet-facing basics through crictl: pod and container lifecycle,
//! exec (output, exit codes, stdin, tty), logs, stop semantics, removal.

use torpor_tests::*;

/// Waits until the container's log shows `needle` (the actor prints
/// "sleeping..." once its signal handling is set up).
fn wait_logs_contain(id: &str, needle: &str) -> Output {
    wait_for(&format!("{needle:?} in the log of {id}"), LIVENESS, || {
        let out = crictl(&["logs", id]);
        (out.success() && out.all_output().contains(needle)).then_some(out)
    })
}

#[test]
fn pod_and_container_lifecycle() {
    let pod = Pod::run("life");
    assert_eq!(pod.state(), "SANDBOX_READY");

    let pods = crictl_json(&["pods", "-o", "json", "--id", &pod.id]);
    let items = pods["items"].as_array().expect("pods list");
    assert_eq!(items.len(), 1, "crictl pods --id: {pods}");
    assert_eq!(items[0]["state"], "SANDBOX_READY");
    assert_eq!(items[0]["runtimeHandler"], runtime_handler(), "pod runs under the handler under test: {}", items[0]);

    let id = pod.create(&container_config("main", &["sleep"]));
    assert_eq!(container_state(&id), "CONTAINER_CREATED");
    crictl_ok(&["start", &id]);
    let v = wait_container_state(&id, "CONTAINER_RUNNING");
    assert_eq!(v["status"]["metadata"]["name"], "main");
    assert!(
        v["status"]["image"]["image"].as_str().unwrap_or_default().contains("actor") || v["status"]["imageRef"].as_str().is_some(),
        "inspect shows the image: {}",
        v["status"]
    );
    assert!(v["info"]["pid"].as_i64().unwrap_or(0) > 0, "inspect shows a pid: {}", v["info"]);

    let ps = crictl_json(&["ps", "-o", "json", "--pod", &pod.id]);
    let ctrs = ps["containers"].as_array().expect("containers list");
    assert_eq!(ctrs.len(), 1, "crictl ps --pod: {ps}");
    assert_eq!(ctrs[0]["id"], id.as_str());
    assert_eq!(ctrs[0]["state"], "CONTAINER_RUNNING");

    crictl_ok(&["stop", "--timeout", "10", &id]);
    assert_eq!(container_state(&id), "CONTAINER_EXITED");
    crictl_ok(&["rm", &id]);
    let ps = crictl_json(&["ps", "-a", "-o", "json", "--pod", &pod.id]);
    assert_eq!(ps["containers"].as_array().map(|a| a.len()), Some(0), "container gone after rm: {ps}");

    let pod_id = pod.id.clone();
    pod.remove();
    let pods = crictl_json(&["pods", "-o", "json", "--id", &pod_id]);
    assert_eq!(pods["items"].as_array().map(|a| a.len()), Some(0), "pod gone after rmp: {pods}");
    assert!(!crictl(&["inspectp", &pod_id]).success(), "inspectp of a removed pod must fail");
}

#[test]
fn exec_output_and_exit_codes() {
    let pod = Pod::run("exec");
    let id = pod.start_actor("main", &["sleep"]);
    wait_container_state(&id, "CONTAINER_RUNNING");

    // streaming exec (what `kubectl exec` uses)
    let out = crictl(&["exec", &id, "/bin/sh", "-c", "echo hello-out; echo hello-err >&2"]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "hello-out", "{out}");
    assert!(out.stderr.contains("hello-err"), "stderr of the exec reaches the client: {out}");

    // exec sync (what kubelet's exec probes use)
    let out = crictl(&["exec", "-s", &id, "/bin/sh", "-c", "echo sync-out"]);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("sync-out"), "{out}");
    // ExecSync's exit_code reaches the client: crictl (1.37) exits 1 and
    // names the code ("... exited with 4: <stderr>")
    let out = crictl(&["exec", "-s", &id, "/bin/sh", "-c", "echo sync-err >&2; exit 4"]);
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("exited with 4"), "crictl names the exit code: {out}");
    assert!(out.stderr.contains("sync-err"), "and the command's stderr: {out}");

    // streaming exec with a non-zero exit: crictl fails and reports the code
    let out = crictl(&["exec", &id, "/bin/sh", "-c", "exit 5"]);
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("exit code 5"), "crictl names the exit code: {out}");

    // a command that does not exist fails
    let out = crictl(&["exec", "-s", &id, "/no/such/binary"]);
    assert!(!out.success(), "{out}");

    // the container itself is unaffected
    assert_eq!(container_state(&id), "CONTAINER_RUNNING");
}

#[test]
fn exec_with_stdin() {
    let pod = Pod::run("stdin");
    let id = pod.start_actor("main", &["sleep"]);
    wait_container_state(&id, "CONTAINER_RUNNING");

    let input = b"first line\nsecond line\n";
    let out = crictl_stdin(&["exec", "-i", &id, "/bin/sh", "-c", "cat; echo eof-seen"], input);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout, "first line\nsecond line\neof-seen\n", "{out}");

    let out = crictl_stdin(&["exec", "-i", &id, "/bin/sh", "-c", "wc -l"], b"a\nb\nc\n");
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "3", "{out}");
}

#[test]
fn exec_with_tty() {
    let pod = Pod::run("tty");
    let id = pod.start_actor("main", &["sleep"]);
    wait_container_state(&id, "CONTAINER_RUNNING");

    // `crictl exec -it` needs a terminal on our side: script(1) provides one.
    let r = rig();
    let inner = format!(
        "{} --runtime-endpoint {} --timeout {} exec -it {} /bin/sh -c 'tty; echo cols=$(stty size)'",
        r.crictl, r.cri_endpoint, r.crictl_timeout, id
    );
    let out = run_with("script", ["-q", "-e", "-c", inner.as_str(), "/dev/null"], Some(b""), COMMAND_LIMIT);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("/dev/pts/"), "the exec got a terminal: {out}");
}

#[test]
fn logs_have_both_streams_in_order() {
    let pod = Pod::run("logs");
    // `actor logs --lines 20`: odd lines "line N stdout" to stdout, even
    // lines "line N stderr" to stderr, then it sleeps.
    let id = pod.start_actor("main", &["logs", "--lines", "20"]);
    wait_container_state(&id, "CONTAINER_RUNNING");
    wait_logs_contain(&id, "line 20 stderr");
    wait_logs_contain(&id, "line 19 stdout");

    let out = crictl(&["logs", &id]);
    assert!(out.success(), "{out}");
    let stdout_nums = numbers_in(&out.stdout);
    let stderr_nums = numbers_in(&out.stderr);
    let want_out: Vec<u64> = (1..=20).filter(|n| n % 2 == 1).collect();
    let want_err: Vec<u64> = (1..=20).filter(|n| n % 2 == 0).collect();
    assert_eq!(stdout_nums, want_out, "stdout lines, in order:\n{out}");
    assert_eq!(stderr_nums, want_err, "stderr lines, in order:\n{out}");
    assert!(out.stdout.lines().all(|l| l.ends_with("stdout")), "only stdout lines on stdout:\n{out}");
    assert!(out.stderr.lines().all(|l| l.ends_with("stderr")), "only stderr lines on stderr:\n{out}");

    // the log file kubelet reads (CRI log format: time stream tag message)
    let v = inspect_container(&id);
    let log_path = v["status"]["logPath"].as_str().expect("logPath").to_string();
    let text = std::fs::read_to_string(&log_path).unwrap_or_else(|e| panic!("read {log_path}: {e}"));
    assert!(text.lines().any(|l| l.contains(" stdout F line 1 stdout")), "{log_path}:\n{text}");
    assert!(text.lines().any(|l| l.contains(" stderr F line 2 stderr")), "{log_path}:\n{text}");

    // --tail works on the stored log
    let out = crictl(&["logs", "--tail", "1", &id]);
    assert!(out.success(), "{out}");
    assert!(!out.all_output().trim().is_empty(), "{out}");
}

/// The line numbers found in `text`, one per non-empty line (the last run of
/// digits on each line).
fn numbers_in(text: &str) -> Vec<u64> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let digits: String = l
                .chars()
                .rev()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(|c| c.is_ascii_digit())
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            digits.parse().ok()
        })
        .collect()
}

#[test]
fn stop_sends_sigterm_first() {
    let pod = Pod::run("stopterm");
    let id = pod.start_actor("main", &["sleep"]);
    wait_container_state(&id, "CONTAINER_RUNNING");
    wait_logs_contain(&id, "sleeping");

    // A long grace period: an actor that exits on SIGTERM is not SIGKILLed.
    crictl_ok(&["stop", "--timeout", "100", &id]);
    let (code, reason) = wait_exited(&id);
    assert_eq!(code, 0, "the actor exits 0 on SIGTERM; it was not killed (reason {reason})");
    wait_logs_contain(&id, "got terminated, exiting");
}

#[test]
fn stop_kills_after_grace_period() {
    let pod = Pod::run("stopkill");
    let id = pod.start_actor("main", &["sleep", "--ignore-term"]);
    wait_container_state(&id, "CONTAINER_RUNNING");
    wait_logs_contain(&id, "sleeping, ignoring SIGTERM");

    crictl_ok(&["stop", "--timeout", "2", &id]);
    let (code, _) = wait_exited(&id);
    assert_eq!(code, 137, "SIGKILLed after the grace period");
    assert_eq!(inspect_container(&id)["status"]["reason"], "Error");
    crictl_ok(&["rm", &id]);
}

#[test]
fn removing_a_pod_removes_its_containers() {
    let pod = Pod::run("rmp");
    let a = pod.start_actor("a", &["sleep"]);
    let b = pod.start_actor("b", &["sleep", "--ignore-term"]);
    wait_container_state(&a, "CONTAINER_RUNNING");
    wait_container_state(&b, "CONTAINER_RUNNING");
    // rmp -f of a running pod: stops and removes everything.
    let pod_id = pod.id.clone();
    crictl_ok(&["rmp", "-f", &pod_id]);
    for id in [&a, &b] {
        assert!(!crictl(&["inspect", id]).success(), "container {id} gone with its pod");
    }
    let pods = crictl_json(&["pods", "-o", "json", "--id", &pod_id]);
    assert_eq!(pods["items"].as_array().map(|a| a.len()), Some(0), "{pods}");
    drop(pod);
}
