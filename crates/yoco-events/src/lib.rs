//! KV events on the wire: what a prefix-aware router (vllm-router `kv_aware`, llm-d's indexer,
//! Dynamo's relay) needs to know about this engine's prefix cache, in vLLM's format.
//!
//! The core records events as data ([`yoco_core::kv::KvEvent`], sub-block grain, bounded log);
//! this crate converts them to the wire grain ([`wire`]), encodes `KVEventBatch`es ([`encode`])
//! and publishes them over ZMQ ([`publisher`]) with a pure-Rust ZMTP implementation (no libzmq,
//! nothing to install). No Python here: `yoco-py` only attaches a [`Publisher`] to a scheduler.

pub mod config;
pub mod encode;
mod msgpack;
pub mod publisher;
pub mod wire;

pub use config::PublisherConfig;
pub use encode::{encode_batch, Encoding};
pub use publisher::{Publisher, PublisherStats, StartError, END_SEQ};
pub use wire::{derived_hash, GrainError, Regrain, WireEvent};
