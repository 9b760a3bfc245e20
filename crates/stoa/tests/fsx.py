#!/usr/bin/env python3
"""An fsx-style check of file data across two mounts of one cluster.

Usage: fsx.py MOUNT_A MOUNT_B SEED OPS [MAX_MIB]

Makes OPS random operations on four files, each on a mount picked at random: writes at
random offsets and lengths, O_APPEND writes, truncates (by handle and by path),
fallocate (reserving space past the end or not, punching holes, zeroing ranges), reads
(through a long-open handle and through a fresh open), stats, fsync and fdatasync,
writes through a shared mapping (msync or not), copy_file_range between the files,
closes of open handles, and replacement of a file by rename. Every read and stat is
checked against a model of the bytes kept here, so each answer must show every change
that returned before it, on either mount. Prints the last operations on a mismatch and
exits 1; exits 2 when one operation takes longer than 60 s (a hang). Files stay under
MAX_MIB MiB (3 by default, within one 4 MiB chunk; more makes truncates and fallocates
span whole chunks).
"""
import ctypes
import mmap
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import watchdog  # noqa: E402

A, B = sys.argv[1], sys.argv[2]
seed = int(sys.argv[3])
nops = int(sys.argv[4])
rnd = random.Random(seed)
DIR = "fsx%d" % seed
MAXLEN = int(sys.argv[5] if len(sys.argv) > 5 else 3) * 1024 * 1024
NF = 4
os.makedirs(os.path.join(A, DIR), exist_ok=True)
model = {i: bytearray() for i in range(NF)}
fds = {}  # (mount, file, flags) -> descriptor
log = []
libc = ctypes.CDLL(None, use_errno=True)
KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE = 0x01, 0x02, 0x10  # fallocate(2) modes


def path(m, i):
    return os.path.join(m, DIR, "f%d" % i)


for i in range(NF):
    with open(path(A, i), "wb"):
        pass


def fd(m, i, flags=os.O_RDWR):
    k = (m, i, flags)
    if k not in fds:
        fds[k] = os.open(path(m, i), flags)
    return fds[k]


def close_some():
    for k in list(fds):
        if rnd.random() < 0.3:
            os.close(fds.pop(k))


def fail(msg):
    print("FAIL seed=%d op#%d: %s" % (seed, len(log), msg), flush=True)
    for l in log[-25:]:
        print("   ", l)
    sys.exit(1)


def check_read(m, i, off, ln, how="pread"):
    exp = bytes(model[i][off:off + ln])
    if how == "pread":
        got = os.pread(fd(m, i), ln, off)
    else:
        f = os.open(path(m, i), os.O_RDONLY)
        try:
            got = os.pread(f, ln, off)
        finally:
            os.close(f)
    if got != exp:
        first = next((k for k in range(min(len(got), len(exp))) if got[k] != exp[k]), min(len(got), len(exp)))
        fail("%s %s f%d off=%d len=%d: got %d bytes, expected %d, first diff at +%d" % (how, m, i, off, ln, len(got), len(exp), first))


def resize(i, size):
    """Records file i cut to `size` bytes, or grown to it with zeros."""
    cur = model[i]
    if size < len(cur):
        del cur[size:]
    else:
        cur.extend(bytes(size - len(cur)))


def put(i, off, data):
    """Records `data` written at `off` of file i, a hole of zeros before it."""
    resize(i, max(off, len(model[i])))
    model[i][off:off + len(data)] = data


def rnd_range(i):
    """A random range in file i or up to 256 KiB past its end."""
    top = min(MAXLEN, len(model[i]) + 256 * 1024)
    off = rnd.randrange(0, max(1, top))
    ln = rnd.choice([1, 17, 512, 4096, 4096 * 3 + 5, 65536, 200000, rnd.randrange(1, 1 << 20)])
    ln = max(1, min(ln, MAXLEN - off))
    return off, ln


t0 = time.time()
progress = [0]
watchdog.start(seed, progress, log)
for n in range(nops):
    progress[0] = n
    m = rnd.choice((A, B))
    i = rnd.randrange(NF)
    r = rnd.random()
    if r < 0.28:
        off, ln = rnd_range(i)
        data = rnd.randbytes(ln)
        log.append(("write", m, i, off, ln))
        os.pwrite(fd(m, i), data, off)
        put(i, off, data)
    elif r < 0.36:
        ln = rnd.choice([1, 100, 4096, 70000])
        data = rnd.randbytes(ln)
        log.append(("append", m, i, ln))
        f = fd(m, i, os.O_WRONLY | os.O_APPEND)
        os.write(f, data)
        model[i].extend(data)
    elif r < 0.40:
        size = len(model[i])
        ns = rnd.choice([0, size // 2, size + 1000, rnd.randrange(0, MAXLEN), max(0, size - 1)])
        log.append(("truncate", m, i, ns))
        if rnd.random() < 0.5:
            os.ftruncate(fd(m, i), ns)
        else:
            os.truncate(path(m, i), ns)
        resize(i, ns)
    elif r < 0.44:
        off, ln = rnd_range(i)
        mode = rnd.choice([0, KEEP_SIZE, PUNCH_HOLE | KEEP_SIZE, ZERO_RANGE, ZERO_RANGE | KEEP_SIZE])
        log.append(("fallocate", m, i, mode, off, ln))
        if libc.fallocate(fd(m, i), mode, ctypes.c_long(off), ctypes.c_long(ln)) != 0:
            fail("fallocate %s f%d: %s" % (m, i, os.strerror(ctypes.get_errno())))
        cur, end = model[i], off + ln
        if mode & (PUNCH_HOLE | ZERO_RANGE) and off < len(cur):
            zeroed = min(end, len(cur))
            cur[off:zeroed] = bytes(zeroed - off)
        if not mode & KEEP_SIZE:
            resize(i, max(end, len(cur)))
    elif r < 0.62:
        off, ln = rnd_range(i)
        how = rnd.choice(["pread", "open"])
        log.append(("read", m, i, off, ln, how))
        check_read(m, i, off, ln, how)
    elif r < 0.70:
        log.append(("stat", m, i))
        how = rnd.random()
        st = os.fstat(fd(m, i)) if how < 0.5 else os.stat(path(m, i))
        if st.st_size != len(model[i]):
            fail("stat %s f%d size %d expected %d" % (m, i, st.st_size, len(model[i])))
    elif r < 0.76:
        log.append(("fsync", m, i))
        if rnd.random() < 0.5:
            os.fsync(fd(m, i))
        else:
            os.fdatasync(fd(m, i))
    elif r < 0.82:
        # A store through a shared mapping of a range inside the file.
        size = len(model[i])
        if size < 4096:
            continue
        off = rnd.randrange(0, size // 4096) * 4096
        ln = min(size - off, rnd.choice([4096, 8192, 65536]))
        data = rnd.randbytes(min(ln, 3000))
        at = rnd.randrange(0, ln - len(data) + 1)
        log.append(("mmapwrite", m, i, off + at, len(data)))
        f = fd(m, i)
        mm = mmap.mmap(f, ln, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
        mm[at:at + len(data)] = data
        if rnd.random() < 0.5:
            mm.flush()
        mm.close()
        model[i][off + at:off + at + len(data)] = data
        if rnd.random() < 0.5:
            os.fsync(f)
    elif r < 0.87:
        j = rnd.randrange(NF)
        if j == i:
            continue
        size = len(model[i])
        if size == 0:
            continue
        soff = rnd.randrange(0, size)
        ln = min(size - soff, rnd.randrange(1, 300000))
        doff = rnd.randrange(0, len(model[j]) + 4096)
        log.append(("copy_file_range", m, i, soff, j, doff, ln))
        # As cp does: the kernel clamps a copy to the size it last learnt (caps.md,
        # known limits).
        os.fstat(fd(m, i))
        os.fstat(fd(m, j))
        done = 0
        while done < ln:
            k = os.copy_file_range(fd(m, i), fd(m, j), ln - done, soff + done, doff + done)
            if k == 0:
                break
            done += k
        put(j, doff, bytes(model[i][soff:soff + done]))
    elif r < 0.92:
        log.append(("close", m))
        close_some()
    elif r < 0.96:
        # A new file written whole, renamed over file i.
        tmp = os.path.join(m, DIR, "tmp")
        data = rnd.randbytes(rnd.randrange(0, 100000))
        log.append(("replace", m, i, len(data)))
        with open(tmp, "wb") as f:
            f.write(data)
        for k in [k for k in fds if k[1] == i]:
            os.close(fds.pop(k))
        os.rename(tmp, path(m, i))
        model[i] = bytearray(data)
    else:
        # The whole file, through a fresh open.
        log.append(("fullcheck", m, i))
        check_read(m, i, 0, MAXLEN + 1, "open")


for k in list(fds):
    os.close(fds.pop(k))


for i in range(NF):
    for m in (A, B):
        check_read(m, i, 0, MAXLEN + 1, "open")


print("ok seed=%d ops=%d in %.1fs" % (seed, nops, time.time() - t0))
