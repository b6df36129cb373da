//! A small Prometheus registry: labelled counters and histograms recorded by the request
//! path, plus gauges read from live state at scrape time. Names live in
//! [`crate::metric_names`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];

type Key = (&'static str, String);

#[derive(Debug, Clone, Default)]
struct Hist {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Counters and histograms.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Key, f64>>,
    hists: Mutex<BTreeMap<Key, Hist>>,
}

/// Renders a label set `{a="x",b="y"}` (values escaped).
pub fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> =
        pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))).collect();
    format!("{{{}}}", inner.join(","))
}

impl Metrics {
    /// Adds to a counter.
    pub fn inc(&self, name: &'static str, pairs: &[(&str, &str)], by: f64) {
        if let Ok(mut c) = self.counters.lock() {
            *c.entry((name, labels(pairs))).or_default() += by;
        }
    }

    /// Records a latency in seconds.
    pub fn observe(&self, name: &'static str, pairs: &[(&str, &str)], seconds: f64) {
        if let Ok(mut h) = self.hists.lock() {
            let e = h
                .entry((name, labels(pairs)))
                .or_insert_with(|| Hist { counts: vec![0; LATENCY_BUCKETS.len()], ..Hist::default() });
            for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
                if seconds <= *b {
                    e.counts[i] += 1;
                }
            }
            e.sum += seconds;
            e.count += 1;
        }
    }

    /// The exposition of the recorded series, plus live `counters` and `gauges` read from
    /// state at scrape time, each as `(name, labels, value)`.
    pub fn render(&self, counters: &[(&'static str, String, f64)], gauges: &[(&'static str, String, f64)]) -> String {
        let mut out = String::new();
        let mut last = "";
        if let Ok(c) = self.counters.lock() {
            for ((name, l), v) in c.iter() {
                if *name != last {
                    let _ = writeln!(out, "# TYPE {name} counter");
                    last = name;
                }
                let _ = writeln!(out, "{name}{l} {v}");
            }
        }
        if let Ok(h) = self.hists.lock() {
            for ((name, l), hist) in h.iter() {
                if *name != last {
                    let _ = writeln!(out, "# TYPE {name} histogram");
                    last = name;
                }
                let inner = l.trim_start_matches('{').trim_end_matches('}');
                let sep = if inner.is_empty() { "" } else { "," };
                for (b, c) in LATENCY_BUCKETS.iter().zip(&hist.counts) {
                    let _ = writeln!(out, "{name}_bucket{{{inner}{sep}le=\"{b}\"}} {c}");
                }
                let _ = writeln!(out, "{name}_bucket{{{inner}{sep}le=\"+Inf\"}} {}", hist.count);
                let _ = writeln!(out, "{name}_sum{l} {}\n{name}_count{l} {}", hist.sum, hist.count);
            }
        }
        for (kind, series) in [("counter", counters), ("gauge", gauges)] {
            for (name, l, v) in series {
                if *name != last {
                    let _ = writeln!(out, "# TYPE {name} {kind}");
                    last = name;
                }
                let _ = writeln!(out, "{name}{l} {v}");
            }
        }
        out
    }
}
