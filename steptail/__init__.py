"""steptail: per-step loss telemetry from JAX process 0 of TPU post-training JobSets."""

__version__ = "0.1.0"
