#!/bin/busybox sh
# /init of the node guest's initramfs (test/vm/node.sh): loads the modules
# the root disk needs (Debian builds virtio and ext4 as modules), mounts
# /dev/vda and hands over to systemd on it. Nothing else runs here.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_pci virtio_blk crc32c_generic ext4; do
  modprobe "$m" || echo "node-init: modprobe $m failed"
done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mkdir -p /newroot
if ! mount -t ext4 -o rw /dev/vda /newroot; then
  echo "node-init: cannot mount /dev/vda; powering off"
  poweroff -f
fi
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
