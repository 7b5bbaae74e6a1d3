"""The fan-out plan of the ``reproduce`` flow: the settings of each experiment and how they are cut into tasks.

Granularity. A Prefect task costs orchestration time of its own, and one setting of the two-Gaussian sweep is
small next to it (the figures: ``benchmarks/README.md``, "Flow overhead"). So a task estimates a *group* of
consecutive settings of one experiment on a *chunk of seeds*: :func:`plan_tasks` packs settings until a task holds
about :data:`TASK_WORK` target points times methods. Each seed draws from its own random stream, so neither the packing
nor the chunking changes any number.

Plain Python (no Prefect import), so the CLI can describe the plan before it starts anything.
"""
from __future__ import annotations

from flows.params import ReproduceParameters
from labelshift.experiments import gaussian, images

__all__ = ["TASK_WORK", "experiment_settings", "plan_tasks", "plan"]

#: work per estimation task, in target points x methods (2M is about 0.3 s of estimation on a 2-core machine)
TASK_WORK = 2_000_000


def experiment_settings(p: ReproduceParameters, experiment: str) -> list:
    """The settings of one experiment: its x values with the fixed target size or shift filled in (Section 6)."""
    if p.is_image:
        return images.settings_grid(experiment, p.grid_values(experiment), m=p.target_size, alpha=p.size_alpha)
    if p.dataset != "gaussian":
        raise ValueError(f"unknown dataset {p.dataset!r}")
    return gaussian.settings_grid(experiment, p.grid_values(experiment), m=p.target_size, p1=p.size_shift)


def plan_tasks(settings: list, seed_chunks: list[list[int]], n_methods: int,
               work: int = TASK_WORK) -> list[tuple[list, list[int]]]:
    """Split (settings x seed chunks) into tasks of about ``work`` target points x methods each.

    For each seed chunk, consecutive settings are packed into a task until it holds at least ``work``; a setting
    that alone holds ``work`` or more is a task of its own (settings are never split: lower ``seeds_per_task`` to
    spread a heavy setting). Returns ``(settings, seeds)`` pairs covering every (setting, seed) exactly once.
    """
    tasks = []
    for seeds in seed_chunks:
        group, acc = [], 0
        for setting in settings:
            cost = len(seeds) * setting.m * n_methods
            if cost >= work:
                if group:
                    tasks.append((group, seeds))
                    group, acc = [], 0
                tasks.append(([setting], seeds))
                continue
            group.append(setting)
            acc += cost
            if acc >= work:
                tasks.append((group, seeds))
                group, acc = [], 0
        if group:
            tasks.append((group, seeds))
    return tasks


def plan(p: ReproduceParameters) -> dict[str, list[tuple[list, list[int]]]]:
    """experiment -> its estimation tasks, as ``(settings, seeds)`` pairs."""
    return {e: plan_tasks(experiment_settings(p, e), p.seed_chunks(), len(p.methods_for(e)))
            for e in p.experiments}
