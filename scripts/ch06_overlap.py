"""Chapter 6 from PyTorch: all-gather + GEMM, serial and overlapped, beside torch's peers.

    torchrun --standalone --nproc_per_node=N scripts/ch06_overlap.py
    torchrun --standalone --nproc_per_node=N scripts/ch06_overlap.py --bench [OUT_CSV]
    torchrun --standalone --nproc_per_node=N scripts/ch06_overlap.py --timeline PREFIX

Mirrors chapters/ch06-overlap with the Python package: each rank holds `rows` rows of the
input and a [K, cols] slice of the weight; every rank computes all_gather(x) @ w. Overlapped:
each chunk of our shard goes to every peer with `nv.put_signal(..., nbi=True)` on a
communication stream, and the compute stream runs `torch.matmul` on a chunk after
`nv.wait_signal` on that chunk's signal (signals carry call numbers, never reset). Checked
against a reference every rank computes from the shared data (bf16 rounding: half a unit in
the last place), then run 20 times in a row with new data. The peers: NCCL's
`all_gather_into_tensor` then `torch.matmul` (serial), and torch's
`torch.ops.symm_mem.fused_all_gather_matmul`; both need one rank per GPU over NCCL, so folded
runs (gloo) skip them and say so.

--bench times, at a 70B-class projection (8192 tokens, K = 8192, 28672 / N columns per rank):
the GEMM alone, our communication alone, NCCL serial, torch's fused op, and ours overlapped
with 1, 2, 4 and 8 chunks, each as the median of 7 samples of 5 eager calls between CUDA
events after a barrier, rank 0's; the CSV gives each overlapped row its bound
(comm + compute) / max(comm, compute) and efficiency (serial - overlapped) / min(comm, compute),
against NCCL serial.

--timeline PREFIX profiles, at the same shape, NCCL serial and ours overlapped with
TIMELINE_CHUNKS chunks: 3 warm-up calls, then TIMELINE_STEPS calls each inside
torch.profiler.record_function("step") after a barrier (benchmarks/plot_timeline.py's
record_steps); rank 0 writes the traces PREFIX_serial.json and PREFIX_overlapped.json and draws
the last step of each as PREFIX_<case>.svg (a lane per CUDA stream, kernels and copies coloured
compute / wait / communication) and PREFIX_<case>.csv (every operation, and the time
communication runs while compute does), both on one time scale.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ch00_common import draw_timelines, main, nv, print_by_pe, start, Tally, timeline_modules

ROWS, K, COLS, CHUNKS = 64, 256, 128, 4
CALLS = 20
BENCH_TOKENS, BENCH_K, BENCH_COLS = 8192, 8192, 28672
SAMPLES, CALLS_PER_SAMPLE = 7, 5
ROUNDS = 5  # --bench's interleaved rounds of the four main contenders
TIMELINE_CHUNKS = 1  # the overlapped schedule's best chunk count in --bench (2x H100)
TIMELINE_STEPS = 3  # profiled calls; the figure draws the last


class AgMatmul:
    """all_gather(shard) @ w with a put and a signal per chunk (chapter 6's AgGemm)."""

    def __init__(self, rows: int, k: int, chunks: int, *, side_gemms: bool = False) -> None:
        n = nv.n_pes()
        if rows % chunks:
            raise ValueError(f"rows ({rows}) must split into {chunks} equal chunks")
        self.rows, self.k, self.chunks = rows, k, chunks
        self.shard = nv.empty((rows, k), torch.bfloat16)  # write our rows here
        self.gathered = nv.empty((n * rows, k), torch.bfloat16)
        self.signals = nv.zeros((n * chunks,), torch.uint64)
        self.comm = torch.cuda.Stream()
        # side_gemms: the peers' chunks' GEMMs on a stream of their own, beside our rows' GEMM
        self.side = torch.cuda.Stream() if side_gemms else None
        self.calls = 0
        nv.barrier()  # every rank's signals are zero before anyone puts

    def put_chunks(self, shard_ready: torch.cuda.Event) -> None:
        """On the communication stream, after `shard_ready`: each chunk of our shard to every
        peer, at our rows."""
        me, n, cr = nv.my_pe(), nv.n_pes(), self.rows // self.chunks
        self.comm.wait_event(shard_ready)
        for step in range(1, n):
            dst = (me + step) % n
            for c in range(self.chunks):
                at = me * self.rows + c * cr
                nv.put_signal(self.gathered[at : at + cr], self.shard[c * cr : (c + 1) * cr], dst,
                              self.signals[me * self.chunks + c], self.calls, nbi=True,
                              stream=self.comm)

    def overlapped(self, w: torch.Tensor, out: torch.Tensor, *, gemm: bool = True) -> None:
        me, n, cr = nv.my_pe(), nv.n_pes(), self.rows // self.chunks
        self.calls += 1
        compute = torch.cuda.current_stream()
        shard_ready = torch.cuda.Event()
        shard_ready.record(compute)
        # Our own rows need no communication: their GEMM goes first, so that the GPU starts
        # on it while the host still enqueues the puts (each a call into the binding).
        if gemm:
            torch.matmul(self.shard, w, out=out[me * self.rows : (me + 1) * self.rows])
        self.put_chunks(shard_ready)
        peers = self.side or compute
        if self.side is not None:
            self.side.wait_event(shard_ready)
        for step in range(1, n):
            src = (me - step) % n  # everyone sends to me + 1 first
            for c in range(self.chunks):
                nv.wait_signal(self.signals[src * self.chunks + c], self.calls, stream=peers)
                at = src * self.rows + c * cr
                if gemm:
                    with torch.cuda.stream(peers):
                        torch.matmul(self.gathered[at : at + cr], w, out=out[at : at + cr])
        nv.quiet(stream=self.comm)  # our puts are done: the shard may change
        compute.wait_stream(self.comm)
        if peers is not compute:
            compute.wait_stream(peers)
        nv.barrier(stream=compute)  # no peer's next call lands while our GEMMs read


def x_of(pe: int, rows: int, k: int, call: int) -> torch.Tensor:
    """Rank `pe`'s input in call `call`: quarters in [-1, 1], exact products."""
    r = torch.arange(rows, device="cuda").unsqueeze(1)
    c = torch.arange(k, device="cuda").unsqueeze(0)
    return (((pe * 7 + r * 3 + c + call * 5) % 9).float() / 4 - 1).to(torch.bfloat16)


def w_of(pe: int, k: int, cols: int) -> torch.Tensor:
    r = torch.arange(k, device="cuda").unsqueeze(1)
    c = torch.arange(cols, device="cuda").unsqueeze(0)
    return (((pe * 3 + r * 5 + c) % 7).float() / 4 - 0.75).to(torch.bfloat16)


def wrong(got: torch.Tensor, reference: torch.Tensor) -> int:
    """Outputs off the fp32 reference by more than bf16 rounding (half a unit in the last
    place, at most 2^-8 of the value). Written as
    "not within", so that a NaN (an output never written: `check` fills with NaN) counts."""
    within = (got.float() - reference).abs() <= reference.abs() / 256 + 1e-6
    return int((~within).sum())


def peers_available() -> Optional[str]:
    """None when NCCL and torch's symmetric memory can run, else why not."""
    if dist.get_backend() != "nccl":
        return "skipped NCCL and torch's fused op: ranks share a GPU (gloo), they need one each"
    if dist.get_world_size() == 1:
        return "skipped NCCL and torch's fused op: one rank, nothing to gather from a peer"
    return None


def torch_fused(shard: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """torch.ops.symm_mem.fused_all_gather_matmul over the world group."""
    import torch.distributed._symmetric_memory as symm_mem

    group_name = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group_name)
    _, outs = torch.ops.symm_mem.fused_all_gather_matmul(shard, [w], 0, group_name)
    return outs[0]


def check(tally: Tally) -> List[str]:
    me, n = nv.my_pe(), nv.n_pes()
    lines = []
    w = w_of(me, K, COLS)
    out = torch.empty((n * ROWS, COLS), dtype=torch.bfloat16, device="cuda")
    for side in (False, True):
        layer = AgMatmul(ROWS, K, CHUNKS, side_gemms=side)
        what = "overlapped, side stream" if side else "overlapped"
        for call in range(CALLS):
            layer.shard.copy_(x_of(me, ROWS, K, call))
            out.fill_(float("nan"))
            layer.overlapped(w, out)
            everyone = torch.cat([x_of(pe, ROWS, K, call) for pe in range(n)]).float()
            bad = wrong(out, everyone @ w.float())
            tally.check(bad == 0, f"{what} call {call}: {bad} of {out.numel()} outputs wrong")
            if call in (0, CALLS - 1):
                lines.append(f"{what} call {call}: {out.numel()} outputs, {bad} wrong")
    reference = torch.cat([x_of(pe, ROWS, K, 0) for pe in range(n)]).float() @ w.float()
    skipped = peers_available()
    if skipped:
        lines.append(skipped)
    else:
        gathered = torch.empty((n * ROWS, K), dtype=torch.bfloat16, device="cuda")
        dist.all_gather_into_tensor(gathered, x_of(me, ROWS, K, 0))
        bad = wrong(gathered @ w, reference)
        tally.check(bad == 0, f"NCCL serial: {bad} outputs wrong")
        lines.append(f"NCCL all_gather_into_tensor + matmul: {bad} wrong")
        try:
            bad = wrong(torch_fused(x_of(me, ROWS, K, 0), w), reference)
            tally.check(bad == 0, f"torch fused_all_gather_matmul: {bad} outputs wrong")
            lines.append(f"torch fused_all_gather_matmul: {bad} wrong")
        except Exception as error:  # noqa: BLE001 - a peer that cannot run is reported
            why = f"{type(error).__name__}: {error}"
            lines.append(f"torch fused_all_gather_matmul did not run: {why}")
    tally.expect_error(lambda: AgMatmul(ROWS + 1, K, CHUNKS), ValueError, "equal chunks")
    return lines


def timed(call: Callable[[], object]) -> float:
    """Median microseconds of one call: CALLS_PER_SAMPLE calls between events, after a barrier."""
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    samples = []
    for sample in range(SAMPLES + 1):
        nv.barrier()
        torch.cuda.synchronize()
        start_event.record()
        for _ in range(CALLS_PER_SAMPLE):
            call()
        end_event.record()
        end_event.synchronize()
        if sample:
            samples.append(start_event.elapsed_time(end_event) * 1e3 / CALLS_PER_SAMPLE)
    return sorted(samples)[len(samples) // 2]


def bench(out_csv: str) -> List[str]:
    me, n = nv.my_pe(), nv.n_pes()
    rows, cols = BENCH_TOKENS // n, BENCH_COLS // n
    w = torch.randn((BENCH_K, cols), device="cuda").to(torch.bfloat16)
    x = torch.randn((rows, BENCH_K), device="cuda").to(torch.bfloat16)
    out = torch.empty((n * rows, cols), dtype=torch.bfloat16, device="cuda")
    # Random, not torch.empty's leftovers: the GEMM alone is timed on it before NCCL fills it,
    # and a GEMM's speed depends on its data (zeros draw less power).
    gathered = torch.randn((n * rows, BENCH_K), device="cuda").to(torch.bfloat16)
    flops = 2.0 * n * rows * BENCH_K * cols
    table = {}
    table["compute"] = timed(lambda: torch.matmul(gathered, w, out=out))
    layer = AgMatmul(rows, BENCH_K, 1)
    layer.shard.copy_(x)
    table["ours_communicate"] = timed(lambda: layer.overlapped(w, out, gemm=False))
    skipped = peers_available()
    if not skipped:
        table["nccl_serial"] = timed(lambda: (dist.all_gather_into_tensor(gathered, x),
                                              torch.matmul(gathered, w, out=out)))
        table["nccl_communicate"] = timed(lambda: dist.all_gather_into_tensor(gathered, x))
        try:
            table["torch_fused"] = timed(lambda: torch_fused(x, w))
        except Exception as error:  # noqa: BLE001 - reported in the output
            skipped = f"torch fused_all_gather_matmul did not run: {error}"
    for chunks in (1, 2, 4, 8):
        layer = AgMatmul(rows, BENCH_K, chunks)
        layer.shard.copy_(x)
        table[f"ours_overlapped_{chunks}"] = timed(lambda: layer.overlapped(w, out))
    for chunks in (1, 2):  # the peers' GEMMs on a side stream, beside our rows' GEMM
        layer = AgMatmul(rows, BENCH_K, chunks, side_gemms=True)
        layer.shard.copy_(x)
        table[f"ours_overlapped_{chunks}_side"] = timed(lambda: layer.overlapped(w, out))
    interleaved = ""
    if not skipped:
        # The same four again, in turn, ROUNDS times: a GPU that heats up under sustained
        # GEMMs clocks down, so methods timed one after the other are not timed alike. Each
        # round's ratio compares neighbours in time; the CSV keeps each method's median.
        layer = AgMatmul(rows, BENCH_K, TIMELINE_CHUNKS)
        layer.shard.copy_(x)
        side_layer = AgMatmul(rows, BENCH_K, TIMELINE_CHUNKS, side_gemms=True)
        side_layer.shard.copy_(x)
        ours = f"ours_overlapped_{TIMELINE_CHUNKS}"
        contenders = {"compute": lambda: torch.matmul(gathered, w, out=out),
                      "nccl_serial": lambda: (dist.all_gather_into_tensor(gathered, x),
                                              torch.matmul(gathered, w, out=out)),
                      "torch_fused": lambda: torch_fused(x, w),
                      ours: lambda: layer.overlapped(w, out),
                      f"{ours}_side": lambda: side_layer.overlapped(w, out)}
        rounds: dict = {name: [] for name in contenders}
        for _ in range(ROUNDS):
            for name, call in contenders.items():
                rounds[name].append(timed(call))
        for name, values in rounds.items():
            table[f"interleaved_{name}"] = statistics.median(values)
        def against_torch(name: str) -> str:
            ratios = [o / f for o, f in zip(rounds[name], rounds["torch_fused"])]
            return (f"per-round {name} / torch_fused: median {statistics.median(ratios):.3f}, "
                    f"range {min(ratios):.3f}-{max(ratios):.3f}")
        interleaved = (f"# interleaved: {ROUNDS} rounds of {', '.join(contenders)} in turn; "
                       f"{against_torch(ours)}; {against_torch(ours + '_side')}")
    comm = table.get("nccl_communicate", table["ours_communicate"])
    serial = table.get("nccl_serial", comm + table["compute"])
    bound = (comm + table["compute"]) / max(comm, table["compute"])
    lines = [skipped] if skipped else []
    if interleaved:
        lines.append(interleaved[2:])
    csv = ["method,n_pes,tokens,k,cols,us,tflops,bound,efficiency"]
    for method, us in table.items():
        tflops = 0.0 if "communicate" in method else flops / us / 1e6
        extra = ","
        if method.removeprefix("interleaved_").startswith("ours_overlapped") or \
                method.endswith("torch_fused"):
            # Interleaved rows against the interleaved serial and GEMM times.
            at = "interleaved_" if method.startswith("interleaved_") else ""
            base, gemm = table.get(f"{at}nccl_serial", serial), table[f"{at}compute"]
            extra = f"{bound:.3f},{(base - us) / min(comm, gemm):.3f}"
        csv.append(f"{method},{n},{BENCH_TOKENS},{BENCH_K},{cols},{us:.1f},{tflops:.1f},{extra}")
        lines.append(f"{method:<20} {us:>9.1f} us {tflops:>7.1f} TFLOP/s {extra}")
    if me == 0:
        gpu, nccl = torch.cuda.get_device_name(), torch.cuda.nccl.version()
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        header = [f"# gpu: {gpu} x {n}; torch {torch.__version__}; NCCL {nccl}", f"# date: {date}",
                  f"# timing: {CALLS_PER_SAMPLE} eager calls between CUDA events after a barrier, "
                  f"median of {SAMPLES}, rank 0; efficiency against NCCL serial"]
        if interleaved:
            header.append(interleaved)
        if nv.process_group_backend() != "nccl":
            header.append("# where: several ranks per GPU (folded): correctness only, not speed")
        with open(out_csv, "w") as f:
            f.write("\n".join(header + csv) + "\n")
        lines.append(f"wrote {out_csv}")
    return lines


def timeline(prefix: str, tally: Tally) -> List[str]:
    """--timeline: NCCL serial and ours overlapped under torch.profiler (every rank), drawn
    on rank 0. A figure that cannot be drawn is a failed check, with its reason."""
    pt, tt = timeline_modules()
    me, n = nv.my_pe(), nv.n_pes()
    rows, cols = BENCH_TOKENS // n, BENCH_COLS // n
    w = torch.randn((BENCH_K, cols), device="cuda").to(torch.bfloat16)
    x = torch.randn((rows, BENCH_K), device="cuda").to(torch.bfloat16)
    out = torch.empty((n * rows, cols), dtype=torch.bfloat16, device="cuda")
    gathered = torch.empty((n * rows, BENCH_K), dtype=torch.bfloat16, device="cuda")
    layer = AgMatmul(rows, BENCH_K, TIMELINE_CHUNKS)
    layer.shard.copy_(x)
    device = torch.cuda.get_device_name()
    gpu = device.removeprefix("NVIDIA ")  # for the titles
    calls: Dict[str, Tuple[str, Callable[[], object]]] = {}
    skipped = peers_available()
    if not skipped:
        calls["serial"] = (f"All-gather + GEMM, NCCL then the GEMM ({n}x {gpu}, rank 0)",
                           lambda: (dist.all_gather_into_tensor(gathered, x),
                                    torch.matmul(gathered, w, out=out)))
    calls["overlapped"] = (f"All-gather + GEMM, ours overlapped in {TIMELINE_CHUNKS} chunks "
                           f"({n}x {gpu}, rank 0)", lambda: layer.overlapped(w, out))
    traces = {name: (title, f"{prefix}_{name}.json") for name, (title, _) in calls.items()}
    for name, (_, call) in calls.items():
        pt.record_steps(call, traces[name][1] if me == 0 else None, steps=TIMELINE_STEPS,
                        warmup=3, barrier=nv.barrier)
    lines = [skipped] if skipped else []
    if me != 0:
        return lines
    nccl = torch.cuda.nccl.version() if not skipped else "not used"
    header = [f"gpu: {device} x {n}; torch {torch.__version__}; NCCL {nccl}",
              "date: " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              f"timing: torch.profiler (CUPTI) on rank 0, the last of {TIMELINE_STEPS} calls, "
              f"each after a barrier; {BENCH_TOKENS} tokens, K = {BENCH_K}, "
              f"{cols} columns per rank"]
    # NVSHMEM's puts to an NVLink peer are copy-engine copies, and no other copy runs here.
    classes = (("compute", tt.COMPUTE), ("wait", tt.WAIT),
               ("communication", f"{tt.COMMUNICATION}|{tt.PEER_COPY}"))
    return lines + draw_timelines(traces, prefix, classes, header, tally)


def run() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", nargs="?", const="overlap.csv", default=None,
                        metavar="OUT_CSV")
    parser.add_argument("--timeline", metavar="PREFIX", help="profile NCCL serial and ours "
                        "overlapped; rank 0 writes PREFIX_<case>.json, .svg and .csv")
    args = parser.parse_args()
    start()
    tally = Tally()
    print_by_pe(check(tally))
    if args.bench:
        print_by_pe(bench(args.bench))
    if args.timeline:
        print_by_pe(timeline(args.timeline, tally))
    return tally.finish()


if __name__ == "__main__":
    main("ch06_overlap.py", run)
