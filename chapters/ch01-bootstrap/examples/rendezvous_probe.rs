//! The unique-id rendezvous alone, without NVSHMEM or a GPU: rank 0 serves a random id,
//! every rank prints the fingerprint it ends up with. The CPU tests launch several of these
//! on loopback to exercise the good path and every failure mode.

use ch01_bootstrap::{LaunchEnv, share_unique_id};
use nvshmem_sys::UniqueId;

fn main() {
    let result = LaunchEnv::from_env()
        .map_err(ch01_bootstrap::BootstrapError::from)
        .and_then(|env| {
            let id = share_unique_id(&env, || {
                let mut id = UniqueId::new();
                rand::fill(&mut id.internal[..]);
                Ok(id)
            })?;
            Ok((env.rank, id))
        });
    match result {
        Ok((rank, id)) => println!("rank {rank}: {id:?}"),
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
    }
}
