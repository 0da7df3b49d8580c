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
        self.output_tokens = Counter(
            "attnkit_output_tokens", "Tokens generated for the outputs (</s> not counted)", registry=r
        )
        self.latency = Histogram("attnkit_request_seconds", "Request latency", ["endpoint"], registry=r)
        # continuous batching (--batching continuous): what the running batches do at every step
        self.running_rows = Gauge(
            "attnkit_running_rows", "Rows decoded at a running batch's step", registry=r
        )
        self.running_sources = Gauge("attnkit_running_sources", "Inputs in the running batches", registry=r)
        self.steps = Counter(
            "attnkit_steps", "Steps of the running batches (their rate is steps/s)", registry=r
        )
        self.step_seconds = Histogram(
            "attnkit_step_seconds", "Time of one step: each running row's time per output token", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
        )  # fmt: skip
        self.first_token_seconds = Histogram(
            "attnkit_first_token_seconds",
            "Time from a request's arrival to its first output token",
            registry=r,
        )

    def iteration(
        self, rows: int, sources: int, first_tokens: list[float], seconds: float, steps: int
    ) -> None:
        """Steps of a running batch: the rows and inputs of all running batches after them, the times
        to first token of the requests that joined, their time and number (a step's time is each
        running row's time per output token)."""
        self.running_rows.set(rows)
        self.running_sources.set(sources)
        self.steps.inc(steps)
        self.step_seconds.observe(seconds / steps)
        for seconds_to_first in first_tokens:
            self.first_token_seconds.observe(seconds_to_first)

    def batch(self, requests: int, inputs: int, seconds: float) -> None:
        """One batch run: its requests, inputs and time."""
        self.batch_requests.observe(requests)
        self.batch_inputs.observe(inputs)
        self.batch_seconds.observe(seconds)
