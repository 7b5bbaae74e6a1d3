"""Experiments of Section 6 of the paper as library functions returning plain arrays and dataclasses.

* :mod:`labelshift.experiments.sweep` -- the per-setting runner (fit once, estimate all seeds as a batch, score)
  and the :class:`~labelshift.experiments.sweep.SettingResult` / :class:`~labelshift.experiments.sweep.SweepResult`
  containers, shared by every experiment;
* :mod:`labelshift.experiments.gaussian` -- the two-Gaussian experiments (Example 1, mu = 1): MSE against shift,
  target size and number of bins;
* :mod:`labelshift.experiments.images` -- the Dirichlet-shift sweeps on a trained image classifier's calibrated
  outputs: MSE against alpha and target size.
"""
from . import gaussian, images, sweep

__all__ = ["gaussian", "images", "sweep"]
