#!/usr/bin/env bash
# Stoa against its peers on this machine, in one run (issue 7): a Stoa cluster (3 meta,
# 3 chunk, replica 3), a GlusterFS replica-3 volume, a MooseFS cluster with goal 3, a
# CephFS with 3 OSDs and pools of size 3 (bricks, chunk servers and OSDs on loopback,
# FUSE clients), and three ceilings: a local directory, a bindfs FUSE passthrough of
# one, and stoa-memfs, a FUSE filesystem in memory served like Stoa's mount (what FUSE
# itself allows here). The same workloads on each: fio for data (sequential 1 MiB write with fsync and
# cold read, 4 KiB random read and write at iodepth 1 and 16, the DRBD+OCFS2 users'
# randrw job), `stoa bench` for metadata, small files, the metadata-study table and fcntl
# locks as a database takes them, and
# 2 concurrent clients (two mounts of the same system).
#
#   bench/peers.sh [--quick] [--seq-mib N] [--rand-mib N] [--runtime S] [--reps N]
#                  [--files N] [--dirs N] [--small N] [--study-ops N] [--lock-ops N]
#                  [--systems a,b,...]
#
# Each figure is the median of --reps runs, recorded with the 1-minute load average.
# Writes bench/results/peers.csv and peers.png and prints each system's figure and
# Stoa's ratio to the best peer (GlusterFS, MooseFS, CephFS; the ceilings are not peers).
# Everything it starts is stopped, unmounted and deleted at exit, even on failure.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

seq_mib=1024 rand_mib=256 runtime=10 reps=3 files=10000 dirs=1000 small=5000 study=2000 locks=2000
systems=stoa,gluster,moosefs,ceph,local,bindfs,memfs
while [ $# -gt 0 ]; do
    case $1 in
        --quick) seq_mib=64 rand_mib=32 runtime=3 reps=1 files=100 dirs=20 small=100 study=50 locks=100; shift ;;
        --seq-mib) seq_mib=$2; shift 2 ;;
        --rand-mib) rand_mib=$2; shift 2 ;;
        --runtime) runtime=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --files) files=$2; shift 2 ;;
        --dirs) dirs=$2; shift 2 ;;
        --small) small=$2; shift 2 ;;
        --study-ops) study=$2; shift 2 ;;
        --lock-ops) locks=$2; shift 2 ;;
        --systems) systems=$2; shift 2 ;;
        *) sed -n '2,20p' "$0" >&2; exit 2 ;;
    esac
done
need_apt fio python3-matplotlib bindfs glusterfs-server glusterfs-client \
    moosefs-master moosefs-chunkserver moosefs-client moosefs-cli \
    ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common
bench_setup peers
# Written as it goes, outside the temporary directory, so a failed run keeps its figures.
csv=$out/peers.csv.partial
echo "system,key,label,unit,median,reps,values,loadavg,notes" >"$csv"
echo "bench: sizes: seq ${seq_mib} MiB, random ${rand_mib} MiB x ${runtime} s, ${reps} reps," \
    "metadata ${files} files / ${dirs} dirs, ${small} small files, study ${study} ops, ${locks} lock pairs" >&2

# ---- systems: each sets up mounts $tmp/SYS/a and $tmp/SYS/b (a second client) ----

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

up_stoa() {
    local d=$tmp/stoa
    stoa_up "$d/cluster" "$d/a" 3 3
    mkdir -p "$d/b"
    "$STOA" mount --dir "$d/cluster" "$d/b" >"$d/mount-b.log" 2>&1 &
    on_exit "stop_pid $!; fusermount3 -uz '$d/b'"
    wait_mount "$d/b" 60
}

up_gluster() {
    local d=$tmp/gluster vol=stoabench$$
    mkdir -p "$d/b1" "$d/b2" "$d/b3" "$d/a" "$d/b"
    if [ -e /var/run/glusterd.pid ] && kill -0 "$(cat /var/run/glusterd.pid)" 2>/dev/null; then
        echo "bench: a glusterd is already running; not starting another" >&2; return 1
    fi
    local host
    host=$(host_addr)
    glusterd -p "$d/glusterd.pid"
    on_exit "kill \$(cat '$d/glusterd.pid')"
    for _ in $(seq 100); do gluster --mode=script pool list >/dev/null 2>&1 && break; sleep 0.2; done
    gluster --mode=script volume create "$vol" replica 3 \
        "$host:$d/b1" "$host:$d/b2" "$host:$d/b3" force >/dev/null
    on_exit "gluster --mode=script volume delete $vol"
    on_exit "for f in /var/run/gluster/vols/$vol/*.pid; do kill \$(cat \$f); done"
    gluster --mode=script volume start "$vol" >/dev/null
    on_exit "gluster --mode=script volume stop $vol force"
    mount -t glusterfs "$host:/$vol" "$d/a"
    on_exit "umount -l '$d/a'"
    mount -t glusterfs "$host:/$vol" "$d/b"
    on_exit "umount -l '$d/b'"
}

# This host's own address, routed over the loopback interface: GlusterFS and MooseFS
# refuse 127.0.0.1 for their servers, and no traffic leaves the machine this way either.
host_addr() {
    local host
    host=$(hostname -I | awk '{print $1}')
    ip route get "$host" | grep -q ' dev lo ' || { echo "bench: $host is not routed over lo" >&2; return 1; }
    echo "$host"
}

# MooseFS: a master and 3 chunk servers on loopback, each with its own config and port.
up_moosefs() {
    local d=$tmp/moosefs i cl cs ml host
    host=$(host_addr)
    mkdir -p "$d/master" "$d/a" "$d/b"
    ml=$(free_port) cs=$(free_port) cl=$(free_port)
    cp /var/lib/mfs/metadata.mfs.empty "$d/master/metadata.mfs"
    echo "$host / rw,alldirs,maproot=0" >"$d/exports.cfg"
    cat >"$d/master.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $d/master
EXPORTS_FILENAME = $d/exports.cfg
MATOML_LISTEN_HOST = $host
MATOML_LISTEN_PORT = $ml
MATOCS_LISTEN_HOST = $host
MATOCS_LISTEN_PORT = $cs
MATOCL_LISTEN_HOST = $host
MATOCL_LISTEN_PORT = $cl
CFG
    mfsmaster -c "$d/master.cfg" start >"$d/master.log" 2>&1
    on_exit "mfsmaster -c '$d/master.cfg' stop"
    for i in 1 2 3; do
        mkdir -p "$d/cs$i/data" "$d/cs$i/hdd"
        echo "$d/cs$i/hdd" >"$d/cs$i/hdd.cfg"
        cat >"$d/cs$i/cs.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $d/cs$i/data
HDD_CONF_FILENAME = $d/cs$i/hdd.cfg
BIND_HOST = $host
MASTER_HOST = $host
MASTER_PORT = $cs
CSSERV_LISTEN_HOST = $host
CSSERV_LISTEN_PORT = $(free_port)
CFG
        mfschunkserver -c "$d/cs$i/cs.cfg" start >"$d/cs$i.log" 2>&1
        on_exit "mfschunkserver -c '$d/cs$i/cs.cfg' stop"
    done
    for m in a b; do
        mfsmount "$d/$m" -H "$host" -P "$cl" >"$d/mount-$m.log" 2>&1
        on_exit "umount -l '$d/$m'"
    done
    mfssetgoal -r 3 "$d/a" >/dev/null
    # Writes need the chunk servers registered with the master.
    for _ in $(seq 100); do
        [ "$(mfscli -H "$host" -P "$cl" -SCS 2>/dev/null | grep -c "$host")" -ge 3 ] && break
        sleep 0.3
    done
}

# CephFS from Debian's packages, without cephadm or systemd: one monitor, a manager (it
# keeps the PG states that `ceph -s` reports), three BlueStore OSDs on sparse files, one
# MDS, metadata and data pools of size 3, mounted twice with ceph-fuse. cephx is off, so
# there are no keyrings to make and hand out. Every daemon runs in the foreground under
# this shell with all its paths under $tmp/ceph (nothing in /var/lib/ceph, /var/run/ceph
# or /var/log/ceph), and is stopped by its pid.
ceph_pids=() ceph_names=() ceph_fuse_a=
cephc() { timeout 60 ceph -c "$tmp/ceph/ceph.conf" "$@"; }
# ceph_daemon NAME CMD...: CMD in the background, its output in log/NAME.out, in a
# session of its own: a Ctrl-C would otherwise stop every daemon at once, under ceph-fuse
# mounts busy with fio, which then hang until killed; it is left to the teardown, which
# goes in order. (setsid execs CMD in place: this shell's children lead no process group.)
ceph_daemon() {
    local name=$1
    shift
    setsid "$@" >"$tmp/ceph/log/$name.out" 2>&1 &
    ceph_pids+=($!) ceph_names+=("$name")
}
# A set-up step, quietly (ceph says "pool created" and the like on stderr), loudly if it fails.
ceph_step() {
    "$@" >>"$tmp/ceph/log/setup.log" 2>&1 || { tail -5 "$tmp/ceph/log/setup.log" >&2; return 1; }
}
# The clients first, then the MDS, then the rest, each group at once (one stop_pid after
# another could take 30 s each) and waiting for these stops only: a bare `wait` would also
# wait for the other systems' daemons. The MDS is killed: on SIGTERM it shuts its
# messenger down before its journal, and hangs on the write that then fails.
ceph_stop() {
    local group i stops
    for group in 'fuse-*' mds '*'; do
        stops=()
        for i in "${!ceph_pids[@]}"; do
            # shellcheck disable=SC2254 # the group is a pattern
            case ${ceph_names[$i]} in $group) ;; *) continue ;; esac
            if [ "${ceph_names[$i]}" = mds ]; then
                kill -KILL "${ceph_pids[$i]}" 2>/dev/null || true
            else
                stop_pid "${ceph_pids[$i]}" &
                stops+=($!)
            fi
        done
        [ ${#stops[@]} -eq 0 ] || wait "${stops[@]}"
    done
}
# Ready: 3 OSDs up, the MDS active, and every PG of every pool active+clean (the pools
# from the monitor's OSD map, as the manager's PG map may not have them all yet). Through
# files: a Ctrl-C in a "$(...)" given to a command with a here-document makes bash 5.2
# fail on its INT trap ("unexpected EOF while looking for matching `)'").
ceph_ready() {
    cephc -s -f json >"$tmp/ceph/status.json" 2>/dev/null || return 1
    cephc osd dump -f json >"$tmp/ceph/osdmap.json" 2>/dev/null || return 1
    python3 - "$tmp/ceph/status.json" "$tmp/ceph/osdmap.json" <<'PY'
import json, sys
try:
    s, osd = (json.load(open(f)) for f in sys.argv[1:])
    pgs = sum(p["pg_num"] for p in osd["pools"])
    clean = sum(x["count"] for x in s["pgmap"]["pgs_by_state"] if x["state_name"] == "active+clean")
    mds = [r for r in s["fsmap"].get("by_rank", []) if r["status"] == "up:active"]
    ok = s["osdmap"]["num_up_osds"] == 3 and pgs > 0 and s["pgmap"]["num_pgs"] == pgs == clean and mds
except (ValueError, KeyError):
    ok = False
sys.exit(0 if ok else 1)
PY
}

up_ceph() {
    local d=$tmp/ceph conf=$tmp/ceph/ceph.conf host mon fsid i uuid id m end
    host=$(host_addr)
    mon=$(free_port)
    fsid=$(cat /proc/sys/kernel/random/uuid)
    mkdir -p "$d/run" "$d/log" "$d/crash" "$d/mon" "$d/mgr/a" "$d/mds/a" "$d/a" "$d/b"
    # msgr2 only, on this host's address; the daemons' ports in 6800-7099, below the 7100
    # and up of stoa-fault's clusters. The monitor would warn under 30% free space on the
    # shared disk, and about insecure global_id reclaim, which means nothing without cephx.
    cat >"$conf" <<CFG
[global]
fsid = $fsid
mon host = [v2:$host:$mon]
public addr = $host
ms bind msgr1 = false
ms bind ipv6 = false
ms bind port min = 6800
ms bind port max = 7099
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 5
run dir = $d/run
admin socket = $d/run/\$name.asok
pid file = $d/run/\$name.pid
log file = $d/log/\$name.log
mon cluster log file = $d/log/cluster.log
crash dir = $d/crash
mon data = $d/mon/\$id
mgr data = $d/mgr/\$id
mds data = $d/mds/\$id
osd data = $d/osd\$id
osd crush chooseleaf type = 0
osd pool default size = 3
osd pool default min size = 2
osd pool default pg autoscale mode = off
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 21474836480
osd memory target = 1073741824
[client]
admin socket = $d/run/\$name.\$pid.asok
log file = $d/log/\$name.\$pid.log
CFG
    on_exit ceph_stop
    ceph_step monmaptool --create --fsid "$fsid" --addv a "[v2:$host:$mon]" "$d/monmap"
    ceph_step ceph-mon -c "$conf" -i a --mkfs --monmap "$d/monmap"
    ceph_daemon mon ceph-mon -c "$conf" -i a -f
    ceph_daemon mgr ceph-mgr -c "$conf" -i a -f
    for i in 0 1 2; do
        uuid=$(cat /proc/sys/kernel/random/uuid)
        id=$(cephc osd new "$uuid")
        mkdir -p "$d/osd$id"
        ceph_step ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid"
        ceph_daemon "osd$id" ceph-osd -c "$conf" -i "$id" -f
    done
    ceph_daemon mds ceph-mds -c "$conf" -i a -f
    ceph_step cephc osd pool create cephfs_metadata 16 16 replicated
    ceph_step cephc osd pool create cephfs_data 64 64 replicated
    ceph_step cephc fs new cephfs cephfs_metadata cephfs_data
    end=$((SECONDS + 300))
    until ceph_ready; do
        for i in "${!ceph_pids[@]}"; do
            kill -0 "${ceph_pids[$i]}" 2>/dev/null && continue
            echo "bench: ceph ${ceph_names[$i]} exited during set-up:" >&2
            tail -5 "$d/log/${ceph_names[$i]}.out" >&2
            return 1
        done
        if [ "$SECONDS" -ge "$end" ]; then
            cephc -s >&2 || true
            echo "bench: CephFS not ready (3 OSDs up, MDS active, all PGs active+clean) after 300 s" >&2
            return 1
        fi
        sleep 2
    done
    for m in a b; do
        ceph_daemon "fuse-$m" ceph-fuse -c "$conf" -f "$d/$m"
        [ "$m" = b ] || ceph_fuse_a=${ceph_pids[-1]}
        on_exit "umount -l '$d/$m'"
        wait_mount "$d/$m" 60 || { tail -5 "$d/log/fuse-$m.out" >&2; return 1; }
        timeout 60 touch "$d/$m/.probe" || { echo "bench: CephFS mount $m is not writable" >&2; return 1; }
        rm "$d/$m/.probe"
    done
}

# ceph-fuse keeps file data in its own cache (client_oc, 200 MiB), out of drop_caches'
# reach: the cold read would come from there, not from the OSDs. Mount a afresh.
cold_ceph() {
    local d=$tmp/ceph
    umount "$d/a"
    stop_pid "$ceph_fuse_a"
    ceph_daemon fuse-a ceph-fuse -c "$d/ceph.conf" -f "$d/a"
    ceph_fuse_a=${ceph_pids[-1]}
    wait_mount "$d/a" 60 || { tail -5 "$d/log/fuse-a.out" >&2; return 1; }
}

# Both "clients" of the local directory are the same directory (fio refuses a symlink).
up_local() { mkdir -p "$tmp/local/a"; ln -s "$tmp/local/a" "$tmp/local/b"; }

up_bindfs() {
    local d=$tmp/bindfs
    mkdir -p "$d/src" "$d/a" "$d/b"
    for m in a b; do
        bindfs "$d/src" "$d/$m"
        on_exit "fusermount -uz '$d/$m'"
    done
}

# One process serves both mounts from one tree in memory: two clients of one filesystem.
up_memfs() {
    local d=$tmp/memfs
    cargo build --release --quiet --bin stoa-memfs
    mkdir -p "$d/a" "$d/b"
    target/release/stoa-memfs "$d/a" "$d/b" >"$d/memfs.log" 2>&1 &
    on_exit "stop_pid $!; fusermount3 -uz '$d/a'; fusermount3 -uz '$d/b'"
    wait_mount "$d/a" 30 && wait_mount "$d/b" 30 || { cat "$d/memfs.log" >&2; return 1; }
}

# ---- workloads ----

# record SYS KEY LABEL UNIT NOTES VALUE... : one row of the CSV (median of the values).
record() {
    local sys=$1 key=$2 label=$3 unit=$4 notes=$5
    shift 5
    python3 - "$sys" "$key" "$label" "$unit" "$notes" "$(cut -d' ' -f1 /proc/loadavg)" "$@" >>"$csv" <<'PY'
import csv, statistics, sys
sysname, key, label, unit, notes, load, *vals = sys.argv[1:]
v = [float(x) for x in vals]
csv.writer(sys.stdout).writerow([sysname, key, label, unit, f"{statistics.median(v):.3f}", len(v),
                                 " ".join(f"{x:.3f}" for x in v), load, notes])
PY
}

# drop_caches SYS: the page cache, and a FUSE client's own cache that this does not
# reach, where the system has one (cold_SYS).
drop_caches() {
    if declare -F "cold_$1" >/dev/null; then "cold_$1"; fi
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# fio_figure JSON FIELD: MiB/s of the write or read side, or IOPS of read/write/both.
fio_figure() {
    python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"]
field = sys.argv[2]
if field == "wbw": print(sum(x["write"]["bw_bytes"] for x in j) / 2**20)
elif field == "rbw": print(sum(x["read"]["bw_bytes"] for x in j) / 2**20)
elif field == "riops": print(sum(x["read"]["iops"] for x in j))
elif field == "wiops": print(sum(x["write"]["iops"] for x in j))
else: print(sum(x["read"]["iops"] + x["write"]["iops"] for x in j))
PY
}

# fio_run DIR NAME ARGS...: runs fio, with O_DIRECT if the filesystem takes it, else
# buffered (FIO_NOTE says which). The JSON lands in $tmp/fio.json.
fio_run() {
    local dir=$1 name=$2
    shift 2
    FIO_NOTE=""
    if ! fio --name="$name" --directory="$dir" --output-format=json --output="$tmp/fio.json" "$@" >"$tmp/fio.err" 2>&1; then
        if printf '%s\n' "$@" | grep -q -- '--direct=1'; then
            FIO_NOTE="O_DIRECT refused: buffered"
            local args=("${@/--direct=1/--direct=0}")
            fio --name="$name" --directory="$dir" --output-format=json --output="$tmp/fio.json" "${args[@]}" >"$tmp/fio.err" 2>&1 ||
                { cat "$tmp/fio.err" >&2; return 1; }
        else
            cat "$tmp/fio.err" >&2; return 1
        fi
    fi
}

data_workloads() {
    local sys=$1 dir=$tmp/$1/a r w rd v
    local ws=() rs=()
    for r in $(seq "$reps"); do
        echo "bench: $sys: seq write/read ${seq_mib} MiB ($r/$reps)" >&2
        warm_memory "$seq_mib"
        fio_run "$dir" seq --filename=seq.bin --rw=write --bs=1M --size="${seq_mib}M" --end_fsync=1 --ioengine=psync
        ws+=("$(fio_figure "$tmp/fio.json" wbw)")
        drop_caches "$sys"
        warm_memory "$seq_mib"
        fio_run "$dir" seq --filename=seq.bin --rw=read --bs=1M --size="${seq_mib}M" --ioengine=psync
        rs+=("$(fio_figure "$tmp/fio.json" rbw)")
        rm -f "$dir/seq.bin"
    done
    record "$sys" seq.write "fio seq write 1M, ${seq_mib} MiB, fsync at end" MiB/s "" "${ws[@]}"
    record "$sys" seq.read "fio seq read 1M, ${seq_mib} MiB, caches dropped" MiB/s "" "${rs[@]}"
    local common=(--filename=rand.bin --size="${rand_mib}M" --bs=4k --ioengine=libaio --direct=1
        --runtime="$runtime" --time_based --ramp_time=1)
    for job in "randread 1 riops" "randread 16 riops" "randwrite 1 wiops" "randwrite 16 wiops" "randrw 64 iops"; do
        read -r rw qd field <<<"$job"
        v=()
        for r in $(seq "$reps"); do
            echo "bench: $sys: 4k $rw iodepth $qd, ${runtime} s ($r/$reps)" >&2
            if [ "$rw" = randrw ]; then
                fio_run "$dir" rand "${common[@]}" --iodepth=64 --readwrite=randrw --rwmixread=75
            else
                fio_run "$dir" rand "${common[@]}" --rw="$rw" --iodepth="$qd"
            fi
            v+=("$(fio_figure "$tmp/fio.json" "$field")")
        done
        if [ "$rw" = randrw ]; then
            record "$sys" randrw.qd64 "fio DRBD+OCFS2 job: 4k randrw 75% read, QD64 (r+w)" IOPS "$FIO_NOTE" "${v[@]}"
        else
            record "$sys" "$rw.qd$qd" "fio 4k $rw QD$qd" IOPS "$FIO_NOTE" "${v[@]}"
        fi
    done
    rm -f "$dir/rand.bin"
}

# Metadata, small files, the study table and locks with `stoa bench` on mount a.
meta_workloads() {
    local sys=$1
    echo "bench: $sys: stoa bench metadata, small files, study table, locks" >&2
    "$STOA" bench "$tmp/$sys/a" --only meta,small,study,locks --workers 1 --files "$files" \
        --dirs "$dirs" --small-files "$small" --study-ops "$study" --lock-ops "$locks" \
        --reps "$reps" --csv "$tmp/sb.csv" >&2
    python3 - "$sys" "$tmp/sb.csv" >>"$csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[2])):
    csv.writer(sys.stdout).writerow([sys.argv[1], r["key"], r["label"], r["unit"], r["median"], r["reps"],
                                     r["values"], r["loadavg"], ""])
PY
}

# Two clients at once, one per mount: metadata (stoa bench) and the randrw job (fio);
# the figure is the sum of both clients' figures.
two_clients() {
    local sys=$1 m v=()
    echo "bench: $sys: 2 clients, metadata" >&2
    # Wait for these two only: a bare `wait` would also wait for the daemons.
    # In step: each phase starts on both mounts at once (stoa bench --together), so
    # the sum is of the same operation on both, not of whichever phases met.
    local pids=() step="$tmp/2c-step-$sys"
    mkdir -p "$step"
    for m in a b; do
        "$STOA" bench "$tmp/$sys/$m" --only meta --workers 1 --files "$files" --dirs "$dirs" \
            --reps "$reps" --quiet --csv "$tmp/2c-$m.csv" --together "$step" >/dev/null &
        pids+=($!)
    done
    wait "${pids[@]}"
    python3 - "$sys" "$tmp/2c-a.csv" "$tmp/2c-b.csv" >>"$csv" <<'PY'
import csv, sys
a = list(csv.DictReader(open(sys.argv[2])))
b = {r["key"]: r for r in csv.DictReader(open(sys.argv[3]))}
for r in a:
    if r["key"] not in ("create.w1", "stat.w1", "unlink.w1", "mkdir.w1"):
        continue
    total = float(r["median"]) + float(b[r["key"]]["median"])
    name = r["key"].split(".")[0]
    csv.writer(sys.stdout).writerow([sys.argv[1], f"2c.{name}", f"2 clients: {name} ({r['label'].split('(')[1].split(')')[0]} each), sum",
                                     r["unit"], f"{total:.3f}", r["reps"], "", r["loadavg"], "medians of each client summed"])
PY
    for r in $(seq "$reps"); do
        echo "bench: $sys: 2 clients, fio randrw QD16 ($r/$reps)" >&2
        local sum=0
        pids=()
        for m in a b; do
            fio --name=two --directory="$(readlink -f "$tmp/$sys/$m")" --filename="two-$m.bin" --size="${rand_mib}M" --bs=4k \
                --ioengine=libaio --direct=0 --iodepth=16 --readwrite=randrw --rwmixread=75 \
                --runtime="$runtime" --time_based --output-format=json --output="$tmp/two-$m.json" >/dev/null &
            pids+=($!)
        done
        wait "${pids[@]}"
        for m in a b; do sum=$(python3 -c "print($sum + $(fio_figure "$tmp/two-$m.json" iops))"); done
        v+=("$sum")
    done
    rm -f "$tmp/$sys"/a/two-*.bin
    record "$sys" 2c.randrw "2 clients: fio 4k randrw 75% read QD16 each (buffered), sum" IOPS "" "${v[@]}"
}

IFS=, read -r -a syslist <<<"$systems"
for sys in "${syslist[@]}"; do
    say "$sys: setting up"
    "up_$sys"
    say "$sys: data workloads (fio)"
    data_workloads "$sys"
    say "$sys: metadata and small files (stoa bench)"
    meta_workloads "$sys"
    say "$sys: two clients"
    two_clients "$sys"
done

mv "$csv" "$out/peers.csv"
# Debian's python3-matplotlib is for Debian's python, whatever python3 comes first in PATH.
/usr/bin/python3 bench/report.py "$out/peers.csv" "$out/peers.png"
echo "bench: results in $out/peers.csv and $out/peers.png" >&2
