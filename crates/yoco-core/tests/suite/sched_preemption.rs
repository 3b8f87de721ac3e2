//! Recompute preemption and priorities (scheduler.md §2.2–2.3, §10.6 SCH-15..18).

use crate::common;

use common::*;
use yoco_core::sched::{NewRequest, Policy};

#[test]
fn preempted_request_resumes_from_its_cached_prefix_and_generates_the_same_tokens() {
    // Block size 4, 6 usable blocks. A and B (8-token prompts) each need a 4th block at position 12;
    // A, admitted first, preempts B (FCFS: the most recently admitted).
    let mut d = Driver::new(config(4, 7));
    let (pa, pb) = (tokens(1, 8), tokens(2, 8));
    d.add(req(1, pa.clone(), 6));
    d.add(req(2, pb.clone(), 12));
    let mut outs: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    let mut preempt_step = None;
    let mut resume = None;
    for step in 0..60 {
        if d.s.num_unfinished() == 0 {
            break;
        }
        let (p, o) = d.step();
        if !p.preempted_ids.is_empty() {
            assert_eq!(
                p.preempted_ids,
                [2],
                "FCFS preempts the most recently admitted"
            );
            assert_eq!(p.req_ids, [1]);
            assert!(
                p.admitted_ids.is_empty(),
                "no admission in a step that preempted"
            );
            preempt_step = Some(step);
        }
        if preempt_step.is_some() && p.admitted_ids == [2] {
            resume.get_or_insert((step, p.admitted_num_cached[0], p.admitted_rows[0]));
        }
        for (k, &id) in o.req_ids.iter().enumerate() {
            outs.entry(id).or_default().push(o.new_tokens[k] as u32);
        }
    }
    assert_eq!(
        preempt_step,
        Some(5),
        "A's 13th token needs a 4th block in the 6th step"
    );
    let (resume_step, cached, _) = resume.expect("B resumed");
    assert_eq!(resume_step, 6, "B resumes as soon as A finished");
    // B had computed 12 tokens (3 full blocks); A took the LRU-first of them (B's last block).
    assert_eq!(cached, 8, "B's first two blocks were still cached");
    assert_eq!(d.s.stats().num_preemptions, 1);
    assert_eq!(outs[&1], d.reference(&pa, 6, &[]));
    assert_eq!(
        outs[&2],
        d.reference(&pb, 12, &[]),
        "recompute after preemption changes nothing"
    );
}

#[test]
fn fcfs_victims_are_always_the_most_recently_admitted() {
    // 8 usable blocks, four requests that grow to 3 blocks each: preemptions must happen, and the
    // first admitted request, at the head of the running list, is never the victim.
    let mut d = Driver::new(config(4, 9));
    for i in 0..4 {
        d.add(req(i, tokens(i, 4), 8));
    }
    let mut preempted = Vec::new();
    while d.s.num_unfinished() > 0 {
        let (p, _) = d.step();
        preempted.extend(p.preempted_ids.iter().copied());
        assert!(d.steps < 200);
    }
    assert!(!preempted.is_empty());
    assert!(
        preempted.iter().all(|&id| id != 0),
        "the first admitted request is never the FCFS victim"
    );
}

#[test]
fn priority_policy_admits_in_priority_then_arrival_order() {
    let mut c = config(16, 64);
    c.policy = Policy::Priority;
    let mut d = Driver::new(c);
    for (id, prio) in [(0, 2), (1, 0), (2, 1)] {
        d.add(NewRequest {
            priority: prio,
            ..req(id, tokens(id, 8), 1)
        });
    }
    let p = d.schedule();
    assert_eq!(p.req_ids, [1, 2, 0]);
    d.finish_step();

    // Mixed priorities and arrivals, one slot: (p0,a4), (p1,a2), (p1,a3), (p2,a1).
    let mut c = config(16, 64);
    c.policy = Policy::Priority;
    c.max_num_seqs = 1;
    let mut d = Driver::new(c);
    for (id, prio) in [(1, 2), (2, 1), (3, 1), (4, 0)] {
        d.add(NewRequest {
            priority: prio,
            ..req(id, tokens(id, 8), 1)
        });
    }
    let mut order = Vec::new();
    while d.s.num_unfinished() > 0 {
        let (p, _) = d.step();
        order.extend(p.admitted_ids);
    }
    assert_eq!(order, [4, 2, 3, 1]);
}

#[test]
fn priority_preemption_evicts_the_least_important_request() {
    let mut c = config(16, 6);
    c.policy = Policy::Priority;
    c.max_num_seqs = 3;
    let mut d = Driver::new(c);
    d.add(NewRequest {
        priority: 1,
        ..req(1, tokens(1, 32), 40)
    });
    let (p, _) = d.step();
    assert_eq!(p.req_ids, [1]);
    d.add(NewRequest {
        priority: 0,
        ..req(2, tokens(2, 32), 40)
    });
    let (p, _) = d.step();
    assert_eq!(p.req_ids, [1, 2], "space for both: no preemption");
    assert!(p.preempted_ids.is_empty());
    // Now all 5 blocks are used; request 2 needs its third block.
    let (p, _) = d.step();
    assert_eq!(
        p.preempted_ids,
        [1],
        "the low-priority request is the victim, though it runs first"
    );
    assert_eq!(p.req_ids, [2], "its scheduling in this step was undone");
    assert_eq!(d.s.stats().num_waiting, 1);
    assert_eq!(d.s.stats().num_running, 1);
    // The victim resumes once the important request finished: it recomputes its prompt and the
    // tokens it had generated (34), minus what the prefix cache still holds.
    let (out1, _) = d.s.request_progress(1).unwrap();
    assert_eq!(out1.len(), 2);
    loop {
        let (p, _) = d.step();
        if let Some(k) = p
            .req_ids
            .iter()
            .position(|&id| id == 1)
            .filter(|_| p.admitted_ids.contains(&1))
        {
            assert!(
                !d.s.contains(2),
                "resumes after the high-priority request finished"
            );
            let cached = p.admitted_num_cached[0];
            assert_eq!(cached % 16, 0);
            assert_eq!(p.positions[p.query_start_loc[k] as usize], cached as i64);
            assert_eq!(
                p.seq_lens[k], 34,
                "32 prompt + 2 generated tokens are (re)computed, then it samples its third"
            );
            break;
        }
        assert!(d.steps < 200);
    }
    d.run(200);
}

#[test]
fn preempting_an_earlier_victim_does_not_skip_the_next_request() {
    // Running order [B (low priority), A, C]. A needs a new block with none free; the victim B sits
    // before A, so the pass index must step back, and C must still be scheduled.
    let mut c = config(16, 5);
    c.policy = Policy::Priority;
    let mut d = Driver::new(c);
    d.add(NewRequest {
        priority: 5,
        ..req(0xB, tokens(1, 10), 20)
    });
    d.step();
    d.add(req(0xA, tokens(2, 32), 20));
    d.add(req(0xC, tokens(3, 8), 20));
    let (p, _) = d.step();
    assert_eq!(p.req_ids, [0xB, 0xA, 0xC]);
    let (p, _) = d.step();
    assert_eq!(p.preempted_ids, [0xB]);
    assert_eq!(
        p.req_ids,
        [0xA, 0xC],
        "C is scheduled after the victim bookkeeping"
    );
    d.run(300);
}
