// The host/device contract's argument structs, part: Chapters 4 and 5's communicators, as every collective kernel receives them.
// kernels/contract/defs.rs holds the limits and failure kinds and includes the parts in
// contract.cuh's order.

contract_structs! {
    fn collectives_structs;

    /// The communicator as every chapter-4 kernel receives it (by value, first argument).
    struct Workspace {
        /// local device [STATE_WORDS] u64: failed at STATE_FAILED, epochs per block slot from STATE_EPOCHS
        state: u64 => "uint64_t*",
        /// host-mapped [FAILURE_WORDS] u64: failed, pe, expected, seen, kind, block, call, -
        error: u64 => "uint64_t*",
        /// symmetric [MAX_PES] u64: ready[p] = the last call PE p announced
        ready: u64 => "uint64_t*",
        /// symmetric [MAX_PES][MAX_BLOCKS] u64: tickets, by writer and block
        done: u64 => "uint64_t*",
        /// symmetric [2][MAX_PES][MAX_PES] u64: (epoch << 32 | rows), by parity and sender
        counts: u64 => "uint64_t*",
        /// symmetric [2][n_pes][ll_slot_bytes]: LL lines, by parity and sender
        ll: u64 => "uint8_t*",
        /// bytes of one LL slot: twice the largest LL payload
        ll_slot_bytes: u64 => "uint64_t",
        /// bound on every wait, in SM clock cycles
        timeout_cycles: i64 => "long long",
        my_pe: i32 => "int",
        n_pes: i32 => "int",
        /// peer_delta[p] = nvshmem_ptr(x, p) - x for any symmetric x (0 for us and past n_pes)
        peer_delta: [i64; MAX_PES] => "int64_t" "[MAX_PES]",
    }

    /// A group of PEs that reach each other through NVSHMEM's RMA calls only (chapter 5: the
    /// PEs of a rail, one per node, or every PE for the flat algorithms): member i is world PE
    /// start + i x stride. Every chapter-5 kernel that crosses nodes receives it by value.
    struct RmaWorkspace {
        /// local device [STATE_WORDS] u64: failed at STATE_FAILED, epochs per block slot from STATE_EPOCHS
        state: u64 => "uint64_t*",
        /// host-mapped [FAILURE_WORDS] u64: the failure record, naming world PEs
        error: u64 => "uint64_t*",
        /// symmetric [MAX_GROUP] u64: ready[i] = the calls member i entered (signal adds)
        ready: u64 => "uint64_t*",
        /// symmetric [RMA_STEPS][MAX_GROUP][MAX_RMA_BLOCKS] u64: tickets, by step, sender and block
        done: u64 => "uint64_t*",
        /// symmetric [MAX_GROUP][MAX_GROUP] u64: all-to-all-v rows of counts, by sender then destination PE
        counts: u64 => "uint64_t*",
        /// symmetric [scratch_bytes]: where reduce-scatter parts and all-to-all-v rows land
        scratch: u64 => "uint8_t*",
        scratch_bytes: u64 => "uint64_t",
        /// bound on every wait, in SM clock cycles
        timeout_cycles: i64 => "long long",
        /// member i is world PE start + i * stride
        start: i32 => "int",
        stride: i32 => "int",
        size: i32 => "int",
        /// this PE's member index
        me: i32 => "int",
    }
}
