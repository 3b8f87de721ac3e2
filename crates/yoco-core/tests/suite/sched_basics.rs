//! Queues, admission order, limits and request validation (scheduler.md §10.6 SCH-1..4).

use crate::common;

use common::*;
use yoco_core::sched::{NewRequest, Scheduler};
use yoco_core::Error;

#[test]
fn added_requests_wait_in_arrival_order_until_scheduled() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    for i in 0..10 {
        s.add_request(req(i, tokens(i, 10), 4)).unwrap();
        assert_eq!(s.stats().num_waiting as u64, i + 1);
        assert_eq!(s.num_unfinished() as u64, i + 1);
    }
    let p = s.schedule();
    assert_eq!(
        p.req_ids,
        (0..10).collect::<Vec<_>>(),
        "all admitted as new, in arrival order"
    );
    assert_eq!(p.admitted_ids, (0..10).collect::<Vec<_>>());
    assert_eq!(row_tokens(p), [10; 10]);
    assert_eq!(p.req_rows, (0..10).collect::<Vec<i32>>());
    assert_eq!(s.stats().num_running, 10);
    assert_eq!(s.stats().num_waiting, 0);
}

#[test]
fn aborting_waiting_requests_shrinks_the_queue() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    for i in 0..10 {
        s.add_request(req(i, tokens(i, 10), 4)).unwrap();
    }
    for i in 0..10 {
        assert!(s.abort(i));
        assert!(!s.abort(i), "second abort is a no-op");
        assert_eq!(s.num_unfinished() as u64, 9 - i);
        assert_eq!(s.stats().num_waiting as u64, 9 - i);
    }
    assert!(s.schedule().req_ids.is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn max_num_seqs_caps_running_requests() {
    let mut c = config(16, 64);
    c.max_num_seqs = 3;
    let mut s = Scheduler::new(c).unwrap();
    for i in 0..10 {
        s.add_request(req(i, tokens(i, 10), 4)).unwrap();
    }
    let p = s.schedule();
    assert_eq!(p.req_ids, [0, 1, 2]);
    let st = s.stats();
    assert_eq!((st.num_running, st.num_waiting), (3, 7));
}

#[test]
fn empty_scheduler_plans_an_empty_step_and_update_accepts_nothing() {
    let mut s = Scheduler::new(config(16, 64)).unwrap();
    let p = s.schedule();
    assert_eq!(p.num_rows(), 0);
    assert_eq!(p.query_start_loc, [0]);
    assert!(!s.awaiting_update());
    assert!(s.update(&[]).unwrap().req_ids.is_empty());
    assert!(s.update(&[5]).is_err(), "no plan awaits a token");
}

#[test]
fn update_rejects_a_wrong_number_of_tokens_without_changing_anything() {
    let mut d = Driver::new(config(16, 64));
    d.add(req(1, tokens(1, 5), 3));
    d.add(req(2, tokens(2, 5), 3));
    d.schedule();
    let err = d.s.update(&[20]).unwrap_err();
    assert!(
        matches!(&err, Error::Request(m) if m.contains("expected 2")),
        "{err}"
    );
    assert!(d.s.update(&[20, -1]).is_err());
    assert!(d.s.awaiting_update());
    let out = d.s.update(&[20, 21]).unwrap();
    assert_eq!(out.req_ids, [1, 2]);
    assert_eq!(out.new_tokens, [20, 21]);
}

#[test]
fn invalid_requests_are_rejected_with_the_reason() {
    let mut c = config(16, 9);
    c.max_model_len = 100;
    let mut s = Scheduler::new(c).unwrap();
    let msg = |e: Error| e.to_string();
    assert!(msg(s.add_request(req(1, vec![], 4)).unwrap_err()).contains("empty"));
    assert!(
        msg(s.add_request(req(1, tokens(1, 101), 4)).unwrap_err()).contains("max_model_len = 100")
    );
    assert!(msg(s.add_request(req(1, tokens(1, 10), 0)).unwrap_err()).contains("max_tokens"));
    let e = s
        .add_request(NewRequest {
            min_tokens: 5,
            ..req(1, tokens(1, 10), 4)
        })
        .unwrap_err();
    assert!(msg(e).contains("min_tokens"));
    let e = s
        .add_request(NewRequest {
            after: Some(1),
            ..req(1, tokens(1, 10), 4)
        })
        .unwrap_err();
    assert!(msg(e).contains("itself"));
    s.add_request(req(1, tokens(1, 10), 4)).unwrap();
    assert!(msg(s.add_request(req(1, tokens(1, 10), 4)).unwrap_err()).contains("already live"));
    // 8 usable blocks of 16 = 128 tokens; max_model_len caps the need at 100 tokens = 7 blocks.
    s.add_request(req(2, tokens(2, 90), 1000)).unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn a_request_the_pool_can_never_hold_is_a_capacity_error() {
    let mut s = Scheduler::new(config(16, 5)).unwrap();
    // 4 usable blocks = 64 tokens.
    let e = s.add_request(req(1, tokens(1, 60), 10)).unwrap_err();
    assert!(
        matches!(&e, Error::Capacity(m) if m.contains("num_blocks")),
        "{e}"
    );
    s.add_request(req(2, tokens(2, 54), 10)).unwrap();
    assert_eq!(s.num_unfinished(), 1);
}

#[test]
fn bad_configurations_are_rejected() {
    let mut c = config(16, 64);
    c.max_num_seqs = 0;
    assert!(
        matches!(Scheduler::new(c).err().unwrap(), Error::Config(m) if m.contains("max_num_seqs"))
    );
    let mut c = config(16, 64);
    c.token_capture_sizes = vec![8, 4];
    assert!(
        matches!(Scheduler::new(c).err().unwrap(), Error::Config(m) if m.contains("token_capture_sizes"))
    );
}

#[test]
fn rows_are_reused_lowest_first_after_requests_finish() {
    let mut d = Driver::new(config(16, 64));
    d.add(req(1, tokens(1, 4), 1));
    d.add(req(2, tokens(2, 4), 5));
    d.step();
    assert!(
        !d.s.contains(1),
        "max_tokens 1 finishes at the first sample"
    );
    d.add(req(3, tokens(3, 4), 2));
    let p = d.schedule();
    assert_eq!(p.req_ids, [2, 3]);
    assert_eq!(p.req_rows, [1, 0], "the freed row 0 is reused");
    assert_eq!(p.dirty_rows, [0]);
    d.finish_step();
}
