//! Logs and traces: the `tracing` subscriber every binary installs, with OpenTelemetry trace
//! export (OTLP over HTTP/protobuf) as an option.
//!
//! Export is on when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the exporter reads those variables itself.
//! Spans are batched on the exporter's own thread, so exporting never blocks a request; the
//! `request` span of the front door, with its id, endpoint, model and target, is the one span
//! per request. Spans carry no prompt text. [`Telemetry::shutdown`] flushes what is buffered.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Environment variables that turn OTLP export on.
const OTLP_ENDPOINT_VARS: &[&str] = &["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"];

/// The installed telemetry; flush it with [`Telemetry::shutdown`] before exiting.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("telemetry: flushing traces failed: {e}");
        }
    }
}

/// Installs the global subscriber: human-readable logs on stderr filtered by `SWITCHYARD_LOG`
/// (default `default_filter`), plus OTLP export when configured. Call it outside an async
/// runtime (the exporter's HTTP client is a blocking one, on its own thread).
pub fn init(default_filter: &str) -> Telemetry {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| default_filter.into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let configured = OTLP_ENDPOINT_VARS.iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let provider = if configured {
        match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()
        {
            Ok(exporter) => Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(opentelemetry_sdk::Resource::builder().with_service_name("switchyard").build())
                    .build(),
            ),
            Err(e) => {
                eprintln!("telemetry: OTLP export is off: {e}");
                None
            }
        }
    } else {
        None
    };
    let otel = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("switchyard")));
    tracing_subscriber::registry().with(filter).with(fmt).with(otel).init();
    Telemetry { provider }
}
