//! The spoke's metrics: the shared engine ([`switchyard_gateway::metrics`]) over the spoke's
//! catalogue ([`crate::metric_names::CATALOGUE`]).

pub use switchyard_gateway::metrics::{CONTENT_TYPE, LATENCY_BUCKETS, Labels, Metrics, labels};

/// The spoke's recorded metrics, registered from its catalogue.
pub fn spoke_metrics() -> Metrics {
    Metrics::new(crate::metric_names::CATALOGUE)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metric_names::{self as m, Kind, Source};

    /// Sample lines as `name{labels}` → value, checking the exposition's structure on the
    /// way: every sample belongs to the family of the last `# TYPE` line, and no family is
    /// declared twice.
    fn samples(text: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        let mut declared: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE line has a kind");
                assert!(declared.iter().all(|(n, _)| n != name), "{name} declared twice:\n{text}");
                declared.push((name.to_owned(), kind.to_owned()));
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("sample has a value");
            let name = series.split('{').next().expect("sample has a name");
            let (family, kind) = declared.last().expect("sample follows a TYPE line");
            let ok = match kind.as_str() {
                "histogram" => [Some(""), Some("_bucket"), Some("_sum"), Some("_count")]
                    .contains(&name.strip_prefix(family.as_str())),
                _ => name == family,
            };
            assert!(ok, "{name} under `# TYPE {family} {kind}`:\n{text}");
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
            assert!(out.insert(series.to_owned(), v).is_none(), "{series} twice:\n{text}");
        }
        out
    }

    #[test]
    fn labelled_counters_accumulate() {
        let metrics = spoke_metrics();
        let chat = [("route", "chat"), ("status", "2xx")];
        metrics.inc(m::REQUESTS_TOTAL, &chat, 1.0);
        metrics.inc(m::REQUESTS_TOTAL, &chat, 2.0);
        metrics.inc(m::REQUESTS_TOTAL, &[("route", "chat"), ("status", "5xx")], 1.0);
        metrics.inc(m::PREDICTED_CACHED_TOKENS_TOTAL, &[("worker_set", "a")], 0.5);
        metrics.inc(m::PREDICTED_CACHED_TOKENS_TOTAL, &[("worker_set", "a")], -7.0);
        let text = metrics.render(&[], &[]);
        let s = samples(&text);
        assert_eq!(s[r#"switchyard_spoke_requests_total{route="chat",status="2xx"}"#], 3.0);
        assert_eq!(s[r#"switchyard_spoke_requests_total{route="chat",status="5xx"}"#], 1.0);
        assert_eq!(s[r#"switchyard_spoke_predicted_cached_tokens_total{worker_set="a"}"#], 0.5);
        assert!(text.contains("# TYPE switchyard_spoke_requests_total counter\n"), "{text}");
        assert!(!text.contains("_total_total"), "{text}");
        // Families never incremented are not exported.
        assert!(!text.contains(m::DECISIONS_TOTAL), "{text}");
    }

    #[test]
    fn concurrent_increments_are_not_lost() {
        let metrics = spoke_metrics();
        std::thread::scope(|s| {
            for t in 0..4 {
                let metrics = &metrics;
                s.spawn(move || {
                    let worker = format!("w{}", t % 2);
                    for _ in 0..1000 {
                        metrics.inc(m::DECISIONS_TOTAL, &[("worker_set", "a"), ("worker", &worker)], 1.0);
                        metrics.observe(m::DECISION_SECONDS, &[], 0.002);
                    }
                });
            }
        });
        let s = samples(&metrics.render(&[], &[]));
        assert_eq!(s[r#"switchyard_spoke_decisions_total{worker_set="a",worker="w0"}"#], 2000.0);
        assert_eq!(s[r#"switchyard_spoke_decisions_total{worker_set="a",worker="w1"}"#], 2000.0);
        assert_eq!(s["switchyard_spoke_decision_seconds_count"], 4000.0);
    }

    #[test]
    fn histograms_render_buckets_sum_and_count() {
        let metrics = spoke_metrics();
        let a = [("worker_set", "a")];
        for v in [0.000_976_562_5, 0.25, 100.0] {
            metrics.observe(m::TTFT_SECONDS, &a, v);
        }
        metrics.observe(m::DECISION_SECONDS, &[], 0.003);
        let text = metrics.render(&[], &[]);
        assert!(text.contains("# TYPE switchyard_spoke_ttft_seconds histogram\n"), "{text}");
        let s = samples(&text);
        let bucket = |le: &str| s[&format!(r#"switchyard_spoke_ttft_seconds_bucket{{worker_set="a",le="{le}"}}"#)];
        assert_eq!(bucket("0.001"), 1.0);
        assert_eq!(bucket("0.1"), 1.0);
        assert_eq!(bucket("0.25"), 2.0, "bounds are inclusive");
        assert_eq!(bucket("80"), 2.0);
        assert_eq!(bucket("+Inf"), 3.0);
        assert_eq!(s[r#"switchyard_spoke_ttft_seconds_sum{worker_set="a"}"#], 100.250_976_562_5);
        assert_eq!(s[r#"switchyard_spoke_ttft_seconds_count{worker_set="a"}"#], 3.0);
        let les: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("switchyard_spoke_ttft_seconds_bucket"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        let expected: Vec<String> = LATENCY_BUCKETS.iter().map(|b| b.to_string()).chain(["+Inf".to_owned()]).collect();
        assert_eq!(les, expected);
        assert_eq!(s[r#"switchyard_spoke_decision_seconds_bucket{le="0.001"}"#], 0.0);
        assert_eq!(s[r#"switchyard_spoke_decision_seconds_bucket{le="0.005"}"#], 1.0);
        assert_eq!(s["switchyard_spoke_decision_seconds_sum"], 0.003);
    }

    #[test]
    fn scraped_series_render_with_escaped_labels() {
        let metrics = spoke_metrics();
        metrics.inc(m::REQUESTS_TOTAL, &[("route", "chat"), ("status", "2xx")], 1.0);
        let w1 = labels(&[("worker_set", "a"), ("worker", "w\"1\\")]);
        let w2 = labels(&[("worker_set", "a"), ("worker", "w2")]);
        let counters = vec![(m::KV_BATCHES_TOTAL, w1.clone(), 7.0), (m::KV_BATCHES_TOTAL, w2.clone(), 2.0)];
        let gauges = vec![
            (m::WORKER_HEALTHY, w1.clone(), 1.0),
            (m::WORKER_HEALTHY, w2, 0.0),
            (m::KV_EVENT_LAG_SECONDS, w1, 0.25),
            (m::FIDELITY_MODE, labels(&[("worker_set", "a")]), 2.0),
        ];
        let text = metrics.render(&counters, &gauges);
        let s = samples(&text);
        assert_eq!(s[r#"switchyard_spoke_kv_event_batches_total{worker_set="a",worker="w\"1\\"}"#], 7.0);
        assert_eq!(s[r#"switchyard_spoke_kv_event_batches_total{worker_set="a",worker="w2"}"#], 2.0);
        assert_eq!(s[r#"switchyard_spoke_worker_healthy{worker_set="a",worker="w2"}"#], 0.0);
        assert_eq!(s[r#"switchyard_spoke_kv_event_lag_seconds{worker_set="a",worker="w\"1\\"}"#], 0.25);
        assert_eq!(s[r#"switchyard_spoke_fidelity_mode{worker_set="a"}"#], 2.0);
        for (name, kind) in [
            (m::REQUESTS_TOTAL, "counter"),
            (m::KV_BATCHES_TOTAL, "counter"),
            (m::WORKER_HEALTHY, "gauge"),
            (m::FIDELITY_MODE, "gauge"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}:\n{text}");
        }
        assert!(text.contains("# HELP switchyard_spoke_worker_healthy Worker health (1 healthy), per worker.\n"));
    }

    #[test]
    fn every_catalogued_name_is_exported_verbatim() {
        let metrics = spoke_metrics();
        let (mut counters, mut gauges) = (Vec::new(), Vec::new());
        for spec in m::CATALOGUE {
            match (spec.source, spec.kind) {
                (Source::Recorded, Kind::Counter) => metrics.inc(spec.name, &[("worker_set", "a")], 1.0),
                (Source::Recorded, Kind::Histogram) => metrics.observe(spec.name, &[], 0.1),
                (Source::Recorded, Kind::Gauge) => panic!("{}: recorded gauges are not supported", spec.name),
                (Source::Scraped, Kind::Counter) => counters.push((spec.name, labels(&[]), 1.0)),
                (Source::Scraped, Kind::Gauge) => gauges.push((spec.name, labels(&[]), 1.0)),
                (Source::Scraped, Kind::Histogram) => panic!("{}: scraped histograms are not supported", spec.name),
            }
        }
        let text = metrics.render(&counters, &gauges);
        let s = samples(&text);
        for spec in m::CATALOGUE {
            let kind = match spec.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            assert!(text.contains(&format!("# TYPE {} {kind}\n", spec.name)), "{}:\n{text}", spec.name);
            let sample =
                if spec.kind == Kind::Histogram { format!("{}_count", spec.name) } else { spec.name.to_owned() };
            assert!(s.keys().any(|k| k.split('{').next() == Some(sample.as_str())), "{sample}:\n{text}");
        }
    }

    #[test]
    fn unregistered_names_are_dropped() {
        let metrics = spoke_metrics();
        metrics.inc("switchyard_spoke_unknown_total", &[], 1.0);
        metrics.observe(m::REQUESTS_TOTAL, &[], 1.0);
        assert_eq!(metrics.render(&[], &[]), "");
        // A scraped series may not shadow a recorded family.
        metrics.inc(m::REQUESTS_TOTAL, &[], 1.0);
        let text = metrics.render(&[(m::REQUESTS_TOTAL, labels(&[]), 5.0)], &[]);
        assert_eq!(samples(&text)["switchyard_spoke_requests_total"], 1.0);
    }

    /// The output parses with the Python `prometheus_client` parser, when a Python with it
    /// is at `$SWITCHYARD_PYTHON` or `~/.cache/switchyard/venv-ci/bin/python`.
    #[test]
    fn parses_with_python_prometheus_client() {
        let python = std::env::var_os("SWITCHYARD_PYTHON").map(std::path::PathBuf::from).or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/switchyard/venv-ci/bin/python"))
        });
        let Some(python) = python.filter(|p| p.exists()) else {
            eprintln!("skipped: no Python with prometheus_client");
            return;
        };
        let metrics = spoke_metrics();
        metrics.inc(m::REQUESTS_TOTAL, &[("route", "chat"), ("status", "2xx")], 3.0);
        metrics.observe(m::TTFT_SECONDS, &[("worker_set", "a")], 0.3);
        let l = labels(&[("worker_set", "a"), ("worker", "w\"1\\\n")]);
        let text = metrics.render(&[(m::KV_GAPS_TOTAL, l.clone(), 4.0)], &[(m::WORKER_INFLIGHT, l, 2.0)]);
        let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
assert fams["switchyard_spoke_requests"].type == "counter", fams
s = {(x.name, tuple(sorted(x.labels.items()))): x.value for f in fams.values() for x in f.samples}
assert s[("switchyard_spoke_requests_total", (("route", "chat"), ("status", "2xx")))] == 3.0, s
w = (("worker", 'w"1\\\n'), ("worker_set", "a"))
assert s[("switchyard_spoke_kv_event_gaps_total", w)] == 4.0, s
assert s[("switchyard_spoke_worker_inflight_requests", w)] == 2.0, s
assert fams["switchyard_spoke_ttft_seconds"].type == "histogram", fams
assert s[("switchyard_spoke_ttft_seconds_bucket", (("le", "0.5"), ("worker_set", "a")))] == 1.0, s
assert s[("switchyard_spoke_ttft_seconds_count", (("worker_set", "a"),))] == 1.0, s
"#;
        let mut child = std::process::Command::new(&python)
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn python");
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(text.as_bytes()).expect("write exposition");
        }
        let status = child.wait().expect("python exits");
        assert!(status.success(), "Python parser rejected:\n{text}");
    }
}
