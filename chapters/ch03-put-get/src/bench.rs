//! The pieces of the p2p benchmark that need no GPU: message sizes, how many operations one
//! timed sample holds, statistics, picking the best launch shape, the CSV formats.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Message sizes: 16 KiB to 1 GiB in steps of x4.
pub fn sizes() -> Vec<usize> {
    std::iter::successors(Some(16usize << 10), |&s| Some(s * 4))
        .take_while(|&s| s <= 1 << 30)
        .collect()
}

/// Operations per timed sample: enough that one sample moves ~256 MiB (small messages) but
/// at least 1 and at most 100 (so a graph of them instantiates quickly).
pub fn ops_per_sample(num_bytes: usize) -> usize {
    (256usize << 20).div_ceil(num_bytes.max(1)).clamp(1, 100)
}

/// Median of the samples (they are sorted in place); NaN for none.
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let mid = samples.len() / 2;
    if !samples.len().is_multiple_of(2) {
        samples[mid]
    } else {
        (samples[mid - 1] + samples[mid]) / 2.0
    }
}

// ANCHOR: bandwidth
/// Bandwidth as this project quotes it: bytes moved by one operation / its time, in
/// GB/s (10^9 bytes per second). `us` is the time of one operation in microseconds.
pub fn gb_per_s(num_bytes: usize, us: f64) -> f64 {
    num_bytes as f64 / (us * 1e-6) / 1e9
}
// ANCHOR_END: bandwidth

/// `h200` for "NVIDIA H200", `h100` for "NVIDIA H100 80GB HBM3": the file-name tag of a GPU.
pub fn gpu_tag(name: &str) -> String {
    let tag: String = name
        .split_whitespace()
        .find(|word| !word.eq_ignore_ascii_case("nvidia"))
        .unwrap_or("gpu")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_lowercase();
    if tag.is_empty() { "gpu".into() } else { tag }
}

/// One CSV row: `method,num_bytes,gb_per_s,us`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub method: String,
    pub num_bytes: usize,
    pub gb_per_s: f64,
    pub us: f64,
}

impl Row {
    /// The row of `method` moving `num_bytes` in `us` microseconds per operation.
    pub fn new(method: &str, num_bytes: usize, us: f64) -> Self {
        Self {
            method: method.into(),
            num_bytes,
            gb_per_s: gb_per_s(num_bytes, us),
            us,
        }
    }
}

/// The order of methods in the CSV: bandwidth, one per implementation, then latency.
pub const METHODS: [&str; 8] = [
    "nvshmem_put",
    "bulk_put",
    "store",
    "copy_engine",
    "copy_engine_local",
    "nccl",
    "put_signal_pingpong",
    "nccl_pingpong",
];

/// Sorts rows by method (in [`METHODS`] order, unknown methods last), then by size.
pub fn sort_rows(rows: &mut [Row]) {
    let rank = |method: &str| METHODS.iter().position(|m| *m == method);
    rows.sort_by_key(|r| (rank(&r.method).unwrap_or(usize::MAX), r.num_bytes));
}

/// `16384 B: store 10.3 GB/s (1.6 us), ...`: every row of one size, for the log.
pub fn size_line(rows: &[Row], num_bytes: usize) -> String {
    let line: Vec<String> = rows
        .iter()
        .filter(|r| r.num_bytes == num_bytes)
        .map(|r| format!("{} {:.1} GB/s ({:.1} us)", r.method, r.gb_per_s, r.us))
        .collect();
    format!("{num_bytes:>10} B: {}", line.join(", "))
}

/// One timed launch shape of one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    /// The implementation, as in [`METHODS`].
    pub method: &'static str,
    /// Which threads share one call or one chunk: `warp`, `block`, `grid`.
    pub scope: &'static str,
    pub num_blocks: u32,
    pub threads_per_block: u32,
    pub num_bytes: usize,
    /// Time of one operation.
    pub us: f64,
}

/// The fastest point of `method` at `num_bytes`, if the sweep has one.
pub fn best<'s>(sweep: &'s [SweepPoint], method: &str, num_bytes: usize) -> Option<&'s SweepPoint> {
    sweep
        .iter()
        .filter(|p| p.method == method && p.num_bytes == num_bytes)
        .min_by(|a, b| a.us.total_cmp(&b.us))
}

/// `method: best launch shape per size (...): 16384:warp:8x256 ...`, a CSV comment.
pub fn best_shapes_comment(sweep: &[SweepPoint], method: &str, sizes: &[usize]) -> String {
    let shapes: Vec<String> = sizes
        .iter()
        .filter_map(|&num_bytes| best(sweep, method, num_bytes))
        .map(|p| {
            let (blocks, threads) = (p.num_blocks, p.threads_per_block);
            format!("{}:{}:{blocks}x{threads}", p.num_bytes, p.scope)
        })
        .collect();
    format!(
        "{method}: best launch shape per size (bytes:scope:blocks x threads): {}",
        shapes.join(" ")
    )
}

/// The sweep CSV: a comment, the header, one line per point.
pub fn sweep_csv(sweep: &[SweepPoint]) -> String {
    let mut text = String::from("# launch-shape sweep of the kernels (same timing as p2p csv)\n");
    text.push_str("method,scope,num_blocks,threads_per_block,num_bytes,gb_per_s,us\n");
    for p in sweep {
        let (blocks, threads, num_bytes) = (p.num_blocks, p.threads_per_block, p.num_bytes);
        let gb_per_s = gb_per_s(num_bytes, p.us);
        let _ = writeln!(
            text,
            "{},{},{blocks},{threads},{num_bytes},{gb_per_s:.3},{:.3}",
            p.method, p.scope, p.us
        );
    }
    text
}

/// The CSV text: `# ` comment lines, the header, the rows.
pub fn csv(comments: &[String], rows: &[Row]) -> String {
    let mut text = String::new();
    for line in comments {
        for part in line.lines() {
            let _ = writeln!(text, "# {part}");
        }
    }
    text.push_str("method,num_bytes,gb_per_s,us\n");
    for row in rows {
        let _ = writeln!(
            text,
            "{},{},{:.3},{:.3}",
            row.method, row.num_bytes, row.gb_per_s, row.us
        );
    }
    text
}

/// "12.8" from cuDriverGetVersion's 12080.
pub fn cuda_version_string(code: i32) -> String {
    format!("{}.{}", code / 1000, (code % 1000) / 10)
}

/// `/proc/driver/nvidia/version`'s "Kernel Module  570.124.06" (or "unknown").
pub fn driver_version(proc_text: Option<&str>) -> String {
    proc_text
        .and_then(|text| {
            let line = text.lines().next()?;
            line.split_whitespace()
                .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// "2026-11-22 19:13 UTC" for `unix_secs` seconds after 1970-01-01 00:00 UTC: the `date:`
/// line every results CSV carries, which the book quotes beside the numbers.
pub fn utc_minute(unix_secs: u64) -> String {
    let (days, secs) = (unix_secs / 86_400, unix_secs % 86_400);
    // Civil date from days since the epoch (Howard Hinnant's `civil_from_days`).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// The `driver:` line of a results CSV: the kernel module's version (from
/// /proc/driver/nvidia/version) and the CUDA driver API's, "driver: 580.1; CUDA driver API 13.0".
pub fn driver_line() -> Result<String, cudarc::driver::DriverError> {
    let mut cuda = 0;
    // SAFETY: writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut cuda) }.result()?;
    let proc_text = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
    Ok(format!(
        "driver: {}; CUDA driver API {}",
        driver_version(proc_text.as_deref()),
        cuda_version_string(cuda)
    ))
}

/// The `#` lines every benchmark's results CSV starts with: the GPUs, the date, the driver
/// and the kernels' build, NVSHMEM's version.
pub fn machine_lines(
    world: &ch01_bootstrap::World,
) -> Result<Vec<String>, cudarc::driver::DriverError> {
    Ok(vec![
        format!("gpu: {} x {}", world.context().name()?, world.n_pes()),
        date_line(),
        format!(
            "{}; kernels: nvcc 13.0, {:?}",
            driver_line()?,
            kernels::BUILT_ARCHS
        ),
        format!("nvshmem: {}", world.nvshmem().version()),
    ])
}

/// The `date:` line of a results CSV: now, to the minute.
pub fn date_line() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("date: {}", utc_minute(now))
}

/// `dir/p2p_<tag>.<ext>`.
pub fn result_path(dir: &Path, tag: &str, suffix: &str) -> PathBuf {
    dir.join(format!("p2p_{tag}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_run_16k_to_1g_by_four() {
        let s = sizes();
        assert_eq!(s.first(), Some(&(16 << 10)));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert_eq!(s.len(), 9);
        assert!(s.windows(2).all(|w| w[1] == 4 * w[0]));
    }

    #[test]
    fn samples_hold_enough_operations() {
        assert_eq!(ops_per_sample(16 << 10), 100);
        assert_eq!(ops_per_sample(16 << 20), 16);
        assert_eq!(ops_per_sample(1 << 30), 1);
        assert_eq!(ops_per_sample(0), 100);
    }

    #[test]
    fn utc_minutes_are_civil_dates() {
        assert_eq!(utc_minute(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_minute(951_782_400), "2000-02-29 00:00 UTC");
        // 2026-11-22 19:13 UTC, the P2P run of record.
        assert_eq!(utc_minute(1_795_374_780), "2026-11-22 19:13 UTC");
        assert!(date_line().starts_with("date: 20"));
    }

    #[test]
    fn median_and_bandwidth() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
        // 1 GB in 2500 us = 400 GB/s (bytes / time, decimal GB).
        assert!((gb_per_s(1_000_000_000, 2500.0) - 400.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_tags_and_versions() {
        assert_eq!(gpu_tag("NVIDIA H200"), "h200");
        assert_eq!(gpu_tag("NVIDIA H100 80GB HBM3"), "h100");
        assert_eq!(gpu_tag(""), "gpu");
        assert_eq!(cuda_version_string(12080), "12.8");
        assert_eq!(cuda_version_string(13000), "13.0");
        let proc_text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Thu Mar 20 2025\nGCC version: 12";
        assert_eq!(driver_version(Some(proc_text)), "570.124.06");
        assert_eq!(driver_version(None), "unknown");
    }

    #[test]
    fn csv_has_comments_header_and_rows() {
        let text = csv(
            &["gpu: NVIDIA H200".into(), "two\nlines".into()],
            &[Row {
                method: "put".into(),
                num_bytes: 16384,
                gb_per_s: 12.3456,
                us: 1.25,
            }],
        );
        assert_eq!(
            text,
            "# gpu: NVIDIA H200\n# two\n# lines\nmethod,num_bytes,gb_per_s,us\nput,16384,12.346,1.250\n"
        );
    }

    #[test]
    fn rows_sort_by_method_then_size() {
        let mut rows = vec![
            Row::new("nccl", 2, 1.0),
            Row::new("mystery", 1, 1.0),
            Row::new("nvshmem_put", 2, 1.0),
            Row::new("nvshmem_put", 1, 1.0),
        ];
        sort_rows(&mut rows);
        let order: Vec<(&str, usize)> = rows
            .iter()
            .map(|r| (r.method.as_str(), r.num_bytes))
            .collect();
        assert_eq!(
            order,
            [
                ("nvshmem_put", 1),
                ("nvshmem_put", 2),
                ("nccl", 2),
                ("mystery", 1)
            ]
        );
        assert_eq!(
            size_line(&rows, 2),
            "         2 B: nvshmem_put 0.0 GB/s (1.0 us), nccl 0.0 GB/s (1.0 us)"
        );
    }

    #[test]
    fn the_best_shape_is_the_fastest_of_its_method_and_size() {
        let point = |method, num_blocks, num_bytes, us| SweepPoint {
            method,
            scope: "warp",
            num_blocks,
            threads_per_block: 256,
            num_bytes,
            us,
        };
        let sweep = [
            point("nvshmem_put", 8, 16, 3.0),
            point("nvshmem_put", 16, 16, 2.0),
            point("bulk_put", 32, 16, 1.0),
            point("nvshmem_put", 32, 64, 0.5),
        ];
        assert_eq!(best(&sweep, "nvshmem_put", 16).unwrap().num_blocks, 16);
        assert!(best(&sweep, "store", 16).is_none());
        assert_eq!(
            best_shapes_comment(&sweep, "nvshmem_put", &[16, 64]),
            "nvshmem_put: best launch shape per size (bytes:scope:blocks x threads): \
             16:warp:16x256 64:warp:32x256"
        );
        assert_eq!(
            sweep_csv(&sweep[2..3]),
            "# launch-shape sweep of the kernels (same timing as p2p csv)\n\
             method,scope,num_blocks,threads_per_block,num_bytes,gb_per_s,us\n\
             bulk_put,warp,32,256,16,0.016,1.000\n"
        );
    }
}
