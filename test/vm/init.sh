#!/bin/busybox sh
# /init of the cgroup v2 guest (test/vm/run.sh): a pure cgroup2 tree, then
# whatever /payload.sh does, then power off. Runs from the initramfs only
# (its root is RAM and writable: /tmp is not mounted over, since the
# checkout the tests were built in, and so their recorded trees, may be
# below /tmp).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
echo "guest: kernel $(uname -r), cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
if [ -x /payload.sh ]; then
  /payload.sh
  echo "guest: payload rc=$?"
fi
echo "guest: done"
poweroff -f
