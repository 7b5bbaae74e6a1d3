"""Prefect tasks that run the paper's estimation experiments (Algorithm 1: estimate per seed, then aggregate).

A task estimates a group of settings on a chunk of seeds (see :mod:`flows.plan` for how the flow sizes them).
"""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.experiments import gaussian

__all__ = ["estimate_settings", "aggregate_sweep", "settings_run_name"]

def settings_run_name() -> str:
    """Task run name like ``shift=0.01..0.2 (5 settings) seeds 0-99`` (shown in the Prefect UI)."""
    from prefect.runtime import task_run

    params = task_run.parameters
    settings, seeds = list(params["settings"]), list(params["seeds"])
    first, last = settings[0], settings[-1]
    values = f"{first.value:g}" if len(settings) == 1 else f"{first.value:g}..{last.value:g} ({len(settings)} settings)"
    return f"{first.kind}={values} seeds {seeds[0]}-{seeds[-1]}"


@task(name="estimate", task_run_name=settings_run_name, cache_policy=NO_CACHE, persist_result=False)
def estimate_settings(settings: list, seeds: list[int], methods: list[str], *, mu: float, n_source: int,
                      base_seed: int) -> list:
    """For each setting: draw the target sets of ``seeds``, estimate w with every method, score the MSE.

    Returns one :class:`~labelshift.experiments.sweep.SettingResult` per setting.
    """
    return [gaussian.run_setting(s, seeds, methods, mu=mu, n_source=n_source, base_seed=base_seed)
            for s in settings]


@task(name="aggregate", task_run_name="aggregate-{kind}", cache_policy=NO_CACHE, persist_result=False)
def aggregate_sweep(kind: str, chunks: list) -> gaussian.SweepResult:
    """Join the seed chunks of each setting and average: mean MSE, its standard error, mean eigenvalue."""
    return gaussian.aggregate(chunks)
