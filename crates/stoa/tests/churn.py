#!/usr/bin/env python3
"""Two mounts churning the same five names of one directory as fast as they can.

    churn.py MOUNT_A MOUNT_B SEED SECONDS

Two processes on each mount create (open O_CREAT, write a byte, close), rename, link,
unlink and stat random names among five in MOUNT/churn-SEED for SECONDS. ENOENT and
EEXIST are what a local disk answers such races with; every other error is counted and
printed by operation. A process still running 60 s after its time is reported hung,
with the system call it is blocked in, and the run fails; so does any error but ESTALE,
which the rare races of flows/caps.md invariant 27 still return (see its known limits).
"""

import collections
import errno
import multiprocessing
import os
import random
import sys
import time

NAMES = [f"n{i}" for i in range(5)]


def churn(root, seed, secs, out):
    rnd = random.Random(seed)
    ops, errors = 0, collections.Counter()
    end = time.monotonic() + secs
    while time.monotonic() < end:
        op = rnd.choice(["create", "rename", "link", "unlink", "stat"])
        a, b = (os.path.join(root, n) for n in rnd.sample(NAMES, 2))
        ops += 1
        try:
            if op == "create":
                fd = os.open(a, os.O_CREAT | os.O_WRONLY, 0o644)
                os.write(fd, b"x")
                os.close(fd)
            elif op == "rename":
                os.rename(a, b)
            elif op == "link":
                os.link(a, b)
            elif op == "unlink":
                os.unlink(a)
            else:
                os.stat(a)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EEXIST):
                errors[(op, errno.errorcode.get(e.errno, str(e.errno)))] += 1
    out.put((ops, dict(errors)))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    mounts, seed, secs = sys.argv[1:3], int(sys.argv[3]), float(sys.argv[4])
    os.makedirs(os.path.join(mounts[0], f"churn-{seed}"), exist_ok=True)
    out = multiprocessing.Queue()
    procs = []
    for i, mount in enumerate(mounts * 2):
        root = os.path.join(mount, f"churn-{seed}")
        p = multiprocessing.Process(target=churn, args=(root, seed * 10 + i, secs, out))
        p.start()
        procs.append(p)
    deadline = time.monotonic() + secs + 60
    hung = []
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            try:
                with open(f"/proc/{p.pid}/syscall") as f:
                    call = f.read().split()[0]
            except OSError:
                call = "?"
            hung.append(f"pid {p.pid} (system call {call})")
    total, errors = 0, collections.Counter()
    for _ in range(len(procs) - len(hung)):
        ops, errs = out.get()
        total += ops
        errors.update(errs)
    print(f"{total} operations in {secs:g} s on two mounts; errors: {dict(errors) or 'none'}")
    for h in hung:
        print(f"HUNG: {h}")
    for p in procs:
        if p.is_alive():
            p.kill()
    unexpected = [k for k in errors if k[1] != "ESTALE"]
    sys.exit(1 if hung or unexpected else 0)


if __name__ == "__main__":
    main()
