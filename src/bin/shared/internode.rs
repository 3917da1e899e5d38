//! What the internode test programs share (`#[path]`-included by internode-notify and
//! internode-dispatch): how they start, a call's case (every rank's routing, rebuilt
//! identically on every rank, its channels and alignment), this rank's layout computed on the
//! host, the handle's and the layout's arrays on the GPU, and the full or cached notify as one
//! collective call.

use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::{POISON_WORD, Tally};
use cudarc::driver::CudaStream;
use nvshmem_tutorial::buffer::{heap_bytes, node_pes_from_env};
use nvshmem_tutorial::internode::Job;
use nvshmem_tutorial::{
    BufferError, BufferOptions, Config, DeviceArray, InternodeHandle, InternodeNotifyCall,
    InternodeNotifyInputs, InternodeRecvCounts, NvshmemBuffer,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::heap;
use crate::shared::soak;
use crate::shared::{AnyError, routing};

pub(crate) const POISON: i32 = POISON_WORD as i32;

/// What an internode test program's checks get: the buffer (on the world), the node size G,
/// this rank, the ranks, the job's seed, and how many calls `--pairs` asks for.
pub(crate) struct Program<'a> {
    pub(crate) buffer: NvshmemBuffer<&'a World>,
    pub(crate) node_pes: usize,
    pub(crate) me: usize,
    pub(crate) n: usize,
    pub(crate) seed: u64,
    pub(crate) calls: Option<usize>,
}

impl Program<'_> {
    /// Rank 0 names the topology and how the program's data travels.
    pub(crate) fn announce(&self, route: &str) {
        if self.me == 0 {
            let (n, g) = (self.n, self.node_pes);
            println!("topology: {n} rank(s) in {} node(s) of {g}: {route}", n / g);
        }
    }
}

/// The checks of an internode test program, into the tally.
pub(crate) type Checks = fn(&Program, &mut Tally) -> Result<(), AnyError>;

// ANCHOR: run_program
/// An internode test program from start to end, its exit code: the soak options, NVSHMEM's
/// heap sized for `region_bytes(n)` = (num_nvl_bytes, num_rdma_bytes) before the world exists,
/// the world, and a normal-mode buffer with those regions; on one node the check that such a
/// buffer is refused, else `checks` with the buffer, then the soak's create-and-destroy loop
/// when asked. The tally's result is collective.
pub(crate) fn main(
    name: &str,
    region_bytes: fn(usize) -> (usize, usize),
    checks: Checks,
) -> ExitCode {
    ch01_bootstrap::checks::exit_code(name, run_program(name, region_bytes, checks))
}

fn run_program(
    name: &str,
    region_bytes: fn(usize) -> (usize, usize),
    checks: Checks,
) -> Result<bool, AnyError> {
    let args = soak::soak_args()?;
    heap::size_the_heap(|n| {
        let (nvl, rdma) = region_bytes(n);
        heap_bytes(n, nvl, rdma)
    })?;
    let world = World::from_env()?;
    let n = world.n_pes();
    let (nvl, rdma) = region_bytes(n);
    let options = args.apply(BufferOptions {
        num_rdma_bytes: rdma,
        ..BufferOptions::normal(nvl)
    });
    let node_pes = node_pes_from_env(&world)?;
    if node_pes == n {
        return refused_on_one_node(&world, options, &name.replace('-', "_"));
    }
    let mut tally = Tally::default();
    let program = Program {
        buffer: NvshmemBuffer::new(&world, options)?,
        node_pes,
        me: world.my_pe(),
        n,
        seed: world.job_seed(),
        calls: args.pairs,
    };
    if let Err(error) = checks(&program, &mut tally) {
        // Said before the buffer goes: its free is NVSHMEM's collective one, which a peer left
        // waiting in a call this rank never makes (a host refusal on this rank alone) never
        // joins, so the line would wait for the launcher's kill and be lost. This rank skips
        // the collective teardown instead and exits now, the first to fail.
        eprintln!("{name}: error: pe {}: {error}", program.me);
        ch01_bootstrap::world::mark_broken_because(&format!(
            "pe {} stopped on an error between collective calls",
            program.me
        ));
        drop(program);
        return Err(format!("pe {me} stopped on the error above", me = world.my_pe()).into());
    }
    drop(program);
    if let Some(count) = args.create_destroy {
        soak::create_destroy(&world, count, options, &mut tally)?;
    }
    Ok(tally.finish(&world)?)
}
// ANCHOR_END: run_program

/// One call's job: every rank's routing (rebuilt identically on every rank), its channels and
/// alignment.
pub(crate) struct Case {
    pub(crate) job: Job,
    pub(crate) config: Config,
    pub(crate) expert_alignment: usize,
}

impl Case {
    pub(crate) fn new(seed: u64, n: usize, g: usize, i: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let experts_per_rank = [1, 4, 8, 16][i % 4];
        let num_experts = experts_per_rank * n;
        // Experts from the first half or three quarters of the range on some calls: the last
        // nodes then get nothing from anyone.
        let choices = [num_experts, num_experts / 2, num_experts * 3 / 4][i % 3].max(1);
        let num_topk = choices.min(8);
        let num_sms = [24, 2, 10, 128, 48][i % 5];
        let routing = (0..n)
            .map(|s| {
                let num_tokens = if s == i % n {
                    0
                } else {
                    rng.random_range(1..400)
                };
                routing::random_topk(&mut rng, num_tokens, num_topk, choices)
                    .chunks(num_topk)
                    .map(<[i64]>::to_vec)
                    .collect()
            })
            .collect();
        let config = Config::new(num_sms, 8, 256, 6, 128).expect("a valid config");
        Self {
            job: Job {
                n_pes: n,
                node_pes: g,
                num_experts,
                num_channels: config.num_channels(),
                routing,
            },
            config,
            expert_alignment: [1, 4, 128][i % 3],
        }
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "{} experts, {} channels, expert_alignment {}",
            self.job.num_experts, self.job.num_channels, self.expert_alignment
        )
    }
}

/// This rank's layout, as `get_dispatch_layout` gives it, computed on the host from the job.
pub(crate) struct HostLayout {
    pub(crate) is_token_in_rank: Vec<bool>,
    pub(crate) num_tokens_per_rank: Vec<i32>,
    pub(crate) num_tokens_per_rdma_rank: Vec<i32>,
    pub(crate) num_tokens_per_expert: Vec<i32>,
}

pub(crate) fn host_layout(job: &Job, me: usize) -> HostLayout {
    let (n, g) = (job.n_pes, job.node_pes);
    let l = (job.num_experts / n) as i64;
    let tokens = &job.routing[me];
    let is_token_in_rank: Vec<bool> = tokens
        .iter()
        .flat_map(|ids| (0..n).map(move |r| ids.iter().any(|&e| e >= 0 && e / l == r as i64)))
        .collect();
    let to_rank = |r: usize| {
        (0..tokens.len())
            .filter(|&t| is_token_in_rank[t * n + r])
            .count()
    };
    let to_node = |k: usize| {
        (0..tokens.len())
            .filter(|&t| (k * g..(k + 1) * g).any(|r| is_token_in_rank[t * n + r]))
            .count()
    };
    let num_tokens_per_expert = (0..job.num_experts as i64)
        .map(|e| tokens.iter().flatten().filter(|&&id| id == e).count() as i32)
        .collect();
    HostLayout {
        num_tokens_per_rank: (0..n).map(|r| to_rank(r) as i32).collect(),
        num_tokens_per_rdma_rank: (0..n / g).map(|k| to_node(k) as i32).collect(),
        num_tokens_per_expert,
        is_token_in_rank,
    }
}

/// The handle's positions 1-6 on the GPU, poisoned.
pub(crate) struct HandleArrays {
    pub(crate) arrays: Vec<DeviceArray<i32>>,
}

impl HandleArrays {
    /// Shapes: [N, C], [n, C], [N, C], [N], [n, C], [n].
    fn shapes(n: usize, nodes: usize, c: usize) -> [(usize, usize); 6] {
        [(nodes, c), (n, c), (nodes, c), (nodes, 0), (n, c), (n, 0)]
    }
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        n: usize,
        nodes: usize,
        c: usize,
    ) -> Result<Self, BufferError> {
        let arrays = Self::shapes(n, nodes, c)
            .iter()
            .map(|&(rows, cols)| {
                let len = rows * cols.max(1);
                DeviceArray::from_host(stream, &vec![POISON; len], rows, cols)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { arrays })
    }
    pub(crate) fn handle(&self) -> InternodeHandle {
        let v = |i: usize| self.arrays[i].view();
        InternodeHandle {
            rdma_channel_prefix_matrix: v(0),
            gbl_channel_prefix_matrix: v(1),
            recv_rdma_channel_prefix_matrix: v(2),
            recv_rdma_rank_prefix_sum: v(3),
            recv_gbl_channel_prefix_matrix: v(4),
            recv_gbl_rank_prefix_sum: v(5),
        }
    }
    pub(crate) fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Vec<Vec<i32>>, BufferError> {
        self.arrays.iter().map(|a| a.to_host(stream)).collect()
    }
}

/// The layout's arrays on the GPU.
pub(crate) struct LayoutArrays {
    pub(crate) is_token_in_rank: DeviceArray<bool>,
    pub(crate) num_tokens_per_rank: DeviceArray<i32>,
    pub(crate) num_tokens_per_rdma_rank: DeviceArray<i32>,
    pub(crate) num_tokens_per_expert: DeviceArray<i32>,
}

impl LayoutArrays {
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        layout: &HostLayout,
        n: usize,
    ) -> Result<Self, BufferError> {
        let vector = |v: &Vec<i32>| DeviceArray::from_host(stream, v, v.len(), 0);
        Ok(Self {
            is_token_in_rank: DeviceArray::from_host(
                stream,
                &layout.is_token_in_rank,
                layout.is_token_in_rank.len() / n,
                n,
            )?,
            num_tokens_per_rank: vector(&layout.num_tokens_per_rank)?,
            num_tokens_per_rdma_rank: vector(&layout.num_tokens_per_rdma_rank)?,
            num_tokens_per_expert: vector(&layout.num_tokens_per_expert)?,
        })
    }
    pub(crate) fn inputs(&self, expert_alignment: usize) -> InternodeNotifyInputs {
        InternodeNotifyInputs {
            num_tokens_per_rank: self.num_tokens_per_rank.view(),
            num_tokens_per_rdma_rank: self.num_tokens_per_rdma_rank.view(),
            num_tokens_per_expert: self.num_tokens_per_expert.view(),
            is_token_in_rank: self.is_token_in_rank.view(),
            expert_alignment,
        }
    }
}

/// A notify of `call` on the world's stream (collective); the counts when it is the full one.
pub(crate) fn notify(
    buffer: &NvshmemBuffer<&World>,
    call: &InternodeNotifyCall,
    handle: &InternodeHandle,
    config: &Config,
) -> Result<Option<InternodeRecvCounts>, BufferError> {
    let stream = buffer.world().stream();
    // SAFETY: every view is a live array of this GPU, kept alive by the caller until the
    // stream is synchronised; the world's stream belongs to the buffer's context.
    let counts =
        unsafe { buffer.internode_notify_raw(call, handle, config, true, stream.cu_stream()) }?;
    stream
        .synchronize()
        .map_err(BufferError::cuda("synchronising after the notify"))?;
    buffer.check()?;
    Ok(counts)
}

/// On one node (no NVSHMEM_TUTORIAL_NODE_PES): a normal-mode buffer with an rdma region, which
/// only spans nodes, is refused. The program's result.
fn refused_on_one_node(
    world: &World,
    options: BufferOptions,
    what: &str,
) -> Result<bool, AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    if me == 0 {
        println!(
            "one node of {n}: {what} needs several (set NVSHMEM_TUTORIAL_NODE_PES to a divisor \
             of {n} below it); checking that the buffer is refused"
        );
    }
    let mut tally = Tally::default();
    let made = NvshmemBuffer::new(world, options).map(drop);
    tally.expect_error(
        me,
        "normal mode with num_rdma_bytes on one node",
        made,
        "inter-node",
    );
    Ok(tally.finish(world)?)
}
