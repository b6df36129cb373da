//! Usage records from the spokes: what their front doors served, counted once each.
//!
//! A spoke resends every record the hub has not acknowledged when its stream breaks
//! (`spoke-agent/src/usage.rs`), so the hub may receive a record twice. Records carry the
//! spoke's instance (one per process run) and a sequence increasing by one per record: the
//! hub applies a record only when its sequence is above the highest it applied for that
//! (cluster, instance), and acknowledges the highest it has — so each record counts exactly
//! once while the hub runs. Records of requests the hub forwarded (`hub_request_id` set) are
//! counted apart (`origin="hub"`) from those of the spokes' own clients (`origin="spoke"`).
//!
//! Invariants: the per-instance state is bounded ([`MAX_INSTANCES`] per cluster; the least
//! recently heard from goes first); the durable ledger (issue 15) takes records from here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard_gateway::metrics::Metrics;
use switchyard_proto::v1::UsageReport;

use crate::metric_names as m;

/// Spoke instances remembered per cluster.
pub const MAX_INSTANCES: usize = 64;

#[derive(Debug, Default)]
struct Counts {
    applied: u64,
    duplicates: u64,
}

/// Per (cluster, instance): the highest sequence applied and when the instance last reported.
type Highest = HashMap<(String, u64), (u64, Instant)>;

/// The highest sequence applied per (cluster, instance), and counts for `/status`.
#[derive(Debug, Default)]
pub struct UsageTally {
    state: Mutex<(Highest, HashMap<String, Counts>)>,
}

impl UsageTally {
    /// An empty tally.
    pub fn new() -> UsageTally {
        UsageTally::default()
    }

    /// Applies `report` from `cluster`: counts its records not applied before into
    /// `metrics` and returns the sequence to acknowledge (every record up to it is applied).
    pub fn apply(&self, cluster: &str, report: &UsageReport, metrics: &Metrics, now: Instant) -> u64 {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (highest, counts) = &mut *guard;
        let key = (cluster.to_owned(), report.instance);
        if !highest.contains_key(&key) {
            let mine: Vec<(u64, Instant)> =
                highest.iter().filter(|((c, _), _)| c == cluster).map(|((_, i), (_, at))| (*i, *at)).collect();
            if mine.len() >= MAX_INSTANCES
                && let Some((oldest, _)) = mine.iter().min_by_key(|(_, at)| *at)
            {
                highest.remove(&(cluster.to_owned(), *oldest));
            }
        }
        let entry = highest.entry(key).or_insert((0, now));
        entry.1 = now;
        let count = counts.entry(cluster.to_owned()).or_default();
        for r in &report.records {
            if r.sequence <= entry.0 {
                count.duplicates += 1;
                metrics.inc(m::USAGE_DUPLICATES_TOTAL, &[("cluster", cluster)], 1.0);
                continue;
            }
            entry.0 = r.sequence;
            count.applied += 1;
            let origin = if r.hub_request_id.is_empty() { "spoke" } else { "hub" };
            let outcome = match r.outcome.as_str() {
                "completed" | "failed" | "cancelled" => r.outcome.as_str(),
                _ => "other",
            };
            let labels = [("cluster", cluster), ("origin", origin)];
            metrics.inc(m::USAGE_RECORDS_TOTAL, &[labels[0], labels[1], ("outcome", outcome)], 1.0);
            for (kind, tokens) in
                [("prompt", r.prompt_tokens), ("cached", r.cached_tokens), ("completion", r.completion_tokens)]
            {
                metrics.inc(m::USAGE_TOKENS_TOTAL, &[labels[0], labels[1], ("kind", kind)], f64::from(tokens));
            }
        }
        entry.0
    }

    /// Records applied and duplicates skipped, per cluster.
    pub fn status(&self) -> Value {
        let guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let per: serde_json::Map<String, Value> = guard
            .1
            .iter()
            .map(|(c, n)| (c.clone(), json!({"applied": n.applied, "duplicates": n.duplicates})))
            .collect();
        Value::Object(per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::v1::UsageRecord;

    fn report(instance: u64, seqs: std::ops::RangeInclusive<u64>, hub: bool) -> UsageReport {
        UsageReport {
            instance,
            records: seqs
                .map(|sequence| UsageRecord {
                    sequence,
                    hub_request_id: if hub { format!("h{sequence}") } else { String::new() },
                    prompt_tokens: 10,
                    completion_tokens: 2,
                    outcome: "completed".into(),
                    ..UsageRecord::default()
                })
                .collect(),
        }
    }

    fn counter(metrics: &Metrics, line_start: &str) -> f64 {
        metrics
            .render(&[], &[])
            .lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    #[test]
    fn a_resent_record_counts_once_and_a_new_instance_starts_afresh() {
        let tally = UsageTally::new();
        let metrics = Metrics::new(m::CATALOGUE);
        let now = Instant::now();
        assert_eq!(tally.apply("east", &report(1, 1..=3, false), &metrics, now), 3);
        // The stream broke before the ack: the spoke resends 2..=3 with 4..=5.
        assert_eq!(tally.apply("east", &report(1, 2..=5, false), &metrics, now), 5);
        // A restarted spoke (a new instance) starts at 1 again.
        assert_eq!(tally.apply("east", &report(9, 1..=2, true), &metrics, now), 2);
        assert_eq!(
            counter(
                &metrics,
                r#"switchyard_hub_usage_records_total{cluster="east",origin="spoke",outcome="completed"}"#
            ),
            5.0
        );
        assert_eq!(
            counter(&metrics, r#"switchyard_hub_usage_records_total{cluster="east",origin="hub",outcome="completed"}"#),
            2.0
        );
        assert_eq!(
            counter(&metrics, r#"switchyard_hub_usage_tokens_total{cluster="east",origin="spoke",kind="prompt"}"#),
            50.0
        );
        assert_eq!(counter(&metrics, r#"switchyard_hub_usage_duplicates_total{cluster="east"}"#), 2.0);
        assert_eq!(tally.status()["east"], json!({"applied": 7, "duplicates": 2}));
    }

    #[test]
    fn instances_are_bounded_per_cluster_and_the_least_recent_goes() {
        let tally = UsageTally::new();
        let metrics = Metrics::new(m::CATALOGUE);
        let t0 = Instant::now();
        for i in 0..=MAX_INSTANCES as u64 {
            tally.apply("west", &report(i, 1..=1, false), &metrics, t0 + std::time::Duration::from_millis(i));
        }
        let held = tally.state.lock().map(|s| s.0.len()).unwrap_or(0);
        assert_eq!(held, MAX_INSTANCES);
        // Instance 0 was forgotten: its record would count again (the ledger dedups by id).
        assert_eq!(tally.apply("west", &report(0, 1..=1, false), &metrics, t0), 1);
        assert_eq!(tally.status()["west"]["duplicates"], json!(0));
    }
}
