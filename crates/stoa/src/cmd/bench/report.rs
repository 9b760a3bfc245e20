//! The pure parts of `stoa bench`: medians, rows, the table and CSV, the progress line and
//! the gap clock. Nothing here touches the filesystem under test, so it is unit-tested.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The median of `values` (the mean of the middle two when the count is even).
/// Panics on an empty slice: a row always has at least one repetition.
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "median of no values");
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Operations per second, guarding a zero duration (a clock too coarse for the work).
pub fn rate(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Splits `total` operations over `workers` as evenly as possible; the parts add up.
pub fn split(total: u64, workers: u64) -> Vec<u64> {
    assert!(workers > 0, "split over no workers");
    (0..workers).map(|i| total / workers + u64::from(i < total % workers)).collect()
}

/// One line of the result: a workload's figure in every repetition.
#[derive(Clone, Debug)]
pub struct Row {
    /// Stable machine name, e.g. `create.w8` (scripts match on it).
    pub key: String,
    /// What a person reads, e.g. `create, 8 workers, one dir`.
    pub label: String,
    pub unit: &'static str,
    pub values: Vec<f64>,
    /// The 1-minute load average when the row finished.
    pub loadavg: f64,
    /// The longest time between two completed operations over all repetitions.
    pub max_gap: Duration,
    /// Operations that failed (only workloads that tolerate errors count them).
    pub errors: u64,
}

impl Row {
    pub fn median(&self) -> f64 {
        median(&self.values)
    }
}

/// The 1-minute load average, or NaN where /proc is missing.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A figure with about four significant digits, without noise for large numbers.
pub fn fmt_figure(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The table printed at the end of a run.
pub fn table(rows: &[Row], show_gap: bool) -> String {
    let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(0).max(8);
    let mut out = format!(
        "{:<width$}  {:>10}  {:<8} {:>5}  {:>7}",
        "workload", "median", "unit", "reps", "load1"
    );
    if show_gap {
        out.push_str(&format!("  {:>10}  {:>6}", "max gap ms", "errors"));
    }
    out.push('\n');
    for r in rows {
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:<8} {:>5}  {:>7.2}",
            r.label,
            fmt_figure(r.median()),
            r.unit,
            r.values.len(),
            r.loadavg
        ));
        if show_gap {
            out.push_str(&format!("  {:>10.1}  {:>6}", r.max_gap.as_secs_f64() * 1e3, r.errors));
        }
        out.push('\n');
    }
    out
}

pub const CSV_HEADER: &str = "key,label,unit,median,reps,values,loadavg,max_gap_ms,errors";

/// The rows as CSV. Labels hold commas, so they are quoted (they never hold quotes:
/// they are ours).
pub fn csv(rows: &[Row]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for r in rows {
        let values = r.values.iter().map(|v| format!("{v:.3}")).collect::<Vec<_>>().join(" ");
        out.push_str(&format!(
            "{},\"{}\",{},{:.3},{},{},{:.2},{:.1},{}\n",
            r.key,
            r.label,
            r.unit,
            r.median(),
            r.values.len(),
            values,
            r.loadavg,
            r.max_gap.as_secs_f64() * 1e3,
            r.errors
        ));
    }
    out
}

/// Records the longest time between two completed operations, from any thread. The clock
/// starts when the phase starts, so a phase that never completes anything shows its whole
/// length as the gap.
pub struct GapClock {
    start: Instant,
    last_ns: AtomicU64,
    max_ns: AtomicU64,
    done: AtomicU64,
}

impl GapClock {
    pub fn new() -> GapClock {
        GapClock {
            start: Instant::now(),
            last_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// One operation completed now.
    pub fn tick(&self) {
        self.tick_at(self.now_ns());
    }

    fn tick_at(&self, now: u64) {
        self.done.fetch_add(1, Ordering::Relaxed);
        let prev = self.last_ns.fetch_max(now, Ordering::AcqRel);
        if now > prev {
            self.max_ns.fetch_max(now - prev, Ordering::AcqRel);
        }
    }

    pub fn completed(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// The longest gap so far, counting the time since the last completion as a gap too
    /// (operations that are stuck right now).
    pub fn max_gap(&self) -> Duration {
        let open = self.now_ns().saturating_sub(self.last_ns.load(Ordering::Acquire));
        Duration::from_nanos(self.max_ns.load(Ordering::Acquire).max(open))
    }

    /// The longest gap between completions, ignoring the time since the last one (for a
    /// phase that finished).
    pub fn max_gap_closed(&self) -> Duration {
        Duration::from_nanos(self.max_ns.load(Ordering::Acquire))
    }
}

/// A one-line progress report on stderr: rewritten in place on a terminal, a plain line
/// every few seconds otherwise (logs), nothing at all when quiet.
pub struct Progress {
    label: String,
    total: u64,
    start: Instant,
    last: Instant,
    tty: bool,
    quiet: bool,
}

impl Progress {
    pub fn new(label: &str, total: u64, quiet: bool) -> Progress {
        let now = Instant::now();
        Progress {
            label: label.to_string(),
            total,
            start: now,
            last: now,
            tty: std::io::stderr().is_terminal(),
            quiet,
        }
    }

    /// Reports `done` of the total, at most a few times a second.
    pub fn update(&mut self, done: u64) {
        let every = if self.tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
        if self.quiet || self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let line = progress_line(&self.label, done, self.total, self.start.elapsed());
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { write!(err, "\r{line}\x1b[K") } else { writeln!(err, "{line}") };
    }

    pub fn finish(&mut self) {
        if self.tty && !self.quiet && self.start != self.last {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
        }
    }
}

/// `label: done/total (pct%), elapsed s`.
pub fn progress_line(label: &str, done: u64, total: u64, elapsed: Duration) -> String {
    let pct = if total == 0 { 100.0 } else { 100.0 * done as f64 / total as f64 };
    format!("{label}: {done}/{total} ({pct:.0}%), {:.0} s", elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, values: &[f64]) -> Row {
        Row {
            key: key.into(),
            label: if key.starts_with("create") {
                format!("{key}, label")
            } else {
                format!("{key} label")
            },
            unit: "ops/s",
            values: values.to_vec(),
            loadavg: 1.5,
            max_gap: Duration::from_millis(12),
            errors: 0,
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[1.0, 100.0, 2.0]), 2.0, "an outlier does not move it");
    }

    #[test]
    #[should_panic(expected = "median of no values")]
    fn median_of_nothing_is_a_bug() {
        median(&[]);
    }

    #[test]
    fn split_adds_up_and_is_even() {
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(10_000, 8).iter().sum::<u64>(), 10_000);
        assert_eq!(split(2, 8).iter().sum::<u64>(), 2);
        let parts = split(1001, 8);
        assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
    }

    #[test]
    fn rate_counts_per_second() {
        assert_eq!(rate(500, Duration::from_millis(250)), 2000.0);
        assert!(rate(1, Duration::ZERO).is_finite());
    }

    #[test]
    fn table_has_a_line_per_row_and_aligned_columns() {
        let rows = vec![row("create.w1", &[100.0, 300.0, 200.0]), row("seq.write", &[12.345])];
        let t = table(&rows, false);
        let lines: Vec<_> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].contains("create.w1, label") && lines[1].contains(" 200 "), "{t}");
        assert!(lines[2].contains("12.3"), "{t}");
        assert_eq!(lines[1].find("ops/s"), lines[2].find("ops/s"), "units line up:\n{t}");
        assert!(table(&rows, true).lines().nth(1).unwrap().contains("12.0"));
    }

    #[test]
    fn csv_has_header_and_median() {
        let c = csv(&[row("stat.w8", &[1.0, 2.0, 9.0])]);
        let mut lines = c.lines();
        assert_eq!(lines.next(), Some(CSV_HEADER));
        let line = lines.next().unwrap();
        assert!(line.starts_with("stat.w8,\"stat.w8 label\",ops/s,2.000,3,"), "{line}");
        let fields: Vec<_> = line.split(',').collect();
        assert_eq!(fields.len(), CSV_HEADER.split(',').count());
        assert_eq!(fields[5], "1.000 2.000 9.000");
    }

    #[test]
    fn figures_keep_about_four_digits() {
        assert_eq!(fmt_figure(12345.6), "12346");
        assert_eq!(fmt_figure(45.67), "45.7");
        assert_eq!(fmt_figure(0.1234), "0.12");
        assert_eq!(fmt_figure(f64::NAN), "-");
    }

    #[test]
    fn gap_clock_keeps_the_longest_gap() {
        let g = GapClock::new();
        g.tick_at(10);
        g.tick_at(30);
        g.tick_at(25); // A completion reported late by another thread is not a gap.
        g.tick_at(130);
        assert_eq!(g.max_gap_closed(), Duration::from_nanos(100));
        assert_eq!(g.completed(), 4);
    }

    #[test]
    fn progress_line_shows_fraction() {
        let l = progress_line("create", 50, 200, Duration::from_secs(3));
        assert_eq!(l, "create: 50/200 (25%), 3 s");
        assert!(progress_line("x", 0, 0, Duration::ZERO).contains("100%"));
    }
}
