//! Ad-hoc: print a workload. `cargo run -p yoco-ref --profile ci --example show -- SEED`
use yoco_ref::workload::{random_workload, WorkloadSpec};
fn main() {
    let seed: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let w = random_workload(seed, &WorkloadSpec::default());
    println!("{:#?}", w.sched);
    for a in &w.arrivals {
        println!("step {} id {} len {} max_tokens {} min {} eos {:?} stop {:?} ign {} prio {} salt {:?} plp {} after {:?}", a.step, a.req.id, a.req.prompt.len(), a.req.max_tokens, a.req.min_tokens, a.req.eos_token_ids, a.req.stop_token_ids, a.req.ignore_eos, a.req.priority, a.req.hash_extras.cache_salt, a.req.prompt_logprobs, a.req.after);
    }
    println!("abort {}", w.abort_chance);
}
