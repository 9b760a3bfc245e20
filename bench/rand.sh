#!/usr/bin/env bash
# 4 KiB random I/O through the mount of a local 3+3 `stoa dev` cluster (replica 3), with
# fio: one thread at queue depth 1 (buffered and O_DIRECT), O_DIRECT at QD16, and the job
# DRBD + OCFS2 users publish (libaio, O_DIRECT, QD64, 75% reads). Prints IOPS per job and
# the peak RSS (VmHWM) of each chunk server over the whole run.
#
#   bench/rand.sh [FILE_MIB] [RUNTIME_S]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_apt fio
file_mib=${1:-64}
runtime=${2:-10}
cargo build --release --quiet --bin stoa

tmp=$(mktemp -d /tmp/stoa-rand.XXXXXX)
on_exit "rm -rf '$tmp'"
stoa_up "$tmp/cluster" "$tmp/mnt" 3 3

# fio_iops FIELD ARGS...: IOPS of the read side, the write side, or both.
fio_iops() {
    local field=$1
    shift
    fio --name=rand --directory="$tmp/mnt" --filename=rand.bin --size="${file_mib}M" --bs=4k \
        --runtime="$runtime" --time_based --ramp_time=1 --output-format=json \
        --output="$tmp/fio.json" "$@" >"$tmp/fio.err" 2>&1 || { cat "$tmp/fio.err" >&2; return 1; }
    python3 - "$tmp/fio.json" "$field" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"]
side = {"r": ["read"], "w": ["write"], "rw": ["read", "write"]}[sys.argv[2]]
print(f'{sum(x[s]["iops"] for x in j for s in side):.0f}')
PY
}

# The file exists and is fully written before any job, so reads never hit holes.
dd if=/dev/urandom of="$tmp/mnt/rand.bin" bs=1M count="$file_mib" conv=fsync status=none

printf '%-52s %10s\n' "4k random, ${file_mib} MiB file, ${runtime} s" IOPS
job() {
    local what=$1
    shift
    printf '%-52s %10s\n' "$what" "$(fio_iops "$@")"
}
job "randwrite QD1 buffered (psync)" w --rw=randwrite --ioengine=psync
job "randwrite QD1 buffered + fsync at end" w --rw=randwrite --ioengine=psync --end_fsync=1
job "randwrite QD1 O_DIRECT (libaio)" w --rw=randwrite --ioengine=libaio --direct=1 --iodepth=1
job "randwrite QD1 O_DSYNC (psync)" w --rw=randwrite --ioengine=psync --sync=dsync
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
drop_caches
job "randread QD1 buffered (psync)" r --rw=randread --ioengine=psync
job "randread QD1 O_DIRECT (libaio)" r --rw=randread --ioengine=libaio --direct=1 --iodepth=1
job "randread QD16 O_DIRECT (libaio)" r --rw=randread --ioengine=libaio --direct=1 --iodepth=16
job "DRBD+OCFS2 randrw 75% read QD64 O_DIRECT: reads" r --ioengine=libaio --direct=1 \
    --iodepth=64 --readwrite=randrw --rwmixread=75
echo "  (same job, reads + writes: $(python3 -c "import json; j=json.load(open('$tmp/fio.json'))['jobs']; print(f\"{sum(x['read']['iops']+x['write']['iops'] for x in j):.0f}\")") IOPS)"

for pid in $(pgrep -P "$STOA_DEV_PID" -f 'stoa chunk' || true); do
    echo "chunk server pid $pid peak RSS: $(awk '/VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$pid/status")"
done
