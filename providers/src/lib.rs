//! External inference providers behind the request path's upstream seam
//! ([`switchyard_gateway::upstream::Upstream`]): AWS Bedrock through the real
//! `aws-sdk-bedrockruntime` client ([`bedrock`]) and OpenAI-compatible APIs
//! ([`OpenAiProviderUpstream`]), each behind one [`guard::Guard`] per provider (circuit
//! breaker and concurrency cap), with the cost of every request in exact money ([`request_cost`]).
//!
//! Invariants:
//! - [`Providers`] is built once per configuration from the fleet's `InferenceProvider`s; a
//!   provider whose client cannot be built (a missing Secret, no region) is kept, reported,
//!   and always unavailable, so planning skips it instead of failing requests;
//! - [`Providers::states`] lists every configured provider (the snapshot treats an unlisted
//!   provider as available), and a provider is available exactly when its guard would admit;
//! - a provider's refusal before any work is [`SendError::Unavailable`]: the relay then tries
//!   the next provider of the decision, never a worker the policy filtered out.

pub mod bedrock;
pub mod guard;
pub mod secrets;
pub mod spill;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use switchyard_core::fleet::{FleetConfig, ProviderCredentials, ProviderKind, TokenPrices};
use switchyard_core::money::PicoUsd;
use switchyard_core::snapshot::ProviderState;
use switchyard_gateway::error::{ErrorKind, GatewayError};
use switchyard_gateway::event::Usage;
use switchyard_gateway::request::InferenceRequest;
use switchyard_gateway::upstream::{EventStream, OpenAiUpstream, ResponseBounds, SendError, Upstream};

use crate::guard::{BreakerState, Guard, Refusal, Verdict};
pub use crate::secrets::SecretFiles;

/// Why a provider could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The resource or its Secret does not give what the client needs.
    #[error("{0}")]
    Config(String),
}

/// The caller-facing error of a guard's refusal.
pub fn refusal_error(provider: &str, refusal: Refusal) -> GatewayError {
    let (code, message) = match refusal {
        Refusal::BreakerOpen => {
            ("provider_breaker_open", format!("provider `{provider}` is failing; its circuit breaker is open"))
        }
        Refusal::AtCapacity => ("provider_at_capacity", format!("provider `{provider}` is at its concurrency limit")),
    };
    GatewayError {
        retry_after: Some(Duration::from_secs(1)),
        ..GatewayError::new(ErrorKind::NoCapacity, code, message)
    }
}

/// What one request cost at `prices`: uncached input, cache reads, cache writes and output,
/// each at its own price, exactly.
pub fn request_cost(prices: &TokenPrices, usage: &Usage) -> PicoUsd {
    let uncached = usage.prompt_tokens.saturating_sub(usage.cached_tokens).saturating_sub(usage.cache_write_tokens);
    PicoUsd::of_tokens(prices.input_per_million, u64::from(uncached))
        .plus(PicoUsd::of_tokens(prices.cached_input_per_million, u64::from(usage.cached_tokens)))
        .plus(PicoUsd::of_tokens(prices.cache_write_input_per_million, u64::from(usage.cache_write_tokens)))
        .plus(PicoUsd::of_tokens(prices.output_per_million, u64::from(usage.completion_tokens)))
}

/// How one provider is reached.
enum Client {
    Bedrock(aws_sdk_bedrockruntime::Client),
    OpenAi {
        http: reqwest::Client,
        base_url: String,
        api_key: Option<Arc<str>>,
    },
    /// The client could not be built; the provider is never available.
    Broken(String),
}

struct Entry {
    kind: ProviderKind,
    client: Client,
    guard: Arc<Guard>,
    first_byte_timeout: Duration,
}

/// The fleet's providers, ready to send to.
pub struct Providers {
    entries: BTreeMap<String, Entry>,
    bounds: ResponseBounds,
}

impl Providers {
    /// Builds a client for each provider of `fleet`. Failures are kept (the provider stays
    /// unavailable) and returned for the caller to report.
    pub async fn build(
        fleet: &FleetConfig,
        secrets: &SecretFiles,
        http: reqwest::Client,
        bounds: ResponseBounds,
    ) -> (Providers, Vec<(String, ProviderError)>) {
        let mut entries = BTreeMap::new();
        let mut failures = Vec::new();
        for (name, p) in &fleet.providers {
            let conn = &p.connection;
            let client = match p.kind {
                ProviderKind::Bedrock => bedrock::client(name, conn, secrets).await.map(Client::Bedrock),
                ProviderKind::OpenAi => openai_client(name, conn, secrets, http.clone()),
            };
            let client = client.unwrap_or_else(|e| {
                failures.push((name.clone(), e.clone()));
                Client::Broken(e.to_string())
            });
            let limits = conn.limits;
            entries.insert(
                name.clone(),
                Entry {
                    kind: p.kind,
                    client,
                    guard: Arc::new(Guard::new(limits.max_concurrency, Duration::from_millis(limits.breaker_open_ms))),
                    first_byte_timeout: Duration::from_millis(limits.first_byte_timeout_ms),
                },
            );
        }
        (Providers { entries, bounds }, failures)
    }

    /// No providers.
    pub fn none() -> Providers {
        Providers { entries: BTreeMap::new(), bounds: ResponseBounds::default() }
    }

    /// Availability of every configured provider at `now`, for the planning snapshot.
    pub fn states(&self, now: Instant) -> BTreeMap<String, ProviderState> {
        self.entries
            .iter()
            .map(|(name, e)| {
                let available = !matches!(e.client, Client::Broken(_)) && e.guard.available(now);
                (name.clone(), ProviderState { available })
            })
            .collect()
    }

    /// An upstream for model id `model_id` of `provider`.
    pub fn upstream(&self, provider: &str, model_id: &str) -> Option<Box<dyn Upstream>> {
        let e = self.entries.get(provider)?;
        match &e.client {
            Client::Bedrock(client) => Some(Box::new(bedrock::BedrockUpstream {
                provider: provider.to_owned(),
                client: client.clone(),
                model_id: model_id.to_owned(),
                guard: e.guard.clone(),
                first_byte_timeout: e.first_byte_timeout,
            })),
            Client::OpenAi { http, base_url, api_key } => Some(Box::new(OpenAiProviderUpstream {
                provider: provider.to_owned(),
                inner: OpenAiUpstream {
                    client: http.clone(),
                    base_url: base_url.clone(),
                    served_model: model_id.to_owned(),
                    body: None,
                    bounds: self.bounds,
                    api_key: api_key.clone(),
                    spoke_worker_set: None,
                },
                guard: e.guard.clone(),
                first_byte_timeout: e.first_byte_timeout,
            })),
            Client::Broken(_) => None,
        }
    }

    /// Each provider's state for `/status`.
    pub fn status(&self) -> Value {
        Value::Array(
            self.entries
                .iter()
                .map(|(name, e)| {
                    let breaker = match (&e.client, e.guard.state()) {
                        (Client::Broken(_), _) => "broken",
                        (_, BreakerState::Closed) => "closed",
                        (_, BreakerState::Open { .. }) => "open",
                        (_, BreakerState::Probing) => "probing",
                    };
                    json!({
                        "name": name,
                        "type": match e.kind { ProviderKind::Bedrock => "Bedrock", ProviderKind::OpenAi => "OpenAI" },
                        "breaker": breaker,
                        "breakerOpened": e.guard.times_opened(),
                        "inFlight": e.guard.in_flight(),
                        "error": match &e.client { Client::Broken(why) => Some(why.as_str()), _ => None },
                    })
                })
                .collect(),
        )
    }
}

fn openai_client(
    name: &str,
    conn: &switchyard_core::fleet::ProviderConnection,
    secrets: &SecretFiles,
    http: reqwest::Client,
) -> Result<Client, ProviderError> {
    let base = conn
        .base_url
        .as_deref()
        .ok_or_else(|| ProviderError::Config(format!("OpenAI provider `{name}` has no baseUrl")))?;
    // The resource names the API root (`https://host/v1`); the upstream adds `/v1/...` itself.
    let base_url = base.trim_end_matches('/').trim_end_matches("/v1").to_owned();
    let api_key = match &conn.credentials {
        ProviderCredentials::Secret { name, key } => Some(Arc::from(secrets.read(name, key)?.as_str())),
        ProviderCredentials::Ambient => None,
        ProviderCredentials::AssumeRole { .. } => {
            return Err(ProviderError::Config(format!("OpenAI provider `{name}` cannot assume an AWS role")));
        }
    };
    Ok(Client::OpenAi { http, base_url, api_key })
}

/// An OpenAI-compatible provider: the worker upstream with a bearer key, behind the
/// provider's guard, resolving after the first event so a failure before it can go to the
/// next provider.
pub struct OpenAiProviderUpstream {
    /// Provider name.
    pub provider: String,
    /// The HTTP upstream.
    pub inner: OpenAiUpstream,
    /// The provider's breaker and cap.
    pub guard: Arc<Guard>,
    /// From sending to the first event.
    pub first_byte_timeout: Duration,
}

impl Upstream for OpenAiProviderUpstream {
    fn send<'a>(&'a self, req: &'a InferenceRequest) -> BoxFuture<'a, Result<EventStream, SendError>> {
        Box::pin(async move {
            let pass = self
                .guard
                .enter(Instant::now())
                .map_err(|r| SendError::Unavailable(refusal_error(&self.provider, r)))?;
            let unhealthy = |e: GatewayError| {
                self.guard.record(&pass, Verdict::Unhealthy, Instant::now());
                SendError::Unavailable(e)
            };
            let first = async {
                let mut stream = self.inner.send(req).await?;
                let first = stream.next().await;
                Ok::<_, SendError>((stream, first))
            };
            let (stream, first) = match tokio::time::timeout(self.first_byte_timeout, first).await {
                Err(_) => {
                    return Err(unhealthy(GatewayError::new(
                        ErrorKind::UpstreamTimeout,
                        "provider_timeout",
                        format!("provider `{}` sent nothing in time", self.provider),
                    )));
                }
                Ok(Err(SendError::Connect(_))) => {
                    return Err(unhealthy(GatewayError::new(
                        ErrorKind::NoCapacity,
                        "provider_unreachable",
                        format!("provider `{}` could not be reached", self.provider),
                    )));
                }
                Ok(Err(SendError::Failed(e) | SendError::Unavailable(e))) => {
                    return Err(match e.kind {
                        ErrorKind::InvalidRequest | ErrorKind::NotFound | ErrorKind::PayloadTooLarge => {
                            self.guard.record(&pass, Verdict::Neutral, Instant::now());
                            SendError::Failed(e)
                        }
                        _ => unhealthy(GatewayError {
                            message: format!("provider `{}`: {}", self.provider, e.message),
                            ..e
                        }),
                    });
                }
                Ok(Ok((_, Some(Err(e))))) => return Err(unhealthy(e)),
                Ok(Ok(v)) => v,
            };
            self.guard.record(&pass, Verdict::Healthy, Instant::now());
            // The pass lives as long as the stream.
            let held = futures::stream::once(async move {
                drop(pass);
                None
            });
            let events = futures::stream::iter(first.map(Some)).chain(stream.map(Some)).chain(held);
            Ok(events.filter_map(futures::future::ready).boxed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::money::MicroUsd;

    #[test]
    fn cost_prices_each_kind_of_token_apart() {
        let prices = TokenPrices {
            input_per_million: MicroUsd(3_000_000),
            output_per_million: MicroUsd(15_000_000),
            cached_input_per_million: MicroUsd(300_000),
            cache_write_input_per_million: MicroUsd(3_750_000),
        };
        let usage = Usage { prompt_tokens: 1_000, completion_tokens: 100, cached_tokens: 600, cache_write_tokens: 300 };
        // 100 × $3 + 600 × $0.30 + 300 × $3.75 + 100 × $15, per million tokens.
        assert_eq!(request_cost(&prices, &usage).to_string(), "0.003105");
    }
}
