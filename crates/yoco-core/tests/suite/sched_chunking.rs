//! Chunked prefill under the token budget (scheduler.md §10.6 SCH-5..7).

use crate::common;

use common::*;

#[test]
fn long_prefill_threshold_caps_each_chunk_and_samples_only_on_the_last() {
    let mut c = config(16, 256);
    c.max_num_batched_tokens = 1024;
    c.long_prefill_token_threshold = 400;
    let mut d = Driver::new(c);
    for i in 0..3 {
        d.add(req(i, tokens(i, 800), 4));
    }
    let (p, o) = d.step();
    assert_eq!(row_tokens(&p), [400, 400, 224]);
    assert!(
        p.logits_indices.is_empty() && o.req_ids.is_empty(),
        "no request finished its prompt"
    );
    let (p, o) = d.step();
    assert_eq!(row_tokens(&p), [400, 400, 224]);
    assert_eq!(p.sample_rows, [0, 1]);
    assert_eq!(o.req_ids, [0, 1]);
    let (p, o) = d.step();
    assert_eq!(row_tokens(&p), [1, 1, 352]);
    assert_eq!(p.sample_rows, [0, 1, 2]);
    assert_eq!(o.req_ids, [0, 1, 2]);
}

#[test]
fn threshold_is_ignored_for_a_lone_request() {
    let mut c = config(16, 512);
    c.max_num_batched_tokens = 1024;
    c.long_prefill_token_threshold = 400;
    let mut d = Driver::new(c);
    d.add(req(1, tokens(1, 2000), 4));
    let (p, _) = d.step();
    assert_eq!(row_tokens(&p), [1024]);
    d.add(req(2, tokens(2, 10), 4));
    let (p, _) = d.step();
    assert_eq!(row_tokens(&p), [400, 10]);
}

#[test]
fn chunked_prefill_lets_a_second_long_prompt_start_in_the_same_step() {
    let mut c = config(16, 256);
    c.max_num_batched_tokens = 1024;
    c.max_num_seqs = 3;
    let mut d = Driver::new(c);
    d.add(req(1, tokens(1, 800), 4));
    d.add(req(2, tokens(2, 800), 4));
    d.add(req(3, tokens(3, 10), 4));
    d.add(req(4, tokens(4, 10), 4));
    let (p, _) = d.step();
    assert_eq!(p.req_ids, [1, 2]);
    assert_eq!(row_tokens(&p), [800, 224]);
}

#[test]
fn long_prompt_is_chunked_across_steps_and_samples_only_on_its_last_chunk() {
    let mut c = config(16, 256);
    c.max_num_batched_tokens = 100;
    let mut d = Driver::new(c);
    let prompt = tokens(9, 350);
    d.add(req(1, prompt.clone(), 3));
    let mut chunks = Vec::new();
    loop {
        let (p, o) = d.step();
        chunks.push((
            row_tokens(&p)[0],
            p.positions[0],
            p.logits_indices.clone(),
            o.req_ids.clone(),
        ));
        if !o.req_ids.is_empty() {
            break;
        }
    }
    assert_eq!(
        chunks,
        [
            (100, 0, vec![], vec![]),
            (100, 100, vec![], vec![]),
            (100, 200, vec![], vec![]),
            (50, 300, vec![49], vec![1])
        ]
    );
    d.run(10);
    let _ = prompt;
}

#[test]
fn token_budget_is_never_exceeded_and_decodes_go_first() {
    let mut c = config(16, 1024);
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 8;
    let mut d = Driver::new(c);
    for i in 0..20u64 {
        d.add(req(
            i,
            tokens(i, 10 + (i as usize * 37) % 90),
            1 + (i as u32 % 7),
        ));
    }
    let mut steps = 0;
    while d.s.num_unfinished() > 0 {
        let running_before: Vec<u64> = d.s.plan().req_ids.clone();
        let (p, _) = d.step();
        assert!(p.num_tokens <= 64);
        // Requests still running from the previous step come first, in their order.
        let kept: Vec<u64> = p
            .req_ids
            .iter()
            .copied()
            .filter(|id| running_before.contains(id))
            .collect();
        assert_eq!(&p.req_ids[..kept.len()], &kept[..]);
        steps += 1;
        assert!(steps < 500);
    }
}
