"""The Kubernetes API, read-only.

- kubectl: kubectl reading a log (`get --raw` of pods/log) as an asyncio subprocess (argv,
  environment, stderr kinds, process groups, the bound on one line)
- kubeclient: the `kubernetes` Python client as the collector uses it
- discovery: JAX process 0 of each JobSet, by list + watch of pods (and JobSets for `--all`)"""
