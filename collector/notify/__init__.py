"""What the collector tells, headless or not.

- metrics: the Prometheus registry of `follow` and its HTTP server
- alerts: each new finding to a log line, the metrics and the webhook outbox
- webhooks: the worker that delivers the outbox (retries, backs off, never loses one)
- health: whether one source works — one line when a failure starts or clears, counted by
  kind; the back-off rule; `mask` for anything logged
- events: the dicts `follow -o ndjson` streams"""
