//! The pieces of the p2p benchmark that need no GPU: message sizes, how many operations one
//! timed sample holds, statistics, the CSV format, and finding NCCL.

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

/// "2.28.9" from NCCL's version code (22809; codes below 10000 use the old 1000-based form).
pub fn nccl_version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// "12.8" from cuDriverGetVersion's 12080.
pub fn cuda_version_string(code: i32) -> String {
    format!("{}.{}", code / 1000, (code % 1000) / 10)
}

// ANCHOR: nccl_probe
/// `Ok` when cudarc will find NCCL; otherwise the reason and the fix. cudarc opens NCCL on
/// first use and panics when none of its candidate names (`libnccl.so`, `libnccl.so.13`, ...)
/// opens; NCCL's pip wheel ships only `libnccl.so.2`, which is not among them. Trying the
/// same names first turns that panic into a message.
pub fn probe_nccl() -> Result<(), String> {
    let mut reasons = Vec::new();
    for name in cudarc::get_lib_name_candidates("nccl") {
        // SAFETY: NCCL's initialisers only set up its own state.
        match unsafe { libloading::Library::new(&name) } {
            Ok(_) => return Ok(()),
            Err(e) => reasons.push(format!("{name}: {e}")),
        }
    }
    Err(nccl_missing_message(&reasons))
}

pub fn nccl_missing_message(reasons: &[String]) -> String {
    format!(
        "NCCL could not be opened ({}{}). cudarc looks for libnccl.so, but the NCCL wheel ships \
         libnccl.so.2: make a directory with a symlink libnccl.so -> .../nvidia/nccl/lib/libnccl.so.2 \
         and put it first on LD_LIBRARY_PATH (benchmarks/run_p2p.sh does this)",
        reasons
            .iter()
            .take(2)
            .cloned()
            .collect::<Vec<_>>()
            .join("; "),
        match reasons.len() {
            0..=2 => String::new(),
            n => format!("; {} more names tried", n - 2),
        }
    )
}
// ANCHOR_END: nccl_probe

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
        assert_eq!(nccl_version_string(22809), "2.28.9");
        assert_eq!(nccl_version_string(2708), "2.7.8");
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
    fn missing_nccl_message_gives_the_fix() {
        let msg = nccl_missing_message(&["libnccl.so: not found".into()]);
        assert!(msg.contains("libnccl.so: not found"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }
}
