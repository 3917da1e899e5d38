// ANCHOR: handle
//! DeepEP's intranode handle, as device views: what a dispatch leaves behind so that a cached
//! dispatch can skip the notify step and a combine can send every result home.
//!
//! - `rank_prefix_matrix` [R, R] i32: [i][j] = tokens ranks 0..=i send to rank j (inclusive).
//!   Received tokens are grouped by source rank in that order: rank i's occupy rows
//!   [m[i-1][me], m[i][me]).
//! - `channel_prefix_matrix` [R, C] i32 (sender side): tokens this rank sends to rank d in
//!   channels 0..=c.
//! - `recv_channel_prefix_matrix` [R, C] i32 (receiver side): where channel c's tokens from
//!   rank s start among s's tokens (exclusive prefix).
//! - `recv_src_idx` [M] i32: each received row's token index on its source rank.
//! - `is_token_in_rank` [N, R] bool: the routing the dispatch was given.
//! - `send_head` [N, R] i32: token t's position in the (channel, rank d) ring of that call,
//!   -1 if t did not go to d. Combine finds each rank's result for t with it.
// ANCHOR_END: handle

use crate::error::BufferError;
use crate::view::{ElemType, View};

#[derive(Debug, Clone, Copy)]
pub struct Handle {
    pub rank_prefix_matrix: View,
    pub channel_prefix_matrix: View,
    pub recv_channel_prefix_matrix: View,
    pub recv_src_idx: View,
    pub is_token_in_rank: View,
    pub send_head: View,
}

impl Handle {
    pub fn num_tokens(&self) -> usize {
        self.is_token_in_rank.rows()
    }
    pub fn num_recv_tokens(&self) -> usize {
        self.recv_src_idx.rows()
    }
    pub fn num_channels(&self) -> usize {
        self.channel_prefix_matrix.cols()
    }

    /// Shapes and dtypes as a dispatch of this buffer makes them, for `n_pes` ranks and
    /// `num_channels` channels (which must be the config's: num_sms / 2).
    pub fn check(
        &self,
        what: &'static str,
        n_pes: usize,
        num_channels: usize,
    ) -> Result<(), BufferError> {
        let (r, c, n) = (Some(n_pes), Some(num_channels), Some(self.num_tokens()));
        if self.num_channels() != num_channels {
            return Err(BufferError::invalid(
                what,
                format!(
                    "the handle was made with {} channels (num_sms = {}) but this config has {} \
                     (num_sms = {}); use the config the dispatch that made the handle used",
                    self.num_channels(),
                    2 * self.num_channels(),
                    num_channels,
                    2 * num_channels
                ),
            ));
        }
        self.rank_prefix_matrix.expect(
            what,
            "handle[0] (rank_prefix_matrix)",
            ElemType::I32,
            &[r, r],
        )?;
        self.channel_prefix_matrix.expect(
            what,
            "handle[1] (channel_prefix_matrix)",
            ElemType::I32,
            &[r, c],
        )?;
        self.recv_channel_prefix_matrix.expect(
            what,
            "handle[2] (recv_channel_prefix_matrix)",
            ElemType::I32,
            &[r, c],
        )?;
        self.recv_src_idx
            .expect(what, "handle[3] (recv_src_idx)", ElemType::I32, &[None])?;
        self.is_token_in_rank.expect(
            what,
            "handle[4] (is_token_in_rank)",
            ElemType::Bool,
            &[None, r],
        )?;
        self.send_head
            .expect(what, "handle[5] (send_head)", ElemType::I32, &[n, r])
    }
}
