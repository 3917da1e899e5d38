//! Opens the real host library that `scripts/setup.sh` installed (no GPU needed: loading
//! and the version query touch no device) and checks every symbol of the table resolves.

#[test]
fn pinned_host_library_loads_and_reports_its_version() {
    let library = nvshmem_sys::load(nvshmem_sys::PINNED_VERSION)
        .unwrap_or_else(|e| panic!("{e}\n(scripts/setup.sh installs the pinned wheel into .venv)"));
    assert_eq!(library.version(), nvshmem_sys::PINNED_VERSION);
    assert!(
        library
            .path()
            .to_string_lossy()
            .contains("libnvshmem_host.so.3"),
        "{:?}",
        library.path()
    );
}

#[test]
fn a_different_expected_version_is_refused_with_both_versions_named() {
    let other = nvshmem_sys::Version {
        major: 3,
        minor: 3,
        patch: 24,
    };
    let err = nvshmem_sys::load(other).expect_err("3.4.5 must not pass as 3.3.24");
    let msg = err.to_string();
    assert!(msg.contains("3.4.5") && msg.contains("3.3.24"), "{msg}");
}
