//! The data path under chunk-server failures, on real processes: a stopped server leaves
//! its chains and wakes up unable to serve or accept anything stale; a server gone too
//! long has its replicas rebuilt on the others, and its old copies are swept when it
//! returns; a flipped byte on disk is found by the scrubber and repaired from a peer; a
//! full cluster answers ENOSPC, keeps what it had and takes writes again once files go;
//! deleted files leave no chunk file behind on any server.

mod common;

use bytes::Bytes;
use common::{eventually, pattern, statvfs, Dev};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stoa_net::{MetaClient, Pool};
use stoa_proto::{
    ChunkOp, ChunkRequest, ChunkResponse, MetaOp, MetaRequest, MetaResponse, Request, Response,
};
use stoa_types::{Chain, ChainTable, ChunkId, FsError, InodeId, NodeId, RequestId, SessionId};

const CHUNK_BYTES: usize = 4 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn addr_of(node: &serde_json::Value) -> SocketAddr {
    node["addr"].as_str().unwrap().parse().unwrap()
}

/// Meta's chain table, asked of the meta replicas directly.
fn chain_table(dev: &Dev) -> ChainTable {
    let metas: Vec<SocketAddr> = dev.cluster_file()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "meta")
        .map(addr_of)
        .collect();
    let client = MetaClient::new(Pool::new(), metas, Duration::from_secs(5));
    let req =
        MetaRequest { session: SessionId(0), req_id: RequestId(0), op: MetaOp::GetChainTable };
    match runtime().block_on(client.call(req)).unwrap() {
        MetaResponse::ChainTable(table) => table,
        other => panic!("GetChainTable answered {other:?}"),
    }
}

/// The node id meta gave the chunk server `stoa dev` calls `id`.
fn chunk_node(dev: &Dev, id: u64) -> NodeId {
    let addr = addr_of(&dev.node("chunk", id));
    let table = chain_table(dev);
    table.nodes.iter().find(|n| n.addr == addr).map(|n| n.id).expect("chunk server is known")
}

/// One chunk request straight to a chunk server, as a client or peer would send it.
fn chunk_call(
    addr: SocketAddr,
    chain: &Chain,
    op: ChunkOp,
    payload: &[u8],
) -> Result<Bytes, FsError> {
    let req = Request::Chunk(ChunkRequest {
        chain: chain.id,
        chain_version: chain.version,
        op,
        deadline_ms: 0,
    });
    let pool = Pool::new();
    let call = pool.call(addr, &req, Bytes::copy_from_slice(payload), Duration::from_secs(5));
    match runtime().block_on(call)? {
        (Response::Chunk(ChunkResponse::Data), data) => Ok(data),
        (Response::Chunk(ChunkResponse::Written { .. }), _) => Ok(Bytes::new()),
        (other, _) => panic!("chunk server answered {other:?}"),
    }
}

fn write_synced(path: &Path, seed: u64, len: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&pattern(seed, 0, len)).unwrap();
    f.sync_all().unwrap();
}

/// Every file (chunk files, unfinished installs) under a chunk server's data directory.
fn chunk_files(data_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(fans) = std::fs::read_dir(data_dir.join("chunks")) else { return out };
    for fan in fans.flatten() {
        for entry in std::fs::read_dir(fan.path()).into_iter().flatten().flatten() {
            out.push(entry.path());
        }
    }
    out
}

/// Every chunk file (`<chunk id>.chunk`: headers and data) under a chunk server's data
/// directory.
fn chunks_held(data_dir: &Path) -> Vec<PathBuf> {
    let mut out = chunk_files(data_dir);
    out.retain(|p| p.extension().is_some_and(|e| e == "chunk"));
    out
}

fn data_dir(dev: &Dev, id: u64) -> PathBuf {
    PathBuf::from(dev.node("chunk", id)["data_dir"].as_str().unwrap())
}

/// Every file (chunk files, unfinished installs) of a chunk of `ino` on chunk servers
/// 1..=`servers`.
fn chunk_files_of(dev: &Dev, servers: u64, ino: u64) -> Vec<PathBuf> {
    let prefix = format!("{ino:016x}-");
    let mut out: Vec<PathBuf> =
        (1..=servers).flat_map(|id| chunk_files(&data_dir(dev, id))).collect();
    out.retain(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)));
    out
}

#[test]
fn a_stopped_chunk_server_leaves_its_chains_and_wakes_up_unable_to_serve_stale_data() {
    let mut dev = Dev::start(1, 3);
    let path = dev.mnt.join("file");
    let len = CHUNK_BYTES + CHUNK_BYTES / 2;
    write_synced(&path, 1, len);
    let ino = InodeId(std::fs::metadata(&path).unwrap().ino());
    let victim = chunk_node(&dev, 2);
    let victim_addr = addr_of(&dev.node("chunk", 2));
    let before = chain_table(&dev);

    dev.signal("chunk", 2, libc::SIGSTOP);
    let stopped = Instant::now();
    eventually(20, "the stopped server has left every chain", || {
        chain_table(&dev).chains.iter().all(|c| !c.write_path().any(|n| n == victim))
    });
    println!("the stopped server left its chains after {:.2} s", stopped.elapsed().as_secs_f64());
    // Writes go on without it.
    write_synced(&path, 2, len);
    dev.signal("chunk", 2, libc::SIGCONT);

    // Whatever it knew before it stopped, it can no longer serve or accept.
    for index in 0..2 {
        let chunk = ChunkId { ino, index };
        let old = before.chain_for(chunk).unwrap();
        let read = chunk_call(victim_addr, old, ChunkOp::Read { chunk, offset: 0, len: 4096 }, b"");
        assert!(
            matches!(read, Err(FsError::Unavailable(_) | FsError::StaleChain { .. })),
            "a read under the old chain version answered {read:?}"
        );
        let write = ChunkOp::Write { chunk, offset: 0, version: None, id: None, durable: false };
        let wrote = chunk_call(victim_addr, old, write, b"stale");
        assert!(
            matches!(wrote, Err(FsError::Unavailable(_) | FsError::StaleChain { .. })),
            "a write under the old chain version answered {wrote:?}"
        );
    }

    // It resyncs what changed and rejoins; then it serves the new data.
    dev.wait_healthy(40);
    let got = std::fs::read(&path).unwrap();
    let want = pattern(2, 0, len);
    let first = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(got == want, "file differs after rejoin: len {} first diff {first:?}", got.len());
    let now = chain_table(&dev);
    for index in 0..2u64 {
        let chunk = ChunkId { ino, index };
        let chain = now.chain_for(chunk).unwrap();
        assert!(chain.members.contains(&victim), "server is back in chain {}", chain.id);
        let data =
            chunk_call(victim_addr, chain, ChunkOp::Read { chunk, offset: 0, len: 4096 }, b"")
                .unwrap();
        let at = index * CHUNK_BYTES as u64;
        assert!(data == pattern(2, at, 4096), "the rejoined replica of chunk {index} is stale");
    }
    dev.stop();
}

#[test]
fn a_server_gone_too_long_is_rebuilt_elsewhere_and_swept_when_it_returns() {
    let mut dev =
        Dev::start_with(1, 4, &["--rebuild-after-secs=2", "--scrub-bytes-per-sec=268435456"]);
    let files = 3;
    let len = CHUNK_BYTES + 1000;
    for i in 0..files {
        write_synced(&dev.mnt.join(format!("f{i}")), 10 + i, len);
    }
    let chunks = files as usize * 2;
    let victim = chunk_node(&dev, 4);
    dev.kill9("chunk", 4);
    eventually(40, "every chain is whole again without the dead server", || {
        chain_table(&dev)
            .chains
            .iter()
            .all(|c| c.members.len() == 3 && c.syncing.is_empty() && !c.members.contains(&victim))
    });
    for i in 0..files {
        let data = std::fs::read(dev.mnt.join(format!("f{i}"))).unwrap();
        assert!(data == pattern(10 + i, 0, len), "f{i} differs after the rebuild");
    }
    let held: usize = (1..=3).map(|id| chunks_held(&data_dir(&dev, id)).len()).sum();
    assert_eq!(held, 3 * chunks, "every chunk is on exactly three live servers");
    // Heartbeats carry the backlog, so status shows it a beat later.
    eventually(10, "status shows no repair backlog", || {
        let status = dev.status();
        let copied: Vec<u64> = status["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["repair"]["copied_chunks"].as_u64().unwrap())
            .collect();
        println!("chunks copied per server: {copied:?}");
        status["repair_backlog"]["chunks"] == 0 && status["repair_backlog"]["bytes"] == 0
    });

    // Back after its chains were rebuilt: it is not needed there, and its copies go.
    assert!(!chunks_held(&data_dir(&dev, 4)).is_empty());
    dev.restart_node("chunk", 4);
    eventually(30, "the returning server dropped its old copies", || {
        chunks_held(&data_dir(&dev, 4)).is_empty()
    });
    dev.stop();
}

#[test]
fn a_flipped_byte_on_disk_is_found_and_repaired_by_the_scrubber() {
    let mut dev = Dev::start_with(1, 3, &["--scrub-bytes-per-sec=268435456"]);
    let path = dev.mnt.join("scrubbed");
    let len = 300_000;
    write_synced(&path, 7, len);
    let ino = InodeId(std::fs::metadata(&path).unwrap().ino());
    let name = ChunkId { ino, index: 0 }.to_string();
    let data_file = chunks_held(&data_dir(&dev, 1))
        .into_iter()
        .find(|p| p.file_stem().is_some_and(|s| s.to_string_lossy() == name))
        .expect("chunk server 1 holds the chunk");
    let good = std::fs::read(&data_file).unwrap();
    let mut bad = good.clone();
    // The data ends the file, after the chunk's headers.
    bad[good.len() - len + 123_456] ^= 0x20;
    std::fs::write(&data_file, &bad).unwrap();

    // A reader never sees it, whichever replica it asks.
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    assert!(std::fs::read(&path).unwrap() == pattern(7, 0, len), "the reader got damaged data");
    eventually(30, "the scrubber repaired the replica", || {
        std::fs::read(&data_file).unwrap() == good
    });
    eventually(10, "status shows the damage found and repaired", || {
        let status = dev.status();
        let sum = |key: &str| -> u64 {
            let servers = status["chunk"].as_array().unwrap();
            servers.iter().map(|c| c["repair"][key].as_u64().unwrap()).sum()
        };
        sum("corrupt_found") >= 1 && sum("corrupt_repaired") >= 1
    });
    dev.stop();
}

#[test]
fn a_full_cluster_answers_enospc_keeps_what_it_had_and_takes_writes_after_a_delete() {
    // Every chunk server keeps all but `room` of this machine's free space, so the three
    // of them (one disk here) fill up after about a third of `room` of file data.
    let room: u64 = 300 << 20;
    let st = statvfs(&std::env::temp_dir());
    let free = st.f_bavail * st.f_frsize;
    assert!(free > room + (1 << 30), "this test needs more than 1.3 GiB free, not {free}");
    let reserve = format!("--reserve-bytes={}", free - room);
    let dev = Dev::start_with(3, 3, &[&reserve]);
    let kept = dev.mnt.join("kept");
    write_synced(&kept, 7, CHUNK_BYTES);

    // Fill it from a thread, so that a hang fails the test instead of stalling it.
    let big = dev.mnt.join("big");
    let (done, finished) = std::sync::mpsc::channel();
    let fill = big.clone();
    std::thread::spawn(move || {
        let mut f = std::fs::File::create(&fill).unwrap();
        let piece = pattern(9, 0, 1 << 20);
        let mut written = 0u64;
        let result = loop {
            if let Err(e) = f.write_all(&piece).and_then(|()| f.sync_data()) {
                break Err((written, e));
            }
            written += piece.len() as u64;
            if written > room {
                break Ok(written);
            }
        };
        let _ = done.send(result);
    });
    let result = finished.recv_timeout(Duration::from_secs(120)).expect("filling hung");
    let (written, err) = result.expect_err("wrote more than the room left without an error");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "filling failed with {err}, not ENOSPC");
    eprintln!("full after {} MiB of file data: {err}", written >> 20);

    // Full, it still serves reads, and what was fsynced before is intact.
    assert_eq!(std::fs::read(&kept).unwrap(), pattern(7, 0, CHUNK_BYTES));
    assert!(dev.status()["meta"]["leader"].as_u64().is_some(), "no meta leader while full");

    // Deleting frees the space on every replica, and writes work again.
    std::fs::remove_file(&big).unwrap();
    let freed = Instant::now();
    let after = dev.mnt.join("after");
    eventually(90, "a write succeeds again after the delete", || {
        let mut f = std::fs::File::create(&after).unwrap();
        f.write_all(&pattern(3, 0, CHUNK_BYTES)).and_then(|()| f.sync_all()).is_ok()
    });
    eprintln!("writes work again {:.1} s after the delete", freed.elapsed().as_secs_f64());
    assert_eq!(std::fs::read(&after).unwrap(), pattern(3, 0, CHUNK_BYTES));
    assert_eq!(std::fs::read(&kept).unwrap(), pattern(7, 0, CHUNK_BYTES));
}

#[test]
fn deleted_files_leave_no_chunk_files_behind() {
    let mut dev = Dev::start_with(3, 3, &["--sweep-secs=1"]);
    let started = Instant::now();
    let ino = |path: &Path| std::fs::metadata(path).unwrap().ino();
    // Cut short before its deletion: its chunks 1 and 2 become tombstones, beyond the
    // size the garbage collector will see.
    let cut = dev.mnt.join("cut");
    write_synced(&cut, 21, 3 * CHUNK_BYTES);
    let file = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
    file.set_len(1 << 20).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let gone = dev.mnt.join("gone");
    write_synced(&gone, 22, CHUNK_BYTES + 4096);
    let kept = dev.mnt.join("kept");
    let kept_len = 3 * CHUNK_BYTES;
    write_synced(&kept, 23, kept_len);
    let (cut_ino, gone_ino, kept_ino) = (ino(&cut), ino(&gone), ino(&kept));
    let tombstones =
        (1..3).map(|i| format!("{}.chunk", ChunkId { ino: InodeId(cut_ino), index: i }));
    let cut_files = chunk_files_of(&dev, 3, cut_ino);
    for name in tombstones {
        let found = cut_files.iter().filter(|p| p.ends_with(&name)).count();
        assert_eq!(found, 3, "a tombstone {name} on every replica after the truncate");
    }

    std::fs::remove_file(&cut).unwrap();
    std::fs::remove_file(&gone).unwrap();
    let deleted = Instant::now();
    eventually(60, "no chunk file of the deleted files is left on any server", || {
        chunk_files_of(&dev, 3, cut_ino).is_empty() && chunk_files_of(&dev, 3, gone_ino).is_empty()
    });
    println!(
        "the deleted files' chunk files were gone {:.1} s after the deletes",
        deleted.elapsed().as_secs_f64()
    );

    // The live file keeps its three chunk files on all three servers, and reads back
    // intact from them.
    assert_eq!(chunk_files_of(&dev, 3, kept_ino).len(), 3 * 3);
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    assert!(std::fs::read(&kept).unwrap() == pattern(23, 0, kept_len), "the live file differs");
    dev.stop();
    println!("test took {:.1} s", started.elapsed().as_secs_f64());
}
