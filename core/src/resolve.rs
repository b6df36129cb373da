//! Alias resolution: from a requested model name to the public models that serve it.
//!
//! Aliases may point at public models or at other aliases. The validator rejects cycles, but
//! resolution stays total on any input: a cycle or a dangling name is an error, never a loop.

use std::collections::BTreeSet;

use crate::fleet::FleetConfig;

/// Why a model name could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Neither a public model nor an alias.
    #[error("model `{0}` does not exist")]
    Unknown(String),
    /// An alias chain loops back on itself.
    #[error("alias cycle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
}

/// The worker sets whose pools serve `name` (a public model or an alias), in the order the
/// expansion and the pools list them, each once.
pub fn worker_sets(cfg: &FleetConfig, name: &str) -> Result<Vec<String>, ResolveError> {
    let mut sets: Vec<String> = Vec::new();
    for model in expand(cfg, name)? {
        if let Some(pool) = cfg.models.get(&model).and_then(|p| cfg.pools.get(&p.pool)) {
            for ws in &pool.worker_sets {
                if !sets.contains(ws) {
                    sets.push(ws.clone());
                }
            }
        }
    }
    Ok(sets)
}

/// Expands `name` into public model names, depth first, in declaration order, each once.
pub fn expand(cfg: &FleetConfig, name: &str) -> Result<Vec<String>, ResolveError> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let mut path = Vec::new();
    expand_into(cfg, name, &mut path, &mut seen, &mut out)?;
    Ok(out)
}

fn expand_into(
    cfg: &FleetConfig,
    name: &str,
    path: &mut Vec<String>,
    seen: &mut BTreeSet<String>,
    out: &mut Vec<String>,
) -> Result<(), ResolveError> {
    if path.iter().any(|p| p == name) {
        let mut cycle = path.clone();
        cycle.push(name.to_owned());
        return Err(ResolveError::Cycle(cycle));
    }
    if cfg.models.contains_key(name) {
        if seen.insert(name.to_owned()) {
            out.push(name.to_owned());
        }
        return Ok(());
    }
    let Some(alias) = cfg.aliases.get(name) else {
        return Err(ResolveError::Unknown(name.to_owned()));
    };
    path.push(name.to_owned());
    for target in &alias.targets {
        expand_into(cfg, target, path, seen, out)?;
    }
    path.pop();
    Ok(())
}

/// Finds one alias cycle, if any, as the list of names along it (first name repeated last).
pub fn find_alias_cycle(cfg: &FleetConfig) -> Option<Vec<String>> {
    cfg.aliases.keys().find_map(|name| match expand(cfg, name) {
        Err(ResolveError::Cycle(c)) => Some(c),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Alias, PublicModel};

    fn cfg(aliases: &[(&str, &[&str])]) -> FleetConfig {
        let mut c = FleetConfig::default();
        for m in ["small", "large"] {
            c.models.insert(m.into(), PublicModel { name: m.into(), pool: format!("{m}-pool") });
        }
        for (a, targets) in aliases {
            c.aliases.insert(
                (*a).into(),
                Alias { name: (*a).into(), targets: targets.iter().map(|t| t.to_string()).collect() },
            );
        }
        c
    }

    #[test]
    fn expands_nested_aliases_once_each() {
        let c = cfg(&[("standard-model", &["large", "cheap"]), ("cheap", &["small", "large"])]);
        assert_eq!(expand(&c, "standard-model").expect("resolves"), vec!["large", "small"]);
        assert_eq!(expand(&c, "small").expect("resolves"), vec!["small"]);
        assert_eq!(expand(&c, "nope"), Err(ResolveError::Unknown("nope".into())));
    }

    #[test]
    fn detects_cycles() {
        let c = cfg(&[("a", &["b"]), ("b", &["small", "a"])]);
        assert_eq!(expand(&c, "a"), Err(ResolveError::Cycle(vec!["a".into(), "b".into(), "a".into()])));
        assert!(find_alias_cycle(&c).is_some());
        assert!(find_alias_cycle(&cfg(&[("a", &["small"])])).is_none());
    }
}
