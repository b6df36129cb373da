//! Cross-resource validation and compilation into the core fleet model.
//!
//! Pure: takes the typed resources (already schema- and CEL-checked by [`crate::load`]) and
//! returns the compiled [`FleetConfig`] plus diagnostics. Checks: unique names, every
//! reference resolves, money amounts parse, no alias cycles or name collisions, no policy
//! that can send a `pii` request to an external provider (E030), and warnings for policies
//! no request can reach and resources nothing uses.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_core::Name;
use switchyard_core::fleet::{
    Alias, EngineLimits, FleetConfig, Match, Objective, OnEmpty, Policy, Pool, Provider, ProviderConnection,
    ProviderCredentials, ProviderKind, ProviderLimits, ProviderMember, ProviderModel, PublicModel, Step, TokenPrices,
    WorkerSet,
};
use switchyard_core::money::MicroUsd;
use switchyard_core::predictor::TtftModel;
use switchyard_core::request::{self, PII_TAG};
use switchyard_core::resolve;
use switchyard_crds as crds;

use crate::diagnostics::{Diagnostic, Severity, code};
use crate::load::{Located, Resources};

/// Validates `res` and compiles what is valid. The config is only fit for serving when no
/// diagnostic is an error.
pub fn validate(res: &Resources) -> (FleetConfig, Vec<Diagnostic>) {
    let mut v = Validator {
        cfg: FleetConfig::default(),
        diags: Vec::new(),
        alias_src: BTreeMap::new(),
        policy_src: BTreeMap::new(),
        rejected: &res.rejected,
    };
    v.worker_sets(&res.worker_sets);
    v.providers(&res.providers);
    v.pools(&res.pools);
    v.backends(&res.backends);
    v.policies(&res.policies);
    v.cfg.sort_policies();
    v.alias_cycles();
    v.policy_reachability();
    v.pii_safety();
    v.unused(res);
    (v.cfg, v.diags)
}

struct Validator<'a> {
    cfg: FleetConfig,
    diags: Vec<Diagnostic>,
    alias_src: BTreeMap<String, (&'a Located<crds::GatewayBackend>, usize)>,
    policy_src: BTreeMap<String, &'a Located<crds::InferencePolicy>>,
    rejected: &'a BTreeSet<(String, String)>,
}

fn name_of<T: kube::Resource>(obj: &T) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

impl<'a> Validator<'a> {
    fn error<T>(&mut self, at: &Located<T>, code: &'static str, path: &str, message: String) {
        self.diags.push(at.diag(Severity::Error, code, path, message));
    }

    fn warn<T>(&mut self, at: &Located<T>, code: &'static str, path: &str, message: String) {
        self.diags.push(at.diag(Severity::Warning, code, path, message));
    }

    /// Reports a duplicate and returns false when `name` was already taken.
    fn claim<T>(&mut self, seen: &mut BTreeSet<String>, at: &Located<T>, kind: &str, name: &str) -> bool {
        if seen.insert(name.to_owned()) {
            return true;
        }
        self.error(at, code::DUPLICATE_NAME, "metadata.name", format!("duplicate {kind} `{name}`"));
        false
    }

    /// Reports a reference to a missing resource, unless that resource exists but was refused
    /// (its own error is already reported).
    fn dangling<T>(&mut self, at: &Located<T>, path: &str, kind: &str, name: &str) {
        if !self.rejected.contains(&(kind.to_owned(), name.to_owned())) {
            self.error(at, code::DANGLING_REFERENCE, path, format!("{kind} `{name}` does not exist"));
        }
    }

    fn money(&mut self, at: &Located<impl Sized>, path: &str, text: &str) -> MicroUsd {
        match text.parse::<MicroUsd>() {
            Ok(m) => m,
            Err(err) => {
                self.diags.push(at.diag(Severity::Error, code::BAD_AMOUNT, path, err.to_string()));
                MicroUsd::ZERO
            }
        }
    }

    fn worker_sets(&mut self, items: &[Located<crds::InferenceWorkerSet>]) {
        let mut seen = BTreeSet::new();
        for at in items {
            let name = name_of(&at.object);
            if !self.claim(&mut seen, at, "InferenceWorkerSet", &name) {
                continue;
            }
            let spec = &at.object.spec;
            let mut workers: Vec<Name> = Vec::new();
            for (i, ep) in spec.endpoints.static_.iter().flatten().enumerate() {
                if workers.iter().any(|w| **w == *ep.name) {
                    self.error(
                        at,
                        code::DUPLICATE_ENTRY,
                        &format!("spec.endpoints.static[{i}].name"),
                        format!("duplicate worker name `{}`", ep.name),
                    );
                    continue;
                }
                workers.push(ep.name.as_str().into());
            }
            let gpu_hour = self.money(at, "spec.cost.gpuHourlyUsd", &spec.cost.gpu_hourly_usd);
            let defaults = TtftModel::default();
            let ttft = TtftModel {
                prefill_tokens_per_sec: spec
                    .capacity
                    .prefill_tokens_per_second
                    .map_or(defaults.prefill_tokens_per_sec, f64::from),
                ..defaults
            };
            self.cfg.worker_sets.insert(
                name.clone(),
                WorkerSet {
                    name: name.into(),
                    served_model: spec.model.as_str().into(),
                    cluster: spec.cluster.clone(),
                    region: spec.region.as_deref().map(Name::from),
                    workers,
                    kv_block_size: spec.kv_block_size,
                    hourly_cost: MicroUsd(gpu_hour.0.saturating_mul(u64::from(spec.cost.gpus_per_worker))),
                    decode_tokens_per_sec: spec.capacity.decode_tokens_per_second.map_or(2_000.0, f64::from),
                    ttft,
                    engine: EngineLimits {
                        max_num_seqs: spec.capacity.max_num_seqs,
                        max_num_batched_tokens: spec.capacity.max_num_batched_tokens,
                        kv_cache_tokens: spec.capacity.kv_cache_tokens,
                    },
                    replicate_engines: spec.ttft_predictor == crds::TtftPredictor::EngineReplica,
                    paced: spec.dispatch_pacing == crds::DispatchPacing::Paced,
                },
            );
        }
    }

    fn providers(&mut self, items: &[Located<crds::InferenceProvider>]) {
        let mut seen = BTreeSet::new();
        for at in items {
            let name = name_of(&at.object);
            if !self.claim(&mut seen, at, "InferenceProvider", &name) {
                continue;
            }
            let spec = &at.object.spec;
            let mut models = BTreeMap::new();
            for (i, m) in spec.models.iter().enumerate() {
                let path = format!("spec.models[{i}]");
                if models.contains_key(&m.name) {
                    self.error(
                        at,
                        code::DUPLICATE_ENTRY,
                        &format!("{path}.name"),
                        format!("duplicate model `{}`", m.name),
                    );
                    continue;
                }
                let prices = TokenPrices {
                    input_per_million: self.money(
                        at,
                        &format!("{path}.pricing.inputPerMillion"),
                        &m.pricing.input_per_million,
                    ),
                    output_per_million: self.money(
                        at,
                        &format!("{path}.pricing.outputPerMillion"),
                        &m.pricing.output_per_million,
                    ),
                    cached_input_per_million: self.money(
                        at,
                        &format!("{path}.pricing.cachedInputPerMillion"),
                        &m.pricing.cached_input_per_million,
                    ),
                    cache_write_input_per_million: match &m.pricing.cache_write_input_per_million {
                        Some(text) => self.money(at, &format!("{path}.pricing.cacheWriteInputPerMillion"), text),
                        None => {
                            self.money(at, &format!("{path}.pricing.inputPerMillion"), &m.pricing.input_per_million)
                        }
                    },
                };
                models.insert(m.name.clone(), ProviderModel { provider_model_id: m.provider_model_id.clone(), prices });
            }
            self.cfg.providers.insert(
                name.clone(),
                Provider {
                    name,
                    kind: match spec.type_ {
                        crds::ProviderType::Bedrock => ProviderKind::Bedrock,
                        crds::ProviderType::OpenAI => ProviderKind::OpenAi,
                    },
                    external: spec.residency.external,
                    region: spec.residency.region.clone().or_else(|| spec.region.clone()),
                    models,
                    expected_ttft_ms: f64::from(spec.expected_ttft_ms),
                    connection: connection(spec),
                },
            );
        }
    }

    fn pools(&mut self, items: &[Located<crds::InferencePool>]) {
        let mut seen = BTreeSet::new();
        for at in items {
            let name = name_of(&at.object);
            if !self.claim(&mut seen, at, "InferencePool", &name) {
                continue;
            }
            let mut pool = Pool { name: name.as_str().into(), worker_sets: Vec::new(), providers: Vec::new() };
            for (i, member) in at.object.spec.members.iter().enumerate() {
                let path = format!("spec.members[{i}]");
                if let Some(ws) = &member.worker_set {
                    if !self.cfg.worker_sets.contains_key(ws) {
                        self.dangling(at, &format!("{path}.workerSet"), "InferenceWorkerSet", ws);
                    } else if pool.worker_sets.contains(ws) {
                        self.error(
                            at,
                            code::DUPLICATE_ENTRY,
                            &format!("{path}.workerSet"),
                            format!("worker set `{ws}` is listed twice"),
                        );
                    } else {
                        pool.worker_sets.push(ws.clone());
                    }
                }
                if let (Some(provider), Some(model)) = (&member.provider, &member.model) {
                    let Some(p) = self.cfg.providers.get(provider) else {
                        self.dangling(at, &format!("{path}.provider"), "InferenceProvider", provider);
                        continue;
                    };
                    if !p.models.contains_key(model) {
                        let known: Vec<&str> = p.models.keys().map(String::as_str).collect();
                        self.error(
                            at,
                            code::DANGLING_REFERENCE,
                            &format!("{path}.model"),
                            format!("provider `{provider}` has no model `{model}` (it offers: {})", known.join(", ")),
                        );
                        continue;
                    }
                    let m = ProviderMember { provider: provider.clone(), model: model.clone() };
                    if pool.providers.contains(&m) {
                        self.error(
                            at,
                            code::DUPLICATE_ENTRY,
                            &format!("{path}.model"),
                            format!("{provider}/{model} is listed twice"),
                        );
                    } else {
                        pool.providers.push(m);
                    }
                }
            }
            self.cfg.pools.insert(name, pool);
        }
    }

    fn backends(&mut self, items: &'a [Located<crds::GatewayBackend>]) {
        let mut seen = BTreeSet::new();
        for at in items {
            let name = name_of(&at.object);
            self.claim(&mut seen, at, "GatewayBackend", &name);
            for (i, m) in at.object.spec.models.iter().enumerate() {
                let path = format!("spec.models[{i}]");
                if self.cfg.models.contains_key(&m.name) {
                    self.error(
                        at,
                        code::NAME_CONFLICT,
                        &format!("{path}.name"),
                        format!("public model `{}` is declared twice", m.name),
                    );
                    continue;
                }
                if !self.cfg.pools.contains_key(&m.pool) {
                    self.dangling(at, &format!("{path}.pool"), "InferencePool", &m.pool);
                    continue;
                }
                self.cfg
                    .models
                    .insert(m.name.clone(), PublicModel { name: m.name.as_str().into(), pool: m.pool.clone() });
            }
        }
        // Aliases after every public model is known, so alias targets may name models declared
        // in any backend.
        for at in items {
            for (i, a) in at.object.spec.aliases.iter().enumerate() {
                let path = format!("spec.aliases[{i}]");
                if self.cfg.models.contains_key(&a.name) {
                    self.error(
                        at,
                        code::NAME_CONFLICT,
                        &format!("{path}.name"),
                        format!("alias `{}` has the same name as a public model", a.name),
                    );
                    continue;
                }
                if self.cfg.aliases.contains_key(&a.name) {
                    self.error(
                        at,
                        code::NAME_CONFLICT,
                        &format!("{path}.name"),
                        format!("alias `{}` is declared twice", a.name),
                    );
                    continue;
                }
                self.cfg.aliases.insert(a.name.clone(), Alias { name: a.name.clone(), targets: a.targets.clone() });
                self.alias_src.insert(a.name.clone(), (at, i));
            }
        }
        let known: BTreeSet<String> = self.cfg.models.keys().chain(self.cfg.aliases.keys()).cloned().collect();
        let mut dangling = Vec::new();
        for (alias, (at, i)) in &self.alias_src {
            for (j, target) in self.cfg.aliases[alias].targets.iter().enumerate() {
                if !known.contains(target) {
                    dangling.push((
                        *at,
                        format!("spec.aliases[{i}].targets[{j}]"),
                        format!("alias `{alias}` targets `{target}`, which is neither a public model nor an alias"),
                    ));
                }
            }
        }
        for (at, path, msg) in dangling {
            self.error(at, code::DANGLING_REFERENCE, &path, msg);
        }
        // Keep only resolvable targets so the compiled config never dangles.
        for alias in self.cfg.aliases.values_mut() {
            alias.targets.retain(|t| known.contains(t));
        }
    }

    fn alias_cycles(&mut self) {
        let mut reported = BTreeSet::new();
        let names: Vec<String> = self.cfg.aliases.keys().cloned().collect();
        for name in names {
            if let Err(resolve::ResolveError::Cycle(cycle)) = resolve::expand(&self.cfg, &name) {
                let members: BTreeSet<String> = cycle.iter().cloned().collect();
                if !reported.insert(members) {
                    continue;
                }
                if let Some((at, i)) = self.alias_src.get(cycle[0].as_str()).copied() {
                    self.error(
                        at,
                        code::ALIAS_CYCLE,
                        &format!("spec.aliases[{i}].targets"),
                        format!("alias cycle: {}", cycle.join(" -> ")),
                    );
                }
            }
        }
        // Break cycles in the compiled config: drop every alias on a cycle.
        let cyclic: Vec<String> = self
            .cfg
            .aliases
            .keys()
            .filter(|a| matches!(resolve::expand(&self.cfg, a), Err(resolve::ResolveError::Cycle(_))))
            .cloned()
            .collect();
        for a in cyclic {
            self.cfg.aliases.remove(&a);
        }
    }

    fn policies(&mut self, items: &'a [Located<crds::InferencePolicy>]) {
        let mut seen = BTreeSet::new();
        let known: BTreeSet<String> = self.cfg.models.keys().chain(self.cfg.aliases.keys()).cloned().collect();
        for at in items {
            let name = name_of(&at.object);
            if !self.claim(&mut seen, at, "InferencePolicy", &name) {
                continue;
            }
            let spec = &at.object.spec;
            for (i, m) in spec.matcher.models.iter().enumerate() {
                if !known.contains(m) {
                    self.error(
                        at,
                        code::DANGLING_REFERENCE,
                        &format!("spec.match.models[{i}]"),
                        format!("`{m}` is neither a public model nor an alias"),
                    );
                }
            }
            let mut steps = Vec::new();
            for (i, s) in spec.steps.iter().enumerate() {
                let path = format!("spec.steps[{i}]");
                let step = match s.type_ {
                    crds::StepType::ExcludeExternal => Step::ExcludeExternal,
                    crds::StepType::RequireRegions => {
                        Step::RequireRegions { regions: s.require_regions.clone().unwrap_or_default() }
                    }
                    crds::StepType::MaxWaitingRequests => {
                        Step::MaxWaitingRequests { max: s.max_waiting_requests.unwrap_or(0) }
                    }
                    crds::StepType::KvCacheUsageBelow => {
                        Step::KvCacheUsageBelow { percent: s.kv_cache_usage_below.unwrap_or(100) }
                    }
                    crds::StepType::PreferModel => {
                        let p = s.prefer_model.clone().unwrap_or_default();
                        if !self.cfg.models.contains_key(&p.model) {
                            self.error(
                                at,
                                code::DANGLING_REFERENCE,
                                &format!("{path}.preferModel.model"),
                                format!("`{}` is not a public model", p.model),
                            );
                        }
                        Step::PreferModel { model: p.model, unless_cached_sooner: p.unless_cached_sooner }
                    }
                };
                steps.push(step);
            }
            let matcher = Match {
                models: spec.matcher.models.clone(),
                tenants: spec.matcher.tenants.clone(),
                tags: spec.matcher.tags.clone(),
                class: spec.matcher.class.map(|c| match c {
                    crds::RequestClass::Interactive => request::RequestClass::Interactive,
                    crds::RequestClass::Batch => request::RequestClass::Batch,
                }),
                complexity: spec
                    .matcher
                    .complexity
                    .iter()
                    .map(|c| match c {
                        crds::Complexity::Low => request::Complexity::Low,
                        crds::Complexity::Medium => request::Complexity::Medium,
                        crds::Complexity::High => request::Complexity::High,
                    })
                    .collect(),
            };
            let policy = Policy {
                name: name.clone(),
                priority: spec.priority,
                matcher,
                steps,
                minimize: match spec.minimize {
                    crds::Minimize::PredictedTTFT => Objective::PredictedTtft,
                    crds::Minimize::Cost => Objective::Cost,
                },
                on_empty: match spec.on_empty {
                    crds::OnEmpty::Reject => OnEmpty::Reject,
                    crds::OnEmpty::Fallback => OnEmpty::Fallback,
                    crds::OnEmpty::Queue => OnEmpty::Queue,
                },
            };
            self.policy_src.insert(name, at);
            self.cfg.policies.push(policy);
        }
    }

    /// Public models a policy's requests can resolve to.
    fn models_of(&self, policy: &Policy) -> BTreeSet<String> {
        let names: Vec<String> = if policy.matcher.models.is_empty() {
            self.cfg.models.keys().chain(self.cfg.aliases.keys()).cloned().collect()
        } else {
            policy.matcher.models.clone()
        };
        names.iter().filter_map(|n| resolve::expand(&self.cfg, n).ok()).flatten().collect()
    }

    fn policy_reachability(&mut self) {
        let mut found: Vec<(String, &'static str, String, String)> = Vec::new();
        for (i, p) in self.cfg.policies.iter().enumerate() {
            if let Some(q) = self.cfg.policies[..i].iter().find(|q| q.matcher.covers(&p.matcher, &[])) {
                let msg = format!(
                    "policy `{}` is never applied: every request it matches is taken first by `{}` (priority {} >= {})",
                    p.name, q.name, q.priority, p.priority
                );
                found.push((p.name.clone(), code::UNREACHABLE_POLICY, "metadata.name".to_owned(), msg));
            }
            let models = self.models_of(p);
            for (j, s) in p.steps.iter().enumerate() {
                if let Step::PreferModel { model, .. } = s
                    && self.cfg.models.contains_key(model)
                    && !models.contains(model)
                {
                    let msg = format!(
                        "requests matched by `{}` never resolve to `{model}`, so this preference never applies",
                        p.name
                    );
                    found.push((p.name.clone(), code::PREFERENCE_NEVER_APPLIES, format!("spec.steps[{j}]"), msg));
                }
            }
        }
        for (name, code, path, msg) in found {
            if let Some(at) = self.policy_src.get(&name).copied() {
                self.warn(at, code, &path, msg);
            }
        }
    }

    /// E030: a policy that a `pii` request can reach and that can spill over to an external
    /// provider. The engine's residency guard blocks such routing at run time anyway; this
    /// check makes the configuration say what it means.
    fn pii_safety(&mut self) {
        let pii = [PII_TAG.to_owned()];
        let mut found = Vec::new();
        for (i, p) in self.cfg.policies.iter().enumerate() {
            if p.on_empty != OnEmpty::Fallback || p.excludes_external() {
                continue;
            }
            let externals: BTreeSet<String> = self
                .models_of(p)
                .iter()
                .filter_map(|m| self.cfg.models.get(m))
                .filter_map(|m| self.cfg.pools.get(&m.pool))
                .flat_map(|pool| pool.providers.iter())
                .filter(|member| self.cfg.providers.get(&member.provider).is_some_and(|pr| pr.external))
                .map(|member| member.provider.clone())
                .collect();
            if externals.is_empty() {
                continue;
            }
            let pii_reaches = p.matcher.tags.iter().any(|t| t == PII_TAG)
                || !self.cfg.policies[..i].iter().any(|q| q.matcher.covers(&p.matcher, &pii));
            if pii_reaches {
                let list: Vec<String> = externals.into_iter().collect();
                found.push((p.name.clone(), format!(
                    "policy `{}` can send pii-tagged requests to external provider(s) {} (onEmpty: Fallback without an ExcludeExternal step); \
                     add an ExcludeExternal step, set onEmpty: Reject, or add a higher-priority policy matching tag `{PII_TAG}` that does",
                    p.name,
                    list.join(", ")
                )));
            }
        }
        for (name, msg) in found {
            if let Some(at) = self.policy_src.get(&name).copied() {
                self.error(at, code::PII_UNSAFE, "spec.onEmpty", msg);
            }
        }
    }

    fn unused(&mut self, res: &Resources) {
        let pooled_sets: BTreeSet<&String> = self.cfg.pools.values().flat_map(|p| p.worker_sets.iter()).collect();
        let pooled_providers: BTreeSet<&String> =
            self.cfg.pools.values().flat_map(|p| p.providers.iter().map(|m| &m.provider)).collect();
        let exposed_pools: BTreeSet<&String> = self.cfg.models.values().map(|m| &m.pool).collect();
        let mut warnings = Vec::new();
        for at in &res.worker_sets {
            let n = name_of(&at.object);
            if self.cfg.worker_sets.contains_key(&n) && !pooled_sets.contains(&n) {
                warnings.push(at.diag(
                    Severity::Warning,
                    code::UNUSED,
                    "metadata.name",
                    format!("InferenceWorkerSet `{n}` is in no InferencePool"),
                ));
            }
        }
        for at in &res.providers {
            let n = name_of(&at.object);
            if self.cfg.providers.contains_key(&n) && !pooled_providers.contains(&n) {
                warnings.push(at.diag(
                    Severity::Warning,
                    code::UNUSED,
                    "metadata.name",
                    format!("InferenceProvider `{n}` is in no InferencePool"),
                ));
            }
        }
        for at in &res.pools {
            let n = name_of(&at.object);
            if self.cfg.pools.contains_key(&n) && !exposed_pools.contains(&n) {
                warnings.push(at.diag(
                    Severity::Warning,
                    code::UNUSED,
                    "metadata.name",
                    format!("InferencePool `{n}` is exposed by no GatewayBackend model"),
                ));
            }
        }
        self.diags.extend(warnings);
    }
}

/// How the request path reaches a provider, from its resource (the CRD's CEL rules already
/// hold: at most one credential source, Bedrock has a region, OpenAI a base URL).
fn connection(spec: &crds::InferenceProviderSpec) -> ProviderConnection {
    let defaults = ProviderLimits::default();
    let limits = spec.limits.clone().unwrap_or_default();
    ProviderConnection {
        aws_region: spec.region.clone().filter(|_| spec.type_ == crds::ProviderType::Bedrock),
        base_url: spec.base_url.clone(),
        credentials: match &spec.credentials {
            Some(crds::CredentialsSpec { secret_ref: Some(r), .. }) => {
                ProviderCredentials::Secret { name: r.name.clone(), key: r.key.clone() }
            }
            Some(crds::CredentialsSpec { role_arn: Some(arn), .. }) => {
                ProviderCredentials::AssumeRole { role_arn: arn.clone() }
            }
            _ => ProviderCredentials::Ambient,
        },
        limits: ProviderLimits {
            max_concurrency: limits.max_concurrency.unwrap_or(defaults.max_concurrency),
            first_byte_timeout_ms: limits
                .first_byte_timeout_seconds
                .map_or(defaults.first_byte_timeout_ms, |s| u64::from(s) * 1_000),
            breaker_open_ms: limits.breaker_open_seconds.map_or(defaults.breaker_open_ms, |s| u64::from(s) * 1_000),
        },
    }
}
