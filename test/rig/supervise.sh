#!/usr/bin/env bash
# A restart loop for the rig's containerd (TORPOR_RIG_PLAIN=1 up.sh), as
# runit or s6 would be on a node without systemd: torpor's node installer
# restarts containerd by signalling it and relies on this to start it again.
#
#   supervise.sh PIDFILE COMMAND ARGS...   runs COMMAND until this loop is
#                                           sent SIGTERM (test/rig/down.sh)
set -u
pidfile="$1"
shift
child=""
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait; exit 0' TERM INT
while :; do
	echo "---- $(date -Is) supervise.sh starting $1" >&2
	"$@" &
	child=$!
	echo "$child" >"$pidfile"
	wait "$child"
	echo "---- $(date -Is) supervise.sh: $1 exited ($?), restarting in 1s" >&2
	sleep 1
done
