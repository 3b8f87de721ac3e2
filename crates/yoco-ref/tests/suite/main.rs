//! yoco-ref's integration tests, one module per file, in one test binary (a binary per file rebuilt
//! the candle-backed reference's generics and relinked it for each file in the optimized `ci` profile).

mod common;

mod executor_toy;
mod golden;
mod metamorphic;
mod mutations;
mod oracle_toy;
mod packaging;
mod property_oracle;
mod scheduler_findings;
