//! The step plan (schedule -> executor) and the step outcome (update -> engine): flat, contiguous
//! arrays in the dtypes the executor consumes, rebuilt in place each step. The executor wraps them
//! without copying; nothing here needs a device sync to interpret.
//!
//! Layout of a step with R scheduled requests ("rows", in schedule order: running requests first,
//! then newly admitted ones), T scheduled tokens and S sampling requests:
//!
//! ```text
//! rows r = 0..R       req_ids[r], req_rows[r], query_start_loc[r..=r+1], seq_lens[r]
//! tokens t = 0..T_pad input_ids[t], positions[t], slot_mapping[g * T_pad + t]   (t >= T: padding)
//! samplers s = 0..S   logits_indices[s] (token index), sample_rows[s] (row), logits_cross_pos[s]
//! cross x = 0..X_pad  cross_indices[x] (token index; x >= X repeats the last real index)
//! holes p = 0..P      placeholder_indices[p] (token index), placeholder_sources[p] (previous
//!                     step's sample index): async scheduling only
//! ```
//!
//! Example: rows with 5, 1 and 3 scheduled tokens, where row 0 ends its prompt, row 1 decodes and
//! row 2 is a middle prefill chunk: `query_start_loc = [0, 5, 6, 9]`, `logits_indices = [4, 5]`,
//! `sample_rows = [0, 1]`, `cross_indices = [4, 5]`, `cross_query_start_loc = [0, 1, 2, 2]`,
//! `logits_cross_pos = [0, 1]`.

/// Why a request finished. `u8` codes cross the boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FinishReason {
    /// EOS sampled.
    Stop = 1,
    /// A stop token id sampled (the token is the stop reason).
    StopToken = 2,
    /// `max_tokens` reached, or the sequence reached `max_model_len`.
    Length = 3,
    /// Aborted by the engine (client gone, shutdown).
    Abort = 4,
    /// Finished by the engine after it matched a stop string.
    StopString = 5,
}

/// Code for "still running" in [`StepOutcome::finish_reasons`].
pub const NOT_FINISHED: u8 = 0;

/// Everything the executor needs for one forward pass.
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    /// Monotonic step counter.
    pub step_id: u64,

    // ---- rows (one per scheduled request) --------------------------------------------------
    /// `[R]` request id of each row.
    pub req_ids: Vec<u64>,
    /// `[R]` the request's persistent row in the block tables and per-request arrays
    /// (`0..max_num_seqs`, stable while the request runs, released at finish/preemption).
    pub req_rows: Vec<i32>,
    /// `[R+1]` prefix sums of scheduled tokens per row.
    pub query_start_loc: Vec<i32>,
    /// `[R]` context length after this step (`num_computed + num_scheduled`); keys are
    /// bottom-right aligned: the row's last query sits at position `seq_lens[r] - 1`.
    pub seq_lens: Vec<i32>,
    /// Max over rows of scheduled tokens (1 = pure decode; 0 for an empty plan).
    pub max_query_len: u32,
    /// Max over rows of `seq_lens` (0 for an empty plan).
    pub max_seq_len: u32,

    // ---- tokens (padded to `num_tokens_padded`) ---------------------------------------------
    /// Scheduled tokens T (<= max_num_batched_tokens).
    pub num_tokens: u32,
    /// T padded up to the next token capture size (== T when none applies).
    pub num_tokens_padded: u32,
    /// `[T_pad]` token ids; padding = 0.
    pub input_ids: Vec<i32>,
    /// `[T_pad]` absolute positions; padding = 0.
    pub positions: Vec<i64>,
    /// `[G * T_pad]` group-major: `slot_mapping[g * T_pad + t] = block * block_size + offset`
    /// of token t in group g; padding tokens write to block 0 (slots `0..block_size`).
    pub slot_mapping: Vec<i64>,

    // ---- placeholders (async scheduling; empty in synchronous mode) ---------------------------
    /// `[P]` token indices whose input id is not known when the plan is built: it is the token the
    /// previous step sampled for the row (`input_ids` holds 0 there). Ascending; one per row at
    /// most, always the row's only scheduled token (a decode).
    pub placeholder_indices: Vec<i32>,
    /// `[P]` for each placeholder, the index into the previous step's sampled ids (that plan's
    /// `logits_indices` order) to read: the executor sets
    /// `input_ids[placeholder_indices[p]] = prev_sampled[placeholder_sources[p]]` before the forward.
    pub placeholder_sources: Vec<i32>,

    // ---- KV copies, applied before the forward ------------------------------------------------
    /// `[C * 4]` rows of `(group, src_block, dst_block, num_tokens)`: copy token slots
    /// `0..num_tokens` of `src` to `dst` in every layer of `group`.
    pub kv_copies: Vec<i32>,

    // ---- sampling -------------------------------------------------------------------------------
    /// `[S]` for each request that samples this step (its prompt is complete after this step), the
    /// token index of its last scheduled token. Rows in the middle of a chunked prefill do not sample.
    pub logits_indices: Vec<i32>,
    /// `[S]` the row of each sampling request (index into `req_ids`).
    pub sample_rows: Vec<i32>,

    // ---- cross-decoder selection (fast prefill) ------------------------------------------------------
    /// Real cross rows X: normally S; more when requests asked for prompt logprobs (then all their
    /// scheduled rows are selected, still the trailing rows of their chunk).
    pub num_cross: u32,
    /// X padded to the next cross capture size (== X when none applies).
    pub num_cross_padded: u32,
    /// `[X_pad]` token indices the cross-decoder computes, ascending; padding repeats the last index.
    pub cross_indices: Vec<i32>,
    /// `[R+1]` prefix sums of cross rows per row (rows with no cross rows have equal bounds).
    pub cross_query_start_loc: Vec<i32>,
    /// `[S]` position of each sampling token within the cross rows (`cross_indices[logits_cross_pos[s]]
    /// == logits_indices[s]`).
    pub logits_cross_pos: Vec<i32>,

    // ---- changes since the previous plan ------------------------------------------------------------
    /// Requests admitted (new or resumed) this step, in admission order; the next two arrays are
    /// parallel to this one.
    pub admitted_ids: Vec<u64>,
    /// Persistent row each admitted request was given (its `req_rows` value from now on).
    pub admitted_rows: Vec<i32>,
    /// Tokens of each admitted request already served from the prefix cache (its `num_computed`
    /// at admission), for the engine's per-request cache-hit report.
    pub admitted_num_cached: Vec<i32>,
    /// Requests preempted this step (they lost their rows and blocks and wait again).
    pub preempted_ids: Vec<u64>,
    /// Block-table rows (`req_rows` values) whose contents changed in any group since the last plan.
    pub dirty_rows: Vec<i32>,
}

impl StepPlan {
    /// Number of rows R.
    pub fn num_rows(&self) -> usize {
        self.req_ids.len()
    }
    /// Number of sampling requests S.
    pub fn num_samples(&self) -> usize {
        self.logits_indices.len()
    }

    /// Number of placeholder inputs P (0 in synchronous mode).
    pub fn num_placeholders(&self) -> usize {
        self.placeholder_indices.len()
    }

    /// Writes the placeholder inputs into `input_ids` (a copy of this plan's, or this plan's own)
    /// from the previous step's sampled ids: what a CPU executor does before the forward (a GPU
    /// executor does the same gather on the device). Sources out of range are left at 0 (a failed
    /// previous step; its requests were aborted, so the rows are discarded).
    pub fn fill_placeholders(&self, input_ids: &mut [i32], prev_sampled: &[i32]) {
        for (&t, &s) in self
            .placeholder_indices
            .iter()
            .zip(&self.placeholder_sources)
        {
            input_ids[t as usize] = prev_sampled.get(s as usize).copied().unwrap_or(0);
        }
    }
}

/// What `update` did with the sampled tokens, as flat arrays over the K requests that received a
/// token or finished.
#[derive(Debug, Clone, Default)]
pub struct StepOutcome {
    /// `[K]`
    pub req_ids: Vec<u64>,
    /// `[K]` the token appended, or -1 when none was (a request that finished without a token).
    pub new_tokens: Vec<i32>,
    /// `[K]` [`NOT_FINISHED`] or a [`FinishReason`] code.
    pub finish_reasons: Vec<u8>,
}
