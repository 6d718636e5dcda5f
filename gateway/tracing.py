"""OpenTelemetry spans for the request path (auth, route, proxy) with W3C
`traceparent` propagated upstream so replica spans join the client's trace.

Off by default; when off, `Tracer.start` returns a shared no-op context and
costs one attribute check. Each app owns its TracerProvider (not the global
one) so tests and embedded stacks can run several apps side by side.
"""

from __future__ import annotations

import contextlib
from typing import Any

from contract.settings import TracingConfig


class Tracing:
    def __init__(self, config: TracingConfig) -> None:
        self.enabled = config.enabled
        self._tracer = None
        self._provider = None
        if not config.enabled:
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        self._propagator = TraceContextTextMapPropagator()
        self._kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
        self._set_span_in_context = set_span_in_context
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        if config.exporter == "console":
            from opentelemetry.sdk.trace.export import (
                ConsoleSpanExporter,
                SimpleSpanProcessor,
            )

            self._provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif config.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,  # extra: specgate[otlp]
            )
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint) if config.otlp_endpoint else OTLPSpanExporter()
            self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("specgate.gateway")

    def add_processor(self, processor: Any) -> None:
        """Attach a span processor (tests use an in-memory exporter)."""
        if self._provider is not None:
            self._provider.add_span_processor(processor)

    def extract(self, traceparent: bytes | None, tracestate: bytes | None = None):
        if not self.enabled or not traceparent:
            return None
        carrier = {"traceparent": traceparent.decode("latin-1")}
        if tracestate:
            carrier["tracestate"] = tracestate.decode("latin-1")
        return self._propagator.extract(carrier)

    # Spans are started and ended explicitly with explicit parent contexts
    # (no attach/detach of the current context): cheaper on the hot path and
    # correct across the awaits of a streamed response.
    def start(self, name: str, parent=None, kind: str = "internal", attributes: dict | None = None):
        return self._tracer.start_span(name, context=parent, kind=self._kinds[kind], attributes=attributes)

    def span_at(self, name: str, parent, start_ns: int, end_ns: int, attributes: dict | None = None) -> None:
        """A finished internal span from timestamps taken earlier: lets the
        request path defer span construction until its response is out."""
        span = self._tracer.start_span(name, context=parent, kind=self._kinds["internal"], attributes=attributes, start_time=start_ns)
        span.end(end_time=end_ns)

    def context_of(self, span):
        return self._set_span_in_context(span)

    def span(self, name: str, context=None, kind: str = "internal", attributes: dict | None = None):
        """Context-manager form for code off the hot path."""
        if not self.enabled:
            return contextlib.nullcontext()
        return self._tracer.start_as_current_span(name, context=context, kind=self._kinds[kind], attributes=attributes)

    def inject(self, headers: dict[str, str], context=None) -> None:
        """Add `traceparent` (and `tracestate`) of `context`'s span to upstream headers."""
        if self.enabled:
            self._propagator.inject(headers, context=context)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
