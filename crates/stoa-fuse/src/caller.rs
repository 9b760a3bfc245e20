//! What the thread that sent a request is doing, as far as its answer must know it: for
//! a lookup, a rename, and which names it moves (caps.md invariant 27); for a create
//! that finds the name made meanwhile, who the thread is, to check its access to the
//! file as the kernel would ([`Creds`]).
//!
//! Linux shows the system call a thread is blocked in, and its arguments, at
//! `/proc/TID/syscall`, and the thread's memory, where the paths of a rename are, at
//! `/proc/TID/mem` (to root, or to the thread's own user where ptrace allows it). A
//! thread this mount cannot look at (another PID namespace, no permission) counts as
//! renaming any name: the answers that depend on it are the careful ones then.

use std::fs::File;
use std::os::unix::fs::FileExt;
use stoa_client::{Attr, FileKind};

/// The longest path Linux takes.
const PATH_MAX: usize = 4096;
/// The page size of the memory read: a read must not cross into an unmapped page.
const PAGE_BYTES: u64 = 4096;
/// Bytes of a path read at once: most paths are short.
const READ_BYTES: usize = 256;

/// The call a thread is blocked in.
#[derive(Debug, PartialEq, Eq)]
pub enum Call {
    /// Not a rename.
    Other,
    /// A rename; the last components of its two paths, when they could be read.
    Rename(Option<[Vec<u8>; 2]>),
}

impl Call {
    /// The call thread `tid` is blocked in now.
    pub fn of(tid: u32) -> Call {
        let Ok(line) = std::fs::read_to_string(format!("/proc/{tid}/syscall")) else {
            return Call::Rename(None);
        };
        Call::parse(&line, || File::open(format!("/proc/{tid}/mem")).ok())
    }

    /// The call `line` (a `/proc/TID/syscall`) shows, its paths read from the memory
    /// `mem` opens.
    fn parse(line: &str, mem: impl FnOnce() -> Option<File>) -> Call {
        let mut words = line.split_whitespace();
        let Some(nr) = words.next().and_then(|n| n.parse::<libc::c_long>().ok()) else {
            return Call::Rename(None);
        };
        let args: Vec<u64> = words
            .take(6)
            .filter_map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
            .collect();
        // The arguments that point at the two paths.
        let paths = match nr {
            #[cfg(target_arch = "x86_64")]
            libc::SYS_rename => (0, 1),
            libc::SYS_renameat | libc::SYS_renameat2 => (1, 3),
            _ => return Call::Other,
        };
        let (Some(from), Some(to)) = (args.get(paths.0), args.get(paths.1)) else {
            return Call::Rename(None);
        };
        let Some(mem) = mem() else { return Call::Rename(None) };
        let last = |at: u64| read_path(&mem, at).map(|p| last_component(&p).to_vec());
        match (last(*from), last(*to)) {
            (Some(from), Some(to)) => Call::Rename(Some([from, to])),
            _ => Call::Rename(None),
        }
    }

    /// Whether this call is (or may be) a rename, whatever its names.
    pub fn renaming(&self) -> bool {
        matches!(self, Call::Rename(_))
    }

    /// Whether this call may be a rename from or onto a name `name`, in any directory.
    pub fn may_rename(&self, name: &[u8]) -> bool {
        match self {
            Call::Other => false,
            Call::Rename(None) => true,
            Call::Rename(Some(names)) => names.iter().any(|n| n == name),
        }
    }
}

/// Who a thread is, as Linux checks its access to a file by its mode bits
/// (`generic_permission`): its filesystem user and group, its other groups, and the
/// capabilities that override those bits.
#[derive(Debug, PartialEq, Eq)]
pub struct Creds {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    /// `CAP_DAC_OVERRIDE`: reads and writes any file.
    dac_override: bool,
    /// `CAP_DAC_READ_SEARCH`: reads any file.
    read_override: bool,
}

/// Bit numbers of the capabilities in `CapEff`.
const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_DAC_READ_SEARCH: u32 = 2;

impl Creds {
    /// The credentials of thread `tid`, which sent a request as user `uid` and group
    /// `gid`. `None` when they cannot be read, do not match (the thread changed them,
    /// or `tid` is no longer that thread), or the thread is in another user namespace
    /// (its capabilities and ids would mean other things there): the careful answer
    /// is the caller's then.
    pub fn of(tid: u32, uid: u32, gid: u32) -> Option<Creds> {
        let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/user")).ok();
        if ns(&tid.to_string())? != ns("self")? {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
        Creds::parse(&status).filter(|c| c.uid == uid && c.gid == gid)
    }

    /// The credentials `status` (a `/proc/TID/status`) shows.
    fn parse(status: &str) -> Option<Creds> {
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
        };
        // Real, effective, saved and filesystem ids: access goes by the last.
        let fs_id = |name: &str| field(name)?.split_whitespace().nth(3)?.parse::<u32>().ok();
        let groups = field("Groups")?.split_whitespace().map(str::parse).collect::<Result<_, _>>();
        let caps = u64::from_str_radix(field("CapEff")?, 16).ok()?;
        Some(Creds {
            uid: fs_id("Uid")?,
            gid: fs_id("Gid")?,
            groups: groups.ok()?,
            dac_override: caps & (1 << CAP_DAC_OVERRIDE) != 0,
            read_override: caps & (1 << CAP_DAC_READ_SEARCH) != 0,
        })
    }

    /// Whether these credentials may open the regular file `attr` with open flags
    /// `flags`: read for `O_RDONLY` and `O_RDWR`, write for `O_WRONLY`, `O_RDWR` and
    /// `O_TRUNC`, by the owner's, the group's or the others' bits as Linux picks them
    /// (Stoa has no ACLs), or by capability. Any other kind of file, or an access mode
    /// of 3, is not decided here: `false`.
    pub fn may_open(&self, attr: &Attr, flags: i32) -> bool {
        let access = flags & libc::O_ACCMODE;
        if attr.kind != FileKind::File || access == libc::O_ACCMODE {
            return false;
        }
        let read = access != libc::O_WRONLY;
        let write = access != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let shift = if self.uid == attr.uid {
            6
        } else if self.gid == attr.gid || self.groups.contains(&attr.gid) {
            3
        } else {
            0
        };
        let bits = (attr.perm >> shift) & 0o7;
        let by_bits = (!read || bits & 0o4 != 0) && (!write || bits & 0o2 != 0);
        by_bits || self.dac_override || (self.read_override && !write)
    }
}

/// The NUL-ended path at `at` in `mem`, or `None` if it cannot be read whole.
fn read_path(mem: &File, mut at: u64) -> Option<Vec<u8>> {
    let mut path = Vec::new();
    while path.len() < PATH_MAX {
        let to_page_end = (PAGE_BYTES - at % PAGE_BYTES) as usize;
        let mut buf = [0u8; READ_BYTES];
        let want = READ_BYTES.min(to_page_end);
        let n = mem.read_at(&mut buf[..want], at).ok().filter(|n| *n > 0)?;
        if let Some(end) = buf[..n].iter().position(|b| *b == 0) {
            path.extend_from_slice(&buf[..end]);
            return Some(path);
        }
        path.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    None
}

/// The name a path ends with, as the kernel takes it for a rename (trailing slashes
/// do not count).
fn last_component(path: &[u8]) -> &[u8] {
    let end = path.iter().rposition(|b| *b != b'/').map_or(0, |i| i + 1);
    let path = &path[..end];
    path.rsplit(|b| *b == b'/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn a_reading_thread_is_not_renaming_and_an_unseen_one_may_rename_anything() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let call = Call::of(me);
        assert_eq!(call, Call::Other, "this thread is reading a file");
        assert!(!call.may_rename(b"a"));
        let unseen = Call::of(u32::MAX);
        assert!(unseen.renaming(), "a thread the mount cannot see counts as renaming");
        assert!(unseen.may_rename(b"a"));
    }

    /// A line as `/proc/TID/syscall` shows a thread blocked in call `nr` with `args`.
    fn line(nr: libc::c_long, args: &[u64]) -> String {
        let mut l = nr.to_string();
        for a in args.iter().chain(std::iter::repeat(&0)).take(6) {
            l += &format!(" {a:#x}");
        }
        l + " 0x7ffd00000000 0x7f0000000000\n"
    }

    #[test]
    fn a_rename_names_the_last_components_of_its_paths() {
        // Paths in this process's memory, read back through /proc/self/mem.
        let from = CString::new("dir/sub/a").unwrap();
        let to = CString::new(format!("/x/{}/b//", "long".repeat(300))).unwrap();
        let (f, t) = (from.as_ptr() as u64, to.as_ptr() as u64);
        let mem = || File::open("/proc/self/mem").ok();
        for l in
            [line(libc::SYS_renameat2, &[3, f, 4, t, 0]), line(libc::SYS_renameat, &[3, f, 4, t])]
        {
            let call = Call::parse(&l, mem);
            assert_eq!(call, Call::Rename(Some([b"a".to_vec(), b"b".to_vec()])), "{l}");
            assert!(call.may_rename(b"a") && call.may_rename(b"b"));
            assert!(!call.may_rename(b"c") && !call.may_rename(b"sub"));
        }
        #[cfg(target_arch = "x86_64")]
        assert!(Call::parse(&line(libc::SYS_rename, &[f, t]), mem).may_rename(b"b"));
        // Memory that cannot be read, or not opened: any name.
        let unreadable = line(libc::SYS_renameat2, &[3, 8, 4, t, 0]);
        assert_eq!(Call::parse(&unreadable, mem), Call::Rename(None));
        let closed = line(libc::SYS_renameat2, &[3, f, 4, t, 0]);
        assert_eq!(Call::parse(&closed, || None), Call::Rename(None));
        assert_eq!(Call::parse("", mem), Call::Rename(None), "nothing shown");
        assert_eq!(Call::parse(&line(libc::SYS_read, &[3]), mem), Call::Other);
    }

    const STATUS: &str = "Name:\tpython3\nUmask:\t0022\nUid:\t1000\t1001\t1002\t1003\n\
                          Gid:\t2000\t2001\t2002\t2003\nGroups:\t5 7 \nCapInh:\t0\n\
                          CapEff:\t0000000000000000\n";

    fn file(perm: u32, uid: u32, gid: u32) -> Attr {
        Attr { perm, uid, gid, ..crate::names::tests::attr(9, FileKind::File, 1) }
    }

    #[test]
    fn credentials_are_the_filesystem_ids_groups_and_overriding_capabilities() {
        let creds = Creds::parse(STATUS).unwrap();
        let want = Creds {
            uid: 1003,
            gid: 2003,
            groups: vec![5, 7],
            dac_override: false,
            read_override: false,
        };
        assert_eq!(creds, want);
        let root = STATUS.replace("CapEff:\t0000000000000000", "CapEff:\t000001ffffffffff");
        let root = Creds::parse(&root).unwrap();
        assert!(root.dac_override && root.read_override);
        assert_eq!(Creds::parse("Uid:\t1\t1\t1\t1\n"), None, "no groups, no capabilities");
        // This thread, as the kernel would name it; and not under another user.
        // SAFETY: gettid, getuid and getgid have no preconditions.
        let (me, uid, gid) = unsafe { (libc::gettid() as u32, libc::getuid(), libc::getgid()) };
        assert!(Creds::of(me, uid, gid).is_some());
        assert_eq!(Creds::of(me, uid.wrapping_add(1), gid), None);
        assert_eq!(Creds::of(u32::MAX, uid, gid), None, "a thread that is gone");
    }

    #[test]
    fn an_open_is_allowed_by_the_bits_linux_picks_or_by_capability() {
        let creds = Creds::parse(STATUS).unwrap();
        let (rd, wr, rw, trunc) =
            (libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC);
        // Owner bits only, even where the group's or the others' would allow more.
        assert!(creds.may_open(&file(0o600, 1003, 0), rw));
        assert!(!creds.may_open(&file(0o466, 1003, 7), wr));
        assert!(creds.may_open(&file(0o466, 1003, 7), rd));
        // A supplementary group's bits, then the others'.
        assert!(creds.may_open(&file(0o640, 1, 7), rd));
        assert!(!creds.may_open(&file(0o640, 1, 7), wr));
        assert!(!creds.may_open(&file(0o606, 1, 7), rd), "group bits, not the others'");
        assert!(creds.may_open(&file(0o606, 1, 8), rw));
        assert!(!creds.may_open(&file(0o604, 1, 8), trunc), "O_TRUNC writes");
        // Not decided here: another kind of file, or access mode 3.
        let mut dir = file(0o777, 1003, 2003);
        dir.kind = FileKind::Dir;
        assert!(!creds.may_open(&dir, rd));
        assert!(!creds.may_open(&file(0o777, 1003, 2003), libc::O_ACCMODE));
        // Capabilities.
        let reader = Creds { read_override: true, ..Creds::parse(STATUS).unwrap() };
        assert!(reader.may_open(&file(0o000, 1, 1), rd));
        assert!(!reader.may_open(&file(0o000, 1, 1), wr));
        let root = Creds { dac_override: true, ..Creds::parse(STATUS).unwrap() };
        assert!(root.may_open(&file(0o000, 1, 1), rw | libc::O_TRUNC));
    }

    #[test]
    fn the_last_component_ignores_trailing_slashes() {
        assert_eq!(last_component(b"a"), b"a");
        assert_eq!(last_component(b"/d/e/a"), b"a");
        assert_eq!(last_component(b"d/a///"), b"a");
        assert_eq!(last_component(b"/"), b"");
        assert_eq!(last_component(b""), b"");
    }
}
