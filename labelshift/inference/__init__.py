"""Inference on an estimate of the target prior: how sure it is, and whether label shift explains the target.

* :mod:`.intervals` -- the Fisher and bootstrap intervals (Section 4.2);
* :mod:`.no_shift` -- the test of "no shift", w = 1 (Section 4.2);
* :mod:`.holdout_conditional` -- how many times the no-shift test and the source-aware interval count the holdout's
  error, so that they hold given the one holdout a model has;
* :mod:`.identifiability` -- whether the estimate can be trusted (Section 5);
* :mod:`.mlls_inputs` -- the inputs those three share (target rows, source prior, the MLLS weights checked);
* :mod:`.source_aware` -- the interval that also counts the holdout's error (calibrator and source prior);
* :mod:`.label_shift_test` -- the label-shift test (is the target the source reweighted by class?), with its
  log-odds part (:mod:`.label_shift_test.log_odds`) and the restricted-support fit used above 20 classes
  (:mod:`.label_shift_test.sparse_null`);
* :mod:`.accuracy` -- the model's expected accuracy on the target, with an interval;
* :mod:`.report` -- :func:`~labelshift.inference.report.assess_shift`, all of the above as one verdict.
"""
