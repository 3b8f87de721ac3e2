//! Stop conditions through `update`, abort and finish in every state, and leak freedom
//! (scheduler.md §3, §10.6 SCH-10, SCH-11, SCH-14).

use crate::common;

use common::*;
use yoco_core::sched::{FinishReason, NewRequest, Scheduler, NOT_FINISHED};

/// Schedules one step and feeds `tok` to every sampling request.
fn step_with(s: &mut Scheduler, tok: i32) -> Vec<(u64, i32, u8)> {
    let n = s.schedule().num_samples();
    let o = s.update(&vec![tok; n]).unwrap().clone();
    s.check_invariants().unwrap();
    (0..o.req_ids.len())
        .map(|k| (o.req_ids[k], o.new_tokens[k], o.finish_reasons[k]))
        .collect()
}

fn all_blocks_free(s: &Scheduler) -> bool {
    let c = s.config();
    (0..s.num_groups()).all(|g| s.kv().num_free_blocks(g) == c.kv.num_blocks[g] - 1)
}

#[test]
fn eos_stops_with_reason_stop_and_frees_the_request() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(NewRequest {
        eos_token_ids: vec![2],
        ..req(1, tokens(1, 5), 10)
    })
    .unwrap();
    assert_eq!(step_with(&mut s, 20), [(1, 20, NOT_FINISHED)]);
    assert_eq!(step_with(&mut s, 2), [(1, 2, FinishReason::Stop as u8)]);
    assert!(!s.contains(1));
    assert!(all_blocks_free(&s));
}

#[test]
fn ignore_eos_keeps_going_and_stop_ids_report_stop_token() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(NewRequest {
        eos_token_ids: vec![2],
        ignore_eos: true,
        stop_token_ids: vec![42],
        ..req(1, tokens(1, 5), 10)
    })
    .unwrap();
    assert_eq!(step_with(&mut s, 2), [(1, 2, NOT_FINISHED)]);
    assert_eq!(
        step_with(&mut s, 42),
        [(1, 42, FinishReason::StopToken as u8)]
    );
}

#[test]
fn max_tokens_caps_the_output_with_reason_length() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(req(1, tokens(1, 5), 2)).unwrap();
    assert_eq!(step_with(&mut s, 10), [(1, 10, NOT_FINISHED)]);
    assert_eq!(step_with(&mut s, 11), [(1, 11, FinishReason::Length as u8)]);
    assert_eq!(s.num_unfinished(), 0);
}

#[test]
fn min_tokens_defers_eos_and_stop_ids() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(NewRequest {
        eos_token_ids: vec![2],
        stop_token_ids: vec![42],
        min_tokens: 3,
        ..req(1, tokens(1, 5), 10)
    })
    .unwrap();
    assert_eq!(step_with(&mut s, 2), [(1, 2, NOT_FINISHED)]);
    assert_eq!(step_with(&mut s, 42), [(1, 42, NOT_FINISHED)]);
    assert_eq!(step_with(&mut s, 2), [(1, 2, FinishReason::Stop as u8)]);
}

#[test]
fn reaching_max_model_len_stops_with_reason_length() {
    let mut c = config(16, 64);
    c.max_model_len = 8;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, tokens(1, 6), 100)).unwrap();
    assert_eq!(step_with(&mut s, 10), [(1, 10, NOT_FINISHED)]);
    assert_eq!(step_with(&mut s, 11), [(1, 11, FinishReason::Length as u8)]);
    // A prompt of exactly max_model_len still samples one token.
    s.add_request(req(2, tokens(2, 8), 100)).unwrap();
    assert_eq!(step_with(&mut s, 12), [(2, 12, FinishReason::Length as u8)]);
}

#[test]
fn abort_in_every_state_frees_everything() {
    let mut c = config(4, 9);
    c.max_num_batched_tokens = 8;
    let mut s = Scheduler::new(c).unwrap();
    // Waiting.
    s.add_request(req(1, tokens(1, 4), 4)).unwrap();
    assert!(s.abort(1));
    // Running, mid-prefill (12-token prompt, 8-token budget).
    s.add_request(req(2, tokens(2, 12), 4)).unwrap();
    step_with(&mut s, 20);
    assert_eq!(s.request_progress(2).unwrap().1, 8);
    assert!(s.abort(2));
    assert!(all_blocks_free(&s));
    // Running, decoding.
    s.add_request(req(3, tokens(3, 4), 10)).unwrap();
    step_with(&mut s, 20);
    step_with(&mut s, 21);
    assert!(s.abort(3));
    assert!(all_blocks_free(&s));
    // Preempted (waiting again after losing its blocks): A and B grow until B is preempted.
    s.add_request(req(4, tokens(4, 8), 16)).unwrap();
    s.add_request(req(5, tokens(5, 8), 16)).unwrap();
    while s.stats().num_preemptions == 0 {
        step_with(&mut s, 30);
    }
    assert_eq!(s.stats().num_waiting, 1);
    assert!(s.abort(5));
    assert!(s.abort(4));
    s.check_invariants().unwrap();
    assert!(all_blocks_free(&s));
    assert_eq!(s.num_unfinished(), 0);
}

#[test]
fn abort_between_schedule_and_update_is_skipped_by_update() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(req(1, tokens(1, 5), 10)).unwrap();
    s.add_request(req(2, tokens(2, 5), 10)).unwrap();
    assert_eq!(s.schedule().num_samples(), 2);
    assert!(s.abort(1));
    // The same id comes back at once (and may reuse the slot): it must not receive the old token.
    s.add_request(req(1, tokens(3, 7), 10)).unwrap();
    let o = s.update(&[20, 21]).unwrap();
    assert_eq!(o.req_ids, [2]);
    assert_eq!(o.new_tokens, [21]);
    assert_eq!(s.request_progress(1).unwrap(), (&[][..], 0));
    s.check_invariants().unwrap();
    let p = s.schedule();
    assert_eq!(p.req_ids, [2, 1]);
}

#[test]
fn finish_frees_a_running_request_for_an_engine_side_reason() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(req(1, tokens(1, 5), 10)).unwrap();
    step_with(&mut s, 20);
    assert!(s.finish(1, FinishReason::StopString));
    assert!(!s.finish(1, FinishReason::StopString));
    assert!(all_blocks_free(&s));
}

#[test]
fn requests_run_to_completion_leave_no_block_referenced() {
    let mut d = Driver::new(config(16, 64));
    for i in 0..5 {
        d.add(req(i, tokens(i % 2, 10), 10));
    }
    d.run(100);
    assert_eq!(d.s.num_unfinished(), 0);
    let st = d.s.stats();
    assert_eq!((st.num_running, st.num_waiting), (0, 0));
    assert!(all_blocks_free(&d.s));
    assert_eq!(st.kv.blocks_used, 0);
    assert!(
        d.s.reset_prefix_cache(),
        "nothing referenced: the cache can be reset"
    );
}

#[test]
fn reset_prefix_cache_fails_while_requests_hold_blocks() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    s.add_request(req(1, tokens(1, 40), 4)).unwrap();
    step_with(&mut s, 20);
    assert!(!s.reset_prefix_cache());
    assert!(s.abort(1));
    assert!(s.reset_prefix_cache());
}

#[test]
fn a_second_turn_recomputes_only_past_its_last_full_cached_block() {
    // vLLM's multi-turn case: the next prompt is the first prompt + its outputs + new tokens; all
    // full blocks of computed tokens hit, so only `prompt_len % 16` tokens are scheduled.
    let mut d = Driver::new(config(16, 64));
    let prompt = tokens(1, 40);
    d.add(req(1, prompt.clone(), 10));
    let mut turn2 = prompt.clone();
    while d.s.num_unfinished() > 0 {
        let (_, o) = d.step();
        turn2.extend(o.new_tokens.iter().map(|&t| t as u32));
    }
    assert_eq!(turn2.len(), 50);
    turn2.extend(tokens(2, 5));
    d.add(req(2, turn2.clone(), 3));
    let (p, _) = d.step();
    assert_eq!(p.admitted_num_cached, [48]);
    assert_eq!(row_tokens(&p), [55 % 16]);
    d.run(10);
}
