"""Simulated TPU cluster: a Kubernetes-API-faithful HTTPS server for kubectl and the
kubernetes Python client, with a simulated MaxText/tunix trainer and scriptable faults.

See docs/simcluster.md. Main entry points:

- :class:`collector.sim.trainer.Trainer` -- pure, seeded generator of trainer output.
- :class:`collector.sim.cluster.SimCluster` -- the simulator (server + cluster + faults).
- :func:`collector.sim.cluster.run_in_thread` -- start one in a background thread (tests).
"""

from collector.sim.trainer import EmittedStep, Trainer

__all__ = ["EmittedStep", "Trainer"]
