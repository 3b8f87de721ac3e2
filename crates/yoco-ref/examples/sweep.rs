//! Ad-hoc sweep: `cargo run -p yoco-ref --profile ci --example sweep -- oracle 0 1000`
use yoco_ref::driver::{run_mock, run_oracle, DriverOptions};
use yoco_ref::workload::{random_workload, WorkloadSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("oracle");
    let from: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    let n: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100);
    let t = std::time::Instant::now();
    let mut fails = 0;
    let mut steps = 0;
    let mut agg = yoco_ref::oracle::OracleStats::default();
    let (mut fin, mut ab, mut rej, mut fu, mut pre, mut toks, mut adopt, mut copies) = (0, 0, 0, 0, 0, 0, 0, 0);
    for seed in from..from + n {
        let w = random_workload(seed, &WorkloadSpec::default());
        let r = match mode {
            "mock" => run_mock(&w, true, &DriverOptions::default(), None),
            _ => run_oracle(&w, &DriverOptions::default(), None),
        };
        match r {
            Ok(r) => {
                steps += r.steps;
                agg += r.oracle;
                fin += r.finished;
                ab += r.aborted;
                rej += r.rejected;
                fu += r.follow_ups;
                pre += r.preemptions;
                toks += r.output_tokens;
                adopt += r.kv.adoptions;
                copies += r.kv.copies;
            }
            Err(e) => {
                fails += 1;
                if fails <= 50 {
                    println!("seed {seed}: {e}");
                }
            }
        }
    }
    println!("{agg:?}\nfinished {fin} aborted {ab} rejected {rej} follow-ups {fu} preemptions {pre} output tokens {toks} kv adoptions {adopt} kv copies {copies}");
    println!("{fails} failures of {n}, {steps} steps, {:.2?}", t.elapsed());
}
