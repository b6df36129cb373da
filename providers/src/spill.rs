//! Spillover targets, shared by the spoke and the hub: a provider decision's candidates as
//! the gateway's targets, each dispatch counted and priced exactly into one [`Spillover`]
//! ledger, with counters in the deployable's own metrics.
//!
//! Invariants: only the decision's provider candidates become targets, in its rank order
//! (the engine has already applied the policy, residency — `pii` never leaves — and provider
//! availability); a provider whose client could not be built is left out; a request counts
//! as sent when dispatched and as completed (with its cost) only when it completes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use switchyard_core::FleetConfig;
use switchyard_core::engine::{Decision, Target as DecidedTarget};
use switchyard_core::fleet::TokenPrices;
use switchyard_core::money::PicoUsd;
use switchyard_gateway::backend::Target;
use switchyard_gateway::event::Usage;
use switchyard_gateway::metrics::Metrics;
use switchyard_gateway::observe::{Booking, Dispatch, Observer, Outcome};
use switchyard_gateway::upstream::Upstream;

use crate::{Providers, request_cost};

/// What spillover to one provider model has come to.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProviderTally {
    /// Requests sent.
    pub requests: u64,
    /// Requests that completed.
    pub completed: u64,
    /// Their cost, exactly.
    pub cost: PicoUsd,
}

/// Help text of the requests counter, the same in every deployable's catalogue.
pub const REQUESTS_TOTAL_HELP: &str = "Requests spilled to external providers, by provider, model and outcome";
/// Help text of the cost counter.
pub const COST_USD_TOTAL_HELP: &str = "Cost of spilled requests in US dollars, by provider and model";

/// The names a deployable counts spillover under (its own metric catalogue's).
#[derive(Debug, Clone, Copy)]
pub struct SpillMetricNames {
    /// Requests by provider, model and outcome.
    pub requests_total: &'static str,
    /// Cost in US dollars by provider and model (a float for dashboards; exact in the ledger).
    pub cost_usd_total: &'static str,
}

/// The spillover ledger of one process.
pub struct Spillover {
    ledger: Mutex<BTreeMap<(String, String), ProviderTally>>,
    metrics: Arc<Metrics>,
    names: SpillMetricNames,
}

impl Spillover {
    /// An empty ledger counting into `metrics` under `names`.
    pub fn new(metrics: Arc<Metrics>, names: SpillMetricNames) -> Spillover {
        Spillover { ledger: Mutex::new(BTreeMap::new()), metrics, names }
    }

    fn with(&self, f: impl FnOnce(&mut BTreeMap<(String, String), ProviderTally>)) {
        match self.ledger.lock() {
            Ok(mut l) => f(&mut l),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// The tally of every provider model used so far.
    pub fn tallies(&self) -> Vec<((String, String), ProviderTally)> {
        let mut out = Vec::new();
        self.with(|l| out = l.iter().map(|(k, t)| (k.clone(), *t)).collect());
        out
    }

    /// The ledger as `/status` shows it: per provider model, requests, completions and the
    /// exact cost as a decimal string.
    pub fn status(&self) -> Vec<Value> {
        self.tallies()
            .into_iter()
            .map(|((provider, model), t)| {
                json!({"provider": provider, "model": model, "requests": t.requests, "completed": t.completed, "costUsd": t.cost.to_string()})
            })
            .collect()
    }

    fn sent(&self, provider: &str, model: &str) {
        self.with(|l| l.entry((provider.to_owned(), model.to_owned())).or_default().requests += 1);
    }

    fn ended(&self, provider: &str, model: &str, outcome: Outcome, cost: Option<PicoUsd>, request_id: &str) {
        let label = match outcome {
            Outcome::Completed => "completed",
            Outcome::ConnectFailed => "refused",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        };
        let labels = [("provider", provider), ("model", model), ("outcome", label)];
        self.metrics.inc(self.names.requests_total, &labels, 1.0);
        self.with(|l| {
            let tally = l.entry((provider.to_owned(), model.to_owned())).or_default();
            if outcome == Outcome::Completed {
                tally.completed += 1;
            }
            if let Some(cost) = cost {
                tally.cost = tally.cost.plus(cost);
            }
        });
        if let Some(cost) = cost {
            let usd = cost.0 as f64 / 1e12;
            self.metrics.inc(self.names.cost_usd_total, &[("provider", provider), ("model", model)], usd);
            tracing::debug!(%request_id, %provider, cost_usd = %cost, "provider request cost");
        }
    }
}

/// The decision's provider candidates as targets, in its rank order.
pub fn spill_targets(
    decision: &Decision,
    fleet: &FleetConfig,
    providers: &Providers,
    spill: &Arc<Spillover>,
    request_id: &str,
) -> Vec<Box<dyn Target>> {
    let mut targets: Vec<Box<dyn Target>> = Vec::new();
    for c in &decision.alternatives {
        let DecidedTarget::Provider { provider, model, provider_model_id } = &c.target else { continue };
        let Some(upstream) = providers.upstream(provider, provider_model_id) else { continue };
        let prices =
            fleet.providers.get(provider).and_then(|p| p.models.get(model)).map(|m| m.prices).unwrap_or_default();
        targets.push(Box::new(ProviderTarget {
            label: format!("{provider}/{model}"),
            provider: provider.clone(),
            model: model.clone(),
            upstream,
            prices,
            spill: spill.clone(),
            request_id: request_id.to_owned(),
        }));
    }
    targets
}

/// One provider model as a target.
struct ProviderTarget {
    label: String,
    provider: String,
    model: String,
    upstream: Box<dyn Upstream>,
    prices: TokenPrices,
    spill: Arc<Spillover>,
    request_id: String,
}

impl Target for ProviderTarget {
    fn label(&self) -> &str {
        &self.label
    }

    fn provider(&self) -> Option<&str> {
        Some(&self.provider)
    }

    fn upstream(&self) -> &dyn Upstream {
        self.upstream.as_ref()
    }

    fn dispatch(&self, _attempt: usize) -> Dispatch {
        self.spill.sent(&self.provider, &self.model);
        Dispatch {
            booking: Booking::none(),
            observers: vec![Box::new(ProviderObserver {
                spill: self.spill.clone(),
                provider: self.provider.clone(),
                model: self.model.clone(),
                prices: self.prices,
                request_id: self.request_id.clone(),
                cost: None,
            })],
        }
    }
}

/// Counts a provider request's outcome and its exact cost.
struct ProviderObserver {
    spill: Arc<Spillover>,
    provider: String,
    model: String,
    prices: TokenPrices,
    request_id: String,
    cost: Option<PicoUsd>,
}

impl Observer for ProviderObserver {
    fn usage(&mut self, usage: &Usage) {
        self.cost = Some(request_cost(&self.prices, usage));
    }

    fn end(&mut self, outcome: Outcome) {
        self.spill.ended(&self.provider, &self.model, outcome, self.cost, &self.request_id);
    }
}
