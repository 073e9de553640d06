#!/usr/bin/env bash
# The rig's S3-compatible server: versitygw (the Versity S3 Gateway) with its
# posix backend, listening on 127.0.0.1:$TORPOR_RIG_S3_PORT, data under
# $TORPOR_RIG_S3_DIR, the bucket $TORPOR_RIG_S3_BUCKET created at first start.
#
#   test/rig/s3.sh start    start (idempotent), wait until it answers
#   test/rig/s3.sh stop     SIGTERM, then SIGKILL after 5 s (idempotent)
#   test/rig/s3.sh kill     SIGKILL at once (a crashed server)
#   test/rig/s3.sh pause    SIGSTOP (a stalled server: connections hang)
#   test/rig/s3.sh continue SIGCONT
#   test/rig/s3.sh status   exit 0 when running and answering
#   test/rig/s3.sh env      print the AWS_* variables a client needs
#
# up.sh starts it and down.sh stops it; tests stop and start it to simulate an
# unreachable object store.
set -euo pipefail
# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

log() { echo "rig/s3: $*" >&2; }
die() { echo "rig/s3: ERROR: $*" >&2; exit 1; }

s3_pid() {
	local pid
	pid="$(cat "$TORPOR_RIG_S3_PIDFILE" 2>/dev/null)" || return 1
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
	[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" = versitygw ] || return 1
	echo "$pid"
}

EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855

# s3_curl METHOD PATH: a signed request (curl's SigV4), prints the HTTP code.
s3_curl() {
	local method=(-X "$1")
	[ "$1" = HEAD ] && method=(-I)
	curl -sS -o /dev/null -w '%{http_code}' "${method[@]}" \
		--aws-sigv4 "aws:amz:$TORPOR_RIG_S3_REGION:s3" \
		--user "$TORPOR_RIG_S3_ACCESS_KEY:$TORPOR_RIG_S3_SECRET_KEY" \
		-H "x-amz-content-sha256: $EMPTY_SHA256" \
		"$TORPOR_RIG_S3_ENDPOINT/$2" 2>/dev/null
}

answering() { [ "$(s3_curl GET "" || true)" = 200 ]; }

start() {
	local bin pid code
	if s3_pid >/dev/null && answering; then return 0; fi
	stop KILL # a hung or foreign leftover
	bin="$(command -v versitygw)" || die "versitygw not found in PATH (make deps installs it)"
	mkdir -p "$TORPOR_RIG_S3_DIR" "$TORPOR_RIG_STATE"
	echo "---- $(date -Is) rig/s3.sh start" >>"$TORPOR_RIG_S3_LOG"
	ROOT_ACCESS_KEY="$TORPOR_RIG_S3_ACCESS_KEY" ROOT_SECRET_KEY="$TORPOR_RIG_S3_SECRET_KEY" \
		setsid "$bin" --port "127.0.0.1:$TORPOR_RIG_S3_PORT" --region "$TORPOR_RIG_S3_REGION" \
		posix "$TORPOR_RIG_S3_DIR" </dev/null >>"$TORPOR_RIG_S3_LOG" 2>&1 9>&- &
	pid=$!
	echo "$pid" >"$TORPOR_RIG_S3_PIDFILE"
	for _ in $(seq 150); do
		answering && break
		[ -d "/proc/$pid" ] || { tail -n 20 "$TORPOR_RIG_S3_LOG" >&2; die "versitygw exited at start"; }
		sleep 0.2
	done
	answering || { tail -n 20 "$TORPOR_RIG_S3_LOG" >&2; die "versitygw does not answer on $TORPOR_RIG_S3_ENDPOINT"; }
	code="$(s3_curl HEAD "$TORPOR_RIG_S3_BUCKET" || true)"
	if [ "$code" != 200 ]; then
		code="$(s3_curl PUT "$TORPOR_RIG_S3_BUCKET" || true)"
		[ "$code" = 200 ] || die "creating bucket $TORPOR_RIG_S3_BUCKET failed (HTTP $code)"
	fi
	log "versitygw up (pid $pid) at $TORPOR_RIG_S3_ENDPOINT, bucket $TORPOR_RIG_S3_BUCKET"
}

stop() {
	local sig=$1 pid
	pid="$(s3_pid)" || { rm -f "$TORPOR_RIG_S3_PIDFILE"; return 0; }
	kill "-$sig" "$pid" 2>/dev/null || true
	kill -CONT "$pid" 2>/dev/null || true # a paused one stops too
	for _ in $(seq 50); do
		[ -d "/proc/$pid" ] || break
		sleep 0.1
	done
	if [ -d "/proc/$pid" ]; then
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.2
	fi
	rm -f "$TORPOR_RIG_S3_PIDFILE"
}

case "${1:-}" in
start) start ;;
stop) stop TERM ;;
kill) stop KILL ;;
pause) pid="$(s3_pid)" || die "not running"; kill -STOP "$pid" ;;
continue) pid="$(s3_pid)" || die "not running"; kill -CONT "$pid" ;;
status) s3_pid >/dev/null && answering ;;
env)
	echo "AWS_ACCESS_KEY_ID=$TORPOR_RIG_S3_ACCESS_KEY"
	echo "AWS_SECRET_ACCESS_KEY=$TORPOR_RIG_S3_SECRET_KEY"
	echo "AWS_REGION=$TORPOR_RIG_S3_REGION"
	echo "AWS_ENDPOINT=$TORPOR_RIG_S3_ENDPOINT"
	echo "AWS_ALLOW_HTTP=true"
	;;
*) echo "usage: $0 start|stop|kill|pause|continue|status|env" >&2; exit 2 ;;
esac
