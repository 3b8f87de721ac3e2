//! How often does changing one earlier token change the greedy next token? (mock model tuning)
use yoco_core::kv::LayerKind;
use yoco_ref::model::{MockConfig, MockModel};
use yoco_ref::rng::Rng;

fn main() {
    let layers = vec![LayerKind::Sliding { window: 5 }, LayerKind::Full, LayerKind::Sliding { window: 5 }, LayerKind::Full, LayerKind::SharesKv { donor: 2 }, LayerKind::SharesKv { donor: 3 }];
    for layers in [layers, vec![LayerKind::Full], vec![LayerKind::Sliding { window: 3 }]] {
        let m = MockModel::new(MockConfig::tiny(layers.clone(), 1)).unwrap();
        let mut rng = Rng::new(5);
        let (mut changed, mut n, mut same_as_input) = (0, 0, 0);
        let mut hist = std::collections::HashMap::new();
        for _ in 0..300 {
            let len = rng.range(4, 30) as usize;
            let mut p: Vec<u32> = (0..len).map(|_| rng.below(64) as u32).collect();
            let x = m.forward_contiguous(&p);
            let a = m.argmax(x.last().unwrap());
            *hist.entry(a).or_insert(0) += 1;
            same_as_input += (a == *p.last().unwrap()) as i32;
            let j = rng.below(len as u64 - 1) as usize;
            p[j] = (p[j] + 1 + rng.below(62) as u32) % 64;
            let b = m.argmax(m.forward_contiguous(&p).last().unwrap());
            changed += (a != b) as i32;
            n += 1;
        }
        println!("{layers:?}: changed {changed}/{n}, argmax==input {same_as_input}, distinct outputs {}", hist.len());
    }
}
