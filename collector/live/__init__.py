"""`follow`: the live path of a line, kubectl -> run model -> detectors -> sinks.

- follower: one JobSet's process 0, `kubectl logs -f`, through every fault
- watchdog: when a quiet stream is suspected of hanging, by its own pace
- sink: a run's SQL commits (retry, fence), raw log; parquet_feed: its Parquet; detect: the detectors' adapter
- supervisor: one supervised task per run; ownership: which runs this replica holds
- view: the terminal view; wiring: metrics, alerts and the supervisor put together"""
