"""`steptail archive`: every pod log of a JobSet saved before it is deleted.

- pods: the JobSet's pods and the logs each holds; job: reading them with kubectl, a few at once
- files: gzip files written whole or not at all; manifest: `manifest.json` of the folder
- ingest: process 0's archived logs into the store as the JobSet's own streams"""
