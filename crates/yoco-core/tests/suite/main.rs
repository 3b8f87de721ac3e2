//! yoco-core's integration tests, one module per file, in one test binary: a binary per file
//! relinked the crate and rebuilt the shared helpers (`common`, `kv_common`) for each of 18 files, which
//! was most of this crate's share of the CI build in the optimized `ci` profile.

mod common;
mod kv_common;
#[path = "../../../../benches/rust/workload.rs"]
mod workload;

mod kv_config;
mod kv_events;
mod kv_free_blocks;
mod kv_prefix_cache;
mod kv_random_invariants;
mod kv_sliding;
mod kv_sub_block;
mod sched_admission;
mod sched_async;
mod sched_async_random;
mod sched_basics;
mod sched_chunking;
mod sched_lifecycle;
mod sched_multimodal;
mod sched_plan;
mod sched_preemption;
mod sched_random;
mod sched_workload;
