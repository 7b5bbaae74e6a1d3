"""How the reproduce flow cuts a sweep into estimation tasks (no servers involved)."""
from __future__ import annotations

from collections import Counter

from flows.params import ReproduceParameters
from flows.plan import TASK_WORK, experiment_settings, plan, plan_tasks


def test_every_setting_and_seed_is_estimated_exactly_once():
    p = ReproduceParameters(n_seeds=30, seeds_per_task=7)
    for experiment, tasks in plan(p).items():
        covered = Counter((s, seed) for settings, seeds in tasks for s in settings for seed in seeds)
        expected = {(s, seed) for s in experiment_settings(p, experiment) for seed in range(30)}
        assert set(covered) == expected and set(covered.values()) == {1}


def test_cheap_settings_are_packed_and_heavy_ones_stand_alone():
    p = ReproduceParameters()                       # the default sweep of `make run`
    tasks = plan(p)
    # bins: 10 settings of 100 seeds x 1000 points x 2 methods = 2M in all -> one task
    assert [len(settings) for settings, _ in tasks["bins"]] == [10]
    # size: m = 5,000 and 10,000 hold 2.5M and 5M >= TASK_WORK each: tasks of their own; the small ones share one
    size_tasks = [[s.m for s in settings] for settings, _ in tasks["size"]]
    assert size_tasks == [[100, 200, 500, 1000, 2000], [5000], [10000]]
    # groups hold consecutive settings, in order
    shift_values = [s.value for settings, _ in tasks["shift"] for s in settings]
    assert shift_values == sorted(shift_values)
    assert len(tasks["shift"]) == -(-13 * 100 * 1000 * 5 // TASK_WORK)     # ceil(6.5M / 2M) = 4


def test_one_setting_per_task_when_each_is_heavy():
    settings = experiment_settings(ReproduceParameters(target_sizes=[10000, 20000]), "size")
    assert plan_tasks(settings, [list(range(100))], 5) == [([settings[0]], list(range(100))),
                                                           ([settings[1]], list(range(100)))]


def test_fashion_mnist_fills_in_its_own_grid_and_keeps_what_is_given():
    from labelshift.experiments import images

    p = ReproduceParameters(dataset="fashion-mnist")
    assert p.is_image and p.experiments == ["alpha", "size"] and p.n_seeds == 100
    assert p.alpha_values == [0.1, 1.0, 10.0] and p.target_sizes[-1] == 10000 and p.target_size == 5000
    assert p.calibrators == ["BCTS", "TS", "VS", "NBVS"]          # BCTS first: the paper's MLLS
    # every calibration x estimator pair once, plus MLLS-CM
    pairs = {images.method_calibration(m, p.calibrators[0]) for m in p.methods}
    assert pairs == {(e, c) for e in ("BBSE-hard", "BBSE-soft", "RLLS", "MLLS") for c in images.CALIBRATIONS} | {
        ("MLLS-CM", "none")}
    assert len(p.methods) == 21 and {"BBSE-hard", "RLLS", "MLLS", "MLLS-CM"} <= set(p.methods)
    given = ReproduceParameters(dataset="fashion-mnist", alpha_values=[0.5], methods=["MLLS@TS", "MLLS"],
                                calibrators=["TS", "BCTS"])
    assert (given.alpha_values, given.methods, given.calibrators) == ([0.5], ["MLLS@TS", "MLLS"], ["TS", "BCTS"])
    assert ReproduceParameters(dataset="mnist-5k").alpha_values == [0.1, 0.3, 1.0, 3.0, 10.0]   # unchanged


def test_calibrated_methods_need_their_calibrator_and_an_image_dataset():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"calibration\(s\) \['VS'\] need them among the calibrators"):
        ReproduceParameters(dataset="fashion-mnist", methods=["MLLS@VS"], calibrators=["TS"])
    with pytest.raises(ValidationError, match="an estimator on a calibration needs an image dataset"):
        ReproduceParameters(methods=["MLLS@TS"])
    assert ReproduceParameters(dataset="digits", methods=["MLLS@none", "RLLS@BCTS"]).methods == ["MLLS@none",
                                                                                                 "RLLS@BCTS"]
