"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class Metrics:
    """Requests by endpoint and status, in progress and their latency; errors by kind; the queue, the
    batches' sizes and time; output tokens (their rate is tokens/s)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("attnkit_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.errors = Counter("attnkit_errors", "Refused or failed requests by kind", ["kind"], registry=r)
        self.queue = Gauge("attnkit_queue_length", "Requests waiting for a batch", registry=r)
        self.in_progress = Gauge(
            "attnkit_requests_in_progress", "Requests being answered", ["endpoint"], registry=r
        )
        self.batch_requests = Histogram(
            "attnkit_batch_requests", "Requests per batch", registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128)
        )
        self.batch_inputs = Histogram(
            "attnkit_batch_inputs",
            "Inputs (sentences) per batch",
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.batch_seconds = Histogram("attnkit_batch_seconds", "Time to run one batch", registry=r)
        self.output_tokens = Counter("attnkit_output_tokens", "Tokens of the outputs", registry=r)
        self.latency = Histogram("attnkit_request_seconds", "Request latency", ["endpoint"], registry=r)

    def batch(self, requests: int, inputs: int, seconds: float) -> None:
        """One batch run: its requests, inputs and time."""
        self.batch_requests.observe(requests)
        self.batch_inputs.observe(inputs)
        self.batch_seconds.observe(seconds)
