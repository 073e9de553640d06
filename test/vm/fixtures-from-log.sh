#!/bin/sh
# Writes the trees test/vm/record-v2.sh printed on the guest's console
# ("=== <path>" then the file's lines) below OUTDIR.
# Usage: test/vm/fixtures-from-log.sh CONSOLE.LOG OUTDIR
set -eu
log=$1; out=$2
tr -d '\r' < "$log" | awk -v out="$out" '
  /^=== end$/ { if (f != "") close(f); f = ""; next }
  /^=== / { if (f != "") close(f); f = out "/" substr($0, 5);
            d = f; sub(/\/[^\/]*$/, "", d); system("mkdir -p \"" d "\""); printf "" > f; next }
  /^(---|guest:|\[ *[0-9]+\.[0-9]+\])/ { if (f != "") close(f); f = ""; next }
  f != "" { print >> f }
'
