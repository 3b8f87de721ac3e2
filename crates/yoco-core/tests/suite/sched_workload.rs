//! The `peer-bench-workload/1` loader reproduces the reference token generator, and the shared
//! workloads run to completion through the scheduler (what the benchmarks time).

use crate::workload;

use std::path::PathBuf;

use yoco_core::kv::LayerKind;
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{NewRequest, Scheduler, SchedulerConfig};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benches/workloads")
}

#[test]
fn splitmix_segments_match_the_reference_generator() {
    assert_eq!(
        workload::gen_tokens(200, 8, 32000),
        [7897, 19861, 13878, 23915, 29846, 31931, 3420, 1707]
    );
    assert_eq!(workload::output_token(2, 3, 32000), 16 + 265);
}

#[test]
fn shared_segments_and_literals_expand_in_order() {
    let w = workload::parse(
        r#"{"format": "peer-bench-workload/1", "name": "t", "vocab_size": 100,
            "engine": {"max_num_seqs": 4},
            "shared_segments": {"sys": {"len": 3, "seed": 5}},
            "requests": [{"id": "x", "arrival_step": 2, "max_tokens": 7,
                          "prompt": [{"ref": "sys"}, {"tokens": [1, 2]}, {"len": 2, "seed": 9}]}]}"#,
    )
    .unwrap();
    let r = &w.requests[0];
    let mut want = workload::gen_tokens(5, 3, 100);
    want.extend([1, 2]);
    want.extend(workload::gen_tokens(9, 2, 100));
    assert_eq!(r.prompt, want);
    assert_eq!(
        (r.arrival_step, r.max_tokens, w.max_num_seqs),
        (2, 7, Some(4))
    );
    assert!(workload::parse(r#"{"format": "other"}"#).is_err());
}

#[test]
fn shared_prefix_workload_runs_to_completion_with_prefix_hits() {
    let w = workload::load(&dir().join("b_shared_prefix.json")).unwrap();
    assert_eq!(w.requests.len(), 1024);
    // A fifth of the workload keeps the test quick; the prefixes still repeat.
    let reqs = &w.requests[..200];
    let bs = 16;
    let mut c = SchedulerConfig::new(vec![LayerKind::Full], bs, w.num_blocks(bs)).unwrap();
    c.max_model_len = w.max_seq_len();
    let mut s = Scheduler::new(c).unwrap();
    let mut mock = MockExecutor::new(w.vocab_size).first_token(workload::FIRST_TOKEN);
    let mut produced = vec![0u32; reqs.len()];
    let (mut next, mut step, mut cached) = (0, 0u64, 0u64);
    while next < reqs.len() || s.num_unfinished() > 0 {
        while next < reqs.len() && reqs[next].arrival_step <= step {
            let r = &reqs[next];
            s.add_request(NewRequest {
                id: next as u64,
                prompt: r.prompt.clone(),
                max_tokens: r.max_tokens,
                eos_token_ids: vec![2],
                ..Default::default()
            })
            .unwrap();
            next += 1;
        }
        s.schedule();
        cached += s
            .plan()
            .admitted_num_cached
            .iter()
            .map(|&x| x as u64)
            .sum::<u64>();
        let sampled = mock.sample(s.plan(), &[]).to_vec();
        for &id in &s.update(&sampled).unwrap().req_ids {
            produced[id as usize] += 1;
        }
        step += 1;
    }
    assert!(reqs.iter().zip(&produced).all(|(r, &p)| p == r.max_tokens));
    // Requests hit their 2048-token system prompt once it is computed: all but those admitted
    // before (or in the same step as) the first computation of their prompt.
    assert!(cached >= (200 - 16) * 2048, "{cached}");
}
