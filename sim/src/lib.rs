//! Switchyard's vLLM-faithful worker simulator.
//!
//! To a router, a simulated worker is indistinguishable from `vllm serve`: the same HTTP API
//! and error bodies, the same Prometheus metric names, the same KV-cache events on the same
//! ZMQ wire (both encodings), and token ids computed from the same tokenizer files and chat
//! template. Behind the API sits a deterministic model of vLLM's V1 engine ([`engine`]): a
//! paged prefix cache with LRU eviction ([`kv_cache`]), continuous batching with chunked
//! prefill and preemption, and a step-time model calibrated per [`profile`]. Time runs at
//! `--time-scale` × real time. Simulator-only endpoints expose ground truth for benchmark
//! oracles and arm faults for reliability tests ([`faults`]). Chat requests that force a tool
//! call get tool calls shaped and counted as vLLM's structured-output path produces them
//! ([`tools`]).

pub mod bedrock;
pub mod calibrate;
pub mod engine;
pub mod faults;
pub mod fleet;
pub mod kv_cache;
pub mod metrics;
pub mod profile;
pub mod publisher;
pub mod runtime;
pub mod server;
pub mod tools;
pub mod validation;
pub mod wire;

pub use fleet::{Fleet, KvEventsConfig, SimConfig, WorkerInfo};
