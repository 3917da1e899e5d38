//! The symmetric heap's size, and the check that every PE allocates the same thing.

use ch01_bootstrap::World;

use crate::SymmetricError;

/// NVSHMEM's heap-size variable, read once at initialisation: set it before launch.
pub const SYMMETRIC_SIZE_VAR: &str = "NVSHMEM_SYMMETRIC_SIZE";
/// NVSHMEM's default when the variable is unset: 1 GiB per PE.
pub const DEFAULT_SYMMETRIC_BYTES: u64 = 1 << 30;

/// Parses a size the way NVSHMEM does: a number with an optional k/m/g/t suffix (powers of
/// 1024), fractions allowed ("3.1M", ".5g"), characters after the suffix ignored.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(number_end);
    if number.is_empty() || number == "." {
        return None;
    }
    let value: f64 = if number.starts_with('.') {
        format!("0{number}").parse().ok()?
    } else {
        number.parse().ok()?
    };
    let scale: u64 = match rest.chars().next().map(|c| c.to_ascii_lowercase()) {
        None => 1,
        Some('k') => 1 << 10,
        Some('m') => 1 << 20,
        Some('g') => 1 << 30,
        Some('t') => 1 << 40,
        Some(_) => return None,
    };
    Some((value * scale as f64).ceil() as u64)
}

/// The heap size this process was started with (`NVSHMEM_SYMMETRIC_SIZE`, else 1 GiB), or
/// the unparsable text.
pub fn configured_heap_bytes() -> Result<u64, String> {
    match std::env::var(SYMMETRIC_SIZE_VAR) {
        Ok(text) => parse_size(&text).ok_or(text),
        Err(_) => Ok(DEFAULT_SYMMETRIC_BYTES),
    }
}

/// "NVSHMEM_SYMMETRIC_SIZE=2G (2147483648 bytes)" or "NVSHMEM_SYMMETRIC_SIZE unset: 1 GiB".
pub(crate) fn describe_heap() -> String {
    match std::env::var(SYMMETRIC_SIZE_VAR) {
        Ok(text) => match parse_size(&text) {
            Some(bytes) => format!("{SYMMETRIC_SIZE_VAR}={text} ({bytes} bytes)"),
            None => format!("{SYMMETRIC_SIZE_VAR}={text:?} does not parse"),
        },
        Err(_) => format!("{SYMMETRIC_SIZE_VAR} unset: NVSHMEM's default of 1 GiB"),
    }
}

// ANCHOR: check_sizes
/// Collective: `Err` on every PE unless every PE passes the same `num_bytes`. Every PE reaches
/// the same verdict: an error on one PE only would leave the others waiting in the next call.
pub fn check_sizes_agree(world: &World, num_bytes: u64) -> Result<(), SymmetricError> {
    let sizes = exchange_u64(world, num_bytes)?;
    if sizes.iter().all(|&s| s == sizes[0]) {
        Ok(())
    } else {
        Err(SymmetricError::SizeMismatch {
            sizes: sizes.into_iter().enumerate().collect(),
        })
    }
}

/// Collective: every PE's `value`, in PE order, on every PE. Each PE writes its value into
/// slot `my_pe` of a small table on every PE (one 8-byte put per peer), a barrier completes
/// the puts, and then each PE reads the whole table locally.
pub fn exchange_u64(world: &World, value: u64) -> Result<Vec<u64>, SymmetricError> {
    let (nvshmem, stream, n_pes) = (world.nvshmem(), world.stream(), world.n_pes());
    // SAFETY: initialised; collective, identical size everywhere (n_pes x 8 bytes).
    let table = unsafe { (nvshmem.malloc)(n_pes * 8) } as u64;
    if table == 0 {
        return Err(SymmetricError::HeapExhausted {
            requested: n_pes * 8,
            heap: describe_heap(),
        });
    }
    let result = (|| {
        let mine = stream
            .clone_htod(&[value])
            .map_err(SymmetricError::cuda("staging the value"))?;
        let (mine_ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&mine, stream);
        let (slot, cs) = (table + 8 * world.my_pe() as u64, stream.cu_stream() as _);
        for pe in 0..n_pes {
            // SAFETY: `slot` is symmetric, `mine_ptr` a live device pointer of 8 bytes.
            unsafe { (nvshmem.putmem_on_stream)(slot as _, mine_ptr as _, 8, pe as i32, cs) };
        }
        // SAFETY: collective; completes the puts above on every PE.
        unsafe { (nvshmem.barrier_all_on_stream)(stream.cu_stream() as _) };
        let mut values = vec![0u64; n_pes];
        // SAFETY: `table` holds n_pes u64; synchronised before use.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut values, table, stream.cu_stream())
        }
        .map_err(SymmetricError::cuda("reading the table"))?;
        stream
            .synchronize()
            .map_err(SymmetricError::cuda("synchronising"))?;
        Ok(values)
    })();
    // SAFETY: collective free of the table; every PE reaches it (errors above are uniform
    // or are CUDA failures that end the job anyway).
    unsafe { (nvshmem.free)(table as *mut _) };
    result
}
// ANCHOR_END: check_sizes

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nvshmem() {
        assert_eq!(parse_size("1073741824"), Some(1 << 30));
        assert_eq!(parse_size("20m"), Some(20 << 20));
        assert_eq!(parse_size("20M"), Some(20 << 20));
        assert_eq!(parse_size("3.1M"), Some(3_250_586));
        assert_eq!(parse_size(".5m"), Some(1 << 19));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("20kk"), Some(20 << 10));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("5x"), None);
    }

    #[test]
    fn mismatch_message_names_each_pe() {
        let err = SymmetricError::SizeMismatch {
            sizes: vec![(0, 4096), (1, 8192)],
        };
        let msg = err.to_string();
        assert!(msg.contains("pe 0 asked for 4096 bytes"), "{msg}");
        assert!(msg.contains("pe 1 asked for 8192 bytes"), "{msg}");
    }

    #[test]
    fn exhaustion_names_the_variable_to_raise() {
        let err = SymmetricError::HeapExhausted {
            requested: 1 << 40,
            heap: describe_heap(),
        };
        assert!(
            err.to_string().contains("Raise NVSHMEM_SYMMETRIC_SIZE"),
            "{err}"
        );
    }
}
