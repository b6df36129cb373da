//! What a policy can know about one request.
//!
//! Request features are computed at the front door (auth gives the tenant, classifiers give
//! tags and complexity, the tokenizer gives the prompt length) and are immutable afterwards.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Name;

/// The tag that marks personal data. Requests carrying it never go to an external provider,
/// whatever the policies say.
pub const PII_TAG: &str = "pii";

/// Service class of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestClass {
    /// A person or agent is waiting.
    #[default]
    Interactive,
    /// Throughput work that may wait for idle capacity.
    Batch,
}

/// Prompt complexity as judged by a classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Complexity {
    /// Simple prompt a small model answers well.
    Low,
    /// Ordinary prompt.
    Medium,
    /// Hard prompt that needs the large model.
    High,
}

/// Identifies one worker in a worker set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerKey {
    /// Worker set name.
    pub worker_set: Name,
    /// Worker name within the set.
    pub worker: Name,
}

/// The features of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestFeatures {
    /// Requested model: a public model name or an alias.
    pub model: String,
    /// Authenticated tenant, if any.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Tags from headers and classifiers (e.g. `pii`).
    #[serde(default)]
    pub tags: BTreeSet<String>,
    /// Service class.
    #[serde(default)]
    pub class: RequestClass,
    /// Classifier verdict on complexity, if one ran.
    #[serde(default)]
    pub complexity: Option<Complexity>,
    /// Prompt length in tokens as the engine will see it.
    pub prompt_tokens: u32,
    /// Requested maximum output tokens, if given.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Prompt tokens already cached on each worker (from the KV index), by worker.
    #[serde(default, with = "cached_tokens_serde")]
    pub cached_tokens: BTreeMap<WorkerKey, u32>,
    /// Breaks ties between equally good candidates; derived from the request id so equal
    /// requests spread while each decision stays reproducible.
    #[serde(default)]
    pub tie_breaker: u64,
    /// The prompt's block hashes as the router's KV index computes them: the one at a
    /// worker's cached length names the prefix the request shares there (replica block
    /// accounting); empty when unknown.
    #[serde(skip)]
    pub block_keys: std::sync::Arc<[u64]>,
}

impl RequestFeatures {
    /// Whether the request carries the PII tag.
    pub fn is_pii(&self) -> bool {
        self.tags.contains(PII_TAG)
    }

    /// Cached prefix tokens for `key`, clamped to the prompt length.
    pub fn cached_on(&self, key: &WorkerKey) -> u32 {
        self.cached_tokens.get(key).copied().unwrap_or(0).min(self.prompt_tokens)
    }

    /// The key of the prefix `cached_tokens` of this prompt cover, in blocks of `block_size`
    /// (0 when nothing is cached or the hashes are unknown).
    pub fn prefix_key(&self, cached_tokens: u32, block_size: u32) -> u64 {
        let blocks = (cached_tokens / block_size.max(1)) as usize;
        blocks.checked_sub(1).and_then(|i| self.block_keys.get(i)).copied().unwrap_or(0)
    }
}

/// JSON form of the per-worker cache map: `[{"workerSet": .., "worker": .., "tokens": ..}]`
/// (JSON objects cannot have struct keys).
mod cached_tokens_serde {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Name, WorkerKey};

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Entry {
        worker_set: Name,
        worker: Name,
        tokens: u32,
    }

    pub(super) fn serialize<S: Serializer>(map: &BTreeMap<WorkerKey, u32>, s: S) -> Result<S::Ok, S::Error> {
        map.iter()
            .map(|(k, &tokens)| Entry { worker_set: k.worker_set.clone(), worker: k.worker.clone(), tokens })
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<WorkerKey, u32>, D::Error> {
        let entries = Vec::<Entry>::deserialize(d)?;
        Ok(entries.into_iter().map(|e| (WorkerKey { worker_set: e.worker_set, worker: e.worker }, e.tokens)).collect())
    }
}
