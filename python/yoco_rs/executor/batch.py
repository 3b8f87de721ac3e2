"""``ForwardBatch``: one step's inputs as torch tensors, the executor's contract with the engine.

The engine builds it from the Rust core's ``StepPlan`` (zero-copy ``torch.from_numpy`` views on the
CPU, non-blocking copies to the device). Tests may build it by hand. Field meanings follow
``crates/yoco-core/src/sched/plan.rs``; shapes use R rows, T scheduled tokens (``T_pad`` with padding),
G KV groups, X cross rows (``X_pad`` with padding), C copy ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """One step's input to ``Executor.execute``: the scheduler's plan as flat, padded torch tensors
    (no per-token Python), covering both decoder halves and the KV copies to apply first."""

    num_tokens: int
    """T: real scheduled tokens; ``input_ids[T:]`` is padding (id 0, position 0, slot 0 of block 0)."""
    input_ids: torch.Tensor
    """[T_pad] int64 (or int32) token ids."""
    positions: torch.Tensor
    """[T_pad] int64 absolute positions."""
    query_start_loc: torch.Tensor
    """[R+1] int32 prefix sums of scheduled tokens per row."""
    seq_lens: torch.Tensor
    """[R] int32 context length after this step; queries are bottom-right aligned to it."""
    block_tables: list[torch.Tensor]
    """Per group, [R, max_blocks_per_seq] int32 block ids of each row (0 = null/skipped)."""
    slot_mapping: torch.Tensor
    """[G, T_pad] int64 KV slot (block * block_size + offset) of each token in each group."""
    kv_copies: torch.Tensor
    """[C, 4] int32 rows (group, src_block, dst_block, num_tokens), applied before the forward."""
    num_cross: int
    """X: real cross rows; ``cross_indices[X:]`` repeats the last index."""
    cross_indices: torch.Tensor
    """[X_pad] int64 token indices whose final hidden state (and logits) are needed, ascending."""
    cross_query_start_loc: torch.Tensor
    """[R+1] int32 prefix sums of cross rows per row (the trailing tokens of each row's chunk)."""
    max_query_len: int = 0
    """max over rows of scheduled tokens (1 means pure decode); 0 = unknown, compute if needed."""
    max_seq_len: int = 0
    """max over rows of ``seq_lens``; 0 = unknown."""
    mm_overlay: tuple[torch.Tensor, torch.Tensor] | None = None
    """``(token_index [M] int64, embeddings [M, H])`` written over the token embeddings (image / audio
    inputs, ``executor/mm_inputs.py``); None for text-only steps."""

    @property
    def num_rows(self) -> int:
        """R: requests in the step."""
        return int(self.seq_lens.shape[0])


def plan_batch(plan, block_tables: list[torch.Tensor]) -> ForwardBatch:
    """The ``ForwardBatch`` of a core ``StepPlan`` (zero-copy views of its arrays), given each KV group's
    block-table rows for the plan's rows (``[R, cols]`` int32). The one place a plan becomes a batch:
    the Python engine gathers the rows from the persistent tables, the Rust step loop sends them."""
    return ForwardBatch(
        num_tokens=int(plan.num_tokens),
        input_ids=torch.from_numpy(plan.input_ids),
        positions=torch.from_numpy(plan.positions),
        query_start_loc=torch.from_numpy(plan.query_start_loc),
        seq_lens=torch.from_numpy(plan.seq_lens),
        block_tables=block_tables,
        slot_mapping=torch.from_numpy(plan.slot_mapping),
        kv_copies=torch.from_numpy(plan.kv_copies),
        num_cross=int(plan.num_cross),
        cross_indices=torch.from_numpy(plan.cross_indices),
        cross_query_start_loc=torch.from_numpy(plan.cross_query_start_loc),
        max_query_len=int(plan.max_query_len),
        max_seq_len=int(plan.max_seq_len),
    )
