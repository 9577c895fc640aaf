"""Grafana dashboards and alert rules as code (grafana-foundation-sdk), their rendering to
JSON and their provisioning through Grafana's HTTP API (dashboards.grafana_api, on aiohttp).

- queries: every SQL text (PostgreSQL, Grafana macros); macros: Grafana's expansion rules
- boards: Run, REQUIRED_RBF and Fleet dashboards; alerts: unified-alerting rules
- render: JSON on disk; provision: idempotent create-or-update in Grafana
- prometheus: Prometheus alert rules (a rules file and a PrometheusRule) over `follow`'s metrics"""
