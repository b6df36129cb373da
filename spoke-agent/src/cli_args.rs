//! Command-line settings of the spoke's request path, shared by `spoke-agent` and
//! `switchyard spoke` so both binaries take the same flags.

use std::time::Duration;

use crate::http::Limits;

/// Request-path limits as command-line flags.
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Requests in flight at most; beyond it requests get 503 (OpenAI) / 529 (Anthropic).
    #[arg(long, default_value_t = 1024)]
    pub max_concurrent: usize,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Seconds a client may take to send its request headers.
    #[arg(long, default_value_t = 10)]
    pub header_read_seconds: u64,
    /// Seconds a client may take to send its request body.
    #[arg(long, default_value_t = 30)]
    pub body_read_seconds: u64,
    /// Seconds a worker may take to answer with headers (queueing included).
    #[arg(long, default_value_t = 600)]
    pub first_byte_seconds: u64,
    /// Longest silence, in seconds, between two events of a worker's stream.
    #[arg(long, default_value_t = 120)]
    pub upstream_idle_seconds: u64,
    /// Largest KV-event message, bytes, accepted from a worker's ZMQ sockets.
    #[arg(long, default_value_t = crate::kv_subscriber::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_kv_message_bytes: u64,
    /// Seconds in-flight streams may run after SIGTERM before they are ended.
    #[arg(long, default_value_t = 30)]
    pub drain_seconds: u64,
}

impl LimitArgs {
    /// The limits these flags describe.
    pub fn limits(&self) -> Limits {
        let mut l = Limits::default();
        l.front.max_concurrent = self.max_concurrent;
        l.front.max_body_bytes = self.max_body_bytes;
        l.front.body_read = Duration::from_secs(self.body_read_seconds);
        l.front.relay.timeouts.first_byte = Duration::from_secs(self.first_byte_seconds);
        l.front.relay.timeouts.idle = Duration::from_secs(self.upstream_idle_seconds);
        l.serve.header_read = Duration::from_secs(self.header_read_seconds);
        l.serve.drain = Duration::from_secs(self.drain_seconds);
        l.max_kv_message_bytes = self.max_kv_message_bytes;
        l
    }
}
