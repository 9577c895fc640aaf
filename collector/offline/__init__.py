"""Saved logs into the store.

- files: plain, gzip or stdin sources, read in blocks of whole lines, in time order
- ingest: the offline pipeline (parser -> run model -> detectors -> SQL and Parquet), one
  transaction per ingest
- reparse: a followed run's rows rebuilt from its raw process-0 log"""
