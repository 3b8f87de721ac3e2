//! Async scheduling (`Scheduler::schedule_ahead`, vLLM's placeholder scheduling): exact cases.
//! Step N+1 is planned while step N awaits its update; a decode whose step-N token is unknown is
//! scheduled on a placeholder the executor fills from step N's samples. The KV-simulating mock
//! makes any wrong input, slot, copy or premature block reuse change the tokens.

use crate::common;

use common::*;
use yoco_core::sched::{FinishReason, NewRequest, NOT_FINISHED};

#[test]
fn a_decode_planned_ahead_takes_its_input_from_the_previous_steps_sample() {
    let mut d = AsyncDriver::new(config(4, 32));
    let prompt = tokens(1, 6);
    let want = d.reference(&prompt, 4, &[]);
    d.add(req(1, prompt.clone(), 4));
    let p0 = d.schedule();
    assert_eq!((p0.num_tokens, p0.num_samples()), (6, 1));
    assert!(p0.placeholder_indices.is_empty());
    // Planned before step 0's token is known: one decode at position 6 on a placeholder that
    // reads step 0's sample 0.
    let p1 = d.schedule();
    assert_eq!(p1.req_ids, [1]);
    assert_eq!(&p1.positions[..1], [6]);
    assert_eq!(p1.seq_lens, [7]);
    assert_eq!(p1.placeholder_indices, [0]);
    assert_eq!(p1.placeholder_sources, [0]);
    assert_eq!(p1.input_ids[0], 0);
    assert_eq!(p1.logits_indices, [0], "the placeholder row samples");
    let o0 = d.update();
    assert_eq!(o0.new_tokens, [want[0] as i32]);
    let mut got = vec![want[0]];
    got.extend(d.run(20).remove(&1).unwrap());
    assert_eq!(got, want, "every later decode ran on the right placeholder");
}

#[test]
fn a_request_that_finishes_at_n_has_its_n_plus_1_row_discarded_and_frees_everything() {
    // Prompt of 7 tokens, block = sub-block = 4: step 0 computes positions 0..6 and samples EOS;
    // step 1, planned ahead, computes position 7 (completing block 1) on the placeholder.
    let mut d = AsyncDriver::new(config(4, 32));
    let prompt = tokens(2, 7);
    let first = d.reference(&prompt, 1, &[])[0];
    d.add(NewRequest {
        eos_token_ids: vec![first],
        ..req(1, prompt.clone(), 8)
    });
    let p0 = d.schedule();
    assert_eq!(p0.num_tokens, 7);
    let p1 = d.schedule();
    assert_eq!(
        p1.req_ids,
        [1],
        "EOS cannot be foreseen: the decode is planned"
    );
    assert_eq!(p1.placeholder_indices, [0]);
    let o0 = d.update();
    assert_eq!(o0.req_ids, [1]);
    assert_eq!(o0.new_tokens, [first as i32]);
    assert_eq!(o0.finish_reasons, [FinishReason::Stop as u8]);
    assert_eq!(d.s.num_unfinished(), 0);
    assert_eq!(
        d.s.stats().kv.blocks_used,
        0,
        "blocks of the discarded row are free"
    );
    // Only what step 0 computed is indexed: sub-block 0, not block 1 (step 1 wrote its last slot
    // and had not been updated when the request ended).
    assert_eq!(d.s.kv().num_indexed_hashes(0), 1);
    let o1 = d.update();
    assert!(o1.req_ids.is_empty(), "the extra row emits nothing");
    assert!(d.in_flight.is_empty() && !d.s.awaiting_update());
    d.s.check_invariants().unwrap();

    // A later request with the same history hits exactly the indexed prefix, and its tokens are
    // right (the KV it reads was computed from known tokens).
    let mut p2 = prompt.clone();
    p2.extend([first, 20, 21]);
    let want = d.reference(&p2, 3, &[]);
    d.add(req(2, p2, 3));
    let p = d.schedule();
    assert_eq!(p.admitted_num_cached, [4]);
    let mut outs = d.run(20);
    assert_eq!(outs.remove(&2).unwrap(), want);
    assert_eq!(d.s.stats().kv.blocks_used, 0);
}

#[test]
fn a_length_limit_reached_by_the_placeholder_is_not_scheduled_again() {
    let mut d = AsyncDriver::new(config(4, 32));
    d.add(req(1, tokens(3, 5), 1));
    d.schedule();
    let p1 = d.schedule();
    assert_eq!(
        p1.num_rows(),
        0,
        "max_tokens 1: the token in flight is the last"
    );
    let o = d.update();
    assert_eq!(o.finish_reasons, [FinishReason::Length as u8]);

    d.add(req(2, tokens(4, 5), 2));
    d.schedule();
    let p1 = d.schedule();
    assert_eq!(p1.req_ids, [2]);
    assert_eq!(d.update().finish_reasons, [NOT_FINISHED]);
    let p2 = d.schedule();
    assert_eq!(
        p2.num_rows(),
        0,
        "max_tokens 2: the second token is in flight"
    );
    assert_eq!(d.update().finish_reasons, [FinishReason::Length as u8]);

    // max_model_len: a placeholder at the last position ends the request; no row past it (which
    // would need a block-table column beyond max_model_len).
    let mut c = config(4, 32);
    c.max_model_len = 8;
    let mut d = AsyncDriver::new(c);
    d.add(req(3, tokens(5, 7), 100));
    d.schedule();
    assert_eq!(d.schedule().num_rows(), 0);
    assert_eq!(d.update().finish_reasons, [FinishReason::Length as u8]);
    assert_eq!(d.s.stats().kv.blocks_used, 0);
}

#[test]
fn a_request_preempted_while_its_placeholder_is_outstanding_keeps_that_token() {
    // Block size 4, 6 usable blocks: A and B (8-token prompts) each need a 4th block at position
    // 12, so FCFS preempts B (the later admitted) in the plan that schedules A's position 12;
    // that plan is planned ahead while the step holding B's previous sample awaits update.
    let mut d = AsyncDriver::new(config(4, 7));
    let (pa, pb) = (tokens(1, 8), tokens(2, 8));
    d.add(req(1, pa.clone(), 6));
    d.add(req(2, pb.clone(), 12));
    let mut outs: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    let mut last_plan_ids: Vec<u64> = Vec::new();
    let mut checked = false;
    for _ in 0..100 {
        if d.s.num_unfinished() == 0 && d.in_flight.is_empty() {
            break;
        }
        let (p, o) = d.step();
        let o = o.unwrap_or_default();
        if !p.preempted_ids.is_empty() {
            assert_eq!(p.preempted_ids, [2]);
            assert!(
                last_plan_ids.contains(&2),
                "B sampled in the step still awaiting update"
            );
            // The update right after resolves B's placeholder although B is now waiting.
            let i = o.req_ids.iter().position(|&id| id == 2).expect("B's token");
            assert_eq!(o.finish_reasons[i], NOT_FINISHED);
            let n = outs.get(&2).map_or(0, Vec::len);
            assert_eq!(o.new_tokens[i] as u32, d.reference(&pb, 12, &[])[n]);
            checked = true;
        }
        for (k, &id) in o.req_ids.iter().enumerate() {
            outs.entry(id).or_default().push(o.new_tokens[k] as u32);
        }
        if p.num_rows() > 0 {
            last_plan_ids = p.req_ids.clone();
        }
    }
    assert!(
        checked,
        "the preemption happened with B's placeholder outstanding"
    );
    assert_eq!(d.s.stats().num_preemptions, 1);
    assert_eq!(outs[&1], d.reference(&pa, 6, &[]));
    assert_eq!(
        outs[&2],
        d.reference(&pb, 12, &[]),
        "recompute after preemption"
    );
    assert_eq!(d.s.stats().kv.blocks_used, 0);
}

#[test]
fn the_last_prefill_chunk_samples_and_the_first_decode_is_planned_on_its_placeholder() {
    let mut c = config(4, 64);
    c.max_num_batched_tokens = 4;
    let mut d = AsyncDriver::new(c);
    let prompt = tokens(6, 10);
    let want = d.reference(&prompt, 3, &[]);
    d.add(req(1, prompt.clone(), 3));
    let mut got = Vec::new();
    let mut plans = Vec::new();
    for _ in 0..4 {
        let (p, o) = d.step();
        plans.push(p);
        got.extend(o.into_iter().flat_map(|o| o.new_tokens).map(|t| t as u32));
    }
    let pos = |k: usize| plans[k].positions[..plans[k].num_tokens as usize].to_vec();
    assert_eq!(pos(0), [0, 1, 2, 3]);
    assert_eq!(
        pos(1),
        [4, 5, 6, 7],
        "a middle chunk is planned ahead on known tokens"
    );
    assert_eq!(pos(2), [8, 9]);
    assert_eq!(pos(3), [10]);
    for k in 0..3 {
        assert!(plans[k].placeholder_indices.is_empty(), "plan {k}");
    }
    assert_eq!(plans[0].num_samples() + plans[1].num_samples(), 0);
    assert_eq!(plans[2].num_samples(), 1, "the last chunk samples");
    assert_eq!(plans[3].placeholder_indices, [0]);
    assert_eq!(plans[3].placeholder_sources, [0]);
    got.extend(d.run(20).remove(&1).unwrap());
    assert_eq!(got, want);
}

#[test]
fn a_copy_source_stays_pinned_until_the_update_of_the_step_that_copies_it() {
    // Block 8, sub-block 4. A (16 tokens) leaves blocks holding sub-blocks [0,1] and [2,3]. B
    // matches sub-blocks 0..=2: block 0 shared, and block 1's first sub-block copied (its source
    // holds more than the match, so it is not adopted).
    let mut c = config(8, 32);
    c.kv.sub_block_size = 4;
    let mut d = AsyncDriver::new(c);
    let pa = tokens(7, 16);
    d.add(req(1, pa.clone(), 1));
    d.run(10);
    d.add(req(3, tokens(8, 5), 6));
    d.schedule(); // C's prefill: in flight
    let mut pb = pa[..12].to_vec();
    pb.extend(tokens(9, 4));
    let want = d.reference(&pb, 4, &[]);
    d.add(req(2, pb, 4));
    let p = d.schedule(); // ahead: C's decode on a placeholder, B admitted with a copy
    assert_eq!(p.admitted_ids, [2]);
    assert_eq!(p.admitted_num_cached, [12]);
    assert_eq!(p.kv_copies.len(), 4, "one copy op");
    let src = p.kv_copies[1] as u32;
    assert_eq!(d.s.kv().ref_count(0, src), 1, "pinned for the copy");
    d.update(); // step of C's prefill: its update must not unpin B's source
    assert_eq!(
        d.s.kv().ref_count(0, src),
        1,
        "the copy has not run yet (its step awaits update)"
    );
    d.step(); // plans the next step, updates B's admission step
    assert_eq!(
        d.s.kv().ref_count(0, src),
        0,
        "unpinned once its step was updated"
    );
    let mut outs = d.run(40);
    assert_eq!(outs.remove(&2).unwrap()[..], want[1..]);
}

#[test]
fn finishing_by_the_engine_after_update_discards_the_row_already_planned() {
    // The step loop matches stop strings after update(N), when N+1 is already planned.
    let mut d = AsyncDriver::new(config(4, 32));
    d.add(req(1, tokens(10, 5), 10));
    d.schedule();
    let p1 = d.schedule();
    assert_eq!(p1.req_ids, [1]);
    d.update();
    assert!(d.s.finish(1, FinishReason::StopString));
    assert_eq!(d.s.stats().kv.blocks_used, 0);
    assert!(d.update().req_ids.is_empty());
    d.s.check_invariants().unwrap();
}

#[test]
#[should_panic(expected = "two plans awaiting update")]
fn at_most_one_step_runs_ahead() {
    let mut d = AsyncDriver::new(config(4, 32));
    d.add(req(1, tokens(11, 5), 10));
    d.schedule();
    d.schedule();
    d.s.schedule_ahead();
}

#[test]
fn sliding_window_blocks_are_indexed_before_the_window_releases_them() {
    // Window 8, block = sub-block 4: a 32-token prompt's first blocks leave the window in the very
    // next plan, which async mode builds before the prefill's update. They must still be indexed
    // (released only after that update), so a later request sharing 24 tokens hits them as it
    // does in synchronous mode, and reads the right KV.
    let mut c = config(4, 64);
    c.layers = vec![
        yoco_core::kv::LayerKind::Sliding { window: 8 },
        yoco_core::kv::LayerKind::Full,
    ];
    c.kv.num_blocks = vec![64, 64];
    let prompt = tokens(12, 32);
    let mut p2 = prompt[..24].to_vec();
    p2.extend(tokens(13, 6));

    let mut d = Driver::new(c.clone());
    d.add(req(1, prompt.clone(), 3));
    d.run(20);
    d.add(req(2, p2.clone(), 3));
    let (p, _) = d.step();
    assert_eq!(
        p.admitted_num_cached,
        [24],
        "synchronous: the shared prefix is a hit"
    );

    let mut d = AsyncDriver::new(c);
    let want = d.reference(&p2, 3, &[]);
    d.add(req(1, prompt, 3));
    d.run(20);
    d.add(req(2, p2, 3));
    let p = d.schedule();
    assert_eq!(
        p.admitted_num_cached,
        [24],
        "async: the same KV was indexed"
    );
    assert_eq!(d.run(20).remove(&2).unwrap(), want);
    assert_eq!(d.s.stats().kv.blocks_used, 0);
}
