//! Typed response events: what every upstream produces and every dialect renders.
//!
//! An upstream yields, in order: any number of [`Event::Text`] and [`Event::ToolCall`]
//! deltas, then at most one [`Event::Finish`], and at most one [`Event::Usage`] (before or
//! after the finish). A stream that ends without a finish was cut short; the relay reports
//! that to the client as an error, never as a normal end.

/// Why generation stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end (end of sequence).
    Stop,
    /// A stop string matched (the string, when the engine names it).
    StopSequence(Option<String>),
    /// The output token limit.
    Length,
    /// The model called tools.
    ToolCalls,
    /// The engine filtered the content.
    ContentFilter,
    /// Anything else the engine said.
    Other(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason`.
    pub fn openai(&self) -> &str {
        match self {
            FinishReason::Stop | FinishReason::StopSequence(_) => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(s) => s,
        }
    }

    /// The Anthropic `stop_reason`.
    pub fn anthropic(&self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Other(_) => "end_turn",
            FinishReason::StopSequence(Some(_)) => "stop_sequence",
            FinishReason::StopSequence(None) => "end_turn",
            FinishReason::Length => "max_tokens",
            FinishReason::ToolCalls => "tool_use",
            FinishReason::ContentFilter => "refusal",
        }
    }
}

/// Token counts of one request, as the engine reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens written to a provider's prompt cache (billed apart; engines report 0).
    pub cache_write_tokens: u32,
}

/// One event of a response.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Generated text.
    Text(String),
    /// A fragment of a tool call; `index` numbers the calls of this response.
    ToolCall {
        /// Which call (0-based).
        index: u32,
        /// Call id (on the call's first fragment).
        id: Option<String>,
        /// Function name (on the call's first fragment).
        name: Option<String>,
        /// A fragment of the arguments' JSON text.
        arguments: String,
    },
    /// Generation ended.
    Finish(FinishReason),
    /// Token counts.
    Usage(Usage),
}

/// A whole response, built from its events (non-streaming clients).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    /// All text.
    pub text: String,
    /// Tool calls, in order: (id, name, arguments).
    pub tool_calls: Vec<(String, String, String)>,
    /// Why it ended.
    pub finish: Option<FinishReason>,
    /// Token counts.
    pub usage: Option<Usage>,
}

impl Collected {
    /// Adds one event.
    pub fn push(&mut self, event: Event) {
        match event {
            Event::Text(t) => self.text.push_str(&t),
            Event::ToolCall { index, id, name, arguments } => {
                let i = index as usize;
                // Indices arrive in order; a gap would be an upstream bug, filled with empty calls.
                while self.tool_calls.len() <= i {
                    self.tool_calls.push((String::new(), String::new(), String::new()));
                }
                let call = &mut self.tool_calls[i];
                if let Some(id) = id {
                    call.0 = id;
                }
                if let Some(name) = name {
                    call.1.push_str(&name);
                }
                call.2.push_str(&arguments);
            }
            Event::Finish(f) => self.finish = Some(f),
            Event::Usage(u) => self.usage = Some(u),
        }
    }
}
