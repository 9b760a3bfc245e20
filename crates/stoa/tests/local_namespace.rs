//! Namespace changes a mount makes by itself (docs/flows/caps.md, "Namespace changes made
//! by the client"): in a directory no other mount uses, a mount answers creates, mkdirs,
//! symlinks, renames, unlinks and rmdirs at once and sends them to meta in batches. Another
//! mount must still see every one of them as soon as it looks, and an fsync of the
//! directory must keep them even if the mount that made them dies right after.

mod common;

use common::{Dev, Mount};
use std::collections::BTreeSet;
use std::fs::{File, FileTimes, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The names in `dir`, sorted.
fn names(dir: &Path) -> BTreeSet<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display()));
    entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// Round `round`'s directory, made on the cluster's own mount: as A sees it, as B does.
fn round_dirs(dev: &Dev, other: &Mount, round: u32) -> (PathBuf, PathBuf) {
    let (a, b) = (dev.mnt.join(format!("r{round}")), other.path.join(format!("r{round}")));
    std::fs::create_dir(&a).unwrap();
    (a, b)
}

fn set(names: &[String]) -> BTreeSet<String> {
    names.iter().cloned().collect()
}

#[test]
fn changes_one_mount_made_alone_are_seen_by_another_at_once() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    for round in 0..12 {
        let (a, b) = round_dirs(&dev, &other, round);
        let mut expect: Vec<String> = Vec::new();
        for i in 0..30 {
            let name = format!("f{i}");
            std::fs::write(a.join(&name), format!("{round}/{i}")).unwrap();
            expect.push(name);
        }
        std::fs::create_dir(a.join("sub")).unwrap();
        std::fs::write(a.join("sub/inner"), b"inner").unwrap();
        symlink("f0", a.join("link")).unwrap();
        std::fs::rename(a.join("f1"), a.join("f1.moved")).unwrap();
        std::fs::rename(a.join("f2"), a.join("f3")).unwrap();
        std::fs::rename(a.join("f5"), a.join("sub/f5")).unwrap();
        std::fs::remove_file(a.join("f4")).unwrap();
        std::fs::create_dir(a.join("gone")).unwrap();
        std::fs::remove_dir(a.join("gone")).unwrap();
        expect.retain(|n| !["f1", "f2", "f4", "f5"].contains(&n.as_str()));
        expect.extend(["f1.moved", "sub", "link"].map(String::from));

        // The other mount looks at once: it sees exactly what A made, with its contents.
        assert_eq!(names(&b), set(&expect), "round {round}: B lists another directory");
        assert_eq!(std::fs::read_to_string(b.join("f3")).unwrap(), format!("{round}/2"));
        assert_eq!(std::fs::read_to_string(b.join("f1.moved")).unwrap(), format!("{round}/1"));
        assert_eq!(std::fs::read_to_string(b.join("sub/f5")).unwrap(), format!("{round}/5"));
        assert_eq!(std::fs::read_to_string(b.join("sub/inner")).unwrap(), "inner");
        assert_eq!(std::fs::read_link(b.join("link")).unwrap(), Path::new("f0"));
        assert_eq!(std::fs::read_to_string(b.join("link")).unwrap(), format!("{round}/0"));
        assert!(std::fs::metadata(b.join("f4")).is_err(), "round {round}: B sees a removed file");
        assert_eq!(std::fs::metadata(b.join("sub")).unwrap().nlink(), 2);

        // Both now use the directory: changes go through meta, one call each, and are
        // seen both ways.
        std::fs::write(a.join("late"), b"from a").unwrap();
        assert_eq!(std::fs::read(b.join("late")).unwrap(), b"from a");
        std::fs::write(b.join("back"), b"from b").unwrap();
        assert_eq!(std::fs::read(a.join("back")).unwrap(), b"from b");
        std::fs::remove_file(b.join("f0")).unwrap();
        assert!(std::fs::metadata(a.join("f0")).is_err(), "round {round}: A sees a removed file");
        assert!(!names(&a).contains("f0"));
    }
}

#[test]
fn a_file_a_mount_made_alone_and_opened_again_outlives_its_unlink_on_another_mount() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    for round in 0..10 {
        let (a, b) = round_dirs(&dev, &other, round);
        std::fs::write(a.join("kept"), format!("kept {round}")).unwrap();
        // The release of that handle reaches meta: the next open is a new one.
        std::fs::File::open(&a).unwrap().sync_all().unwrap();
        // Meta hears of this open in A's next batch, not before open(2) returns.
        let mut f =
            std::fs::OpenOptions::new().read(true).write(true).open(a.join("kept")).unwrap();
        std::fs::remove_file(b.join("kept")).unwrap();
        // A's handle goes on: meta had the open before the unlink, so the file lives on
        // as an orphan (its attributes come from meta now: the unlink recalled A's cap).
        let meta =
            f.metadata().unwrap_or_else(|e| panic!("round {round}: fstat after unlink: {e}"));
        assert_eq!(meta.nlink(), 0, "round {round}");
        std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap();
        std::io::Write::write_all(&mut f, b"+more").unwrap();
        f.sync_all().unwrap_or_else(|e| panic!("round {round}: fsync after unlink: {e}"));
        let mut back = String::new();
        std::io::Seek::rewind(&mut f).unwrap();
        std::io::Read::read_to_string(&mut f, &mut back).unwrap();
        assert_eq!(back, format!("kept {round}+more"));
        assert!(names(&a).is_empty() && names(&b).is_empty(), "round {round}");
    }
}

#[test]
fn an_fsynced_directory_keeps_what_a_mount_made_alone_after_it_dies() {
    let dev = Dev::start(3, 3);
    let doomed = Mount::new(&dev, "doomed");
    let dir = doomed.path.join("work");
    std::fs::create_dir(&dir).unwrap();
    let mut expect = Vec::new();
    for i in 0..200 {
        let name = format!("file{i:03}");
        // A close leaves the size commit on its way to meta (flows/write.md); what must
        // survive the mount's death is what was fsynced: each file, then the directory.
        let mut f = std::fs::File::create(dir.join(&name)).unwrap();
        std::io::Write::write_all(&mut f, name.as_bytes()).unwrap();
        f.sync_all().unwrap();
        expect.push(name);
    }
    std::fs::create_dir(dir.join("nested")).unwrap();
    expect.push("nested".into());
    std::fs::File::open(&dir).unwrap().sync_all().unwrap();
    // SAFETY: plain kill(2) of the mount process this test started.
    assert_eq!(unsafe { libc::kill(doomed.pid() as i32, libc::SIGKILL) }, 0);

    // The survivor waits (at most a lease) for the dead mount's cap on the directory.
    let seen = dev.mnt.join("work");
    assert_eq!(names(&seen), set(&expect));
    for name in expect.iter().filter(|n| n.starts_with("file")) {
        assert_eq!(std::fs::read(seen.join(name)).unwrap(), name.as_bytes(), "{name}");
    }
}

#[test]
fn creates_racing_from_many_threads_across_inode_reservations_all_land() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let (a, b) = round_dirs(&dev, &other, 0);
    // More creates than one inode reservation holds (4,096), from threads that race for
    // numbers: meta takes a session's creates only in number order and only from its
    // current reservation, so a number taken and queued late would be refused. (The
    // client takes and queues under one lock; the window it closed was microseconds
    // wide, so this covers the crossing under concurrency rather than reproducing it.)
    let (threads, each) = (8, 640);
    let makers: Vec<_> = (0..threads)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..each {
                    let path = a.join(format!("t{t}-{i}"));
                    std::fs::File::create(&path)
                        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
                }
            })
        })
        .collect();
    for maker in makers {
        maker.join().expect("a creating thread panicked");
    }
    // The fsync waits for every batch; a create meta refused would be missing.
    std::fs::File::open(&a).unwrap().sync_all().unwrap();
    let expect: BTreeSet<String> =
        (0..threads).flat_map(|t| (0..each).map(move |i| format!("t{t}-{i}"))).collect();
    assert_eq!(names(&a), expect, "the mount that made them");
    assert_eq!(names(&b), expect, "another mount");
}

/// A mount changes the mode and owner of a file it holds alone by itself, as it makes
/// the file (SQLite, as root, sets every journal it creates to the owner it already
/// has): no Raft entry each. The other mount sees the last change as soon as it looks,
/// and one made there after is seen back on the first.
#[test]
fn mode_and_owner_changes_of_a_file_one_mount_holds_are_made_there_and_seen_on_the_other() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let (a, _) = round_dirs(&dev, &other, 0);
    let file = a.join("journal");
    std::fs::write(&file, b"header").unwrap();
    let applied = || dev.status()["meta"]["last_applied"].as_u64().expect("applied index");
    let before = applied();
    for round in 0..200u32 {
        let mode = 0o600 | (round % 8) << 3;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&file, Some(round % 3), Some(7)).unwrap();
        let seen = std::fs::metadata(&file).unwrap();
        assert_eq!((seen.mode() & 0o7777, seen.uid(), seen.gid()), (mode, round % 3, 7));
    }
    let entries = applied() - before;
    println!("400 mode and owner changes on one mount added {entries} log entries");
    assert!(entries < 100, "{entries} log entries for 400 changes of a file held alone");
    let theirs = other.path.join("r0/journal");
    let seen = std::fs::metadata(&theirs).unwrap();
    assert_eq!((seen.mode() & 0o7777, seen.uid(), seen.gid()), (0o600 | 7 << 3, 199 % 3, 7));
    assert_eq!(std::fs::read(&theirs).unwrap(), b"header");
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o7777, 0o640);
}

/// Mail delivery into a Maildir, as every MDA does it: the message written in `tmp/`, linked
/// into `new/`, its `tmp/` name removed; and a lock file taken by linking a unique file to
/// the lock's name. A mount holding the directories and the file makes those links and
/// unlinks itself (no log entry each). The other mount sees every name, link count and
/// byte as soon as it looks, and a link made once both use the directories goes through
/// meta and is seen both ways.
#[test]
fn hard_links_a_mount_makes_alone_are_made_there_and_seen_on_the_other() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let (a, b) = round_dirs(&dev, &other, 0);
    for sub in ["tmp", "new"] {
        std::fs::create_dir(a.join(sub)).unwrap();
    }
    let applied = || dev.status()["meta"]["last_applied"].as_u64().expect("applied index");
    let before = applied();
    for i in 0..200 {
        let (tmp, new) = (a.join(format!("tmp/m{i}")), a.join(format!("new/m{i}")));
        std::fs::write(&tmp, format!("message {i}")).unwrap();
        std::fs::hard_link(&tmp, &new).unwrap();
        assert_eq!(std::fs::metadata(&new).unwrap().nlink(), 2, "message {i}");
        std::fs::remove_file(&tmp).unwrap();
        assert_eq!(std::fs::metadata(&new).unwrap().nlink(), 1, "message {i}");
    }
    let lock = a.join("new/.lock");
    std::fs::write(a.join("tmp/locker"), b"pid 7").unwrap();
    std::fs::hard_link(a.join("tmp/locker"), &lock).unwrap();
    let taken = std::fs::hard_link(a.join("tmp/locker"), &lock).unwrap_err();
    assert_eq!(taken.raw_os_error(), Some(libc::EEXIST), "a second link to a taken name");
    let on_dir = std::fs::hard_link(a.join("tmp"), a.join("tmp2")).unwrap_err();
    assert_eq!(on_dir.raw_os_error(), Some(libc::EPERM), "a link of a directory");
    let entries = applied() - before;
    println!("200 deliveries (write, link, unlink) on one mount added {entries} log entries");
    assert!(entries < 150, "{entries} log entries for 200 deliveries made alone");

    // The other mount looks at once.
    let mut expect: BTreeSet<String> = (0..200).map(|i| format!("m{i}")).collect();
    expect.insert(".lock".into());
    assert_eq!(names(&b.join("new")), expect);
    assert_eq!(names(&b.join("tmp")), set(&["locker".into()]));
    for i in [0, 99, 199] {
        let seen = std::fs::metadata(b.join(format!("new/m{i}"))).unwrap();
        assert_eq!(seen.nlink(), 1, "B: message {i}");
        assert_eq!(
            std::fs::read_to_string(b.join(format!("new/m{i}"))).unwrap(),
            format!("message {i}")
        );
    }
    let (mine, theirs) =
        (std::fs::metadata(&lock).unwrap(), std::fs::metadata(b.join("new/.lock")).unwrap());
    assert_eq!((theirs.ino(), theirs.nlink()), (mine.ino(), 2));
    assert_eq!(std::fs::metadata(b.join("tmp/locker")).unwrap().ino(), mine.ino());
    assert_eq!(std::fs::read(b.join("new/.lock")).unwrap(), b"pid 7");

    // Both use the directories now: links go through meta, seen both ways.
    std::fs::hard_link(b.join("new/m5"), b.join("tmp/again")).unwrap();
    assert_eq!(std::fs::metadata(a.join("new/m5")).unwrap().nlink(), 2);
    assert_eq!(std::fs::read_to_string(a.join("tmp/again")).unwrap(), "message 5");
    std::fs::remove_file(a.join("new/.lock")).unwrap();
    assert_eq!(std::fs::metadata(b.join("tmp/locker")).unwrap().nlink(), 1);
    assert!(std::fs::metadata(b.join("new/.lock")).is_err(), "B still sees the lock");
}

/// A pid or lock file rewritten with `O_TRUNC` while it is empty, or a file truncated to
/// the size it has, has nothing cut: a mount holding it alone makes the change there (a
/// change of its times), with no log entry each. Bytes still buffered stay; a shorter
/// truncate after them cuts as ever, and the other mount sees the result.
#[test]
fn a_truncate_to_the_size_a_file_held_alone_has_is_made_there() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let (a, b) = round_dirs(&dev, &other, 0);
    let file = a.join("pid");
    std::fs::write(&file, b"").unwrap();
    let made = std::fs::metadata(&file).unwrap();
    let applied = || dev.status()["meta"]["last_applied"].as_u64().expect("applied index");
    let before = applied();
    for _ in 0..200 {
        drop(OpenOptions::new().write(true).truncate(true).open(&file).unwrap());
    }
    let entries = applied() - before;
    println!("200 opens with O_TRUNC of an empty file held alone added {entries} log entries");
    assert!(entries < 100, "{entries} log entries for 200 truncates to the size a file has");
    let mut f = OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all(b"0123456789").unwrap();
    f.set_len(10).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"0123456789");
    f.set_len(4).unwrap();
    f.set_len(4).unwrap();
    drop(f);
    assert_eq!(std::fs::read(b.join("pid")).unwrap(), b"0123");
    let seen = std::fs::metadata(b.join("pid")).unwrap();
    assert_eq!(seen.len(), 4);
    assert!(seen.ctime_nsec() != made.ctime_nsec() || seen.ctime() > made.ctime());
}

/// `tar`, `cp -a` and `rsync` set the times of each file they write while its writes
/// are still buffered or on their way: the mount makes the change itself and sends it
/// once those writes are committed, with no Raft entry of its own (a commit sets the
/// mtime to when its writes finished, so it must not reach meta after the change). The
/// other mount sees the times set, and a write made after them moves the mtime on.
#[test]
fn times_set_right_after_writes_are_made_on_the_mount_and_seen_on_the_other() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let (a, b) = round_dirs(&dev, &other, 0);
    let applied = || dev.status()["meta"]["last_applied"].as_u64().expect("applied index");
    let old = |i: u32| UNIX_EPOCH + Duration::from_secs(1_600_000_000 + u64::from(i));
    let before = applied();
    let mut readers = Vec::new();
    for i in 0..200u32 {
        let mut f = File::create(a.join(format!("f{i}"))).unwrap();
        f.write_all(&vec![i as u8; 10_000]).unwrap();
        f.set_times(FileTimes::new().set_modified(old(i)).set_accessed(old(0))).unwrap();
        std::os::unix::fs::fchown(&f, Some(i % 3), Some(7)).unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(0o640)).unwrap();
        drop(f);
        // Opened while the changes wait behind the writes, read once they are all in.
        readers.push(File::open(a.join(format!("f{i}"))).unwrap());
    }
    let entries = applied() - before;
    println!("200 files written and their times set on one mount: {entries} log entries");
    assert!(entries < 100, "{entries} log entries for 200 files, their times set each");
    std::thread::sleep(Duration::from_secs(1));
    for (i, mut reader) in readers.into_iter().enumerate() {
        let mut back = Vec::new();
        reader.read_to_end(&mut back).unwrap();
        let right = back == vec![i as u8; 10_000];
        assert!(right, "f{i} read back on its own mount: {} bytes, not as written", back.len());
    }
    for i in 0..200u32 {
        let seen = std::fs::metadata(b.join(format!("f{i}"))).unwrap();
        let got = (seen.modified().unwrap(), seen.len(), seen.mode() & 0o7777, seen.uid());
        assert_eq!(got, (old(i), 10_000, 0o640, i % 3), "f{i} as the other mount sees it");
        assert_eq!(std::fs::read(b.join(format!("f{i}"))).unwrap(), vec![i as u8; 10_000]);
    }
    // Looked at from the other mount while still open and written: the recall of the
    // cap waits for the change behind the writes.
    let (a1, b1) = round_dirs(&dev, &other, 1);
    for i in 0..5u32 {
        let mut f = File::create(a1.join(format!("f{i}"))).unwrap();
        f.write_all(&vec![i as u8; 10_000]).unwrap();
        f.set_times(FileTimes::new().set_modified(old(i))).unwrap();
        let seen = std::fs::metadata(b1.join(format!("f{i}"))).unwrap();
        assert_eq!((seen.modified().unwrap(), seen.len()), (old(i), 10_000), "f{i} at once");
    }
    // Written after the times were set, in the same open: the mtime is the write's.
    let started = SystemTime::now() - Duration::from_secs(5);
    let mut f = OpenOptions::new().append(true).open(a.join("f0")).unwrap();
    f.write_all(b"more").unwrap();
    f.set_times(FileTimes::new().set_modified(old(7))).unwrap();
    f.write_all(b"and after").unwrap();
    drop(f);
    let seen = std::fs::metadata(b.join("f0")).unwrap();
    assert_eq!(seen.len(), 10_013);
    assert!(seen.modified().unwrap() > started, "a write after the times set kept them");
}

/// `rm -r` of a tree another mount made, once that mount is gone: the remover takes
/// each directory with its listing and its files exclusively, many per call, and removes
/// them by itself, in batches, not one Raft entry per name (a tree of 25,900 entries
/// took 27-47 s to remove, one log entry each, about 1 ms). A file with two links and a
/// symlink still go to meta one by one, and so do the names of the directories a third
/// mount holds caps on (it has a file open in one: meta gives no directory another
/// mount uses). That file lives on for its handle; a fresh mount finds nothing left.
/// Removed through meta name by name, the tree added 213 log entries; here 72. Moving
/// 50 files out of one of its directories first goes the same way.
#[test]
fn a_tree_made_on_a_mount_that_left_is_removed_on_another_in_batches() {
    let dev = Dev::start(3, 3);
    let reader = Mount::new(&dev, "reader");
    let maker = Mount::new(&dev, "maker");
    let tree = maker.path.join("tree");
    for d in 0..4 {
        let dir = tree.join(format!("d{d}/inner"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            std::fs::write(dir.join(format!("f{f:02}")), format!("{d}/{f}")).unwrap();
        }
    }
    std::fs::create_dir(tree.join("empty")).unwrap();
    std::fs::hard_link(tree.join("d0/inner/f00"), tree.join("d1/linked")).unwrap();
    symlink("d0", tree.join("link")).unwrap();
    // Closing the maker's session gives up every cap it held.
    drop(maker);
    let mut open = File::open(reader.path.join("tree/d2/inner/f07")).unwrap();

    let applied = || dev.status()["meta"]["last_applied"].as_u64().expect("applied index");
    // `mv` of the 50 files of one directory into another takes them the same way.
    let before = applied();
    let (from, to) = (dev.mnt.join("tree/d3/inner"), dev.mnt.join("tree/d3"));
    for f in 0..50 {
        std::fs::rename(from.join(format!("f{f:02}")), to.join(format!("m{f:02}"))).unwrap();
    }
    let entries = applied() - before;
    println!("50 files moved added {entries} log entries");
    assert!(entries < 25, "{entries} log entries to move 50 files one mount took");
    {
        // Seen from a mount that then leaves, giving its caps back.
        let viewer = Mount::new(&dev, "viewer");
        assert!(names(&viewer.path.join("tree/d3/inner")).is_empty(), "moved, seen elsewhere");
        assert_eq!(std::fs::read_to_string(viewer.path.join("tree/d3/m49")).unwrap(), "3/49");
    }
    let before = applied();
    std::fs::remove_dir_all(dev.mnt.join("tree")).unwrap();
    let entries = applied() - before;
    println!("rm -r of 208 files and 10 directories added {entries} log entries");
    assert!(entries < 100, "{entries} log entries to remove 218 names one mount took");

    let mut kept = String::new();
    open.read_to_string(&mut kept).unwrap();
    assert_eq!(kept, "2/7", "a file open on another mount, read after its removal");
    assert!(names(&reader.path).is_empty(), "the reader's mount still lists the tree");
    let fresh = Mount::new(&dev, "fresh");
    assert!(names(&fresh.path).is_empty(), "a fresh mount still lists the tree");
}
