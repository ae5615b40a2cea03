#!/bin/sh
# Runs inside the QEMU guest (scripts/qemu/run): the VFIO path end to end on
# QEMU's NVMe controllers. Exit status 0 = pass. Topology (scripts/qemu/run):
#   0000:00:04.0  NVMe, 4096-byte LBAs, MDTS 3, own IOMMU group
#   0000:00:05.0  NVMe, 512-byte LBAs, MDTS 3, own IOMMU group
#   0000:01:01.0  NVMe behind a PCI bridge, sharing its group with a virtio device
#   0000:00:07.0  NVMe granting one I/O queue pair (max_ioqpairs=1)
#   0000:00:08.0  NVMe with namespaces 1 and 2 (plain) and 3 (8 bytes of metadata per block)
#   0000:00:09.0  ivshmem-plain: BAR2 is 16 MiB of RAM the host sees through its backing file
#   0000:00:00.0  the q35 host bridge (not NVMe)
# mdadm and dmsetup (with their libraries) are in /sbin: scripts/qemu/fetch-guest-tools.
set -u
export PATH=/bin:/sbin
NVME0=0000:00:04.0
NVME1=0000:00:05.0
ONEPAIR=0000:00:07.0
MULTINS=0000:00:08.0
SHARED=0000:01:01.0
VIRTIO=0000:01:02.0
HOSTBRIDGE=0000:00:00.0
IVSHMEM=0000:00:09.0
# KV geometry of the P2P demos: 4 KiB objects, 32 KiB per block.
P2P_GEOMETRY="--layers 4 --kv-heads 2 --head-dim 64 --block-tokens 16"

step() { echo "guest: === $*"; }
fail() { echo "GUEST-FAIL: $*"; exit 1; }
# expect_refusal WHAT TEXT CMD...: CMD must fail and its output must contain TEXT.
expect_refusal() {
    what="$1"; text="$2"; shift 2
    if "$@" >/tmp/out 2>&1; then cat /tmp/out; fail "$what: '$*' succeeded"; fi
    cat /tmp/out
    grep -q -- "$text" /tmp/out || fail "$what: the message does not say '$text'"
}
driver_of() { basename "$(readlink "/sys/bus/pci/devices/$1/driver" 2>/dev/null)" 2>/dev/null; }
# blk_of BDF: the block device of namespace 1 of a controller on the kernel's nvme driver
# (nvme2n1; under native multipath the controller's directory lists the path, nvme2c2n1).
blk_of() {
    for p in /sys/bus/pci/devices/$1/nvme/nvme*/nvme*n1; do
        [ -e "$p" ] && basename "$p" | sed 's/c[0-9]*n/n/'
    done | head -n1
}
no_iommu_faults() {
    if dmesg | grep 'DMAR: \[DMA'; then fail "IOMMU fault in the kernel log $1"; fi
}
# The daemon's geometry: small objects (16 tokens x 2 heads x 64 x bf16 = 4 KiB per layer).
SERVE_GEOMETRY="--layers 4 --kv-heads 2 --head-dim 64 --block-tokens 16"
# start_tuttid SOCKET DRIVES LOG: tutti serve on vfio-bound DRIVES (formatting them as a new
# pool); sets $serve to its pid once it serves.
start_tuttid() {
    rm -f "$1"
    # shellcheck disable=SC2086
    tutti serve --socket "$1" --drives "$2" --open create $SERVE_GEOMETRY --log tutti_daemon=info,warn \
        >"$3.out" 2>"$3.err" &
    serve=$!
    for _ in $(seq 600); do
        # Serving once it says so (the socket is bound a moment before that line).
        [ -S "$1" ] && grep -q "serving pool" "$3.out" && return 0
        kill -0 $serve 2>/dev/null || break
        sleep 0.1
    done
    cat "$3.out" "$3.err"
    fail "tutti serve --drives $2 did not come up"
}
stop_tuttid() {
    kill $serve; wait $serve; rc=$?
    [ $rc = 0 ] || { cat "$1.out" "$1.err"; fail "tutti serve exited with status $rc on SIGTERM"; }
}
# free_pairs SOCKET: the free I/O queue pairs of every controller, one line each.
free_pairs() { tutti status --socket "$1" --json | grep '"free_pairs"'; }

# The kernel's nvme driver probes asynchronously: wait for the namespaces.
for _ in $(seq 100); do
    [ -b /dev/nvme0n1 ] && [ -b /dev/nvme1n1 ] && [ -b /dev/nvme2n1 ] && break
    sleep 0.1
done
[ -b /dev/nvme0n1 ] || fail "the kernel's nvme driver did not bring up the controllers"
# Hugepages for the large DMA buffers of the first drive (the second uses locked 4 KiB pages).
echo 64 >/proc/sys/vm/nr_hugepages

step "tutti admin list"
tutti admin list || fail "admin list"
tutti admin list --json >/tmp/list.json || fail "admin list --json"
for b in $NVME0 $NVME1 $SHARED; do grep -q "\"$b\"" /tmp/list.json || fail "admin list --json misses $b"; done
grep -q '"model": "QEMU NVMe Ctrl' /tmp/list.json || fail "admin list --json shows no model"

step "refusals"
expect_refusal "not NVMe" "not an NVMe controller" tutti admin bind $HOSTBRIDGE
expect_refusal "non-viable group" "not viable" tutti admin bind $SHARED
grep -q "$VIRTIO" /tmp/out || fail "non-viable group: the message does not name $VIRTIO"
[ "$(driver_of $SHARED)" = nvme ] || fail "$SHARED was touched by a refused bind"

mke2fs -q -b 4096 /dev/nvme0n1 >/dev/null 2>&1 || fail "mke2fs"
mkdir -p /mnt/data && mount -t ext4 /dev/nvme0n1 /mnt/data || fail "mount"
tutti admin list | grep -q "mounted at /mnt/data" || fail "admin list does not show the mount"
expect_refusal "mounted" "mounted at /mnt/data" tutti admin bind $NVME0
umount /mnt/data
mkswap /dev/nvme1n1 >/dev/null 2>&1 && swapon /dev/nvme1n1 || fail "swapon"
expect_refusal "swap" "swapoff" tutti admin bind $NVME1
swapoff /dev/nvme1n1
[ "$(driver_of $NVME0)" = nvme ] && [ "$(driver_of $NVME1)" = nvme ] || fail "a refused bind changed a driver"

step "refusals: md, device-mapper and open holders on $ONEPAIR (still on the kernel's nvme driver)"
# mdadm and dmsetup come from Debian's packages (scripts/qemu/fetch-guest-tools); there is no
# udev here, so dmsetup creates its own device nodes and mdadm keeps its map under /run.
export DM_DISABLE_UDEV=1
mkdir -p /run/mdadm
for _ in $(seq 100); do
    D="$(blk_of $ONEPAIR)"
    [ -n "$D" ] && [ -b "/dev/$D" ] && break
    sleep 0.1
done
[ -n "$D" ] && [ -b "/dev/$D" ] || fail "the kernel's nvme driver shows no namespace of $ONEPAIR"
# in_use_refused WHAT TEXT: `tutti admin bind $ONEPAIR` must fail saying TEXT and leave the
# drive on nvme; then the marker line the host's console check requires.
in_use_refused() {
    expect_refusal "$1" "$2" tutti admin bind $ONEPAIR
    [ "$(driver_of $ONEPAIR)" = nvme ] || fail "$1: a refused bind changed the driver of $ONEPAIR"
    echo "IN-USE-REFUSED: $1"
}

# (1) the whole namespace as a member of an assembled, unmounted md array (a degraded raid1).
mdadm --create /dev/md0 --run --metadata=1.2 --level=1 --raid-devices=2 --assume-clean \
    "/dev/$D" missing </dev/null || fail "mdadm --create md0 on /dev/$D"
grep -q "^md0 : active" /proc/mdstat || { cat /proc/mdstat; fail "md0 is not assembled"; }
in_use_refused "md member" "$D is a member of the md RAID array md0"
mdadm --stop /dev/md0 && mdadm --zero-superblock "/dev/$D" || fail "stopping md0"

# (2) a device-mapper linear target on the whole namespace.
sectors="$(blockdev --getsz "/dev/$D")" || fail "blockdev --getsz /dev/$D"
dmsetup create tutti-whole --table "0 $sectors linear /dev/$D 0" || fail "dmsetup create tutti-whole"
in_use_refused "dm holder" "$D is under a device-mapper device dm-[0-9]* (/dev/mapper/tutti-whole)"
dmsetup remove tutti-whole || fail "dmsetup remove tutti-whole"

# (3) a process holding the namespace open (no filesystem, no holder: only /proc/PID/fd shows it).
/bin/sleep 600 <"/dev/$D" &
holder=$!
in_use_refused "open by a process" "$D is open by pid $holder (sleep)"
kill $holder; wait $holder 2>/dev/null

# (4) partitions: an md array of two of them, a dm target on one, a process holding one open.
printf 'o\nn\np\n1\n\n+24M\nn\np\n2\n\n+24M\nw\n' | fdisk "/dev/$D" >/tmp/fdisk.out 2>&1
for _ in $(seq 50); do [ -b "/dev/${D}p2" ] && break; sleep 0.1; done
[ -b "/dev/${D}p1" ] && [ -b "/dev/${D}p2" ] || { cat /tmp/fdisk.out; fail "no partitions on /dev/$D"; }
mdadm --create /dev/md1 --run --metadata=1.2 --level=1 --raid-devices=2 --assume-clean \
    "/dev/${D}p1" "/dev/${D}p2" </dev/null || fail "mdadm --create md1 on the partitions of /dev/$D"
in_use_refused "md member partition" "${D}p1 is a member of the md RAID array md1"
grep -q "${D}p2 is a member of the md RAID array md1" /tmp/out || fail "md member partition: ${D}p2 is not named"
mdadm --stop /dev/md1 && mdadm --zero-superblock "/dev/${D}p1" "/dev/${D}p2" || fail "stopping md1"
psectors="$(blockdev --getsz "/dev/${D}p2")" || fail "blockdev --getsz /dev/${D}p2"
dmsetup create tutti-part --table "0 $psectors linear /dev/${D}p2 0" || fail "dmsetup create tutti-part"
in_use_refused "dm holder partition" "${D}p2 is under a device-mapper device dm-[0-9]* (/dev/mapper/tutti-part)"
dmsetup remove tutti-part || fail "dmsetup remove tutti-part"
/bin/sleep 600 <"/dev/${D}p1" &
holder=$!
in_use_refused "partition open by a process" "${D}p1 is open by pid $holder (sleep)"
kill $holder; wait $holder 2>/dev/null

# Cleaned up: no array, no mapping, no holder, no partition table. Now the bind goes through.
dd if=/dev/zero of="/dev/$D" bs=1M count=1 2>/dev/null && blockdev --rereadpt "/dev/$D" || fail "wiping /dev/$D"
[ ! -e "/dev/${D}p1" ] || fail "the partitions of /dev/$D are still there"
tutti admin bind $ONEPAIR || fail "admin bind $ONEPAIR after the md, dm and open holders were removed"
[ "$(driver_of $ONEPAIR)" = vfio-pci ] || fail "$ONEPAIR is not on vfio-pci"
echo "IN-USE-CLEARED: $ONEPAIR bound after cleanup"

step "tutti admin bind"
tutti admin bind $NVME0 $NVME1 || fail "admin bind"
[ "$(driver_of $NVME0)" = vfio-pci ] && [ "$(driver_of $NVME1)" = vfio-pci ] || fail "not bound to vfio-pci"
tutti admin list

step "tutti admin identify"
tutti admin identify $NVME0 || fail "admin identify $NVME0"
tutti admin identify $NVME1 --json >/tmp/id.json || fail "admin identify --json $NVME1"
grep -q '"lba_size": 512' /tmp/id.json || fail "identify $NVME1 does not show 512-byte LBAs"
expect_refusal "noiommu on an IOMMU machine" "drop --noiommu" tutti admin identify $NVME0 --noiommu

step "read/write verification through VFIO"
# stderr goes to a file: on the serial console it is a terminal and would get progress bars.
tutti selftest --drives $NVME0,$NVME1 --hugepages auto,never 2>/tmp/err || { cat /tmp/err; fail "selftest"; }
cat /tmp/err
no_iommu_faults "during the verification"

step "gio_uring: the host executor (CUDA kernel source on CPU threads) drives both controllers"
# After its passes it recovers both drives (every I/O SQ/CQ deleted and created again through the
# admin queue) and runs one more verified pass on the recreated queues.
tutti selftest --drives $NVME0,$NVME1 --no-verify --gio --gio-ioctx 512 2>/tmp/err >/tmp/gio.txt \
    || { cat /tmp/err /tmp/gio.txt; fail "gio selftest"; }
cat /tmp/err /tmp/gio.txt
for b in $NVME0 $NVME1; do
    grep -q "^selftest gio recovery: $b.* deleted and created again" /tmp/gio.txt || fail "gio selftest: $b was not recovered"
done
grep -q "^selftest gio recovery: after recovery: .* bytes verified" /tmp/gio.txt || fail "gio selftest: no verified pass after the recovery"
no_iommu_faults "during the gio_uring round trip"

step "tutti demo: a request's KV stored and loaded layer by layer on both controllers"
# 256 tokens of Llama-3-8B KV (32 MiB) fit the 64 MiB namespaces. The controllers have different
# LBA sizes (4096/512) and share one IOMMU view, so the pool takes the main path: layer IOCBs whose
# (file, block) pairs the executor expands, in each drive's own LBAs. The run must say so.
# The demo's own wait deadline (120 s) fires before this timeout: a stall is reported by tutti.
timeout 150 tutti demo --drives $NVME0,$NVME1 --tokens 256 2>/tmp/err >/tmp/demo.txt \
    || { cat /tmp/err /tmp/demo.txt; fail "demo"; }
grep -q "layer IOCBs" /tmp/demo.txt || { cat /tmp/demo.txt; fail "demo did not use layer IOCBs"; }
sed 's/^/demo: /' /tmp/demo.txt
no_iommu_faults "during the demo"

step "P2P: the drives' DMA stores KV from and loads KV into the ivshmem BAR"
tutti admin bind --kv-device $IVSHMEM || fail "admin bind --kv-device $IVSHMEM"
[ "$(driver_of $IVSHMEM)" = vfio-pci ] || fail "$IVSHMEM is not on vfio-pci"
expect_refusal "a bridge as KV device" "never a bridge" tutti admin bind --kv-device $HOSTBRIDGE
# BAR2 mmapped through vfio-pci is a PFN map; VFIO_IOMMU_MAP_DMA of it in each drive's container
# routes the drives' DMA through the virtual IOMMU into the BAR. --p2p require: no fallback.
# The host checks the BAR's backing file against the digest printed here (nothing writes the
# first 8 MiB of the BAR after this: the fallback test below uses the second half).
for backend in direct gio; do
    # shellcheck disable=SC2086
    timeout 150 tutti demo --drives $NVME0,$NVME1 --kv-device $IVSHMEM --p2p require --tokens 512 \
        --backend $backend $P2P_GEOMETRY 2>/tmp/err >/tmp/demo.txt \
        || { cat /tmp/err /tmp/demo.txt; fail "P2P demo --backend $backend"; }
    sed "s/^/demo: p2p ($backend): /" /tmp/demo.txt
    grep -q "^data path: p2p (vfio-pci $IVSHMEM BAR2)" /tmp/demo.txt || fail "P2P demo ($backend): not on the p2p data path"
    grep -q "every byte verified" /tmp/demo.txt || fail "P2P demo ($backend): not verified"
done
no_iommu_faults "during the P2P demos"
digest="$(sed -n 's/^KV device memory: .*: \([0-9]*\) bytes at BAR offset \([0-9]*\), \([0-9]*\) of them non-zero, fnv1a64 \([0-9a-f]*\)$/\2 \1 \3 \4/p' /tmp/demo.txt)"
[ -n "$digest" ] || fail "the P2P demo printed no digest of the device memory"
echo "P2P-HOST-CHECK: $digest"

step "tutti bench sgl-vs-prp: SGL, PRP+list and two-page PRP reads of the same objects on both controllers"
# Small on purpose: the guest may run under TCG on a busy host. The figures are QEMU's NVMe
# emulation speed, not an SSD's; what must hold is that every mode read back the stored bytes.
tutti bench sgl-vs-prp --drives $NVME0,$NVME1 --sizes 32K --bytes 512K --passes 1 --exec-blocks 1 \
    2>/tmp/err >/tmp/bench.txt || { cat /tmp/err /tmp/bench.txt; fail "bench sgl-vs-prp"; }
echo "bench: QEMU's controller (an emulator's speed, not an SSD's):"
sed 's/^/bench: /' /tmp/bench.txt
no_iommu_faults "during the SGL vs PRP benchmark"

step "conformance probes (edge-case commands; DIFF = differs from the spec, reported, not fatal)"
tutti selftest --drives $NVME0,$NVME1 --no-verify --probe 2>/tmp/err || { cat /tmp/err; fail "probes"; }
cat /tmp/err
no_iommu_faults "during the probes"

# Before the negative test: the IOMMU fault check greps the whole kernel log.
step "a controller that grants one I/O queue pair"
# $ONEPAIR is on vfio-pci since the in-use refusals; binding it again must say so and succeed.
tutti admin bind $ONEPAIR $MULTINS || fail "admin bind $ONEPAIR $MULTINS"
tutti admin identify $ONEPAIR --json >/tmp/id.json || fail "admin identify $ONEPAIR"
grep -q '"io_queue_pairs": 1,' /tmp/id.json || { cat /tmp/id.json; fail "$ONEPAIR does not grant exactly one pair"; }
tutti selftest --drives $ONEPAIR 2>/tmp/err >/tmp/one.txt || { cat /tmp/err /tmp/one.txt; fail "selftest on one pair"; }
cat /tmp/one.txt
grep -q "on 1 queue pairs" /tmp/one.txt || fail "selftest on one pair: not verified on its one pair"
for backend in gio direct; do
    timeout 150 tutti demo --drives $ONEPAIR --tokens 128 --backend $backend 2>/tmp/err >/tmp/demo.txt \
        || { cat /tmp/err /tmp/demo.txt; fail "demo --backend $backend on one queue pair"; }
    grep -q "every byte verified" /tmp/demo.txt || { cat /tmp/demo.txt; fail "demo on one pair: not verified"; }
    sed "s/^/demo: one pair ($backend): /" /tmp/demo.txt
done
no_iommu_faults "on the one-pair controller"

step "a controller with several namespaces, one of them formatted with metadata"
tutti admin identify $MULTINS | tee /tmp/id.txt || fail "admin identify $MULTINS"
grep -q "512 B data + 8 B metadata" /tmp/id.txt || fail "identify does not show namespace 3's metadata"
grep -q "not usable by tutti" /tmp/id.txt || fail "identify does not say namespace 3 is unusable"
tutti admin identify $MULTINS --json >/tmp/id.json || fail "admin identify --json $MULTINS"
grep -q '"metadata_size": 8' /tmp/id.json || fail "identify --json does not show 8 bytes of metadata"
grep -q '"command_set": "nvm"' /tmp/id.json || fail "identify --json does not show the command set"
expect_refusal "namespace with metadata" "reformat" tutti demo --drives $MULTINS/3 --tokens 128
grep -q "namespace 3" /tmp/out && grep -q "8 B metadata" /tmp/out || fail "the refusal does not name namespace 3 and its format"
tutti selftest --drives $MULTINS 2>/tmp/err >/tmp/multi.txt || { cat /tmp/err /tmp/multi.txt; fail "selftest on $MULTINS"; }
cat /tmp/multi.txt
grep -q "nsid 1 .* verified" /tmp/multi.txt && grep -q "nsid 2 .* verified" /tmp/multi.txt \
    || fail "selftest did not verify both plain namespaces of $MULTINS"
timeout 150 tutti demo --drives $MULTINS --tokens 128 2>/tmp/err >/tmp/demo.txt \
    || { cat /tmp/err /tmp/demo.txt; fail "demo on every namespace of $MULTINS"; }
grep -q "on 2 drives" /tmp/demo.txt || { cat /tmp/demo.txt; fail "demo did not use namespaces 1 and 2 of $MULTINS"; }
grep -q "every byte verified" /tmp/demo.txt || { cat /tmp/demo.txt; fail "demo on two namespaces: not verified"; }
grep -q "namespace skipped" /tmp/err || { cat /tmp/err; fail "demo did not say it skipped namespace 3"; }
sed 's/^/demo: two namespaces: /' /tmp/demo.txt
no_iommu_faults "on the multi-namespace controller"

step "tuttid on VFIO drives: two client processes at once on $NVME0 and $NVME1"
SOCK=/tmp/tuttid.sock
start_tuttid $SOCK $NVME0,$NVME1 /tmp/serve
tutti status --socket $SOCK >/tmp/st.txt || { cat /tmp/st.txt; fail "tutti status"; }
grep -q "controller $NVME0" /tmp/st.txt && grep -q "controller $NVME1" /tmp/st.txt \
    || { cat /tmp/st.txt; fail "status does not show both controllers"; }
free_pairs $SOCK >/tmp/pairs.before
for seed in 1 2; do
    tutti selftest --client $SOCK --seed $seed --chunks 8 >/tmp/client$seed.txt 2>/tmp/client$seed.err &
    eval "client$seed=\$!"
done
wait $client1; rc1=$?
wait $client2; rc2=$?
for seed in 1 2; do
    cat /tmp/client$seed.txt /tmp/client$seed.err
    grep -q "^selftest client $seed: .* on 2 drives .*every byte verified" /tmp/client$seed.txt \
        || fail "tuttid client $seed on VFIO drives did not verify its bytes"
    sed 's/^/tuttid: /' /tmp/client$seed.txt
done
[ $rc1 = 0 ] && [ $rc2 = 0 ] || fail "a tuttid client exited with status $rc1/$rc2"
no_iommu_faults "with two tuttid clients on VFIO drives"

step "tuttid on VFIO drives: a client SIGKILLed in the middle of a load"
# It registers 32 MiB of KV memory (1024 blocks of 32 KiB) and maps it itself: type1 pins those
# pages for as long as they are mapped, whether or not their process is still alive.
# Pages pinned right now (FOLL_PIN, which type1 uses): /proc/vmstat counts pins and unpins.
pinned() { awk '/^nr_foll_pin_acquired/ {a=$2} /^nr_foll_pin_released/ {r=$2} END {print a-r}' /proc/vmstat; }
grep -q '^nr_foll_pin_acquired' /proc/vmstat || fail "this kernel does not count pinned pages in /proc/vmstat"
mem_kib() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo; }
before_kib=$(mem_kib)
before_pins=$(pinned)
tutti selftest --client $SOCK --seed 3 --chunks 512 --hold >/tmp/client3.txt 2>/tmp/client3.err &
held=$!
for _ in $(seq 600); do
    grep -q "holding mid-load" /tmp/client3.txt && break
    kill -0 $held 2>/dev/null || break
    sleep 0.1
done
grep -q "holding mid-load" /tmp/client3.txt || { cat /tmp/client3.txt /tmp/client3.err; fail "the held client never got mid-load"; }
tutti status --socket $SOCK >/tmp/st.txt || fail "tutti status with a held client"
cat /tmp/st.txt
grep -q "selftest-client-3 .*queues \[[^]]" /tmp/st.txt || fail "status does not show the held client's queue leases"
held_kib=$(mem_kib)
held_pins=$(pinned)
kill -9 $held; wait $held 2>/dev/null
gone=0
for _ in $(seq 100); do
    tutti status --socket $SOCK --json >/tmp/st.json || fail "tutti status --json after the kill"
    if ! grep -q selftest-client-3 /tmp/st.json; then gone=1; break; fi
    sleep 0.1
done
[ $gone = 1 ] || { cat /tmp/st.json; fail "the killed client is still listed with its leases"; }
free_pairs $SOCK >/tmp/pairs.after
cmp -s /tmp/pairs.before /tmp/pairs.after || { cat /tmp/pairs.before /tmp/pairs.after; fail "the killed client's queue pairs did not come back"; }
grep -q '"pinned": 0,' /tmp/st.json || { cat /tmp/st.json; fail "the killed client's pins were not dropped"; }
# It mapped its memory itself (type1 pins the pages of the mapping process); the daemon
# unmapped that through the shared container after deleting its queues.
grep -q "unmapped what a departed client had mapped itself" /tmp/serve.err \
    || { cat /tmp/serve.err; fail "the daemon did not unmap the killed client's own mappings"; }
# (tracing colours its fields: the escape codes go.)
grep "unmapped what a departed client had mapped itself" /tmp/serve.err | head -n 3 | tr -d '\033' \
    | sed -e 's/\[[0-9;]*m//g' -e 's/^/tuttid: daemon: /'
# Unmapped, the dead client's pages are unpinned and freed: the memory comes back.
after_kib=$(mem_kib)
after_pins=$(pinned)
echo "tuttid: killed client: pinned pages $before_pins before it, $held_pins while it held its load, $after_pins after tuttid released it (MemAvailable $before_kib, $held_kib, $after_kib KiB)"
# 32 MiB = 8192 pages of registered memory, plus its queues.
[ $((held_pins - before_pins)) -ge 8192 ] || fail "the held client's 32 MiB do not show as pinned pages (the check below would mean nothing)"
[ $((after_pins - before_pins)) -lt 512 ] || fail "the killed client's pages are still pinned after tuttid released it"
if grep -q "stays out of use" /tmp/serve.err; then cat /tmp/serve.err; fail "an IOVA range of the killed client could not be released"; fi
# This one first checks that queue memory outside its mapped IOVA ranges is refused.
tutti selftest --client $SOCK --seed 4 --refusals >/tmp/client4.txt 2>/tmp/client4.err \
    || { cat /tmp/client4.txt /tmp/client4.err; fail "a client after the killed one"; }
grep "with live rings kept, on 2 VFIO controllers" /tmp/client4.txt | sed 's/^/tuttid: refusals: /'
grep -q "with live rings kept, on 2 VFIO controllers" /tmp/client4.txt \
    || { cat /tmp/client4.txt; fail "queue memory outside a client's ranges was not refused on both controllers"; }
grep "every byte verified" /tmp/client4.txt | sed 's/^/tuttid: after a killed client: /'
grep -q "every byte verified" /tmp/client4.txt || fail "the client after the killed one did not verify"
# Every client gave its IOVA ranges back cleanly (none leaked its memory to stay safe).
if grep -l "unmap not confirmed" /tmp/client*.err; then fail "a client could not give an IOVA range back"; fi
echo "TUTTID-KILLED-CLIENT-RELEASED"
stop_tuttid /tmp/serve
no_iommu_faults "with tuttid clients on VFIO drives"

step "tuttid on the two-namespace controller $MULTINS serves both plain namespaces"
start_tuttid $SOCK $MULTINS /tmp/serve-multi
tutti selftest --client $SOCK --seed 5 >/tmp/client5.txt 2>/tmp/client5.err \
    || { cat /tmp/client5.txt /tmp/client5.err /tmp/serve-multi.err; fail "a client of tuttid on $MULTINS"; }
grep -q "^selftest client 5: .* on 2 drives .*every byte verified" /tmp/client5.txt \
    || { cat /tmp/client5.txt; fail "tuttid on $MULTINS did not serve both namespaces"; }
sed 's/^/tuttid: two namespaces: /' /tmp/client5.txt
stop_tuttid /tmp/serve-multi

step "tuttid on the one-pair controller $ONEPAIR: the daemon moves a client's layers on its one pair"
start_tuttid $SOCK $ONEPAIR /tmp/serve-one
tutti selftest --client $SOCK --seed 6 >/tmp/client6.txt 2>/tmp/client6.err \
    || { cat /tmp/client6.txt /tmp/client6.err /tmp/serve-one.err; fail "a client of tuttid on the one-pair $ONEPAIR"; }
grep -q "^selftest client 6: .*every byte verified" /tmp/client6.txt \
    || { cat /tmp/client6.txt; fail "the client on $ONEPAIR did not verify its bytes"; }
sed "s/^/tuttid: one pair ($ONEPAIR, proxied): /" /tmp/client6.txt
stop_tuttid /tmp/serve-one
no_iommu_faults "with tuttid on the unusual controllers"
tutti admin unbind $ONEPAIR $MULTINS || fail "admin unbind $ONEPAIR $MULTINS"

step "unmapped IOVA"
echo "TUTTI-NEGATIVE-TEST-BEGIN" >/dev/kmsg
echo "TUTTI-NEGATIVE-TEST-BEGIN"
tutti selftest --drives $NVME1 --no-verify --iommu-negative 2>/tmp/err || { cat /tmp/err; fail "negative test"; }
cat /tmp/err
dmesg | grep -q 'DMAR: \[DMA' || fail "negative test: no IOMMU fault in the kernel log"
step "P2P fallback: device memory the IOMMU does not map for the drive is refused by the probe"
# The drive's mappings of the BAR are removed right after they are made (--kv-device-unreachable):
# its DMA into the target is blocked by the virtual IOMMU, which QEMU's controller completes with
# success status. The probe's byte check must refuse it, and the KV must move through staging.
before_faults=$(dmesg | grep -c 'DMAR: \[DMA')
# shellcheck disable=SC2086
timeout 150 tutti demo --drives $NVME1 --kv-device $IVSHMEM --kv-device-offset 8M --kv-device-unreachable --tokens 256 \
    $P2P_GEOMETRY 2>/tmp/err >/tmp/demo.txt || { cat /tmp/err /tmp/demo.txt; fail "demo with an unreachable KV device"; }
sed 's/^/demo: p2p fallback: /' /tmp/demo.txt
grep -q "^data path: staged (P2P probe of vfio-pci $IVSHMEM BAR2 on $NVME1" /tmp/demo.txt \
    || fail "the unreachable KV device was not refused by the probe"
grep -q "every byte verified" /tmp/demo.txt || fail "the staged fallback did not verify every byte"
# (After the negative test: the kernel rate-limits its DMAR fault lines, and the negative test
# needs its own. The probe's byte check is what refuses the target; the count is for the reader.)
after_faults=$(dmesg | grep -c 'DMAR: \[DMA')
echo "demo: p2p fallback: IOMMU fault lines in the kernel log: $before_faults before the probe, $after_faults after"
echo "P2P-FALLBACK-STAGED"
# Late fault lines of the probe land before the end marker, not after it.
sleep 2
echo "TUTTI-NEGATIVE-TEST-END"


step "tutti admin unbind"
tutti admin unbind $NVME0 $NVME1 || fail "admin unbind"
[ "$(driver_of $NVME0)" = nvme ] && [ "$(driver_of $NVME1)" = nvme ] || fail "not returned to nvme"
tutti admin list
echo "GUEST-PASS"
