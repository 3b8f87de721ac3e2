//! The order of one step loop iteration, in both modes, and the executor calls.
//!
//! ```text
//! async:  launch(N) │ apply(N−1): update · text · events · gauges │ deliver · commands · aborts │ schedule_ahead(N+1) │ collect(N)
//! sync:   apply(N−1) · gauges · deliver · commands · aborts · schedule(N) │ launch(N) │ deliver · commands │ collect(N)
//! ```
//!
//! Async mode pays off only when `launch` returns before the forward ends (a GPU): with a forward
//! that runs inside `launch` (the CPU executor), step N−1's tokens would wait for step N's whole
//! forward. The Python CLI therefore defaults to the synchronous order on the CPU
//! (`rust_frontend.async_scheduling_on`), where each step's events are sent before the next launch.
//!
//! In async mode, when nothing could be planned ahead (the requests in flight are all finishing),
//! the next iteration falls back to the synchronous order for one step: apply, then plan. It also
//! does not plan ahead while a constrained sequence (structured outputs) is live: the next step's
//! masks need this step's tokens on the host (`step_loop.rs`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use yoco_core::sched::StepPlan;

use crate::executor::StepInputs;
use crate::step_loop::{Collected, InFlight, StepLoop};

impl StepLoop {
    /// One iteration; false when the loop must stop (shutdown, or too many failed steps).
    pub(crate) fn cycle(&mut self) -> bool {
        let mut shutdown = false;
        if self.planned.is_none() && self.in_flight.is_none() {
            // Nothing runs: apply the last step and send its events now, then plan after it. The
            // events go out before the next launch: an executor whose forward runs inside `launch`
            // (the CPU) would otherwise hold every token back by one forward.
            if let Some(c) = self.collected.take() {
                self.apply_step(c);
                self.publish_gauges();
                self.deliver();
            }
            shutdown |= self.drain_commands();
            self.apply_aborts();
            self.planned = self.plan(false);
            if self.planned.is_none() {
                // Nothing runnable (everything finished, or every request waits on memory held
                // by none: cannot happen with validated requests): deliver and idle briefly.
                self.deliver();
                self.publish_kv_events();
                self.publish_gauges();
                if !self.live.is_empty() {
                    std::thread::sleep(Duration::from_micros(200));
                }
                return !shutdown && self.failures < self.max_failures;
            }
        }
        if let Some(mut plan) = self.planned.take() {
            if self.collected.as_ref().is_some_and(|c| c.error.is_some()) {
                // The step whose samples these placeholders read failed: its requests (the only
                // ones with placeholders here) are aborted below, so their rows are discarded.
                plan.placeholder_indices.clear();
                plan.placeholder_sources.clear();
            }
            self.launch(plan);
        }

        // The forward's shadow.
        if let Some(c) = self.collected.take() {
            self.apply_step(c);
            // Before the events: a client that sees its request end reads gauges that count it out.
            self.publish_gauges();
        }
        self.deliver();
        self.reap_closed();
        shutdown |= self.drain_commands();
        self.apply_aborts();
        self.publish_kv_events();
        if self.ahead && self.in_flight.is_some() && !self.grammar.any_constrained() {
            self.planned = self.plan(true);
        }

        if let Some(f) = self.in_flight.take() {
            self.collected = Some(self.collect(f));
            self.collected_at = Some(Instant::now());
        }
        self.publish_gauges();
        !shutdown && self.failures < self.max_failures
    }

    /// Plans a step (ahead of the one in flight, or after everything was applied); `None` when
    /// the plan is empty.
    pub(crate) fn plan(&mut self, ahead: bool) -> Option<StepPlan> {
        let empty = if ahead {
            self.sched.schedule_ahead().num_rows() == 0
        } else {
            self.sched.schedule().num_rows() == 0
        };
        (!empty).then(|| self.sched.take_plan())
    }

    /// Announces the plan's admissions and starts it.
    pub(crate) fn launch(&mut self, plan: StepPlan) {
        let t0 = Instant::now();
        if let Some(prev) = self.last_step.replace(t0) {
            self.stats.observe_step((t0 - prev).as_nanos() as u64);
        }
        if let Some(c) = self.collected_at.take() {
            self.stats.observe_gap((t0 - c).as_nanos() as u64);
        }
        for id in &plan.preempted_ids {
            if let Some(l) = self.live.get_mut(id) {
                l.preemptions += 1;
            }
        }
        let mut resumed = Vec::new();
        for k in 0..plan.admitted_ids.len() {
            let id = plan.admitted_ids[k];
            if let Some(l) = self.live.get_mut(&id) {
                if !l.admitted {
                    l.admitted = true;
                    self.stats.observe_admitted(&mut l.times, t0);
                    l.cached = plan.admitted_num_cached[k].max(0) as u32;
                } else {
                    resumed.push((
                        id,
                        self.text
                            .tokens(id)
                            .map(<[u32]>::to_vec)
                            .unwrap_or_default(),
                    ));
                }
            }
        }
        self.stats.observe_plan(plan.num_tokens, plan.num_cross);
        let plan = Arc::new(plan);
        let ngroups = self.sched.num_groups();
        let tables: Vec<&[i32]> = (0..ngroups).map(|g| self.sched.block_table(g)).collect();
        // Grammar masks start on the pool now and run while the forward does (never for a plan
        // made ahead: `cycle` does not plan ahead while a constrained sequence is live).
        let masks = self.grammar.start(&plan);
        let prompt_scoring = self.lps.plan(&plan);
        let launched = self.exec.launch(&StepInputs {
            plan: &plan,
            tables: &tables,
            max_blocks_per_seq: self.sched.max_blocks_per_seq(),
            resumed: &resumed,
            masks,
            prompt_scoring,
        });
        self.in_flight = Some(InFlight { plan, launched });
    }

    /// Waits for the step in flight; what it produced goes to `self.out`, checked against the plan
    /// before anything else reads it (the next launch fills placeholders from the sampled ids). The
    /// step's grammar job is collected and its prompt logprobs filed here, before the next launch
    /// starts the next job and lists the next positions to score.
    pub(crate) fn collect(&mut self, f: InFlight) -> Collected {
        let num_samples = f.plan.num_samples();
        let result = f.launched.and_then(|()| {
            let out = &mut self.out;
            self.exec.collect().map(|o| out.clone_from(o))
        });
        self.grammar.finish();
        let error = match result {
            Err(e) => Some(e.0),
            Ok(()) => self.check_output(num_samples).err(),
        };
        match &error {
            None => {
                self.sample_ids.clear();
                self.sample_ids.extend(
                    f.plan
                        .sample_rows
                        .iter()
                        .map(|&r| f.plan.req_ids[r as usize]),
                );
                for (id, plp) in self.lps.take_prompt(&self.out) {
                    if let Some(l) = self.live.get_mut(&id) {
                        l.prompt_logprobs = Some(plp);
                    }
                }
            }
            Some(_) => self.out.clear(),
        }
        // The executor let go of the plan (or keeps its own clone): give the buffers back.
        if let Ok(plan) = Arc::try_unwrap(f.plan) {
            self.sched.recycle_plan(plan);
        }
        self.stats.steps.fetch_add(1, Relaxed);
        Collected { num_samples, error }
    }

    /// Whether the executor's output fits the step: one valid token id per sampling row, logprob
    /// tables of the sizes asked.
    fn check_output(&mut self, num_samples: usize) -> Result<(), String> {
        let s = &self.out.sampled;
        if s.len() != num_samples {
            return Err(format!(
                "executor returned {} sampled ids for {} sampling rows",
                s.len(),
                num_samples
            ));
        }
        if let Some(i) = s.iter().position(|&t| t < 0) {
            return Err(format!(
                "bad sampled ids: sampled[{i}] = {} is not a token id",
                s[i]
            ));
        }
        self.lps.check(&self.out, num_samples)
    }
}
