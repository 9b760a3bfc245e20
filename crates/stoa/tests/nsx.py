#!/usr/bin/env python3
"""A check of the namespace across two mounts of one cluster, against a model.

Usage: nsx.py MOUNT_A MOUNT_B SEED OPS

Makes OPS random namespace operations in a small tree (names a..e, three levels deep), each
on a mount picked at random: creates, appends, truncates, mkdir, rmdir, unlink, renames
(plain, RENAME_NOREPLACE and RENAME_EXCHANGE; of files and directories, over files and empty
directories, into their own subtree), hard links, symbolic links, chmod, setting and removing
extended attributes, handles of files held open across an unlink or a rename on the other
mount, and handles of directories held open, through which creates, mkdir, unlink, lstat
and listings are made (the *at calls) wherever the other mount moved or removed them. Each
operation's result (success, or which errno) is checked against a model of the tree, kept
here, that follows Linux's rules; so are lstat, readlink, listdir, getxattr and reads, by
path and through held handles. Every answer must show every change that returned before
it, on either mount. Run on one local directory (the same path twice) it must pass: that
is how the model is checked. Prints the last operations on a mismatch and exits 1; exits 2
when one operation takes longer than 60 s (a hang).
"""
import ctypes
import errno
import os
import random
import stat
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import watchdog  # noqa: E402

A, B = sys.argv[1], sys.argv[2]
seed = int(sys.argv[3])
nops = int(sys.argv[4])
rnd = random.Random(seed)
DIR = "nsx%d" % seed
NAMES = "abcde"
os.makedirs(os.path.join(A, DIR))

# The model: inodes by number; a directory's entries map names to inode numbers.
FILE, DIRECTORY, LINK = "file", "dir", "symlink"
inodes = {0: {"type": DIRECTORY, "mode": 0o755, "entries": {}, "xattrs": {}}}
next_ino = [1]
held = []  # (mount, inode number, descriptor) of files held open
held_dirs = []  # the same, of directories
log = []
NOREPLACE, EXCHANGE = 1, 2  # renameat2(2) flags
libc = ctypes.CDLL(None, use_errno=True)


def renameat2(src, dst, flags):
    if libc.renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src)


class Err(Exception):
    def __init__(self, code):
        self.errno = code


def fail(msg):
    print("FAIL seed=%d op#%d: %s" % (seed, len(log), msg), flush=True)
    for entry in log[-30:]:
        print("   ", entry)
    sys.exit(1)


def new_inode(kind, **kw):
    ino = next_ino[0]
    next_ino[0] += 1
    inodes[ino] = dict(type=kind, xattrs={}, **kw)
    return ino


def walk(parts):
    """The inode of the directory holding the last of `parts`, as Linux walks a path:
    a missing component is ENOENT, a file ENOTDIR, a symbolic link (all dangle) ENOENT."""
    ino = 0
    for name in parts[:-1]:
        child = inodes[ino]["entries"].get(name)
        if child is None:
            raise Err(errno.ENOENT)
        kind = inodes[child]["type"]
        if kind == FILE:
            raise Err(errno.ENOTDIR)
        if kind == LINK:
            raise Err(errno.ENOENT)
        ino = child
    return ino


def lookup(parts):
    """(parent, inode or None) of a path, not following a final symbolic link."""
    parent = walk(parts)
    return parent, inodes[parent]["entries"].get(parts[-1])


def follow(parts):
    """The inode a path names, following a final symbolic link (which dangles)."""
    _, ino = lookup(parts)
    if ino is None or inodes[ino]["type"] == LINK:
        raise Err(errno.ENOENT)
    return ino


def links(ino):
    """A file's link count, a directory's 2 plus its subdirectories, by the model."""
    node = inodes[ino]
    if node["type"] == DIRECTORY:
        return 2 + sum(1 for c in node["entries"].values() if inodes[c]["type"] == DIRECTORY)
    return node["nlink"]


def rnd_path():
    return [rnd.choice(NAMES) for _ in range(rnd.choice((1, 1, 2, 2, 3)))]


def real(m, parts):
    return os.path.join(m, DIR, *parts)


def outcome(fn, error):
    """("ok", what fn returns) or ("err", the errno of its `error`)."""
    try:
        return "ok", fn()
    except error as e:
        return "err", e.errno


def expect(what, model_fn, real_fn):
    """Runs the operation on the model and for real; both must succeed with the same
    value, or fail with the same errno. Returns "ok" or "err"."""
    want, got = outcome(model_fn, Err), outcome(real_fn, OSError)
    if want != got:
        def show(r):
            return errno.errorcode.get(r[1], r[1]) if r[0] == "err" else "%r" % (r[1],)
        fail("%s: got %s, expected %s" % (what, show(got), show(want)))
    return got[0]


def apply(what, model_fn, real_fn):
    """Like expect, but the model's change is made only when the operation succeeds."""
    if expect(what, lambda: model_fn(False), lambda: real_fn() and None) == "ok":
        model_fn(True)


def token():
    return ("%d.%d\n" % (seed, len(log))).encode()


# Operations on the model. Each takes `do`: False checks and returns the errno Linux gives,
# True makes the change (called only after the real operation succeeded).

def m_create(parts, data):
    return lambda do: m_create_at(walk(parts), parts[-1], data)(do)


def m_rewrite(parts, change):
    """A file's bytes become change(its bytes)."""
    def run(do):
        ino = follow(parts)
        if inodes[ino]["type"] == DIRECTORY:
            raise Err(errno.EISDIR)
        if do:
            inodes[ino]["data"] = change(inodes[ino]["data"])
    return run


def m_append(parts, data):
    return m_rewrite(parts, lambda old: old + data)


def m_mkdir(parts):
    return lambda do: m_mkdir_at(walk(parts), parts[-1])(do)


def drop_link(parent, name):
    ino = inodes[parent]["entries"].pop(name)
    if inodes[ino]["type"] == DIRECTORY:
        inodes[ino]["gone"] = True
    else:
        inodes[ino]["nlink"] -= 1


def m_rmdir(parts):
    def run(do):
        parent, ino = lookup(parts)
        if ino is None:
            raise Err(errno.ENOENT)
        if inodes[ino]["type"] != DIRECTORY:
            raise Err(errno.ENOTDIR)
        if inodes[ino]["entries"]:
            raise Err(errno.ENOTEMPTY)
        if do:
            drop_link(parent, parts[-1])
    return run


def m_unlink(parts):
    return lambda do: m_unlink_at(walk(parts), parts[-1])(do)


def m_rename(src, dst, flags=0):
    def run(do):
        sparent, sino = lookup(src)
        dparent = walk(dst)
        if sino is None:
            raise Err(errno.ENOENT)
        dino = inodes[dparent]["entries"].get(dst[-1])
        if flags & NOREPLACE and dino is not None:
            raise Err(errno.EEXIST)
        if flags & EXCHANGE and dino is None:
            raise Err(errno.ENOENT)
        if dst[:len(src)] == src and len(dst) > len(src):
            raise Err(errno.EINVAL)
        if src[:len(dst)] == dst and len(src) > len(dst):
            raise Err(errno.EINVAL if flags & EXCHANGE else errno.ENOTEMPTY)
        if dino == sino:
            return
        if flags & EXCHANGE:
            if do:
                inodes[sparent]["entries"][src[-1]] = dino
                inodes[dparent]["entries"][dst[-1]] = sino
            return
        sdir = inodes[sino]["type"] == DIRECTORY
        if dino is not None:
            ddir = inodes[dino]["type"] == DIRECTORY
            if sdir and not ddir:
                raise Err(errno.ENOTDIR)
            if ddir and not sdir:
                raise Err(errno.EISDIR)
            if ddir and inodes[dino]["entries"]:
                raise Err(errno.ENOTEMPTY)
        if do:
            if dino is not None:
                drop_link(dparent, dst[-1])
            inodes[dparent]["entries"][dst[-1]] = inodes[sparent]["entries"].pop(src[-1])
    return run


def m_truncate(parts, size):
    return m_rewrite(parts, lambda old: old[:size] + b"\0" * (size - len(old[:size])))


def in_held(ino, name):
    """The inode `name` leads to in directory `ino`, reached by a path or through a held
    handle: a directory removed since has no entries, and nothing can be made in it."""
    if inodes[ino].get("gone"):
        raise Err(errno.ENOENT)
    return inodes[ino]["entries"].get(name)


def m_create_at(ino, name, data):
    def run(do):
        if in_held(ino, name) is not None:
            raise Err(errno.EEXIST)
        if do:
            inodes[ino]["entries"][name] = new_inode(FILE, mode=0o644, nlink=1, data=data)
    return run


def m_mkdir_at(ino, name):
    def run(do):
        if in_held(ino, name) is not None:
            raise Err(errno.EEXIST)
        if do:
            mode = 0o755 | (inodes[ino]["mode"] & stat.S_ISGID)
            inodes[ino]["entries"][name] = new_inode(DIRECTORY, mode=mode, entries={})
    return run


def m_unlink_at(ino, name):
    def run(do):
        child = in_held(ino, name)
        if child is None:
            raise Err(errno.ENOENT)
        if inodes[child]["type"] == DIRECTORY:
            raise Err(errno.EISDIR)
        if do:
            drop_link(ino, name)
    return run


def m_link(src, dst):
    def run(do):
        _, sino = lookup(src)
        if sino is None:
            raise Err(errno.ENOENT)
        dparent, dino = lookup(dst)
        if dino is not None:
            raise Err(errno.EEXIST)
        if inodes[sino]["type"] == DIRECTORY:
            raise Err(errno.EPERM)
        if do:
            inodes[dparent]["entries"][dst[-1]] = sino
            inodes[sino]["nlink"] += 1
    return run


def m_symlink(target, parts):
    def run(do):
        parent, ino = lookup(parts)
        if ino is not None:
            raise Err(errno.EEXIST)
        if do:
            inodes[parent]["entries"][parts[-1]] = new_inode(LINK, mode=0o777, nlink=1, target=target)
    return run


def m_chmod(parts, mode):
    def run(do):
        ino = follow(parts)
        if do:
            inodes[ino]["mode"] = mode
    return run


def m_setxattr(parts, key, value):
    def run(do):
        ino = follow(parts)
        if do:
            inodes[ino]["xattrs"][key] = value
    return run


def m_removexattr(parts, key):
    def run(do):
        ino = follow(parts)
        if key not in inodes[ino]["xattrs"]:
            raise Err(errno.ENODATA)
        if do:
            del inodes[ino]["xattrs"][key]
    return run


# Checks of what a mount shows.

def check_lstat(m, parts):
    def want():
        _, ino = lookup(parts)
        if ino is None:
            raise Err(errno.ENOENT)
        node = inodes[ino]
        size = len(node["data"]) if node["type"] == FILE else len(node["target"]) if node["type"] == LINK else None
        return node["type"], node["mode"], links(ino), size

    def got():
        st = os.lstat(real(m, parts))
        kind = FILE if stat.S_ISREG(st.st_mode) else DIRECTORY if stat.S_ISDIR(st.st_mode) else LINK
        return kind, stat.S_IMODE(st.st_mode), st.st_nlink, None if kind == DIRECTORY else st.st_size

    expect("lstat %s %s" % (m, "/".join(parts)), want, got)


def check_read(m, parts):
    def want():
        ino = follow(parts)
        if inodes[ino]["type"] == DIRECTORY:
            raise Err(errno.EISDIR)
        return inodes[ino]["data"]

    def got():
        fd = os.open(real(m, parts), os.O_RDONLY)
        try:
            return os.pread(fd, 1 << 20, 0)
        finally:
            os.close(fd)

    expect("read %s %s" % (m, "/".join(parts)), want, got)


def check_listdir(m, parts):
    def want():
        ino = follow(parts)
        if inodes[ino]["type"] != DIRECTORY:
            raise Err(errno.ENOTDIR)
        return sorted(inodes[ino]["entries"])

    expect("listdir %s %s" % (m, "/".join(parts)), want, lambda: sorted(os.listdir(real(m, parts))))


def check_readlink(m, parts):
    def want():
        _, ino = lookup(parts)
        if ino is None:
            raise Err(errno.ENOENT)
        if inodes[ino]["type"] != LINK:
            raise Err(errno.EINVAL)
        return inodes[ino]["target"]

    expect("readlink %s %s" % (m, "/".join(parts)), want, lambda: os.readlink(real(m, parts)))


def check_xattrs(m, parts):
    def got():
        p = real(m, parts)
        return {k: os.getxattr(p, k) for k in os.listxattr(p) if k.startswith("user.")}

    expect("xattrs %s %s" % (m, "/".join(parts)), lambda: dict(inodes[follow(parts)]["xattrs"]), got)


def check_held():
    """A handle held open reads its inode's bytes and link count, even once unlinked or
    renamed on the other mount."""
    m, ino, fd = rnd.choice(held)
    node = inodes[ino]
    log.append(("held-read", m, ino))
    data = os.pread(fd, 1 << 20, 0)
    if data != node["data"]:
        fail("held %s inode %d: read %r, expected %r" % (m, ino, data, node["data"]))
    st = os.fstat(fd)
    if st.st_nlink != node["nlink"] or st.st_size != len(node["data"]):
        fail("held %s inode %d: fstat nlink %d size %d, expected %d %d"
             % (m, ino, st.st_nlink, st.st_size, node["nlink"], len(node["data"])))


progress = [0]


def write_to(path, flags, data, dir_fd=None):
    """Opens `path` with `flags` (mode 0644 if it creates), writes `data` and closes."""
    fd = os.open(path, flags, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def op_create(n, m, p, s):
    data = token()
    log.append(("create", m, s))
    apply("create %s %s" % (m, s), m_create(p, data),
          lambda: write_to(real(m, p), os.O_CREAT | os.O_EXCL | os.O_WRONLY, data))


def op_append(n, m, p, s):
    data = token()
    log.append(("append", m, s))
    apply("append %s %s" % (m, s), m_append(p, data),
          lambda: write_to(real(m, p), os.O_WRONLY | os.O_APPEND, data))


def op_truncate(n, m, p, s):
    size = rnd.randrange(0, 40)
    log.append(("truncate", m, s, size))
    apply("truncate %s %s" % (m, s), m_truncate(p, size), lambda: os.truncate(real(m, p), size))


def op_mkdir(n, m, p, s):
    log.append(("mkdir", m, s))
    apply("mkdir %s %s" % (m, s), m_mkdir(p), lambda: os.mkdir(real(m, p)))


def op_rmdir(n, m, p, s):
    log.append(("rmdir", m, s))
    apply("rmdir %s %s" % (m, s), m_rmdir(p), lambda: os.rmdir(real(m, p)))


def op_unlink(n, m, p, s):
    log.append(("unlink", m, s))
    apply("unlink %s %s" % (m, s), m_unlink(p), lambda: os.unlink(real(m, p)))


def op_rename(n, m, p, s):
    q = rnd_path()
    flags = rnd.choice((0, 0, 0, NOREPLACE, EXCHANGE))
    log.append(("rename", m, s, "/".join(q), flags))
    apply("rename(%d) %s %s %s" % (flags, m, s, "/".join(q)), m_rename(p, q, flags),
          lambda: renameat2(real(m, p), real(m, q), flags))


def op_link(n, m, p, s):
    q = rnd_path()
    log.append(("link", m, s, "/".join(q)))
    apply("link %s %s %s" % (m, s, "/".join(q)), m_link(p, q),
          lambda: os.link(real(m, p), real(m, q), follow_symlinks=False))


def op_symlink(n, m, p, s):
    target = "nowhere/%d" % n
    log.append(("symlink", m, target, s))
    apply("symlink %s %s" % (m, s), m_symlink(target, p), lambda: os.symlink(target, real(m, p)))


def op_chmod(n, m, p, s):
    mode = rnd.choice((0o600, 0o644, 0o755, 0o700, 0o4755, 0o2775, 0o1777, 0o0))
    log.append(("chmod", m, s, oct(mode)))
    apply("chmod %s %s" % (m, s), m_chmod(p, mode), lambda: os.chmod(real(m, p), mode))


def op_setxattr(n, m, p, s):
    key = "user.k%d" % rnd.randrange(3)
    value = token()
    log.append(("setxattr", m, s, key))
    apply("setxattr %s %s" % (m, s), m_setxattr(p, key, value),
          lambda: os.setxattr(real(m, p), key, value))


def op_removexattr(n, m, p, s):
    key = "user.k%d" % rnd.randrange(3)
    log.append(("removexattr", m, s, key))
    apply("removexattr %s %s" % (m, s), m_removexattr(p, key),
          lambda: os.removexattr(real(m, p), key))


def op_hold(n, m, p, s):
    """Holds a handle of a file or directory open, to use it after the other mount moves
    or removes it."""
    try:
        ino = follow(p)
    except Err:
        return
    kind = inodes[ino]["type"]
    into = held if kind == FILE else held_dirs
    if len(into) >= 8:
        return
    log.append(("hold", m, s, ino))
    into.append((m, ino, os.open(real(m, p), os.O_RDWR if kind == FILE else os.O_RDONLY)))


def op_release(n, m, p, s):
    into = rnd.choice((held, held_dirs))
    if into:
        h = into.pop(rnd.randrange(len(into)))
        log.append(("release", h[0], h[1]))
        os.close(h[2])


def op_held_append(n, m, p, s):
    if held:
        m, ino, fd = rnd.choice(held)
        data = token()
        log.append(("held-append", m, ino))
        os.pwrite(fd, data, len(inodes[ino]["data"]))
        inodes[ino]["data"] += data


def op_held_read(n, m, p, s):
    if held:
        check_held()


def op_in_held_dir(n, m, p, s):
    """A create, mkdir, unlink, lstat or listing through a held directory handle (the
    *at calls), which must reach the directory wherever the other mount moved it."""
    if not held_dirs:
        return
    m, ino, dfd = rnd.choice(held_dirs)
    name = rnd.choice(NAMES)
    what = rnd.choice(("create", "mkdir", "unlink", "lstat", "list"))
    log.append(("at-" + what, m, ino, name))
    label = "%s at %s inode %d %s" % (what, m, ino, name)
    if what == "create":
        data = token()
        apply(label, m_create_at(ino, name, data),
              lambda: write_to(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, data, dir_fd=dfd))
    elif what == "mkdir":
        apply(label, m_mkdir_at(ino, name), lambda: os.mkdir(name, dir_fd=dfd))
    elif what == "unlink":
        apply(label, m_unlink_at(ino, name), lambda: os.unlink(name, dir_fd=dfd))
    elif what == "lstat":
        def want():
            child = in_held(ino, name)
            if child is None:
                raise Err(errno.ENOENT)
            return inodes[child]["type"]

        def got():
            st = os.lstat(name, dir_fd=dfd)
            return FILE if stat.S_ISREG(st.st_mode) else DIRECTORY if stat.S_ISDIR(st.st_mode) else LINK
        expect(label, want, got)
    else:
        # A removed directory lists empty (glibc takes the kernel's ENOENT for its end).
        def want():
            return [] if inodes[ino].get("gone") else sorted(inodes[ino]["entries"])

        expect(label, want, lambda: sorted(os.listdir(dfd)))


def checking(kind, check):
    """An operation that checks what path p shows on a mount."""
    def op(n, m, p, s):
        log.append((kind, m, s))
        check(m, p)
    return op


def check_listing(m, p):
    """The listing of p or of its directory."""
    check_listdir(m, p[:-1] if len(p) > 1 and rnd.random() < 0.5 else p)


# Operations and their weights (in hundredths of all operations).
OPS = [
    (op_create, 11), (op_append, 5), (op_truncate, 3), (op_mkdir, 8), (op_rmdir, 5),
    (op_unlink, 5), (op_rename, 11), (op_link, 4), (op_symlink, 3), (op_chmod, 4),
    (op_setxattr, 3), (op_removexattr, 2), (op_hold, 3), (op_release, 2),
    (op_held_append, 2), (op_held_read, 3), (op_in_held_dir, 6),
    (checking("lstat", check_lstat), 8), (checking("read", check_read), 4),
    (checking("listdir", check_listing), 4), (checking("readlink", check_readlink), 2),
    (checking("xattrs", check_xattrs), 2),
]
watchdog.start(seed, progress, log)
t0 = time.time()
for n in range(nops):
    progress[0] = n
    m = rnd.choice((A, B))
    p = rnd_path()
    op = rnd.choices([o for o, _ in OPS], weights=[w for _, w in OPS])[0]
    op(n, m, p, "/".join(p))

progress[0] = nops
for m, ino, fd in held + held_dirs:
    os.close(fd)


def check_tree(m, parts, ino):
    """Every entry under a directory, on one mount, against the model."""
    log.append(("tree", m, "/".join(parts)))
    got = sorted(os.listdir(real(m, parts)))
    if got != sorted(inodes[ino]["entries"]):
        fail("listdir %s /%s: got %s, expected %s" % (m, "/".join(parts), got, sorted(inodes[ino]["entries"])))
    for name, child in inodes[ino]["entries"].items():
        check_lstat(m, parts + [name])
        kind = inodes[child]["type"]
        if kind == DIRECTORY:
            check_tree(m, parts + [name], child)
        elif kind == FILE:
            check_read(m, parts + [name])
            check_xattrs(m, parts + [name])


for m in (A, B):
    check_tree(m, [], 0)

print("ok seed=%d ops=%d in %.1fs" % (seed, nops, time.time() - t0))
