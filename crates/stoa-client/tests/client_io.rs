//! The client against an in-memory cluster: data crosses chunk boundaries, holes read as
//! zeros, truncate cuts chunk data, retries survive busy servers, orphans get purged.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use stoa_client::{Client, ClientConfig, FileKind, InodeId, Owner, SetAttr};
use stoa_types::ChunkId;
use support::fake_cluster::FakeCluster;

const CHUNK: u32 = 64 * 1024;
const ROOT_OWNER: Owner = Owner { uid: 0, gid: 0 };

async fn setup() -> (FakeCluster, Client) {
    let cluster = FakeCluster::start(CHUNK).await;
    let cfg = ClientConfig {
        meta: vec![cluster.addr],
        name: "test".into(),
        caps_max: stoa_client::CAPS_MAX_DEFAULT,
        data_cache_bytes: stoa_client::DATA_CACHE_DEFAULT,
    };
    let client = Client::connect(cfg).await.unwrap();
    (cluster, client)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn new_file(client: &Client, name: &[u8]) -> InodeId {
    client.create(InodeId::ROOT, name, FileKind::File, 0o644, ROOT_OWNER, 0).await.unwrap().ino
}

/// Waits (at most 30 s) until meta knows `ino` open by no session: the last close's
/// release leaves in the background.
async fn wait_released(cluster: &FakeCluster, ino: InodeId) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cluster.state.lock().unwrap().opens.contains(&ino.0) {
        assert!(std::time::Instant::now() < deadline, "the release never reached meta");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_data_reads_back_across_chunk_boundaries() {
    let (_cluster, client) = setup().await;
    let ino = new_file(&client, b"big").await;
    let fh = client.open(ino).await.unwrap();
    let data = pattern(10 * CHUNK as usize + 1234, 7);
    for (i, piece) in data.chunks(40_000).enumerate() {
        client.write(fh, (i * 40_000) as u64, piece).await.unwrap();
    }
    // Before the flush, the size already counts the buffered bytes.
    assert_eq!(client.getattr(ino).await.unwrap().size, data.len() as u64);
    client.flush(fh).await.unwrap();
    let mut back = Vec::new();
    let mut offset = 0u64;
    loop {
        let got = client.read(fh, offset, 100_000).await.unwrap();
        if got.is_empty() {
            break;
        }
        offset += got.len() as u64;
        back.extend(got);
    }
    assert_eq!(back.len(), data.len());
    assert!(back == data, "data differs");
    client.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_random_writes_read_back_at_once_and_travel_batched() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"random").await;
    let fh = client.open(ino).await.unwrap();
    let size = 8 * CHUNK as usize;
    let mut model = vec![0u8; size];
    client.write(fh, 0, &model).await.unwrap();
    client.flush(fh).await.unwrap();
    let before = cluster.state.lock().unwrap().chunk_writes;
    // A fixed linear congruential sequence: the same offsets every run.
    let mut x: u64 = 12345;
    let writes = 2000;
    for i in 0..writes {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let offset = (x >> 33) as usize % (size - 700);
        let piece = pattern(1 + (x >> 20) as usize % 700, i as u8);
        client.write(fh, offset as u64, &piece).await.unwrap();
        model[offset..offset + piece.len()].copy_from_slice(&piece);
        if i % 100 == 0 {
            // Reads see the writes still buffered, queued or in flight.
            let at = (x >> 40) as usize % (size - 5000);
            let got = client.read(fh, at as u64, 5000).await.unwrap();
            assert!(got == model[at..at + 5000], "read at {at} after write {i} differs");
        }
    }
    client.flush(fh).await.unwrap();
    let sent = cluster.state.lock().unwrap().chunk_writes - before;
    assert!(sent < writes / 4, "{writes} small writes took {sent} chunk writes");
    let back = client.read(fh, 0, size as u32).await.unwrap();
    assert!(back == model, "data differs after the flush");
    client.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holes_read_as_zeros_and_reads_stop_at_the_end() {
    let (_cluster, client) = setup().await;
    let ino = new_file(&client, b"sparse").await;
    let fh = client.open(ino).await.unwrap();
    let far = 3 * u64::from(CHUNK) + 10;
    client.write(fh, far, b"tail").await.unwrap();
    client.fsync(fh).await.unwrap();
    let got = client.read(fh, far - 6, 100).await.unwrap();
    assert_eq!(&got[..], b"\0\0\0\0\0\0tail");
    assert!(client.read(fh, far + 4, 10).await.unwrap().is_empty());
    let zeros = client.read(fh, 5, 1000).await.unwrap();
    assert_eq!(zeros, vec![0u8; 1000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_cuts_chunk_data_then_size() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"cut").await;
    let fh = client.open(ino).await.unwrap();
    client.write(fh, 0, &pattern(3 * CHUNK as usize, 1)).await.unwrap();
    let set = SetAttr { size: Some(u64::from(CHUNK) + 100), ..Default::default() };
    assert_eq!(client.setattr(ino, set).await.unwrap().size, u64::from(CHUNK) + 100);
    {
        let st = cluster.state.lock().unwrap();
        assert_eq!(st.chunks[&ChunkId { ino, index: 1 }].len(), 100);
        assert!(!st.chunks.contains_key(&ChunkId { ino, index: 2 }));
    }
    // Growing again reads zeros where the cut data was.
    let set = SetAttr { size: Some(2 * u64::from(CHUNK)), ..Default::default() };
    client.setattr(ino, set).await.unwrap();
    let got = client.read(fh, u64::from(CHUNK) + 90, 20).await.unwrap();
    assert_eq!(&got[10..], &[0u8; 10]);
    client.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_chunk_servers_are_retried_and_fsync_syncs_written_chunks() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"retry").await;
    let fh = client.open(ino).await.unwrap();
    cluster.busy_writes.store(3, Ordering::SeqCst);
    client.write(fh, 0, b"hello").await.unwrap();
    client.fsync(fh).await.unwrap();
    assert_eq!(&client.read(fh, 0, 5).await.unwrap()[..], b"hello");
    assert!(cluster.state.lock().unwrap().synced.contains(&ChunkId { ino, index: 0 }));
    assert_eq!(cluster.busy_writes.load(Ordering::SeqCst), 0);
}

/// An fsync of what is still buffered sends it as durable writes, each also a `Sync` of
/// its chunk on every server of the chain: one pass down the chain, no `Sync` after it.
/// What was sent before the fsync began still gets a `Sync`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_of_buffered_writes_makes_them_durable_without_a_sync_of_its_own() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"journal").await;
    let fh = client.open(ino).await.unwrap();
    let chunk = ChunkId { ino, index: 0 };
    client.write(fh, 0, &pattern(4096, 1)).await.unwrap();
    client.fsync(fh).await.unwrap();
    {
        let st = cluster.state.lock().unwrap();
        assert!(st.synced.contains(&chunk), "the buffered write was not made durable");
        assert_eq!(st.sync_calls, 0, "a Sync followed the durable write");
    }
    cluster.state.lock().unwrap().synced.clear();
    client.write(fh, 4096, &pattern(4096, 2)).await.unwrap();
    client.flush(fh).await.unwrap();
    client.fdatasync(fh).await.unwrap();
    {
        let st = cluster.state.lock().unwrap();
        assert_eq!(st.sync_calls, 1, "a write sent before the fsync was not synced");
        assert_eq!(st.synced, vec![chunk]);
    }
    assert_eq!(client.read(fh, 0, 8192).await.unwrap()[4096..], pattern(4096, 2)[..]);
    client.release(fh).await.unwrap();
}

/// Found by the fault tests: a write-behind failure was reported by whichever flush
/// came first and then forgotten. The kernel flushes on every close of a descriptor,
/// also when a forked child execs and closes its inherited copy, so that flush took the
/// error and the owner's fsync returned success over data that never reached a chunk
/// server (an fsynced file read back empty). A flush must report without consuming;
/// fsync must report to every handle that was open when the write failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_behind_error_reaches_the_fsync_of_every_open_handle() {
    use stoa_client::FsError;
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"shared").await;
    let (a, b) = (client.open(ino).await.unwrap(), client.open(ino).await.unwrap());
    client.write(a, 0, b"from a").await.unwrap();
    cluster.full_writes.store(1, Ordering::SeqCst);
    // A close of a copy of `a` (a child's exec) sends the bytes, which fail; held
    // exclusively, it does not wait for them.
    client.flush(a).await.unwrap();
    // A flush without a handle (syncfs) waits for them, reports their failure, and
    // leaves the error to the handles too.
    assert_eq!(client.flush_all().await, Err(FsError::NoSpace));
    // A chmod (made here: the file is held exclusively) reports nothing.
    client.setattr(ino, SetAttr { perm: Some(0o600), ..SetAttr::default() }).await.unwrap();
    // A flush reports it without consuming it.
    assert_eq!(client.flush(a).await, Err(FsError::NoSpace));
    assert_eq!(client.fsync(a).await, Err(FsError::NoSpace));
    assert_eq!(client.fsync(b).await, Err(FsError::NoSpace), "the other writer's fsync");
    // Consumed once per handle; a handle opened later never sees it.
    client.fsync(a).await.unwrap();
    client.fsync(b).await.unwrap();
    let c = client.open(ino).await.unwrap();
    client.write(c, 0, b"from c").await.unwrap();
    client.fsync(c).await.unwrap();
    assert_eq!(&client.read(c, 0, 6).await.unwrap()[..], b"from c");
    for fh in [a, b, c] {
        client.release(fh).await.unwrap();
    }
}

/// A close of a file held exclusively waits neither for its data nor for its size
/// commit: nobody else can see the file before this client's cap is recalled, which
/// waits for both. An fsync waits for both, also through another handle, and a read
/// here sees what is still on its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_of_a_file_held_exclusively_waits_for_neither_its_data_nor_its_size() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"small").await;
    let fh = client.open(ino).await.unwrap();
    let data = pattern(4096, 3);
    cluster.hold_writes.store(true, Ordering::SeqCst);
    cluster.hold_commits_above.store(0, Ordering::SeqCst);
    client.write(fh, 0, &data).await.unwrap();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), client.release(fh));
    closed.await.expect("the close waited for the chunk write").unwrap();
    assert!(cluster.state.lock().unwrap().chunks.is_empty(), "the write is still held");
    assert_eq!(client.getattr(ino).await.unwrap().size, 4096, "this client knows the size");
    let fh = client.open(ino).await.unwrap();
    assert_eq!(client.read(fh, 0, 4096).await.unwrap(), data, "read here before it landed");
    let syncing = tokio::spawn({
        let client = client.clone();
        async move { client.fsync(fh).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!syncing.is_finished(), "an fsync returned before the data was written");
    cluster.hold_writes.store(false, Ordering::SeqCst);
    while !cluster.state.lock().unwrap().chunks.contains_key(&ChunkId { ino, index: 0 }) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!syncing.is_finished(), "an fsync returned before the size was on meta");
    assert_eq!(cluster.state.lock().unwrap().attrs[&ino.0].size, 0, "the commit is held");
    cluster.hold_commits_above.store(u64::MAX, Ordering::SeqCst);
    syncing.await.unwrap().unwrap();
    {
        let st = cluster.state.lock().unwrap();
        assert_eq!(st.chunks[&ChunkId { ino, index: 0 }], data);
        assert_eq!(st.attrs[&ino.0].size, 4096);
    }
    client.release(fh).await.unwrap();
}

/// After a write-behind failed, a close waits for its writes again for a while, so
/// that a full cluster answers `ENOSPC` at the close of the next file it refuses rather
/// than only at an fsync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_write_behind_failure_a_close_waits_for_its_writes_and_reports() {
    use stoa_client::FsError;
    let (cluster, client) = setup().await;
    let (x, y) = (new_file(&client, b"x").await, new_file(&client, b"y").await);
    cluster.full_writes.store(2, Ordering::SeqCst);
    let fh = client.open(x).await.unwrap();
    client.write(fh, 0, b"refused").await.unwrap();
    client.release(fh).await.unwrap();
    // The refusal is known once everything was flushed (the unmount's flush).
    assert_eq!(client.flush_all().await, Err(FsError::NoSpace));
    let fh = client.open(y).await.unwrap();
    client.write(fh, 0, b"refused too").await.unwrap();
    assert_eq!(client.release(fh).await, Err(FsError::NoSpace), "the close of the next file");
    assert!(cluster.state.lock().unwrap().chunks.is_empty());
}

/// A recall flushes what was written under the cap and acks; it does not wait for a
/// write made uncapped after it began, whose commit may wait at meta for the session
/// the recall serves (docs/flows/caps.md invariant 29). Here that commit is held until
/// the ack came: before, the recall waited for it, and the two waited for each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_does_not_wait_for_a_write_made_uncapped_after_it_began() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"recalled").await;
    let fh = client.open(ino).await.unwrap();
    let (before, after) = (pattern(4096, 1), pattern(4096, 2));
    cluster.hold_commits_above.store(0, Ordering::SeqCst);
    client.write(fh, 0, &before).await.unwrap();
    let seq = cluster.state.lock().unwrap().granted[&ino.0];
    let recall = stoa_proto::CapRef { ino, seq };
    cluster.state.lock().unwrap().recalls.push(recall);
    // The recall sent the buffered write; its commit arrives and is held.
    let arrived = |n: u64| {
        let state = cluster.state.clone();
        async move {
            while state.lock().unwrap().commits_arrived < n {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), arrived(1)).await.unwrap();
    let later = tokio::spawn({
        let (client, after) = (client.clone(), after.clone());
        async move { client.write(fh, 8192, &after).await }
    });
    let written = |n: u64| {
        let state = cluster.state.clone();
        async move {
            while state.lock().unwrap().chunk_writes < n {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), written(2)).await.unwrap();
    // The first commit goes through; the uncapped write's (to 12 KiB) stays held.
    cluster.hold_commits_above.store(4096, Ordering::SeqCst);
    let acked = async {
        while !cluster.state.lock().unwrap().released.contains(&recall) {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), acked)
        .await
        .expect("the recall waited for the write made after it began");
    assert_eq!(cluster.state.lock().unwrap().attrs[&ino.0].size, 4096);
    assert!(!later.is_finished(), "the uncapped write returned before its commit");
    cluster.hold_commits_above.store(u64::MAX, Ordering::SeqCst);
    later.await.unwrap().unwrap();
    assert_eq!(cluster.state.lock().unwrap().attrs[&ino.0].size, 12288);
    let mut want = before;
    want.resize(8192, 0);
    want.extend_from_slice(&after);
    assert_eq!(client.read(fh, 0, 16384).await.unwrap(), want);
    client.release(fh).await.unwrap();
}

/// The size commit of a file this client holds alone travels in a batch with the commits
/// of other files (one Raft entry for many), not as a call of its own; an fsync waits
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_held_alone_commits_its_size_in_a_batch() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"alone").await;
    let fh = client.open(ino).await.unwrap();
    client.write(fh, 0, &pattern(4096, 7)).await.unwrap();
    client.fsync(fh).await.unwrap();
    let on_meta = {
        let st = cluster.state.lock().unwrap();
        assert_eq!((st.commit_calls, st.batched_commits), (0, 1));
        assert_eq!(st.attrs[&ino.0].size, 4096);
        st.attrs[&ino.0].clone()
    };
    // The cap holds what the commit left on meta, version and times included.
    assert_eq!(client.getattr(ino).await.unwrap(), on_meta);
    client.release(fh).await.unwrap();
}

/// A file opened again after its last close, when the client no longer keeps its state,
/// reads under the cap it still holds with the size cached with the cap: no meta call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_opened_again_reads_under_its_cap_without_asking_meta_for_the_size() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"again").await;
    let fh = client.open(ino).await.unwrap();
    let data = pattern(4096, 5);
    client.write(fh, 0, &data).await.unwrap();
    client.fsync(fh).await.unwrap();
    client.release(fh).await.unwrap();
    wait_released(&cluster, ino).await;
    let asked = cluster.state.lock().unwrap().getattr_calls;
    let fh = client.open(ino).await.unwrap();
    assert_eq!(client.read(fh, 0, 64 * 1024).await.unwrap(), data);
    assert_eq!(cluster.state.lock().unwrap().getattr_calls, asked, "the read asked meta");
    client.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_open_file_is_purged_on_last_close() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"orphan").await;
    let fh = client.open(ino).await.unwrap();
    client.write(fh, 0, b"still here").await.unwrap();
    client.unlink(InodeId::ROOT, b"orphan").await.unwrap();
    assert_eq!(&client.read(fh, 0, 100).await.unwrap()[..], b"still here");
    client.release(fh).await.unwrap();
    // Meta hears of the last close in the background, off the close's critical path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cluster.state.lock().unwrap().purged.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the release never reached meta");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(cluster.state.lock().unwrap().purged, vec![ino.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_opened_and_closed_in_a_loop_stays_open_at_meta_while_a_handle_is() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"looped").await;
    let released = || !cluster.state.lock().unwrap().opens.contains(&ino.0);
    for round in 0..200u32 {
        let fh = client.open(ino).await.unwrap();
        // Whether the last release was taken back or had left, meta has the file open
        // once the open returned: an open and a release never cross.
        assert!(!released(), "round {round}: open at meta");
        if round % 50 == 49 {
            // Let a release leave now and then, so the next open must reach meta.
            client.release(fh).await.unwrap();
            wait_released(&cluster, ino).await;
        } else {
            client.release(fh).await.unwrap();
        }
    }
    wait_released(&cluster, ino).await;
    let calls = cluster.state.lock().unwrap().open_calls;
    assert!((4..=200).contains(&calls), "{calls} opens reached meta");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_reads_are_served_by_readahead() {
    let (_cluster, client) = setup().await;
    let ino = new_file(&client, b"stream").await;
    let fh = client.open(ino).await.unwrap();
    let data = pattern(6 * CHUNK as usize, 3);
    client.write(fh, 0, &data).await.unwrap();
    client.release(fh).await.unwrap();
    let fh = client.open(ino).await.unwrap();
    let mut back = Vec::new();
    for offset in (0..data.len()).step_by(16 * 1024) {
        back.extend(client.read(fh, offset as u64, 16 * 1024).await.unwrap());
    }
    assert!(back == data, "data differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_meta_expires_the_session_old_handles_fail_and_new_work_goes_on() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"f").await;
    let old = client.open(ino).await.unwrap();
    client.write(old, 0, b"before").await.unwrap();
    client.flush(old).await.unwrap();
    let first = client.session().session;
    cluster.state.lock().unwrap().expired.insert(first.0);
    // The next meta call finds the session expired: it fails (it began in the expired
    // session) and a new session is opened, in which the call after it succeeds.
    let made = client.create(InodeId::ROOT, b"g", FileKind::File, 0o644, ROOT_OWNER, 0).await;
    assert_eq!(made.unwrap_err().errno(), libc::EIO);
    assert_ne!(client.session().session, first);
    let other = new_file(&client, b"g").await;
    let err = client.read(old, 0, 6).await.unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err:?}");
    assert_eq!(client.write(old, 0, b"x").await.unwrap_err().errno(), libc::EIO);
    assert_eq!(client.release(old).await.unwrap_err().errno(), libc::EIO);
    // Files opened now work, the old one too.
    for ino in [ino, other] {
        let fh = client.open(ino).await.unwrap();
        client.write(fh, 0, b"after").await.unwrap();
        assert_eq!(&client.read(fh, 0, 5).await.unwrap()[..], b"after");
        client.release(fh).await.unwrap();
    }
}

/// A lookup waits for the namespace changes queued before it, not for the opens and
/// releases queued with them, which change nothing it reads: on a fresh mount, each
/// file's first lookup waited a log commit for the previous file's open and release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_waits_for_no_queued_open_or_release() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"a").await;
    client.lookup(InodeId::ROOT, b"a").await.unwrap();
    cluster.hold_batches.store(true, Ordering::SeqCst);
    let fh = client.open(ino).await.unwrap();
    client.release(fh).await.unwrap();
    let looked = client.lookup(InodeId::ROOT, b"missing");
    let looked = tokio::time::timeout(std::time::Duration::from_secs(10), looked).await;
    let looked = looked.expect("the lookup waited for a queued open and release");
    assert_eq!(looked.unwrap_err(), stoa_types::FsError::NotFound);
    cluster.hold_batches.store(false, Ordering::SeqCst);
    wait_released(&cluster, ino).await;
}

/// An open whose change had not left when the file's last handle closed is taken back
/// with it, and meta hears of neither; one that had left is released as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_closed_before_it_left_costs_meta_nothing() {
    let (cluster, client) = setup().await;
    let (a, b) = (new_file(&client, b"a").await, new_file(&client, b"b").await);
    client.lookup(InodeId::ROOT, b"a").await.unwrap();
    client.lookup(InodeId::ROOT, b"b").await.unwrap();
    let before = cluster.state.lock().unwrap().open_calls;
    cluster.hold_batches.store(true, Ordering::SeqCst);
    // The batch with b's open leaves and is held at meta; a's opens queue behind it.
    let fb = client.open(b).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cluster.state.lock().unwrap().batches_arrived == 0 {
        assert!(std::time::Instant::now() < deadline, "b's open never left");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for _ in 0..3 {
        let fa = client.open(a).await.unwrap();
        client.release(fa).await.unwrap();
    }
    client.release(fb).await.unwrap();
    cluster.hold_batches.store(false, Ordering::SeqCst);
    wait_released(&cluster, b).await;
    client.sync_namespace().await;
    let st = cluster.state.lock().unwrap();
    assert_eq!(st.open_calls - before, 1, "only b's open reached meta");
    assert!(!st.opens.contains(&a.0));
}

/// A recall's ack waits for the queued changes that name its inode (here a file's open,
/// which must reach meta before the file can go: caps.md invariant 19), not for changes
/// of other inodes: a batch held up at a meta leader that lost its place held every
/// recall of the mount behind it (FAULT_TESTS.md, the `--seed 36` stall).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_waits_only_for_the_queued_changes_naming_its_inode() {
    let (cluster, client) = setup().await;
    let (a, b) = (new_file(&client, b"a").await, new_file(&client, b"b").await);
    client.lookup(InodeId::ROOT, b"a").await.unwrap();
    client.lookup(InodeId::ROOT, b"b").await.unwrap();
    cluster.hold_batches.store(true, Ordering::SeqCst);
    // Queued behind the held batch: it holds a cap on the file.
    let fh = client.open(b).await.unwrap();
    let recall = |ino: InodeId| {
        let seq = cluster.state.lock().unwrap().granted[&ino.0];
        let recall = stoa_proto::CapRef { ino, seq };
        cluster.state.lock().unwrap().recalls.push(recall);
        recall
    };
    let acked = |r: stoa_proto::CapRef| {
        let state = cluster.state.clone();
        async move {
            while !state.lock().unwrap().released.contains(&r) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    };
    let other = recall(a);
    tokio::time::timeout(std::time::Duration::from_secs(10), acked(other))
        .await
        .expect("the recall of a file waited for the queued open of another");
    let own = recall(b);
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), acked(own)).await;
    assert!(early.is_err(), "the recall of a file was acked before its queued open was sent");
    assert!(!cluster.state.lock().unwrap().opens.contains(&b.0));
    cluster.hold_batches.store(false, Ordering::SeqCst);
    tokio::time::timeout(std::time::Duration::from_secs(10), acked(own)).await.unwrap();
    assert!(cluster.state.lock().unwrap().opens.contains(&b.0), "acked before the open applied");
    client.release(fh).await.unwrap();
}

/// An fdatasync of a file held exclusively whose size meta already has waits for the
/// data on the chunk servers but not for the commit of the new mtime; an fsync waits for
/// it, and so does an fdatasync of a write that grows the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fdatasync_of_an_overwrite_waits_for_its_data_but_not_its_mtime() {
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"db").await;
    let fh = client.open(ino).await.unwrap();
    client.write(fh, 0, &pattern(8192, 1)).await.unwrap();
    client.fsync(fh).await.unwrap();
    let committed = cluster.state.lock().unwrap().attrs[&ino.0].clone();
    assert_eq!(committed.size, 8192);

    cluster.hold_commits_above.store(0, Ordering::SeqCst);
    let page = pattern(4096, 2);
    client.write(fh, 4096, &page).await.unwrap();
    let synced = tokio::time::timeout(Duration::from_secs(10), client.fdatasync(fh));
    synced.await.expect("the fdatasync waited for the mtime commit").unwrap();
    {
        let st = cluster.state.lock().unwrap();
        assert_eq!(st.chunks[&ChunkId { ino, index: 0 }][4096..], page[..], "data first");
        assert!(st.synced.contains(&ChunkId { ino, index: 0 }), "the chunk was synced");
        assert_eq!(st.attrs[&ino.0].mtime, committed.mtime, "the commit is held");
    }
    let waits = |sync: &'static str| {
        let client = client.clone();
        tokio::spawn(async move {
            match sync {
                "fsync" => client.fsync(fh).await,
                _ => client.fdatasync(fh).await,
            }
        })
    };
    let full = waits("fsync");
    client.write(fh, 8192, &page).await.unwrap();
    let growing = waits("fdatasync");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!full.is_finished(), "an fsync returned before the mtime was on meta");
    assert!(!growing.is_finished(), "an fdatasync returned before the size was on meta");
    cluster.hold_commits_above.store(u64::MAX, Ordering::SeqCst);
    full.await.unwrap().unwrap();
    growing.await.unwrap().unwrap();
    assert_eq!(cluster.state.lock().unwrap().attrs[&ino.0].size, 12288);
    client.release(fh).await.unwrap();
}

/// The commits of overwrites of a file held alone, whose size meta has (only their
/// mtime is new to meta), are held here and sent as one (`HeldTimes`): a database's
/// write and fdatasync is not a Raft entry each. A stat here shows their mtime all the
/// same. An fsync sends it, so does a change of times (which stays over it), a recall
/// before its ack, and the time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commits_of_overwrites_are_held_and_sent_as_one() {
    use stoa_types::{SetTime, Timestamp};
    let (cluster, client) = setup().await;
    let ino = new_file(&client, b"db").await;
    let fh = client.open(ino).await.unwrap();
    client.write(fh, 0, &pattern(16384, 1)).await.unwrap();
    client.fsync(fh).await.unwrap();
    let on_meta = || cluster.state.lock().unwrap().attrs[&ino.0].clone();
    let commits = || {
        let st = cluster.state.lock().unwrap();
        st.commit_calls + st.batched_commits
    };
    let (sent, before) = (commits(), on_meta());
    let overwrite = |seed: u8| {
        let client = client.clone();
        async move {
            client.write(fh, u64::from(seed % 4) * 4096, &pattern(4096, seed)).await.unwrap();
            client.fdatasync(fh).await.unwrap();
        }
    };
    for seed in 0..20 {
        overwrite(seed).await;
    }
    assert_eq!(commits(), sent, "an overwrite's commit was sent");
    let here = client.getattr(ino).await.unwrap();
    assert!(here.mtime > before.mtime, "a stat here shows the overwrites' mtime");
    assert_eq!((here.size, on_meta().mtime), (16384, before.mtime));
    client.fsync(fh).await.unwrap();
    assert_eq!((commits(), on_meta().mtime), (sent + 1, here.mtime), "the fsync sent it");

    // A change of times made after an overwrite stays over it.
    overwrite(20).await;
    let set_at = Timestamp { secs: 1_000_000, nanos: 0 };
    let set = SetAttr { mtime: Some(SetTime::At(set_at)), ..SetAttr::default() };
    client.setattr(ino, set).await.unwrap();
    client.fsync(fh).await.unwrap();
    assert_eq!(commits(), sent + 2);
    assert_eq!((on_meta().mtime, client.getattr(ino).await.unwrap().mtime), (set_at, set_at));

    // Left alone, it goes once its time is up, and not before: the timer of a hold an
    // fsync sent leaves the next hold to its own.
    overwrite(21).await;
    client.fsync(fh).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let begun = std::time::Instant::now();
    overwrite(22).await;
    let deadline = begun + Duration::from_secs(10);
    while commits() < sent + 4 {
        assert!(std::time::Instant::now() < deadline, "a held commit was never sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(begun.elapsed() >= Duration::from_secs(1), "a hold was sent before its time");
    assert_eq!(on_meta().mtime, client.getattr(ino).await.unwrap().mtime);

    // A recall sends it before its ack.
    overwrite(23).await;
    let held = client.getattr(ino).await.unwrap().mtime;
    assert!(held > on_meta().mtime);
    let seq = cluster.state.lock().unwrap().granted[&ino.0];
    let recall = stoa_proto::CapRef { ino, seq };
    cluster.state.lock().unwrap().recalls.push(recall);
    let acked = async {
        while !cluster.state.lock().unwrap().released.contains(&recall) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_millis(900), acked).await.expect("no ack");
    assert_eq!(on_meta().mtime, held, "acked before the held commit reached meta");
    client.release(fh).await.unwrap();
}

/// Small files read whole in inode order: the client fetches the next files' first
/// chunks before they are opened (neighbors.rs), so most of their reads need no chunk
/// read. A fetched chunk is never served across a change: not after another client's
/// write (its cap was recalled first, so the read is under another cap), nor after this
/// client's own write to the file between the fetch and the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_read_in_inode_order_are_fetched_ahead_and_no_change_is_missed() {
    let (cluster, client) = setup().await;
    let mut files = Vec::new();
    for i in 0..20u8 {
        let ino = new_file(&client, format!("f{i}").as_bytes()).await;
        let fh = client.open(ino).await.unwrap();
        client.write(fh, 0, &pattern(4096, i)).await.unwrap();
        client.fsync(fh).await.unwrap();
        client.release(fh).await.unwrap();
        files.push(ino);
    }
    assert!(files.windows(2).all(|w| w[1].0 == w[0].0 + 1), "inodes in order: {files:?}");
    let reads = || cluster.state.lock().unwrap().chunk_reads;
    let read_whole = |ino: InodeId| {
        let client = client.clone();
        async move {
            let fh = client.open(ino).await.unwrap();
            let got = client.read(fh, 0, 8192).await.unwrap();
            client.release(fh).await.unwrap();
            got.to_vec()
        }
    };
    // The first two, in order, start a window over the next sixteen.
    let before = reads();
    for (i, &ino) in files[..2].iter().enumerate() {
        assert!(read_whole(ino).await == pattern(4096, i as u8), "file {i}: other bytes");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reads() < before + 2 + 16 {
        assert!(std::time::Instant::now() < deadline, "the next files were not fetched");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Another client writes file 6: its cap is recalled first, then its data changes.
    let ino = files[6];
    let recall = stoa_proto::CapRef { ino, seq: cluster.state.lock().unwrap().granted[&ino.0] };
    cluster.state.lock().unwrap().recalls.push(recall);
    while !cluster.state.lock().unwrap().released.contains(&recall) {
        assert!(std::time::Instant::now() < deadline, "the recall was never acked");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cluster.state.lock().unwrap().chunks.insert(ChunkId { ino, index: 0 }, pattern(4096, 106));
    // This client writes file 8 after its fetch.
    let fh = client.open(files[8]).await.unwrap();
    client.write(fh, 0, &pattern(4096, 108)).await.unwrap();
    client.fsync(fh).await.unwrap();
    client.release(fh).await.unwrap();

    let before = reads();
    for (i, &ino) in files.iter().enumerate().skip(2) {
        let seed = match i {
            6 | 8 => 100 + i as u8,
            _ => i as u8,
        };
        assert!(read_whole(ino).await == pattern(4096, seed), "file {i}: other bytes");
    }
    // Files 6 and 8 were read again; the window, half used at file 9, fetched the last
    // two; the other fourteen were answered from their fetches.
    assert_eq!(reads() - before, 4);
}
