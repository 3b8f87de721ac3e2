//! Multimodal requests in the scheduler: the encoder budget per step, and prefix hits that know
//! which image / audio item a placeholder run held.

use crate::common;

use common::*;
use yoco_core::kv::MmPlaceholder;
use yoco_core::sched::Scheduler;
use yoco_core::Error;

fn item(offset: u32, length: u32, id: &str) -> MmPlaceholder {
    MmPlaceholder {
        offset,
        length,
        identifier: id.into(),
    }
}

/// A prompt of `n` tokens whose run `offset .. offset + length` holds placeholder id 7.
fn prompt_with_run(seed: u64, n: usize, offset: usize, length: usize) -> Vec<u32> {
    let mut p = tokens(seed, n);
    for t in &mut p[offset..offset + length] {
        *t = 7;
    }
    p
}

#[test]
fn decodes_keep_running_while_an_image_waits_for_the_encoder_budget() {
    let mut c = config(16, 256);
    c.max_num_encoder_input_tokens = 64;
    let mut d = Driver::new(c);
    // a text request, decoding after its first step
    d.add(req(1, tokens(1, 8), 40));
    d.step();
    // two image requests (64 encoder tokens each): one fits per step
    for id in [2, 3] {
        let p = prompt_with_run(id, 80, 10, 64);
        d.s.add_request_mm(req(id, p, 4), vec![item(10, 64, &format!("img{id}"))])
            .unwrap();
    }
    let (p, _) = d.step();
    // the decode, the first image request whole, the second only up to its item
    assert_eq!(p.req_ids, [1, 2, 3]);
    assert_eq!(row_tokens(&p), [1, 80, 10]);
    let (p, _) = d.step();
    // next step: the second request's item (and the rest of its prompt) alongside the decodes
    assert_eq!(p.req_ids, [1, 2, 3]);
    assert_eq!(row_tokens(&p), [1, 1, 70]);
    d.run(1000);
    assert_eq!(d.s.num_unfinished(), 0);
}

#[test]
fn a_chunk_that_starts_at_an_item_beyond_the_budget_waits_a_step() {
    let mut c = config(16, 256);
    c.max_num_encoder_input_tokens = 32;
    let mut d = Driver::new(c);
    // two items of 32 right after each other: each fills a step's budget
    let p = prompt_with_run(5, 70, 2, 64);
    d.s.add_request_mm(req(5, p, 2), vec![item(2, 32, "a"), item(34, 32, "b")])
        .unwrap();
    let (p, _) = d.step();
    assert_eq!(row_tokens(&p), [34], "stops before the second item");
    let (p, _) = d.step();
    assert_eq!(row_tokens(&p), [36], "the second item and the rest");
    d.run(100);
}

#[test]
fn items_are_validated_at_add_request() {
    let mut c = config(16, 256);
    c.max_num_encoder_input_tokens = 32;
    let mut s = Scheduler::new(c).unwrap();
    let p = tokens(1, 50);
    let cases: Vec<(Vec<MmPlaceholder>, &str)> = vec![
        (vec![item(3, 0, "a")], "empty placeholder run"),
        (vec![item(40, 20, "a")], "past the prompt"),
        (
            vec![item(0, 10, "a"), item(5, 10, "b")],
            "sorted and disjoint",
        ),
        (vec![item(0, 33, "a")], "max_num_encoder_input_tokens = 32"),
        (vec![item(0, 3, "")], "empty identifier"),
    ];
    for (i, (items, want)) in cases.into_iter().enumerate() {
        match s.add_request_mm(req(i as u64, p.clone(), 4), items) {
            Err(Error::Request(m)) => assert!(m.contains(want), "{m:?} should say {want:?}"),
            other => panic!("case {i}: expected a request error, got {other:?}"),
        }
    }
    assert_eq!(s.num_unfinished(), 0, "nothing was queued");
    // adjacent runs and a run ending at the last prompt token are fine
    s.add_request_mm(
        req(9, p, 4),
        vec![item(0, 10, "a"), item(10, 32, "b"), item(42, 8, "c")],
    )
    .unwrap();
}

/// Runs `prompt` (with `items`) to completion on `d`; returns the tokens it reused from the cache.
fn run_one(d: &mut Driver, id: u64, prompt: Vec<u32>, items: Vec<MmPlaceholder>) -> i32 {
    d.s.add_request_mm(req(id, prompt, 1), items).unwrap();
    let (p, _) = d.step();
    let k = p.admitted_ids.iter().position(|&a| a == id).unwrap();
    let cached = p.admitted_num_cached[k];
    d.run(100);
    cached
}

#[test]
fn the_same_image_hits_and_another_image_misses_from_its_placeholder_start() {
    // block 16, sub-block 4; the run covers tokens 6..30 of a 48-token prompt
    let mut c = config(16, 256);
    c.kv.sub_block_size = 4;
    let mut d = Driver::new(c);
    let p = prompt_with_run(3, 48, 6, 24);
    assert_eq!(run_one(&mut d, 1, p.clone(), vec![item(6, 24, "cat")]), 0);
    // the same image: everything but the last token's sub-block
    assert_eq!(run_one(&mut d, 2, p.clone(), vec![item(6, 24, "cat")]), 44);
    // same tokens, another image: only the sub-block before the run (tokens 0..4)
    assert_eq!(run_one(&mut d, 3, p.clone(), vec![item(6, 24, "dog")]), 4);
    // the text alone (no item) does not reuse the image's blocks past the run start either
    assert_eq!(run_one(&mut d, 4, p.clone(), vec![]), 4);
    // the same image again after those: still hits
    assert_eq!(run_one(&mut d, 5, p, vec![item(6, 24, "cat")]), 44);
    assert_eq!(d.s.num_unfinished(), 0);
}
