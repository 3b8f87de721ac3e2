//! yoco-server's HTTP and step-loop tests against the mock engine, one module per file, in one test
//! binary: as a binary per file, each rebuilt the test server (`common`) and the axum/hyper/serde
//! generics it instantiates in the optimized `ci` profile, a third of the CI build. Every test starts
//! its own server on its own port, so the modules share nothing but the process.

mod common;

mod async_scheduling;
mod chat_http;
mod chat_sampling_http;
mod completions_http;
mod data_parallel;
mod lifecycle;
mod logprobs_http;
mod manual_loop;
mod media_http;
mod structured_http;
mod tool_parsers;
mod tools_http;
