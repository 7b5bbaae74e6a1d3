"""The label-shift test: is the target the source reweighted by class (p_t(x | y) = p_s(x | y), Garg et al.,
NeurIPS 2020, Section 2)? It tests the label-shift assumption; it does not detect a shift.

* :mod:`.goodness_of_fit` -- :func:`label_shift_test` itself (the overview and its use: that module's docstring);
* :mod:`.inputs` -- its checked inputs; :mod:`.holdout` -- the holdout's checks and :func:`prepare_holdout`, its
  part made once for many targets;
* :mod:`.regions` -- the regions of the output simplex; :mod:`.regions_fit` -- the regions part (likelihood ratio
  or Wald form, the evidence per region and per class); :mod:`.null_fit` -- its null fit and parametric bootstrap
  on the dense table, :mod:`.sparse_null` -- the same on a restricted support above DENSE_MAX_CLASSES classes,
  both by the batched SQUAREM EM of :mod:`.squarem`;
* :mod:`.log_odds` -- the log-odds part (the profiles inside each predicted class);
* :mod:`.holdout_noise` -- the holdout's own error, drawn kappa times over in both bootstraps (the test given one
  holdout);
* :mod:`.sequential` -- stopping a bootstrap early (Besag & Clifford's sequential p-value);
* :mod:`.result` -- :class:`LabelShiftTest` and its :class:`Region` items, :func:`combine_p_values`.
"""
from __future__ import annotations

from .goodness_of_fit import label_shift_test
from .holdout import (MAX_CONFIDENCE_BINS, MIN_CLASS_ROWS, MIN_HOLDOUT, MIN_REGION_ROWS, PreparedHoldout,
                      prepare_holdout)
from .holdout_noise import HOLDOUT_INFLATION
from .inputs import BOOTSTRAP_DRAWS, CALIBRATIONS, METHODS, MIN_TARGET
from .null_fit import DENSE_MAX_CLASSES
from .result import REGIONS_SHARE, LabelShiftTest, Region, combine_p_values
from .sequential import STOP_EXCEEDANCES, sequential_p_value

__all__ = ["LabelShiftTest", "Region", "label_shift_test", "PreparedHoldout", "prepare_holdout", "MIN_HOLDOUT",
           "MIN_CLASS_ROWS", "MIN_TARGET", "MIN_REGION_ROWS", "MAX_CONFIDENCE_BINS", "BOOTSTRAP_DRAWS", "CALIBRATIONS",
           "STOP_EXCEEDANCES", "sequential_p_value", "METHODS", "DENSE_MAX_CLASSES", "REGIONS_SHARE",
           "combine_p_values", "HOLDOUT_INFLATION"]
