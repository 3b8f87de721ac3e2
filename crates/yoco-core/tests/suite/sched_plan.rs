//! The step plan's arrays for mixed batches, spelled out: rows, tokens, sampling, the cross-decoder
//! selection (fast prefill), padding, block tables and dirty rows.

use crate::common;

use common::*;
use yoco_core::sched::{NewRequest, SchedulerConfig};

/// Budget 9, threshold 7, block size 4: step 1 runs P's first chunk (7 of 12) and D's 1-token
/// prompt; step 2 adds L (20 tokens). Step 2's rows: P ends its prompt (5), D decodes (1), L's first
/// chunk (3) is a middle chunk: the batch of plan.rs's module doc.
fn mixed(
    l_prompt_logprobs: bool,
    token_sizes: Vec<u32>,
    cross_sizes: Vec<u32>,
) -> (Driver, Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut c: SchedulerConfig = config(4, 64);
    c.max_num_batched_tokens = 9;
    c.long_prefill_token_threshold = 7;
    c.token_capture_sizes = token_sizes;
    c.cross_capture_sizes = cross_sizes;
    let mut d = Driver::new(c);
    let (p, dd, l) = (tokens(1, 12), tokens(2, 1), tokens(3, 20));
    d.add(req(10, p.clone(), 5));
    d.add(req(11, dd.clone(), 5));
    let (p1, o1) = d.step();
    assert_eq!(row_tokens(&p1), [7, 1]);
    assert_eq!(p1.logits_indices, [7], "only D samples in step 1");
    assert_eq!(o1.req_ids, [11]);
    d.add(NewRequest {
        prompt_logprobs: l_prompt_logprobs,
        ..req(12, l.clone(), 5)
    });
    (d, p, dd, l)
}

#[test]
fn mixed_prefill_decode_and_middle_chunk_batch_has_the_documented_arrays() {
    let (mut d, p, _dd, l) = mixed(false, vec![], vec![]);
    let d_out = d.s.request_progress(11).unwrap().0.to_vec();
    let plan = d.schedule();
    assert_eq!(plan.req_ids, [10, 11, 12]);
    assert_eq!(plan.req_rows, [0, 1, 2]);
    assert_eq!(plan.query_start_loc, [0, 5, 6, 9]);
    assert_eq!(plan.seq_lens, [12, 2, 3]);
    assert_eq!(plan.num_tokens, 9);
    assert_eq!(plan.num_tokens_padded, 9);
    let mut ids: Vec<i32> = p[7..12].iter().map(|&x| x as i32).collect();
    ids.push(d_out[0] as i32);
    ids.extend(l[..3].iter().map(|&x| x as i32));
    assert_eq!(plan.input_ids, ids);
    assert_eq!(plan.positions, [7, 8, 9, 10, 11, 1, 0, 1, 2]);
    assert_eq!(plan.logits_indices, [4, 5]);
    assert_eq!(plan.sample_rows, [0, 1]);
    assert_eq!(plan.num_cross, 2);
    assert_eq!(plan.cross_indices, [4, 5]);
    assert_eq!(plan.cross_query_start_loc, [0, 1, 2, 2]);
    assert_eq!(plan.logits_cross_pos, [0, 1]);
    assert_eq!(plan.admitted_ids, [12]);
    assert_eq!(plan.admitted_rows, [2]);
    assert_eq!(plan.admitted_num_cached, [0]);
    assert!(plan.preempted_ids.is_empty());
    assert_eq!(plan.max_query_len, 5);
    assert_eq!(plan.max_seq_len, 12);
    // P grew from 2 to 3 blocks, D stays in its first block, L is new.
    assert_eq!(plan.dirty_rows, [0, 2]);
    let out = d.finish_step();
    assert_eq!(out.req_ids, [10, 11]);
}

#[test]
fn prompt_logprobs_widen_the_cross_selection_to_all_scheduled_rows() {
    let (mut d, ..) = mixed(true, vec![], vec![]);
    let plan = d.schedule();
    assert_eq!(plan.query_start_loc, [0, 5, 6, 9]);
    assert_eq!(plan.logits_indices, [4, 5]);
    assert_eq!(plan.num_cross, 5);
    assert_eq!(plan.cross_indices, [4, 5, 6, 7, 8]);
    assert_eq!(plan.cross_query_start_loc, [0, 1, 2, 5]);
    assert_eq!(plan.logits_cross_pos, [0, 1]);
    d.finish_step();
    // L's next chunks stay fully selected, and its sampling row is the last of them.
    let plan = d.schedule();
    let k = plan.req_ids.iter().position(|&id| id == 12).unwrap();
    let (a, b) = (plan.query_start_loc[k], plan.query_start_loc[k + 1]);
    let (ca, cb) = (
        plan.cross_query_start_loc[k] as usize,
        plan.cross_query_start_loc[k + 1] as usize,
    );
    assert_eq!(plan.cross_indices[ca..cb], (a..b).collect::<Vec<_>>()[..]);
}

#[test]
fn prompt_logprobs_requests_never_read_the_prefix_cache() {
    let mut d = Driver::new(config(4, 64));
    let prompt = tokens(7, 20);
    d.add(req(1, prompt.clone(), 1));
    d.run(10);
    d.add(NewRequest {
        prompt_logprobs: true,
        ..req(2, prompt.clone(), 1)
    });
    d.add(req(3, prompt.clone(), 1));
    let plan = d.schedule();
    assert_eq!(plan.admitted_ids, [2, 3]);
    assert_eq!(
        plan.admitted_num_cached[0], 0,
        "prompt logprobs need every prompt row computed"
    );
    assert!(
        plan.admitted_num_cached[1] > 0,
        "a plain request hits the cached prompt"
    );
    assert_eq!(row_tokens(&plan)[0], 20);
}

#[test]
fn padding_rounds_tokens_up_and_repeats_the_last_cross_index() {
    let (mut d, ..) = mixed(false, vec![4, 16, 32], vec![1, 4, 8]);
    let plan = d.schedule();
    assert_eq!(plan.num_tokens, 9);
    assert_eq!(plan.num_tokens_padded, 16);
    assert_eq!(plan.input_ids.len(), 16);
    assert!(plan.input_ids[9..].iter().all(|&x| x == 0));
    assert!(plan.positions[9..].iter().all(|&x| x == 0));
    for g in 0..d.s.num_groups() {
        assert!(
            plan.slot_mapping[g * 16 + 9..(g + 1) * 16]
                .iter()
                .all(|&x| x == 0),
            "padding writes slot 0 of block 0"
        );
    }
    assert_eq!(plan.num_cross, 2);
    assert_eq!(plan.num_cross_padded, 4);
    assert_eq!(plan.cross_indices, [4, 5, 5, 5]);
    // Sampling is unaffected by padding.
    assert_eq!(plan.logits_indices, [4, 5]);
    d.finish_step();
}

#[test]
fn token_count_above_every_capture_size_is_not_padded() {
    let mut c = config(4, 64);
    c.token_capture_sizes = vec![1, 2, 4];
    c.cross_capture_sizes = vec![1];
    let mut d = Driver::new(c);
    d.add(req(1, tokens(1, 10), 2));
    d.add(req(2, tokens(2, 3), 2));
    let plan = d.schedule();
    assert_eq!((plan.num_tokens, plan.num_tokens_padded), (13, 13));
    assert_eq!((plan.num_cross, plan.num_cross_padded), (2, 2));
    d.finish_step();
    // Pure decode of 2 rows pads to 2 tokens exactly, and 2 cross rows stay 2.
    let plan = d.schedule();
    assert_eq!((plan.num_tokens, plan.num_tokens_padded), (2, 2));
    assert_eq!(plan.max_query_len, 1);
    d.finish_step();
}

#[test]
fn block_tables_are_persistent_and_only_changed_rows_are_dirty() {
    let mut d = Driver::new(config(4, 64));
    d.add(req(1, tokens(1, 6), 10));
    d.add(req(2, tokens(2, 3), 10));
    let plan = d.schedule();
    assert_eq!(plan.dirty_rows, [0, 1]);
    let mbps = d.s.max_blocks_per_seq();
    d.finish_step();
    let mut dirty_steps = Vec::new();
    for step in 0..6 {
        let before: Vec<i32> = d.s.block_table(0).to_vec();
        let plan = d.schedule();
        let after = d.s.block_table(0).to_vec();
        for row in 0..2usize {
            let changed =
                before[row * mbps..(row + 1) * mbps] != after[row * mbps..(row + 1) * mbps];
            assert_eq!(
                changed,
                plan.dirty_rows.contains(&(row as i32)),
                "step {step} row {row}"
            );
            if changed {
                dirty_steps.push((step, row));
            }
        }
        d.finish_step();
    }
    // Request 1 (6 tokens) crosses into its third block at position 8 (step 2), request 2 (3
    // tokens) into its second at position 4 (step 1) and its third at position 8 (step 5).
    assert_eq!(dirty_steps, [(1, 1), (2, 0), (5, 1)]);
}

#[test]
fn sliding_window_and_full_groups_each_map_every_token() {
    use yoco_core::kv::LayerKind;
    let layers = vec![
        LayerKind::Sliding { window: 8 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 0 },
        LayerKind::SharesKv { donor: 1 },
    ];
    let mut c = SchedulerConfig::new(layers, 4, 64).unwrap();
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 16;
    c.max_model_len = 200;
    let mut d = Driver::new(c);
    assert_eq!(d.s.num_groups(), 2);
    let prompt = tokens(5, 40);
    d.add(req(1, prompt.clone(), 20));
    let want = d.reference(&prompt, 20, &[]);
    let mut got = Vec::new();
    while d.s.num_unfinished() > 0 {
        let (_, o) = d.step();
        got.extend(o.new_tokens.iter().map(|&t| t as u32));
    }
    assert_eq!(
        got, want,
        "the KV-simulating mock reads only what the window keeps"
    );
}
