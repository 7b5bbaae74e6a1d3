"""Estimating the target prior: the estimators of the paper's Section 3 and the solvers behind them.

* :mod:`.base` -- the estimator interface and the batched :class:`~labelshift.estimation.base.Estimate`;
* :mod:`.estimators` -- BBSE, RLLS, MLLS and its variants, PCC (Sections 3-4);
* :mod:`.solvers` -- the batched numerical solvers they call (EM, SQUAREM, Newton, the RLLS program);
* :mod:`.registry` -- the estimators by name, as the sweeps, the flows and the CLI build them;
* :mod:`.diagnostics` -- the weight MSE of Section 6 and the Hessian's minimum eigenvalue (Section 5).
"""
