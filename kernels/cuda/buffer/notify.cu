// Chapter 7: the notify step. Before any token moves, every PE must learn how many tokens it
// will receive from each peer (to size its outputs and place each peer's tokens) and from
// each channel of each peer (to know where a channel's tokens start). Each PE packs its
// counts into one row; chapter 4's all-gather (one LL traversal) gives every PE every row;
// then each PE derives its own prefix sums locally.
//
// A row, int32: [tokens per rank: n_pes][num_tokens_per_expert: num_experts]
//               [channel_prefix_matrix: n_pes x num_channels]
// The routing, is_token_in_rank, is what dispatch sends, so everything the rings rely on (the
// tokens per rank and per channel) is counted from it; the caller's num_tokens_per_rank is only
// compared with those counts. A mismatch is an input error (COUNTS_MISMATCH): the step still
// completes, with the counted numbers, and the host raises it at its next check.
#include "moe.cuh"

using namespace moe;

// ANCHOR: notify_prepare
// Block d counts, per channel, the tokens going to PE d and writes the inclusive prefix
// (channel_prefix_matrix[d][c], handle element 1) and the row, its total included (checked
// against num_tokens_per_rank[d]). Block 0 also copies the expert counts into the row.
// NotifyPrepareArgs (contract.cuh) says what each pointer holds.
extern "C" __global__ void __launch_bounds__(NOTIFY_THREADS) moe_notify_prepare(const __grid_constant__ NotifyPrepareArgs a) {
    __shared__ int per_channel[MAX_CHANNELS];
    const int n = a.n_pes;
    const int dst = blockIdx.x;
    for (int c = threadIdx.x; c < a.num_channels; c += blockDim.x) per_channel[c] = 0;
    __syncthreads();
    for (int c = 0; c < a.num_channels; ++c) {
        int begin, end;
        channel_range(a.num_tokens, a.num_channels, c, &begin, &end);
        int count = 0;
        for (int t = begin + threadIdx.x; t < end; t += blockDim.x) count += a.is_token_in_rank[int64_t(t) * n + dst];
        for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) count += __shfl_xor_sync(ALL_LANES, count, offset);
        if (threadIdx.x % WARP_SIZE == 0 && count > 0) atomicAdd(&per_channel[c], count);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int* row_prefix = a.row + n + a.num_experts + dst * a.num_channels;
        int sum = 0;
        for (int c = 0; c < a.num_channels; ++c) {
            sum += per_channel[c];
            a.channel_prefix_matrix[dst * a.num_channels + c] = sum;
            row_prefix[c] = sum;
        }
        a.row[dst] = sum;
        const int given = a.num_tokens_per_rank[dst];
        if (given != sum) record_input_error(a.bad_input, COUNTS_MISMATCH, dst, sum, uint64_t(int64_t(given)));
    }
    if (dst == 0) {
        for (int i = threadIdx.x; i < a.num_experts; i += blockDim.x) a.row[n + i] = a.num_tokens_per_expert[i];
    }
}
// ANCHOR_END: notify_prepare

// ANCHOR: notify_finish
// From every PE's row (`a.rows`, the all-gather's output), this PE's receive side:
// rank_prefix_matrix[i][j] = tokens PEs 0..i send to PE j (inclusive; handle element 0),
// recv_channel_prefix_matrix[s][c] = where channel c's tokens from s start among s's tokens
// (exclusive; handle element 2), and for the host, through mapped memory (`a.counts`, word 0
// written last): the number of tokens to receive and each local expert's count rounded up to
// `expert_alignment`. One block; NotifyFinishArgs (contract.cuh) says what each pointer holds.
extern "C" __global__ void __launch_bounds__(NOTIFY_THREADS) moe_notify_finish(const __grid_constant__ NotifyFinishArgs a) {
    const int n = a.n_pes;
    const int row_len = n + a.num_experts + n * a.num_channels;
    const int num_local = a.num_experts / n;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int sum = 0;
        for (int i = 0; i < n; ++i) {
            sum += a.rows[i * row_len + j];
            a.rank_prefix_matrix[i * n + j] = sum;
        }
    }
    for (int k = threadIdx.x; k < n * a.num_channels; k += blockDim.x) {
        const int src = k / a.num_channels, c = k % a.num_channels;
        const int* prefix = a.rows + src * row_len + n + a.num_experts + a.my_pe * a.num_channels;
        a.recv_channel_prefix_matrix[k] = c == 0 ? 0 : prefix[c - 1];
    }
    volatile int* host = a.counts;
    for (int e = threadIdx.x; e < num_local; e += blockDim.x) {
        int sum = 0;
        for (int i = 0; i < n; ++i) sum += a.rows[i * row_len + n + a.my_pe * num_local + e];
        host[1 + e] = (sum + a.expert_alignment - 1) / a.expert_alignment * a.expert_alignment;
    }
    __syncthreads();  // every thread's counts before thread 0's fence: it publishes them all
    if (threadIdx.x == 0) {
        int total = 0;
        for (int i = 0; i < n; ++i) total += a.rows[i * row_len + a.my_pe];
        __threadfence_system();
        host[0] = total;
    }
}
// ANCHOR_END: notify_finish
