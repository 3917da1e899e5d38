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
    // Fields of one type too: what a hand-ordered parameter list would get wrong unseen.
    let swaps = [
        ("Workspace", "timeout_cycles", "my_pe"),
        ("LayoutArgs", "num_tokens_per_rank", "num_tokens_per_expert"),
        ("NotifyPrepareArgs", "num_tokens", "n_pes"),
        ("NotifyFinishArgs", "n_pes", "my_pe"),
    ];
    for (name, a, b) in swaps {
        let header = swap_fields(&contract::c_header(), name, a, b);
        let err = compile("swapped", &header).expect_err("a swapped field built");
        assert!(err.contains(&format!("{name}::")), "{name}: {err}");
        assert!(
            err.contains("offset differs from the Rust struct"),
            "{name}: {err}"
        );
    }
}

/// The parameter types of every `extern "C"` kernel in `source`: (kernel, types), each type
/// without `const`, `__grid_constant__` and the parameter's name.
fn extern_c_parameters(source: &str) -> Vec<(String, Vec<String>)> {
    source
        .split("extern \"C\" __global__ void ")
        .skip(1)
        .map(|rest| {
            let rest = match rest.strip_prefix("__launch_bounds__") {
                Some(bounds) => bounds[bounds.find(')').unwrap() + 1..].trim_start(),
                None => rest,
            };
            let open = rest.find('(').unwrap();
            let close = open + rest[open..].find(')').unwrap();
            let types = rest[open + 1..close]
                .split(',')
                .map(|param| {
                    let words: Vec<&str> = param
                        .split_whitespace()
                        .filter(|w| !matches!(*w, "const" | "__grid_constant__"))
                        .collect();
                    words[..words.len().saturating_sub(1)].join(" ")
                })
                .collect();
            (rest[..open].trim().to_string(), types)
        })
        .collect()
}

/// The buffer's kernels take contract structs only: a scalar or pointer parameter would be
/// one more list written in the same order on both sides, which no build checks.
#[test]
fn every_buffer_kernel_takes_contract_structs_only() {
    let header = contract::c_header();
    let buffer = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cuda/buffer");
    let mut kernels = Vec::new();
    for entry in std::fs::read_dir(&buffer).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cu") {
            let source = std::fs::read_to_string(&path).unwrap();
            kernels.extend(extern_c_parameters(&source));
        }
    }
    for kernel in [
        "moe_layout",
        "moe_notify_prepare",
        "moe_notify_finish",
        "moe_scatter",
    ] {
        assert!(
            kernels.iter().any(|(k, _)| k == kernel),
            "{kernel} not found in {buffer:?}"
        );
    }
    for (kernel, types) in &kernels {
        for ty in types {
            assert!(
                header.contains(&format!("\nstruct {ty} {{")),
                "{kernel}: parameter type `{ty}` is no struct of the contract (kernels/contract/defs.rs)"
            );
        }
    }
    let of = |name: &str| &kernels.iter().find(|(k, _)| k == name).unwrap().1;
    assert_eq!(of("moe_layout"), &["LayoutArgs"]);
    assert_eq!(of("moe_notify_prepare"), &["NotifyPrepareArgs"]);
    assert_eq!(of("moe_notify_finish"), &["NotifyFinishArgs"]);
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
