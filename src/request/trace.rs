//! OpenTelemetry traces of requests (`tracing:`): one server span per traced request, a child
//! span per upstream attempt, the client's W3C `traceparent`/`tracestate` continued and passed
//! on to the upstream. Spans are exported over OTLP/HTTP by the SDK's batch processor, on its
//! own thread: the request path only ends spans into its bounded queue (a collector that is
//! down or slow drops spans, never requests).
//!
//! The provider is made once, when the server starts its services (`TraceExport`, after it
//! has daemonized: a thread made before the fork would not survive it), on a blocking thread:
//! the exporter's blocking HTTP client must be neither built nor dropped inside the async
//! runtime. Requests before that are not traced. A reload that changes `tracing` takes effect
//! at the next start.

use crate::config::model::TracingSettings;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The most spans waiting for export; past it, spans are dropped (and counted).
const QUEUE: usize = 2048;

/// The batch processor, behind a count of the spans handed to it and not yet taken for
/// export: past `QUEUE`, a span is dropped here and counted (the SDK's own queue, as large,
/// then never fills, and its drops would not be seen).
#[derive(Debug)]
struct Gated {
    inner: BatchSpanProcessor,
    waiting: Arc<AtomicUsize>,
    dropped: IntCounter,
}

impl SpanProcessor for Gated {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }
    fn on_end(&self, span: SpanData) {
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= QUEUE {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            self.dropped.inc();
            return;
        }
        self.inner.on_end(span);
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting the spans the batch processor takes from its queue.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    waiting: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.waiting.fetch_sub(batch.len(), Ordering::AcqRel);
        self.inner.export(batch)
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The process's traces: the provider (kept for the life of the process) and its tracer.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    pub hash_tenant: bool,
    sample: f64,
}

static TRACES: OnceLock<Traces> = OnceLock::new();

/// The process's traces, if `tracing` was configured at start-up.
pub fn traces() -> Option<&'static Traces> {
    TRACES.get()
}

impl Traces {
    fn make(s: &TracingSettings, dropped: IntCounter) -> Result<Traces, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", s.otlp))
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("tracing.otlp: {e}"))?;
        // a batch every 500 ms (or of 512 spans), at most `QUEUE` waiting: the rest dropped,
        // and counted
        let gate = Arc::new(AtomicUsize::new(0));
        let batch = BatchSpanProcessor::builder(Counted {
            inner: exporter,
            waiting: gate.clone(),
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_millis(500))
                .with_max_queue_size(QUEUE)
                .build(),
        )
        .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Gated {
                inner: batch,
                waiting: gate,
                dropped,
            })
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                s.sample,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(s.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "tollgate");
        Ok(Traces {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            hash_tenant: s.hash_tenant,
            sample: s.sample,
        })
    }

    /// Export what is queued (at shutdown).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }

    /// Whether a request may be traced at all: a client's traceparent says (its sampled flag);
    /// without one, any `sample` above 0 (the sampler then draws). The others cost a header
    /// lookup: no span is made, and a traceparent goes on to the upstream as it came.
    pub fn wanted(&self, headers: &http::HeaderMap) -> bool {
        match headers.get("traceparent").map(|v| v.as_bytes()) {
            // version-trace_id-parent_id-flags: the last two hex digits, bit 0 sampled
            Some(v) if v.len() == 55 => char::from(v[54]).to_digit(16).is_some_and(|d| d & 1 == 1),
            _ => self.sample > 0.0,
        }
    }

    /// Start the server span of a request, continuing the client's trace if it sent one.
    pub fn server_span(
        &self,
        method: &str,
        headers: &http::HeaderMap,
        request_id: Option<&http::HeaderValue>,
    ) -> Context {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let id = request_id.map(|id| {
            KeyValue::new(
                "tollgate.request_id",
                String::from_utf8_lossy(id.as_bytes()).into_owned(),
            )
        });
        let span = self
            .tracer
            .span_builder(method.to_string())
            .with_kind(SpanKind::Server)
            .with_attributes(id)
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span)
    }

    /// Start the span of one upstream attempt under the request's span.
    pub fn upstream_span(&self, parent: &Context, server: &str, attempt: u32) -> Context {
        let span = self
            .tracer
            .span_builder("upstream")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("server.address", server.to_string()),
                KeyValue::new("tollgate.attempt", i64::from(attempt)),
            ])
            .start_with_context(&self.tracer, parent);
        parent.with_span(span)
    }

    /// Write the span of `cx` as `traceparent` (and `tracestate`) into an upstream request.
    pub fn inject(&self, cx: &Context, set: &mut dyn FnMut(&'static str, String)) {
        self.propagator.inject_context(cx, &mut HeaderInjector(set));
    }
}

/// End the span of `cx`, marking it an error when `failed`.
pub fn end(cx: &Context, failed: Option<String>) {
    let span = cx.span();
    if let Some(why) = failed {
        span.set_status(Status::error(why));
    }
    span.end();
}

/// Whether the span of `cx` is recorded (sampled): attributes for it are worth making.
pub fn recording(cx: &Context) -> bool {
    cx.span().is_recording()
}

/// Add attributes to the span of `cx`.
pub fn set(cx: &Context, attributes: Vec<KeyValue>) {
    cx.span().set_attributes(attributes);
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut dyn FnMut(&'static str, String));

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // the propagator writes only these two
        let name = match key {
            "traceparent" => "traceparent",
            "tracestate" => "tracestate",
            _ => return,
        };
        (self.0)(name, value);
    }
}

/// A tenant as spans name it under `tenant: hash`: the first 8 bytes of its BLAKE2b, in hex.
pub fn tenant_hash(tenant: &[u8]) -> String {
    use blake2::Digest;
    let d = blake2::Blake2b512::digest(tenant);
    d.iter()
        .take(8)
        .fold(String::with_capacity(16), |mut s, b| {
            use std::fmt::Write;
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The background service that makes the process's traces and flushes them at shutdown.
pub struct TraceExport {
    pub settings: TracingSettings,
    /// `tollgate_trace_spans_dropped_total`.
    pub dropped: IntCounter,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for TraceExport {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let s = self.settings.clone();
        let dropped = self.dropped.clone();
        match tokio::task::spawn_blocking(move || Traces::make(&s, dropped)).await {
            Ok(Ok(t)) => {
                let _ = TRACES.set(t);
                log::info!("tracing: spans go to {}/v1/traces", self.settings.otlp);
            }
            Ok(Err(e)) => log::error!("tracing: {e}; requests are not traced"),
            Err(e) => log::error!("tracing: {e}; requests are not traced"),
        }
        let _ = shutdown.changed().await;
        if let Some(t) = traces() {
            let _ = tokio::task::spawn_blocking(|| t.flush()).await;
        }
    }
}
