"""Simulated TPU cluster: a Kubernetes-API-faithful HTTPS server for kubectl and the
kubernetes Python client, with a simulated MaxText/tunix trainer and scriptable faults.

See docs/simcluster.md (its last section maps the modules). Main entry points:

- :class:`steptail.simcluster.trainer.Trainer` -- pure, seeded generator of trainer output.
- :class:`steptail.simcluster.cluster.SimCluster` -- the simulator (server + cluster + faults).
- :func:`steptail.simcluster.cluster.run_in_thread` -- start one in a background thread (tests).
"""

from steptail.simcluster.trainer import EmittedStep, Trainer

__all__ = ["EmittedStep", "Trainer"]
