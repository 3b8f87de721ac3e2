//! Runs the real scheduler and block manager over a [`Workload`], step by step, executing every
//! plan on the reference: either the [`PlanOracle`] (synthetic K/V, attention paged == contiguous
//! after every step) or the [`MockExecutor`] (a tiny model; token streams checked against a
//! cache-less, unbatched run at the end). The executor side sees only what a real executor sees:
//! the plan and the block-table rows it announces as dirty.
//!
//! A `mutate` hook may corrupt plans before execution, to prove the checks catch each bug.

use std::collections::{HashMap, HashSet};

use yoco_core::kv::KvMetrics;
use yoco_core::sched::plan::NOT_FINISHED;
use yoco_core::sched::{NewRequest, Scheduler, StepPlan};

use crate::bail;
use crate::error::{Error, Result};
use crate::executor::MockExecutor;
use crate::model::{MockConfig, MockModel, StopRule};
use crate::oracle::{OracleConfig, OracleStats, PlanOracle};
use crate::plan_view::{PlanGeometry, PlanView};
use crate::rng::{chain, Rng};
use crate::tables::TableMirror;
use crate::truth::Truth;
use crate::workload::{Workload, ORACLE_HEADS};

/// What executes the plans.
pub enum Engine {
    /// Synthetic K/V on reference paged memory; every query's paged attention is compared with
    /// its contiguous history after every step.
    Oracle(PlanOracle),
    /// The tiny model on reference paged memory; its greedy token streams are compared with a
    /// cache-less, unbatched run at the end.
    Mock(MockExecutor),
    /// Nothing: plans are parsed and answered with arbitrary tokens (the scheduler's own cost,
    /// the baseline of the benches).
    Null,
}

/// What a run checks beyond the engine's own comparisons, and when it gives up.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// A run that has not finished after this many steps is a failure (a stall or livelock).
    pub max_steps: usize,
    /// The truth's "who samples which token" check. Off only to show that the numeric and
    /// token-stream checks catch a bad logits index on their own.
    pub check_sampling: bool,
    /// Check stop decisions against vLLM's rules (max_tokens, max_model_len, min_tokens, EOS, stop ids).
    pub check_stops: bool,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            max_steps: 5_000,
            check_sampling: true,
            check_stops: true,
        }
    }
}

/// A finished or aborted request's token stream.
#[derive(Debug, Clone)]
pub struct Stream {
    /// The request id the workload (or a follow-up turn) submitted.
    pub id: u64,
    /// Its prompt, as submitted.
    pub prompt: Vec<u32>,
    /// Every token the scheduler's outcomes gave it, in order.
    pub output: Vec<u32>,
    /// The stop rules it was submitted with, so `verify_stream` can say where the cache-less run
    /// stops.
    pub stop: StopRule,
    /// Aborted mid-run: the stream may end early (it is still checked as a prefix).
    pub aborted: bool,
}

/// What a run did, so tests can assert their checks were not vacuous (steps ran, caches hit,
/// copies and preemptions happened) and benches can count work.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// Non-empty plans executed until every request ended.
    pub steps: usize,
    /// What the plan oracle compared (all zero unless the engine was the oracle).
    pub oracle: OracleStats,
    /// Requests that ended by the scheduler's stop rules.
    pub finished: usize,
    /// Requests the driver aborted (the workload's abort chance).
    pub aborted: usize,
    /// Requests `add_request` refused (capacity, length).
    pub rejected: usize,
    /// Follow-up turns submitted (a finished request's prompt + output + new text).
    pub follow_ups: usize,
    /// Plans the mutation hook changed.
    pub mutations: usize,
    /// Tokens sampled, all requests.
    pub output_tokens: usize,
    /// The block manager's metrics at the end of the run (prefix hits, copies, adoptions).
    pub kv: KvMetrics,
    /// Preemptions the scheduler reported.
    pub preemptions: u64,
    /// Every ended request's stream (finished or aborted), in the order they ended.
    pub streams: Vec<Stream>,
}

/// Hook to corrupt a plan before it executes; returns whether it changed anything.
pub type Mutator<'a> = &'a mut dyn FnMut(&mut StepPlan) -> bool;

fn stop_rule(r: &NewRequest, max_model_len: u32) -> StopRule {
    StopRule {
        max_tokens: r.max_tokens as usize,
        min_tokens: r.min_tokens as usize,
        eos: r.eos_token_ids.clone(),
        stop_tokens: r.stop_token_ids.clone(),
        ignore_eos: r.ignore_eos,
        max_model_len: max_model_len as usize,
    }
}

fn geometry(s: &Scheduler, w: &Workload) -> PlanGeometry {
    PlanGeometry {
        block_size: w.sched.kv.block_size as usize,
        num_blocks: w.sched.kv.num_blocks.iter().map(|&n| n as usize).collect(),
        max_num_seqs: w.sched.max_num_seqs as usize,
        max_blocks_per_seq: s.max_blocks_per_seq(),
    }
}

/// Runs `w` with the plan oracle checking every step.
pub fn run_oracle(
    w: &Workload,
    opts: &DriverOptions,
    mutate: Option<Mutator>,
) -> Result<RunReport> {
    let sched = Scheduler::new(w.sched.clone())?;
    let oracle = PlanOracle::new(OracleConfig {
        layers: w.sched.layers.clone(),
        heads: ORACLE_HEADS,
        scale: 1.0,
        geo: geometry(&sched, w),
        seed: w.seed,
        tolerance: 1e-6,
    })?;
    run(w, sched, Engine::Oracle(oracle), opts, mutate)
}

/// Runs `w` with no checks at all (the scheduler's own cost).
pub fn run_null(w: &Workload) -> Result<RunReport> {
    let sched = Scheduler::new(w.sched.clone())?;
    let opts = DriverOptions {
        check_stops: false,
        ..Default::default()
    };
    run(w, sched, Engine::Null, &opts, None)
}

/// The mock model a workload runs on (its layers, its vocabulary).
pub fn mock_model(w: &Workload) -> Result<MockModel> {
    let mut cfg = MockConfig::tiny(w.sched.layers.clone(), w.seed ^ 0x00D3_1A7E);
    cfg.vocab = w.vocab as usize;
    MockModel::new(cfg)
}

/// Runs `w` on the mock executor and checks every stream against a cache-less, unbatched run.
pub fn run_mock(
    w: &Workload,
    fast_prefill: bool,
    opts: &DriverOptions,
    mutate: Option<Mutator>,
) -> Result<RunReport> {
    let sched = Scheduler::new(w.sched.clone())?;
    let model = mock_model(w)?;
    let exec = MockExecutor::new(model.clone(), &geometry(&sched, w), fast_prefill)?;
    let report = run(w, sched, Engine::Mock(exec), opts, mutate)?;
    for s in &report.streams {
        model
            .verify_stream(&s.prompt, &s.output, &s.stop, s.aborted)
            .map_err(|e| Error(format!("request {}: {e}", s.id)))?;
    }
    Ok(report)
}

/// The driver loop (see the module docs).
pub fn run(
    w: &Workload,
    mut sched: Scheduler,
    engine: Engine,
    opts: &DriverOptions,
    mutate: Option<Mutator>,
) -> Result<RunReport> {
    let mut live: HashMap<u64, Stream> = HashMap::new();
    let result = run_steps(w, &mut sched, engine, opts, mutate, &mut live);
    // Whatever happened, give every live request's blocks back before the scheduler is dropped.
    let mut ids: Vec<u64> = live.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        sched.abort(id);
    }
    result
}

fn run_steps(
    w: &Workload,
    sched: &mut Scheduler,
    mut engine: Engine,
    opts: &DriverOptions,
    mut mutate: Option<Mutator>,
    live: &mut HashMap<u64, Stream>,
) -> Result<RunReport> {
    let geo = geometry(sched, w);
    let mut mirror = TableMirror::new(
        geo.num_blocks.len(),
        geo.max_num_seqs,
        geo.max_blocks_per_seq,
    );
    let mut truth = Truth::default();
    let mut rng = Rng::new(chain(w.seed, 0xD21E));
    let mut report = RunReport::default();
    let mut arrivals: Vec<(usize, NewRequest)> =
        w.arrivals.iter().map(|a| (a.step, a.req.clone())).collect();
    arrivals.reverse(); // pop from the back in step order
    let mut next_id = w.arrivals.iter().map(|a| a.req.id + 1).max().unwrap_or(0);
    let mut idle_steps = 0;

    let abort = |id: u64,
                 sched: &mut Scheduler,
                 truth: &mut Truth,
                 engine: &mut Engine,
                 live: &mut HashMap<u64, Stream>,
                 report: &mut RunReport| {
        if sched.abort(id) {
            truth.reqs.remove(&id);
            if let Engine::Oracle(o) = engine {
                o.forget(id);
            }
            let mut s = live.remove(&id).expect("live stream");
            s.aborted = true;
            report.streams.push(s);
            report.aborted += 1;
        }
    };

    for step in 0.. {
        if step >= opts.max_steps {
            bail!(
                "workload {}: {} requests still unfinished after {step} steps",
                w.seed,
                sched.num_unfinished()
            );
        }
        while arrivals.last().is_some_and(|(s, _)| *s <= step) {
            let (_, req) = arrivals.pop().unwrap();
            if trace() {
                eprintln!(
                    "add {} prompt {} max_tokens {} after {:?} plp {} salt {:?}",
                    req.id,
                    req.prompt.len(),
                    req.max_tokens,
                    req.after,
                    req.prompt_logprobs,
                    req.hash_extras.cache_salt
                );
            }
            match sched.add_request(req.clone()) {
                Ok(()) => {
                    truth.add(req.id, &req.prompt, &req.hash_extras, req.prompt_logprobs);
                    let stop = stop_rule(&req, w.sched.max_model_len);
                    live.insert(
                        req.id,
                        Stream {
                            id: req.id,
                            prompt: req.prompt,
                            output: vec![],
                            stop,
                            aborted: false,
                        },
                    );
                }
                Err(yoco_core::Error::Capacity(_)) | Err(yoco_core::Error::Request(_)) => {
                    report.rejected += 1
                }
                Err(e) => return Err(e.into()),
            }
        }
        if w.abort_chance > 0.0 && rng.chance(w.abort_chance) && !live.is_empty() {
            let mut ids: Vec<u64> = live.keys().copied().collect();
            ids.sort_unstable();
            let id = *rng.pick(&ids);
            abort(id, sched, &mut truth, &mut engine, live, &mut report);
        }
        if sched.num_unfinished() == 0 {
            if arrivals.is_empty() {
                break;
            }
            continue;
        }

        let mut plan = sched.schedule().clone();
        if trace() {
            let st = sched.stats();
            eprintln!(
                "step {} rows {:?} admitted {:?}/{:?} preempted {:?} copies {:?} | running {} waiting {} free {:?}",
                plan.step_id,
                plan.req_ids.iter().zip(&plan.seq_lens).zip(plan.query_start_loc.windows(2)).map(|((id, s), q)| (*id, *s, q[1] - q[0])).collect::<Vec<_>>(),
                plan.admitted_ids,
                plan.admitted_num_cached,
                plan.preempted_ids,
                plan.kv_copies,
                st.num_running,
                st.num_waiting,
                (0..geo.num_blocks.len()).map(|g| sched_free(sched, g)).collect::<Vec<_>>()
            );
        }
        if plan.num_rows() == 0 {
            idle_steps += 1;
            if idle_steps > 3 && arrivals.is_empty() {
                let st = sched.stats();
                bail!(
                    "workload {}: the scheduler plans nothing for {idle_steps} steps with {} requests unfinished ({} running, {} waiting){}",
                    w.seed,
                    sched.num_unfinished(),
                    st.num_running,
                    st.num_waiting,
                    if st.num_running == 0 { "; admission stalls with nothing running" } else { "" }
                );
            }
            continue;
        }
        idle_steps = 0;
        report.steps += 1;
        if let Some(m) = mutate.as_mut() {
            if m(&mut plan) {
                report.mutations += 1;
            }
        }
        let ctx = |e: Error| Error(format!("workload {} step {}: {e}", w.seed, plan.step_id));
        let view = PlanView::parse(&plan, &geo).map_err(ctx)?;
        let arbitrary = |view: &PlanView| -> Vec<i32> {
            view.samples
                .iter()
                .map(|s| {
                    let row = &view.rows[s.row];
                    (chain(chain(w.seed, row.req_id), row.seq_len as u64) % w.vocab as u64) as i32
                })
                .collect()
        };
        let checked = !matches!(engine, Engine::Null);
        if checked {
            mirror.upload(&plan.dirty_rows, |g| sched.block_table(g));
            truth.begin_step(&plan, &view).map_err(ctx)?;
        }
        let sampled: Vec<i32> = match &mut engine {
            Engine::Oracle(o) => {
                o.check_step(&plan, &view, &mut truth, &mirror)
                    .map_err(ctx)?;
                arbitrary(&view)
            }
            Engine::Mock(m) => m.execute(&plan, &view, &mirror).map_err(ctx)?,
            Engine::Null => arbitrary(&view),
        };
        if checked {
            if opts.check_sampling {
                truth.check_sampling(&plan, &view).map_err(ctx)?;
            }
            truth.end_step(&view).map_err(ctx)?;
        }

        // Sometimes a client goes away while the step runs.
        if w.abort_chance > 0.0 && rng.chance(w.abort_chance) {
            let id = view.rows[rng.below(view.rows.len() as u64) as usize].req_id;
            abort(id, sched, &mut truth, &mut engine, live, &mut report);
        }
        let mut expect: HashMap<u64, i32> = HashMap::new();
        for (s, &tok) in view.samples.iter().zip(&sampled) {
            let id = view.rows[s.row].req_id;
            if live.contains_key(&id) {
                expect.insert(id, tok);
            }
        }
        let outcome = sched
            .update(&sampled)
            .map_err(|e| {
                Error(format!(
                    "workload {} step {}: update: {e}",
                    w.seed, plan.step_id
                ))
            })?
            .clone();
        let mut seen = HashSet::new();
        for k in 0..outcome.req_ids.len() {
            let (id, tok, fr) = (
                outcome.req_ids[k],
                outcome.new_tokens[k],
                outcome.finish_reasons[k],
            );
            let Some(stream) = live.get_mut(&id) else {
                bail!(
                    "workload {} step {}: outcome names request {id}, which is not live",
                    w.seed,
                    plan.step_id
                );
            };
            seen.insert(id);
            if tok >= 0 {
                if expect.get(&id) != Some(&tok) {
                    bail!("workload {} step {}: outcome gives request {id} token {tok}, it sampled {:?}", w.seed, plan.step_id, expect.get(&id));
                }
                stream.output.push(tok as u32);
                if let Some(r) = truth.reqs.get_mut(&id) {
                    r.tokens.push(tok as u32);
                }
                report.output_tokens += 1;
            }
            let total = stream.prompt.len() + stream.output.len();
            if opts.check_stops
                && !stream.output.is_empty()
                && stream.stop.stops(&stream.output, total) != (fr != NOT_FINISHED)
            {
                bail!(
                    "workload {} step {}: request {id} after {} output tokens (last {tok}, total {total}): finish reason {fr}, vLLM's stop rules say {}",
                    w.seed, plan.step_id, stream.output.len(), if fr == NOT_FINISHED { "stop" } else { "go on" }
                );
            }
            if fr != NOT_FINISHED {
                let s = live.remove(&id).unwrap();
                truth.reqs.remove(&id);
                if let Engine::Oracle(o) = &mut engine {
                    o.forget(id);
                }
                report.finished += 1;
                // Another turn of the same conversation: prompt + answer + new text.
                if report.follow_ups < w.max_follow_ups && rng.chance(w.follow_up_chance) {
                    let mut prompt = s.prompt.clone();
                    prompt.extend_from_slice(&s.output);
                    prompt.extend((0..rng.range(1, 6)).map(|_| rng.below(w.vocab as u64) as u32));
                    let room = w.sched.max_model_len as usize - 1;
                    prompt.truncate(room);
                    let template = w
                        .arrivals
                        .iter()
                        .find(|a| a.req.id == id)
                        .map(|a| a.req.clone())
                        .unwrap_or_default();
                    let req = NewRequest {
                        id: next_id,
                        prompt,
                        after: None,
                        max_tokens: template.max_tokens.max(1),
                        ..template
                    };
                    next_id += 1;
                    report.follow_ups += 1;
                    arrivals.push((step + 1, req));
                    arrivals.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
                }
                report.streams.push(s);
            }
        }
        for id in expect.keys() {
            if !seen.contains(id) {
                bail!(
                    "workload {} step {}: request {id} sampled but the outcome does not mention it",
                    w.seed,
                    plan.step_id
                );
            }
        }
    }
    if let Engine::Oracle(o) = &engine {
        report.oracle = o.stats;
    }
    let st = sched.stats();
    report.kv = st.kv;
    report.preemptions = st.num_preemptions;
    Ok(report)
}

/// `YOCO_REF_TRACE=1` prints every plan (debugging a failing seed).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("YOCO_REF_TRACE").is_some_and(|v| v != "0"))
}

fn sched_free(s: &Scheduler, g: usize) -> u64 {
    let _ = g;
    s.stats().kv.blocks_free
}
