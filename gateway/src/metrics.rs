//! Prometheus metrics on the `prometheus-client` crate, for every Switchyard server.
//!
//! Each server lists what it exports in one catalogue of [`Spec`]s (the spoke's
//! `metric_names`, the hub's `metric_names`) and builds its [`Metrics`] from it. Two kinds of
//! series, both catalogued:
//!
//! - **Recorded** counters and histograms, updated on the request path through
//!   [`Metrics::inc`] and [`Metrics::observe`]. Each is a [`Family`] keyed by its label
//!   pairs, registered once in a [`Registry`] when [`Metrics`] is built; the name → family
//!   map is immutable afterwards, so an observation takes no global lock. A family
//!   finds an existing label set under an `RwLock` *read* lock (uncontended between
//!   observers); only the first observation of a new label set takes the family's write
//!   lock. A counter is then a lock-free atomic add; a histogram observation takes that one
//!   series' own mutex.
//! - **Scraped** counters and gauges (worker health, in-flight requests, index blocks, KV
//!   event counts and lag, fidelity mode), read from live state by the `/metrics` handler
//!   and passed to [`Metrics::render`], which encodes them through a scrape-local registry.
//!
//! [`Metrics::render`] writes the Prometheus text format, version 0.0.4, with
//! `prometheus-client`'s encoder (serve it as [`CONTENT_TYPE`]). Names are exported
//! exactly as written in the catalogue: counters are registered without their
//! `_total` suffix because the encoder appends it. Series never observed are not
//! exported, and families come out in catalogue order, series within a family in no
//! particular order.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic; the exported name ends in `_total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Latency buckets, sum and count.
    Histogram,
}

/// Where a metric's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Updated on the request path through `Metrics::inc` / `Metrics::observe`.
    Recorded,
    /// Read from live state at scrape time and passed to `Metrics::render`.
    Scraped,
}

/// One exported metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The exported name.
    pub name: &'static str,
    /// `# HELP` text, without the final full stop (the encoder appends one).
    pub help: &'static str,
    /// The Prometheus type.
    pub kind: Kind,
    /// Where the values come from.
    pub source: Source,
}

/// A catalogue entry (for `const` catalogues).
pub const fn spec(name: &'static str, help: &'static str, kind: Kind, source: Source) -> Spec {
    Spec { name, help, kind, source }
}

/// Upper bounds of the latency histograms, seconds (`+Inf` is implicit).
pub const LATENCY_BUCKETS: [f64; 17] =
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];

/// The `Content-Type` of [`Metrics::render`]'s output: Prometheus text, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A series' label pairs, in the order given.
pub type Labels = Vec<(String, String)>;

type CounterFamily = Family<Labels, Counter<f64, AtomicU64>>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// The recorded counters and histograms (see the module documentation).
pub struct Metrics {
    catalogue: &'static [Spec],
    registry: Registry,
    counters: HashMap<&'static str, CounterFamily>,
    histograms: HashMap<&'static str, HistogramFamily>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("counters", &self.counters.len())
            .field("histograms", &self.histograms.len())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every recorded metric of `catalogue`.
    pub fn new(catalogue: &'static [Spec]) -> Self {
        let mut registry = Registry::default();
        let mut counters = HashMap::new();
        let mut histograms = HashMap::new();
        for spec in catalogue.iter().filter(|s| s.source == Source::Recorded) {
            match spec.kind {
                Kind::Counter => {
                    let family = CounterFamily::default();
                    registry.register(counter_stem(spec.name), spec.help, family.clone());
                    counters.insert(spec.name, family);
                }
                Kind::Histogram => {
                    let family = HistogramFamily::new_with_constructor(latency_histogram);
                    registry.register(spec.name, spec.help, family.clone());
                    histograms.insert(spec.name, family);
                }
                // Nothing on the request path sets a gauge; gauges are scraped.
                Kind::Gauge => {}
            }
        }
        Self { catalogue, registry, counters, histograms }
    }

    fn help(&self, name: &str) -> &'static str {
        self.catalogue.iter().find(|s| s.name == name).map_or("Switchyard metric", |s| s.help)
    }
}

/// The label set of `pairs`, for [`Metrics::render`]'s scraped series.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The name a counter is registered under: the encoder appends `_total` itself.
fn counter_stem(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

#[cold]
fn unregistered(name: &str, what: &str) {
    tracing::warn!(metric = name, "{what} of a metric not registered as recorded in the catalogue; dropped");
}

impl Metrics {
    /// Adds `by` (finite, non-negative) to a recorded counter.
    pub fn inc(&self, name: &'static str, pairs: &[(&str, &str)], by: f64) {
        if !by.is_finite() || by < 0.0 {
            return;
        }
        match self.counters.get(name) {
            Some(family) => {
                family.get_or_create(&labels(pairs)).inc_by(by);
            }
            None => unregistered(name, "increment"),
        }
    }

    /// Records a latency in seconds into a recorded histogram.
    pub fn observe(&self, name: &'static str, pairs: &[(&str, &str)], seconds: f64) {
        match self.histograms.get(name) {
            Some(family) => family.get_or_create(&labels(pairs)).observe(seconds),
            None => unregistered(name, "observation"),
        }
    }

    /// The exposition of the recorded series, then the live `counters` and `gauges` read
    /// from state at scrape time, each as `(name, labels, value)`. A scraped counter
    /// listed twice with the same labels is summed; a gauge keeps its last value.
    pub fn render(&self, counters: &[(&'static str, Labels, f64)], gauges: &[(&'static str, Labels, f64)]) -> String {
        let mut scraped = Registry::default();
        let mut counter_families: Vec<(&str, CounterFamily)> = Vec::new();
        for (name, l, v) in counters {
            if let Some(family) = self.scraped_family(&mut scraped, &mut counter_families, name, counter_stem(name)) {
                family.get_or_create(l).inc_by(*v);
            }
        }
        let mut gauge_families: Vec<(&str, GaugeFamily)> = Vec::new();
        for (name, l, v) in gauges {
            if let Some(family) = self.scraped_family(&mut scraped, &mut gauge_families, name, name) {
                family.get_or_create(l).set(*v);
            }
        }

        let mut out = String::new();
        for registry in [&self.registry, &scraped] {
            if let Err(e) = prometheus_text::encode(&mut out, registry) {
                tracing::warn!(error = %e, "encoding metrics failed");
            }
        }
        out
    }

    /// The scrape-local family of `name`, registered (as `register_as`) on first use;
    /// `None` when a recorded family already exports that name.
    fn scraped_family<F>(
        &self,
        scraped: &mut Registry,
        families: &mut Vec<(&'static str, F)>,
        name: &'static str,
        register_as: &str,
    ) -> Option<F>
    where
        F: Default + Clone + prometheus_client::registry::Metric,
    {
        if self.counters.contains_key(name) || self.histograms.contains_key(name) {
            unregistered(name, "scraped value");
            return None;
        }
        if let Some((_, f)) = families.iter().find(|(n, _)| *n == name) {
            return Some(f.clone());
        }
        let family = F::default();
        scraped.register(register_as, self.help(name), family.clone());
        families.push((name, family.clone()));
        Some(family)
    }
}
