#!/bin/sh
# PostgreSQL 15 (Debian's) as a container's main process, run as user
# postgres: creates the cluster in $PGDATA on first start (a pod's volume),
# then execs the postmaster (so it is the container's main process and gets
# its signals). Test image: trust authentication, also from the pod network.
set -eu
: "${PGDATA:?PGDATA must name the data directory}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	initdb -D "$PGDATA" --username=postgres --auth=trust --encoding=UTF8 --locale=C --no-instructions
	printf 'host all all 0.0.0.0/0 trust\n' >>"$PGDATA/pg_hba.conf"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp "$@"
