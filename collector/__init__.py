"""The collector: what reads the cluster and saved logs, and runs the live path. One room per
role, bottom to top (an import points to its own room or a lower one: tests/test_layers.py):

- notify: what the collector tells — Prometheus metrics, alerts and their webhooks, each
  source's health (one line when a failure starts and clears), the ndjson events
- offline: saved logs — files (plain, gzip, stdin), the ingest pipeline, reparse
- cluster: the Kubernetes API — kubectl subprocesses, the Python client, discovery of process 0
- live: `follow` — the follower and its watchdog, the run's sink and detectors, the
  supervisor, replica ownership, the terminal view, the wiring
- archive: `steptail archive` — every pod log of a JobSet saved before it is deleted"""
