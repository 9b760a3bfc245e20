//! `stoa bench --quick` runs end to end on a mounted `stoa dev` cluster, prints a row for
//! every workload group with a positive figure, writes the CSV, and leaves nothing behind.
//! Sizes are cut further than --quick so the test stays well under a minute.

mod common;

use common::{Dev, STOA};
use std::process::Command;

#[test]
fn stoa_bench_quick_measures_a_dev_mount_and_cleans_up() {
    let dev = Dev::start(1, 1);
    let csv = dev.dir.join("../bench.csv");
    let out = Command::new(STOA)
        .arg("bench")
        .arg(&dev.mnt)
        .args(["--quick", "--reps", "1", "--workers", "1,2", "--files", "20", "--dirs", "5"])
        .args(["--seq-mib", "2", "--rand-mib", "1", "--rand-ops", "20", "--small-files", "10"])
        .args(["--study-ops", "100", "--quiet", "--gap", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stoa bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for label in [
        "seq write",
        "4k random read",
        "create (20 in one dir), 2 workers",
        "readdir",
        "small files",
        "study",
    ] {
        assert!(stdout.contains(label), "no `{label}` row:\n{stdout}");
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<_> = text.lines().skip(1).collect();
    assert!(rows.len() >= 20, "expected every figure in the CSV:\n{text}");
    for row in &rows {
        let median: f64 = row.rsplit(',').nth(5).unwrap().parse().unwrap();
        assert!(median > 0.0, "a zero figure: {row}");
    }
    let left: Vec<_> = std::fs::read_dir(&dev.mnt).unwrap().collect();
    assert!(left.is_empty(), "stoa bench left files behind: {left:?}");
}
