//! The generated `contract.cuh` holds the kernels to the Rust layouts: it compiles as
//! generated, and a C++ side that drifts from the Rust declaration (fields swapped, a field
//! of another width) does not.

use std::path::PathBuf;
use std::process::Command;

use crate::contract::{self, Failure};

/// Compiles `header` (as `contract.cuh`) with a source that includes it; nvcc's stderr on
/// failure.
fn compile(test: &str, header: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kernels-contract-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("contract.cuh"), header).unwrap();
    let source: PathBuf = dir.join("use.cu");
    std::fs::write(
        &source,
        "#include \"contract.cuh\"\n__global__ void k(contract::Workspace) {}\n",
    )
    .unwrap();
    let output = Command::new(env!("KERNELS_NVCC"))
        .args(["-std=c++17", "-arch=sm_90", "-c", "-I"])
        .arg(&dir)
        .arg(&source)
        .arg("-o")
        .arg(dir.join("use.o"))
        .output()
        .expect("running nvcc");
    let _ = std::fs::remove_dir_all(&dir);
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// `header` with the declaration lines of fields `a` and `b` of `struct name` swapped.
fn swap_fields(header: &str, name: &str, a: &str, b: &str) -> String {
    let start = header.find(&format!("struct {name} {{")).unwrap();
    let end = start + header[start..].find("};").unwrap();
    let mut lines: Vec<String> = header[start..end].lines().map(String::from).collect();
    let find = |lines: &[String], field: &str| {
        lines
            .iter()
            .position(|l| {
                !l.trim_start().starts_with("//") && l.trim_end().ends_with(&format!(" {field};"))
            })
            .unwrap_or_else(|| panic!("no field {field} in struct {name}"))
    };
    let (i, j) = (find(&lines, a), find(&lines, b));
    lines.swap(i, j);
    format!(
        "{}{}{}",
        &header[..start],
        lines.join("\n") + "\n",
        &header[end..]
    )
}

#[test]
fn the_generated_header_compiles() {
    compile("as-generated", &contract::c_header()).unwrap();
}

#[test]
fn a_swapped_field_does_not_build() {
    let header = swap_fields(
        &contract::c_header(),
        "Workspace",
        "timeout_cycles",
        "my_pe",
    );
    let err = compile("swapped", &header).expect_err("a swapped field built");
    assert!(err.contains("Workspace::"), "{err}");
    assert!(err.contains("offset differs from the Rust struct"), "{err}");
}

#[test]
fn a_field_of_another_width_does_not_build() {
    let header =
        contract::c_header().replacen("    int num_channels;", "    int64_t num_channels;", 1);
    assert_ne!(
        header,
        contract::c_header(),
        "the test no longer finds the field it widens"
    );
    let err = compile("wider", &header).expect_err("a wider field built");
    assert!(err.contains("differs from the Rust struct"), "{err}");
}

#[test]
fn every_failure_code_decodes_to_its_own_kind_and_no_other() {
    for &kind in Failure::ALL {
        assert_eq!(Failure::from_code(kind as u64), Ok(kind));
        assert!(
            !kind.meaning().is_empty()
                && kind
                    .device_name()
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
        );
    }
    assert_eq!(Failure::from_code(0), Err(0));
    // Past the largest code (the codes have gaps: chapter 5's start at 20).
    let past = Failure::ALL.iter().map(|&k| k as u64).max().unwrap() + 1;
    assert_eq!(Failure::from_code(past), Err(past));
}
