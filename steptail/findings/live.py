"""The live side for `follow`: one object per followed run that feeds each batch to the
engine (primed with what the store already holds), stores what it finds and publishes it.

    live = LiveFindings(store, run, alerter, settings, reference_ce)
    ...each flush:   await live.batch(batch)            # after SqlSink.write of the same batch
    ...every second: await live.tick(running=pod_is_running)
    ...on reconnect: await live.stream_gap(stream, start_ns, end_ns, reason)
    ...on failure:   await live.failure("auth_failure" | "stream_failure", reason)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from steptail.alerts import Alerter
from steptail.findings.model import Finding, Settings
from steptail.findings.store import load_engine, save_findings
from steptail.model import Batch
from storage.db import Store


class LiveFindings:
    def __init__(
        self,
        store: Store,
        run: str,
        alerter: Alerter | None = None,
        settings: Settings | None = None,
        reference_ce: dict[int, float] | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.store, self.run, self.alerter, self.clock = store, run, alerter, clock
        self.engine = load_engine(store, run, settings, reference_ce, clock=clock)
        # What the stored rows already showed is stored (idempotently) but not alerted again.
        with store.engine.begin() as conn:
            save_findings(conn, list(self.engine.findings.values()))

    async def batch(self, batch: Batch) -> list[Finding]:
        """Findings opened or grown by this batch (already stored and published)."""
        if self.alerter is not None and self.alerter.metrics is not None and batch.loss_parts:
            last = batch.loss_parts[-1]
            self.alerter.metrics.step(self.run, last[2], at_ns=self.clock())
        return await self._handle(self.engine.observe(batch))

    async def tick(self, running: bool = True) -> list[Finding]:
        return await self._handle(self.engine.tick(self.clock(), running))

    async def stream_gap(self, stream: str, start_ns: int, end_ns: int | None, reason: str) -> list[Finding]:
        return await self._handle(self.engine.observe_stream_gap(stream, start_ns, end_ns, reason))

    async def failure(self, kind: str, reason: str) -> list[Finding]:
        return await self._handle(self.engine.observe_failure(kind, reason, self.clock()))

    async def finish(self) -> list[Finding]:
        """When following ends for good (the run finished)."""
        return await self._handle(self.engine.finish())

    async def _handle(self, findings: list[Finding]) -> list[Finding]:
        if findings:
            with self.store.engine.begin() as conn:
                save_findings(conn, findings)
                if self.alerter is not None:
                    self.alerter.record(conn, findings)
            if self.alerter is not None:
                await self.alerter.publish(findings, recorded=True)
        return findings
