"""The profiling pass that sizes the KV pool: the largest step's forward and sampler run once before the
pool exists, their peak bytes are counted (on the CPU by ``AllocationCounter``, standing in for the CUDA
allocator's statistics), and the pool is what a device budget holds once that much is left free."""

from __future__ import annotations

import pytest
import torch

from yoco_rs import bundled
from yoco_rs.executor import Executor
from yoco_rs.executor.memory_profile import AllocationCounter, StepMemory, largest_step, profile_step_memory
from yoco_rs.runtime import plan_kv_pool

MNBT, SEQS, BS = 512, 16, 16


@pytest.fixture(scope="module")
def executor():
    return Executor.from_pretrained(bundled.default_model_dir(), device="cpu")


def test_the_allocation_counter_counts_live_storages_and_their_peak():
    with AllocationCounter() as c:
        a = torch.ones(1000, dtype=torch.float32)  # 4000 bytes, kept
        b = torch.ones(2000, dtype=torch.float32)  # 8000 bytes, freed below
        v = a[:10]  # a view allocates nothing
        a.add_(1)  # in place: nothing
        del b
        d = a * 2  # 4000 bytes, kept
    assert c.peak == 4000 + 8000  # b was freed before d was allocated
    assert c.live == 4000 + 4000
    del v, d


def test_the_largest_step_uses_the_whole_token_budget_and_samples_every_row():
    b = largest_step(3, max_num_batched_tokens=100, max_num_seqs=8, block_size=16)
    assert b.num_tokens == 100 and b.num_rows == 8 and b.num_cross == 8
    assert b.query_start_loc.tolist()[-1] == 100 and b.seq_lens.sum().item() == 100
    assert b.cross_indices.tolist() == [q - 1 for q in b.query_start_loc.tolist()[1:]]


def test_profiling_counts_the_logits_and_the_sampler_temporaries(executor):
    step = profile_step_memory(executor, max_num_batched_tokens=MNBT, max_num_seqs=SEQS, block_size=BS)
    vocab = int(executor.args.vocab_size)
    assert step.forward_bytes >= SEQS * vocab * 4  # at least the float32 logits of every sampled row
    # penalty state [max_num_seqs, vocab] int32 + bool, and the top-k/top-p sort's int64 indices
    assert step.sampler_bytes >= SEQS * vocab * (4 + 1) + SEQS * vocab * 8
    assert step.graph_bytes == 0 and step.total == step.forward_bytes + step.sampler_bytes
    assert not executor.kv_caches  # the stand-in pool is gone
    bigger = profile_step_memory(executor, max_num_batched_tokens=2 * MNBT, max_num_seqs=SEQS, block_size=BS)
    assert bigger.forward_bytes > step.forward_bytes  # a bigger step needs more


def test_the_profiled_step_shrinks_the_pool_under_a_fake_device_budget(executor):
    step = profile_step_memory(executor, max_num_batched_tokens=MNBT, max_num_seqs=SEQS, block_size=BS)
    budget = 64 << 20
    kw = dict(max_num_seqs=SEQS, max_num_batched_tokens=MNBT)
    plain = executor.plan_kv(BS, budget, **kw)
    sized = plan_kv_pool(executor, BS, budget, step, **kw)
    block_set = sum(sized.bytes_per_block)  # one block in every group: the pool's granularity
    assert sized.total_bytes <= budget - step.total
    assert plain.total_bytes - sized.total_bytes >= step.total - block_set
    assert sized.max_tokens < plain.max_tokens
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        plan_kv_pool(executor, BS, step.total, step, **kw)


def test_the_budget_split_reads_as_the_startup_line_prints_it():
    s = StepMemory(forward_bytes=3 << 30, sampler_bytes=512 << 20, graph_bytes=1 << 30)
    assert s.describe() == "step 4.50 GiB (forward 3.00 GiB, sampler 0.50 GiB, graphs 1.00 GiB)"
