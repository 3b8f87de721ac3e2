//! The mock executor on hand-built plans (independent of the real scheduler): chunked prefill,
//! copy-on-match, a decode batch, padding and the cross-decoder selection reproduce the cache-less
//! run; and the reference's KV grouping agrees with the block manager's.

use yoco_core::kv::{kv_groups, HashExtras, LayerKind};
use yoco_ref::executor::MockExecutor;
use yoco_ref::layout::ModelLayout;
use yoco_ref::model::{MockConfig, MockModel, StopRule};
use yoco_ref::plan_view::{PlanGeometry, PlanView};
use yoco_ref::rng::Rng;
use yoco_ref::toy::ToyPlanner;
use yoco_ref::truth::Truth;
use yoco_ref::workload::random_layers;

#[test]
fn mock_executor_on_toy_plans_matches_the_cache_less_run() {
    let layers = vec![
        LayerKind::Sliding { window: 3 },
        LayerKind::Full,
        LayerKind::Sliding { window: 3 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 2 },
        LayerKind::SharesKv { donor: 3 },
    ];
    let model = MockModel::new(MockConfig::tiny(layers, 5)).unwrap();
    let geo = PlanGeometry {
        block_size: 4,
        num_blocks: vec![32, 32],
        max_num_seqs: 4,
        max_blocks_per_seq: 8,
    };
    for fast_prefill in [true, false] {
        let mut exec = MockExecutor::new(model.clone(), &geo, fast_prefill).unwrap();
        let mut toy = ToyPlanner::new(geo.clone(), 9);
        toy.token_capture_sizes = vec![16, 32];
        toy.cross_capture_sizes = vec![4];
        let mut truth = Truth::default();
        let a: Vec<u32> = (0..11).map(|i| (i * 5 + 1) % 64).collect();
        let mut b = a[..6].to_vec();
        b.extend([40, 41, 42, 43, 44, 45, 46]);
        truth.add(1, &a, &HashExtras::default(), false);
        truth.add(2, &b, &HashExtras::default(), false);
        toy.admit(1, 0);
        let mut schedule: Vec<Vec<(u64, usize)>> = vec![vec![(1, 6)], vec![(1, 5)]];
        schedule.push(vec![(1, 1), (2, 7)]);
        for _ in 0..4 {
            schedule.push(vec![(1, 1), (2, 1)]);
        }
        for (i, chunks) in schedule.iter().enumerate() {
            if i == 2 {
                toy.admit_sharing(2, 1, 1, 6).unwrap();
            }
            let plan = toy.plan(chunks, &truth).unwrap();
            let view = PlanView::parse(&plan, &geo).unwrap();
            truth.begin_step(&plan, &view).unwrap();
            let sampled = exec.execute(&plan, &view, &toy.mirror()).unwrap();
            truth.end_step(&view).unwrap();
            for (s, t) in view.samples.iter().zip(sampled) {
                truth
                    .get_mut(view.rows[s.row].req_id)
                    .unwrap()
                    .tokens
                    .push(t as u32);
            }
        }
        let stop = StopRule {
            max_tokens: 10,
            max_model_len: 100,
            ..Default::default()
        };
        for (id, prompt) in [(1, &a), (2, &b)] {
            let got = &truth.get(id).unwrap().tokens[prompt.len()..];
            assert_eq!(
                got,
                &model.generate_uncached(prompt, &stop)[..got.len()],
                "request {id}, fast_prefill {fast_prefill}"
            );
            assert!(got.len() >= 5);
        }
    }
}

#[test]
fn reference_grouping_matches_the_block_managers() {
    let mut rng = Rng::new(3);
    for _ in 0..200 {
        let bs = *rng.pick(&[2u32, 4, 8, 16]);
        let layers = random_layers(&mut rng, bs);
        let ours = ModelLayout::new(&layers).unwrap();
        let theirs = kv_groups(&layers).unwrap();
        assert_eq!(ours.groups.len(), theirs.len(), "{layers:?}");
        for (o, t) in ours.groups.iter().zip(&theirs) {
            assert_eq!(o.kind, t.kind, "{layers:?}");
            assert_eq!(o.layers, t.layers, "{layers:?}");
        }
        for (i, k) in layers.iter().enumerate() {
            if let LayerKind::SharesKv { donor } = k {
                let g = ours.kv_of[i].group;
                assert!(
                    theirs[g].readers.contains(&(i, *donor)),
                    "layer {i} reads group {g}: {layers:?} {theirs:?}"
                );
            }
        }
    }
}
