"""`steptail simcluster`: run the simulated TPU cluster in the foreground."""

from __future__ import annotations

import asyncio
import shlex

import click


@click.command("simcluster")
@click.option("--scenario", "scenario_path", type=click.Path(exists=True, dir_okay=False),
              help="YAML/JSON scenario file (docs/simcluster.md). Default: one 4-host JobSet at 1 step/s.")
@click.option("--port", type=int, default=0, show_default=True, help="0 = an ephemeral port.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--kubeconfig-out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the kubeconfig (default: in a temporary directory).")
@click.option("--chaos", "chaos_seed", type=int, default=None, metavar="SEED",
              help="Serve a random fault schedule drawn from SEED (simcluster/chaos.py) and print it, "
                   "one fault a line; the same SEED draws the same schedule. Not with --scenario.")
@click.option("--chaos-duration", type=float, default=60.0, show_default=True,
              help="With --chaos: seconds of training the schedule spans.")
def command(scenario_path: str | None, port: int, host: str, kubeconfig_out: str | None,
            chaos_seed: int | None, chaos_duration: float) -> None:
    """Run a simulated GKE cluster (Kubernetes API over HTTPS) with TPU JobSets, a simulated
    trainer in JAX process 0 and scripted faults, until interrupted (Ctrl-C)."""
    import yaml

    from steptail.commands._common import fail
    from steptail.simcluster.cluster import SimCluster
    from steptail.simcluster.scenario import Scenario

    schedule = None
    if chaos_seed is not None:
        from steptail.simcluster.chaos import draw_schedule, format_schedule, scenario_of

        if scenario_path:
            fail("--chaos draws its own scenario: give --scenario or --chaos, not both")
        schedule = draw_schedule(chaos_seed, duration=chaos_duration, database=False)  # no store here
        click.echo(format_schedule(schedule))
    try:
        if schedule is not None:
            scenario = Scenario.from_dict(scenario_of(schedule))
        else:
            scenario = Scenario.load(scenario_path) if scenario_path else Scenario.from_dict({})
    except OSError as exc:
        fail(f"cannot read scenario {scenario_path}: {exc.strerror or exc}")
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # a file that does not parse, or keys/values of the wrong shape: one line, no traceback
        detail = " ".join(str(exc).split())[:300]
        fail(f"bad scenario {scenario_path}: {detail}")

    async def main() -> None:
        sim = SimCluster(scenario, host=host, port=port, kubeconfig_out=kubeconfig_out)
        try:
            await sim.start()
        except OSError as exc:
            fail(f"cannot start the simulated cluster on {host}:{port}: {exc.strerror or exc}")
        except (TypeError, ValueError) as exc:  # e.g. a trainer value of the wrong type
            fail(f"bad scenario {scenario_path}: {' '.join(str(exc).split())[:300]}")
        ns = scenario.namespace
        js = scenario.jobsets[0].name if scenario.jobsets else "NAME"
        env = f"KUBECONFIG={shlex.quote(str(sim.kubeconfig_path))} CLOUDSDK_CORE_ACCOUNT={shlex.quote(sim.account)}"
        click.echo(f"simcluster listening on {sim.server_url}")
        click.echo(f"kubeconfig: {sim.kubeconfig_path}")
        click.echo("point kubectl at it:")
        click.echo(f"  {env} kubectl get pods -n {ns} -l jobset.sigs.k8s.io/jobset-name={js}")
        click.echo(f"  {env} kubectl logs -f --timestamps -n {ns} "
                   f"$({env} kubectl get pods -n {ns} -o name -l jobset.sigs.k8s.io/jobset-name={js},"
                   "jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0)")
        click.echo("Ctrl-C to stop.", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await sim.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
