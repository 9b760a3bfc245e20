//! What the thread that sent a lookup is doing, as far as the lookup must know it: a
//! rename, and which names it moves (caps.md invariant 27).
//!
//! Linux shows the system call a thread is blocked in, and its arguments, at
//! `/proc/TID/syscall`, and the thread's memory, where the paths of a rename are, at
//! `/proc/TID/mem` (to root, or to the thread's own user where ptrace allows it). A
//! thread this mount cannot look at (another PID namespace, no permission) counts as
//! renaming any name: the answers that depend on it are the careful ones then.

use std::fs::File;
use std::os::unix::fs::FileExt;

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

    #[test]
    fn the_last_component_ignores_trailing_slashes() {
        assert_eq!(last_component(b"a"), b"a");
        assert_eq!(last_component(b"/d/e/a"), b"a");
        assert_eq!(last_component(b"d/a///"), b"a");
        assert_eq!(last_component(b"/"), b"");
        assert_eq!(last_component(b""), b"");
    }
}
