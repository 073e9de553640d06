#!/bin/sh
# Inside the cgroup v2 guest (test/vm/run.sh --record): builds a container's
# cgroup as kubelet+runc lay it out under each driver, runs a process in it,
# then prints every file torpor reads (and /proc/<pid>/cgroup) between
# "=== <path>" markers, from which test/vm/run.sh writes the recorded trees
# runtime/tests/data/cgroup/v2-{cgroupfs,systemd}/.
set -u
R=/sys/fs/cgroup
POD=pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0
CID=4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b
dump() { # layout pid dir...
  layout=$1; pid=$2; shift 2
  echo "=== $layout/proc/4242/cgroup"; cat /proc/$pid/cgroup
  for d in "$@"; do
    for f in cgroup.controllers cgroup.subtree_control cgroup.type cgroup.procs cgroup.events cgroup.freeze \
             memory.current memory.max memory.stat memory.events cpu.stat cpu.max pids.current; do
      [ -f "$R/$d/$f" ] || continue
      echo "=== $layout/sys/fs/cgroup/$d/$f"; cat "$R/$d/$f"
    done
    # write-only: recorded as empty files
    [ -f "$R/$d/cgroup.kill" ] && echo "=== $layout/sys/fs/cgroup/$d/cgroup.kill"
  done
  echo "=== $layout/sys/fs/cgroup/cgroup.controllers"; cat $R/cgroup.controllers
}
mkcg() { # path...: each level with the controllers enabled for its children
  p=""
  for part in $(echo "$1" | tr / ' '); do
    echo "+cpu +memory +pids" > "$R$p/cgroup.subtree_control"
    p="$p/$part"; mkdir -p "$R$p"
  done
}
run_in() { # dir: a busy shell that touches 8 MiB of tmpfs, then idles
  sh -c "echo \$\$ > $R/$1/cgroup.procs; dd if=/dev/zero of=/tmp/fill-\$\$ bs=1M count=8 2>/dev/null; i=0; while [ \$i -lt 20000 ]; do i=\$((i+1)); done; exec sleep 1000" </dev/null >/dev/null 2>&1 &
  echo $!
}
layout() { # name container-dir parent-dirs...
  name=$1; dir=$2; shift 2
  mkcg "$dir"
  echo 268435456 > "$R/$dir/memory.max"
  echo "50000 100000" > "$R/$dir/cpu.max"
  pid=$(run_in "$dir")
  echo "--- $name: pid $pid in $dir"
  sleep 2
  # an OOM kill in the container: a 64 MiB buffer under a 16 MiB limit
  echo 16777216 > "$R/$dir/memory.max"
  sh -c "echo \$\$ > $R/$dir/cgroup.procs; exec dd if=/dev/zero of=/dev/null bs=64M count=1" 2>/dev/null
  echo 268435456 > "$R/$dir/memory.max"
  echo "--- $name: oom done"
  echo 1 > "$R/$dir/cgroup.freeze"; sleep 1
  dump "$name" "$pid" "$dir" "$@"
  echo 0 > "$R/$dir/cgroup.freeze"
  echo 1 > "$R/$dir/cgroup.kill"; sleep 1
  echo "--- after cgroup.kill: $(cat $R/$dir/cgroup.events | tr '\n' ' ')"
}
layout v2-cgroupfs kubepods/burstable/$POD/$CID kubepods/burstable/$POD
layout v2-systemd kubepods.slice/kubepods-burstable.slice/kubepods-burstable-$POD.slice/cri-containerd-$CID.scope \
  kubepods.slice/kubepods-burstable.slice/kubepods-burstable-$POD.slice
echo "=== end"
