"""Typed parameters of the flows: each an ``Annotated`` type with its constraints and description, which validates
the CLI's options, the flow's arguments and renders the deployment's form in the Prefect UI.

The defaults are the paper's two-Gaussian experiments (Section 6, Figures 1 and 2; mu = 1, the true p_s(y|x) as
predictor, 100 seeds per setting) on the library's default grids (:mod:`labelshift.experiments.gaussian`).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from labelshift.estimation import registry
from labelshift.inference.multiplicity import CORRECTIONS, SEGMENT_CORRECTION
from labelshift.inference.segments import (MIN_SEGMENT_SIZE, PROCESS_ROWS, SEGMENT_BOUNDS, SEGMENT_PROCESSES,
                                          SegmentSettings)
from labelshift.inference.settings import BOUNDS, AssessmentSettings
from labelshift.inference.settings import DEFAULTS as ASSESSMENT
from labelshift.errors import InputError
from labelshift.experiments import gaussian, images
from runtime.environment import dask_scheduler_address

#: an estimator on one named calibration, ``<estimator>@<calibration>`` (image datasets only; the names of
#: :mod:`labelshift.experiments.images`, e.g. MLLS@VS, BBSE-soft@none)
CALIBRATED_METHODS: tuple[str, ...] = tuple(f"{e}@{c}" for e in images.CALIBRATED_ESTIMATORS
                                            for c in images.CALIBRATIONS)

Dataset = Literal["gaussian", "mnist-5k", "digits", "fashion-mnist", "mnist", "cifar10"]
Experiment = Literal["shift", "size", "bins", "alpha"]
Method = Literal[("BBSE-hard", "BBSE-soft", "RLLS", "RLLS-soft", "MLLS-CM", "MLLS", "PCC", "MLLS-uncal",
                  *CALIBRATED_METHODS)]
Calibrator = Literal["BCTS", "TS", "VS", "NBVS"]

#: the image datasets (Dirichlet-shift sweeps on a trained network's calibrated outputs)
IMAGE_DATASETS: tuple[str, ...] = ("mnist-5k", "digits", "fashion-mnist", "mnist", "cifar10")
#: experiments of the image datasets: MSE vs Dirichlet alpha, MSE vs target size m
IMAGE_EXPERIMENTS: tuple[str, ...] = ("alpha", "size")
#: methods of the image sweeps: the paper's four plus MLLS on the uncalibrated softmax
IMAGE_METHODS: tuple[str, ...] = tuple(images.METHODS)
#: target size of the image alpha sweep (paper: 5000)
IMAGE_TARGET_SIZE = 5000

EXPERIMENTS: tuple[str, ...] = ("shift", "size", "bins")
GAUSSIAN_TARGET_SIZE = 1000
#: the methods of the paper's Figure 1 (the default); RLLS-soft and PCC can be added
METHODS: tuple[str, ...] = tuple(gaussian.METHODS)
#: the bins experiment compares MLLS on a predictor binned into n equal-width bins with MLLS-CM (Figure 2)
BINS_METHODS: tuple[str, ...] = tuple(gaussian.BINS_METHODS)


def parameters_of(model: type[BaseModel], values: dict):
    """``model(**values)``, or an InputError saying what is wrong with each bad value (for runs from the UI or API)."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise InputError("; ".join(f"{'.'.join(str(part) for part in err['loc']) or 'parameters'}: {err['msg']}"
                                   for err in exc.errors())) from None


def documented(model: type[BaseModel]):
    """Decorator (under ``@flow``): the flow's docstring gets an ``Args`` section, before its ``Returns``, with the
    description of each parameter from ``model`` (Prefect shows these in a deployment's form)."""
    def decorate(fn):
        doc = inspect.cleandoc(fn.__doc__ or "")
        head, sep, tail = doc.partition("\n\nReturns:")
        args = "\n".join(f"    {name}: {field.description}" for name, field in model.model_fields.items()
                         if field.description)
        fn.__doc__ = f"{head}\n\nArgs:\n{args}{sep}{tail}"
        return fn
    return decorate


def _unique(values: list) -> list:
    if len(set(values)) != len(values):
        dup = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(f"values must be distinct, {dup} appear more than once")
    return values


def _same(given, default) -> bool:
    """A parameter value equal to a default (lists compared item by item, whatever the sequence type)."""
    if isinstance(given, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(given) == list(default)
    return given == default


def _unique_sorted(values: list) -> list:
    """Grid values: distinct, in increasing order (the curves are drawn and logged with step = index)."""
    return sorted(_unique(values))


DatasetParam = Annotated[Dataset, Field(
    description="Data set of the sweep. 'gaussian': the paper's mixture of two unit-variance Gaussians "
                "(Example 1) with the true p_s(y|x) as the predictor. 'mnist-5k', 'digits', 'fashion-mnist' "
                "(offline, pushed to the store on first use; fashion-mnist from Debian's dataset-fashion-mnist), "
                "'mnist', 'cifar10' (push them first with `labelshift data push`): a "
                "network trained on the train pool, BCTS-calibrated on the valid pool, Dirichlet-shifted target "
                "sets from the test pool. For an image dataset the Gaussian defaults of experiments, methods and "
                "target_size are replaced by alpha+size, the image methods and 5000; fashion-mnist also has its "
                "own grid (labelshift.experiments.images.SWEEP_DEFAULTS: every calibration x estimator pair, "
                "alpha 0.1/1/10, m up to 10,000).")]
ExperimentsParam = Annotated[list[Experiment], Field(
    min_length=1, description="Which experiments to run: 'shift' (MSE vs p_t(y=1) at a fixed target size), "
                              "'size' (MSE vs target size m at a fixed shift), 'bins' (MSE and the minimum "
                              "Hessian eigenvalue vs the number of calibration bins); image datasets: 'alpha' "
                              "(MSE vs Dirichlet alpha at m = target_size) and 'size' (at alpha = size_alpha)."),
    AfterValidator(_unique)]
ShiftValuesParam = Annotated[list[Annotated[float, Field(gt=0.0, lt=1.0)]], Field(
    min_length=1, description="Target class-1 proportions p_t(y=1) of the shift experiment, each in (0, 1); the "
                              "source is balanced (p_s(y=1) = 0.5)."), AfterValidator(_unique_sorted)]
TargetSizesParam = Annotated[list[Annotated[int, Field(ge=10, le=1_000_000)]], Field(
    min_length=1, description="Target sample sizes m of the size experiment (at p_t(y=1) = size_shift)."),
    AfterValidator(_unique_sorted)]
BinsValuesParam = Annotated[list[Annotated[int, Field(ge=2, le=10_000)]], Field(
    min_length=1, description="Numbers of equal-width bins the predictor is aggregated over in the bins "
                              "experiment (at m = target_size and p_t(y=1) = size_shift)."),
    AfterValidator(_unique_sorted)]
TargetSizeParam = Annotated[int, Field(
    ge=10, le=1_000_000, description="Target sample size m of the shift and bins experiments (paper: 1000).")]
SizeShiftParam = Annotated[float, Field(
    gt=0.0, lt=1.0, description="p_t(y=1) of the size and bins experiments (paper: 0.01, a severe shift).")]
NSeedsParam = Annotated[int, Field(
    ge=2, le=100_000, description="Independent draws (source and target sets) per setting; the MSE is averaged "
                                  "over them (paper: 100).")]
MethodsParam = Annotated[list[Method], Field(
    min_length=1, description="Estimators compared in the shift, size and alpha experiments; 'MLLS-uncal' (MLLS "
                              "on the raw softmax) and '<estimator>@<calibration>' (an estimator on one "
                              "calibration: none, or one of the calibrators; e.g. MLLS@VS) only for image "
                              "datasets."), AfterValidator(_unique)]
AlphaValuesParam = Annotated[list[Annotated[float, Field(gt=0.0, le=1e4)]], Field(
    min_length=1, description="Dirichlet concentrations alpha of the alpha experiment (image datasets; smaller is "
                              "more severe shift)."), AfterValidator(_unique_sorted)]
SizeAlphaParam = Annotated[float, Field(
    gt=0.0, le=1e4, description="Dirichlet alpha of the size experiment on image datasets (paper: 0.1).")]
ModelSeedsParam = Annotated[int, Field(
    ge=1, le=100, description="Networks trained per image dataset (model seeds 0..n-1); seed s of a sweep uses "
                              "model s mod n (Alexandari et al.: 10 models x 10 draws).")]
NetworkParam = Annotated[Literal["lenet", "resnet18"] | None, Field(
    description="Network trained on an image dataset: 'lenet' (Lipton et al.'s MNIST network) or 'resnet18' (the "
                "CIFAR form; use a GPU); empty = the dataset's own (labelshift.experiments.datasets.DATASETS).")]
EpochsParam = Annotated[int | None, Field(
    ge=1, le=1000, description="Training epochs; empty = the dataset's default (labelshift.experiments.training).")]
TrainLimitParam = Annotated[int | None, Field(
    ge=20, description="Train on a class-stratified subset of this many examples (smoke tests); empty = all.")]
CalibratorsParam = Annotated[list[Calibrator], Field(
    min_length=1, description="Calibrators fit on the valid logits and saved; MLLS uses the first (paper: BCTS)."),
    AfterValidator(_unique)]
GoodAccuracyParam = Annotated[float, Field(
    ge=0.0, le=1.0, description="Test accuracy from which a newly trained model gets the 'latest-good' alias in "
                                "the MLflow model registry.")]
BaseSeedParam = Annotated[int, Field(
    ge=0, description="Root of the random streams; seed i of a setting draws from (base_seed, setting, i), so "
                      "results do not depend on how seeds are split into tasks.")]
SeedsPerTaskParam = Annotated[int | None, Field(
    ge=1, description="Seeds estimated by one Prefect task. When not set: all seeds of a setting in one task (cheapest "
                      "orchestration); smaller chunks spread one setting over more workers.")]
MuParam = Annotated[float, Field(gt=0.0, le=10.0, description="Class means are -mu and +mu (paper: 1).")]
NSourceParam = Annotated[int, Field(
    ge=100, le=10_000_000, description="Labelled source examples used to fit each estimator (confusion "
                                       "matrices, bin calibration).")]
StoreParam = Annotated[str | None, Field(
    description="Object store for the result tables and figures: s3://bucket/prefix or a local folder. Empty: "
                "$LABELSHIFT_STORE, else <home>/store.")]
TrackingUriParam = Annotated[str | None, Field(
    description="MLflow tracking URI (http://host:port for a server). When not set: $MLFLOW_TRACKING_URI, else "
                "sqlite:///<home>/mlflow.db.")]
MlflowExperimentParam = Annotated[str | None, Field(
    description="MLflow experiment name. When not set: $LABELSHIFT_MLFLOW_EXPERIMENT, else 'labelshift-reproduce'.")]


class ReproduceParameters(BaseModel):
    """All parameters of the ``reproduce`` flow, validated together (the defaults are those of ``make run``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: DatasetParam = "gaussian"
    experiments: ExperimentsParam = list(EXPERIMENTS)
    shift_values: ShiftValuesParam = list(gaussian.DEFAULT_SHIFTS)
    target_sizes: TargetSizesParam = list(gaussian.DEFAULT_SIZES)
    bins_values: BinsValuesParam = list(gaussian.DEFAULT_BINS)
    target_size: TargetSizeParam = GAUSSIAN_TARGET_SIZE
    size_shift: SizeShiftParam = 0.01
    n_seeds: NSeedsParam = 100
    methods: MethodsParam = list(METHODS)
    base_seed: BaseSeedParam = 0
    seeds_per_task: SeedsPerTaskParam = None
    mu: MuParam = 1.0
    n_source: NSourceParam = 10_000
    store: StoreParam = None
    tracking_uri: TrackingUriParam = None
    mlflow_experiment: MlflowExperimentParam = None
    alpha_values: AlphaValuesParam = list(images.DEFAULT_ALPHAS)
    size_alpha: SizeAlphaParam = 0.1
    model_seeds: ModelSeedsParam = 1
    network: NetworkParam = None
    epochs: EpochsParam = None
    train_limit: TrainLimitParam = None
    calibrators: CalibratorsParam = ["BCTS"]
    good_accuracy: GoodAccuracyParam = 0.9

    @model_validator(mode="before")
    @classmethod
    def _image_defaults(cls, data):
        """For an image dataset, swap the Gaussian defaults for the image ones (a value equal to the Gaussian
        default counts as not given: the flow and its deployment form always pass every parameter)."""
        if isinstance(data, dict) and data.get("dataset") in IMAGE_DATASETS:
            data = dict(data)
            if list(data.get("experiments") or EXPERIMENTS) == list(EXPERIMENTS):
                data["experiments"] = list(IMAGE_EXPERIMENTS)
            if list(data.get("methods") or METHODS) == list(METHODS):
                data["methods"] = list(IMAGE_METHODS)
            if data.get("target_size") in (None, GAUSSIAN_TARGET_SIZE):
                data["target_size"] = IMAGE_TARGET_SIZE
            general = {"methods": list(IMAGE_METHODS)}
            for name, value in images.SWEEP_DEFAULTS.get(data["dataset"], {}).items():   # the dataset's own grid
                given = data.get(name)
                if given is None or _same(given, general.get(name, cls.model_fields[name].default)):
                    data[name] = value
        return data

    @model_validator(mode="after")
    def _fits_dataset(self) -> "ReproduceParameters":
        if self.is_image:
            bad = [e for e in self.experiments if e not in IMAGE_EXPERIMENTS]
            if bad:
                raise ValueError(f"experiments {bad} are for the 'gaussian' dataset; image datasets run "
                                 f"{', '.join(IMAGE_EXPERIMENTS)}")
            missing = sorted({m.partition("@")[2] for m in self.methods if "@" in m} - {"none", *self.calibrators})
            if missing:
                raise ValueError(f"methods on the calibration(s) {missing} need them among the calibrators "
                                 f"({', '.join(self.calibrators)}); add them to calibrators")
        else:
            if "alpha" in self.experiments:
                raise ValueError("the 'alpha' experiment (Dirichlet shift) needs an image dataset")
            if "MLLS-uncal" in self.methods:
                raise ValueError("'MLLS-uncal' needs an image dataset (the Gaussian predictor is exact)")
            paired = [m for m in self.methods if "@" in m]
            if paired:
                raise ValueError(f"{paired}: an estimator on a calibration needs an image dataset (the Gaussian "
                                 "predictor is exact)")
        return self

    @property
    def is_image(self) -> bool:
        return self.dataset in IMAGE_DATASETS

    @model_validator(mode="after")
    def _chunks_fit(self) -> "ReproduceParameters":
        if self.seeds_per_task is not None and self.seeds_per_task > self.n_seeds:
            raise ValueError(f"seeds_per_task ({self.seeds_per_task}) cannot exceed n_seeds ({self.n_seeds})")
        return self

    def seed_chunks(self) -> list[list[int]]:
        """Seeds 0..n_seeds-1 split into the chunks that the estimation tasks receive."""
        size = self.seeds_per_task or self.n_seeds
        seeds = list(range(self.n_seeds))
        return [seeds[i:i + size] for i in range(0, self.n_seeds, size)]

    def grid_values(self, experiment: str) -> list:
        """The x values of one experiment."""
        return {"shift": self.shift_values, "size": self.target_sizes, "bins": self.bins_values,
                "alpha": self.alpha_values}[experiment]

    def methods_for(self, experiment: str) -> tuple[str, ...]:
        """Estimators run in one experiment (the bins experiment has its own pair, see :data:`BINS_METHODS`)."""
        return BINS_METHODS if experiment == "bins" else tuple(self.methods)

    def as_mlflow_params(self) -> dict[str, str]:
        """Flat string parameters for the MLflow parent run."""
        out = {}
        for name, value in self.model_dump().items():
            if isinstance(value, list):
                value = ",".join(str(v) for v in value)
            out[name] = "" if value is None else str(value)
        return out


# -- the reestimate flow ---------------------------------------------------------------------------------------------
#: the registered model a re-estimation uses unless told otherwise (``reproduce --dataset mnist-5k`` registers it)
DEFAULT_MODEL = "models:/labelshift-mnist-5k@latest-good"
#: MLflow experiment of the re-estimation runs
REESTIMATE_EXPERIMENT = "reestimation"
#: type of the error :class:`ReestimateParameters` raises for an estimator without the interval it asks for
INTERVAL_ERROR = "estimator_interval"

Estimator = Literal[registry.REESTIMATION_ESTIMATORS]
Interval = Literal[registry.INTERVALS]


@dataclasses.dataclass(frozen=True)
class Logged:
    """When a ``reestimate`` parameter is an MLflow param of its run (Annotated metadata): ``"always"``, ``"given"``
    (only when set), ``"segments"`` (only with ``segment_column``) or ``"never"`` (how the run reads and writes, not
    the statistics it reports)."""

    when: Literal["always", "given", "segments", "never"] = "always"


NOT_LOGGED, LOGGED_WHEN_GIVEN, LOGGED_WITH_SEGMENTS = Logged("never"), Logged("given"), Logged("segments")

ModelParam = Annotated[str, Field(
    description="The deployed classifier in the MLflow model registry: models:/NAME@ALIAS (e.g. "
                "models:/labelshift-mnist-5k@latest-good) or models:/NAME/VERSION. Its run must hold the "
                "calibrator (calibration/<calibrator>.json) and the labelled source holdout "
                "(calibration/source_holdout.npz), as models registered by `labelshift reproduce` do.")]
TargetParam = Annotated[str | None, Field(
    description="Where the new unlabelled data arrives: s3://bucket/prefix/ or a local folder. Every *.npy or "
                "*.parquet under it is a batch: model inputs (.npy: shape (n, *input shape), float; .parquet: the "
                "model's feature columns) or, for a registered reference, the model's logged outputs (prediction "
                "logs, docs/reestimation.md)."), NOT_LOGGED]
CalibratorParam = Annotated[str, Field(
    description="Which calibrator logged beside the model to apply (BCTS, TS, VS, NBVS).")]
EstimatorParam = Annotated[Estimator, Field(
    description="Estimator of the target prior. MLLS (maximum likelihood, the paper's recommendation) or BBSE "
                "(confusion-matrix inversion; needs `interval='bootstrap'`).")]
CrossCheckParam = Annotated[list[Estimator], Field(
    description="Estimators run alongside for comparison; their priors are logged as cross_check/<method>/...")]
IntervalParam = Annotated[Interval, Field(
    description="Confidence intervals per class: 'source-aware' (MLLS sandwich that includes the error of "
                "the calibrator and p_s fit on the labelled holdout -- needs a TS, BCTS, VS or NBVS calibrator), "
                "'fisher' (Fisher information of the MLLS likelihood, target sampling error only: too short when "
                "the holdout is small next to the target) or 'bootstrap' (percentiles from resampling the target "
                "rows, target only; needed for the BBSE estimators). See docs/intervals.md.")]
LevelParam = Annotated[float, Field(**BOUNDS["level"].constraints(), description="Confidence level of the intervals, strictly between "
                                                                "0 and 1 (e.g. 0.95 for 95% intervals).")]
SignificanceParam = Annotated[float, Field(
    **BOUNDS["significance"].constraints(), description="Level of the test of 'no shift' (w = 1; a two-sample test of the mean calibrated "
                                "prediction, target against the source holdout): shifted when p < this; "
                                f"{BOUNDS['significance'].describe()}. Also the level of the label-shift test unless "
                                "`label_shift_significance` is set.")]
LabelShiftSignificanceParam = Annotated[float | None, Field(
    **BOUNDS["label_shift_significance"].constraints(), description="Level of the label-shift test alone, strictly between 0 and 1: 'Not label shift' "
                                "(no corrected outputs written) when its p-value is below this. Smaller (e.g. 0.01) "
                                "withholds the outputs of truly label-shifted data less often (on about this "
                                "fraction of such runs) and catches fewer violations (a new class, input drift). "
                                "When not set: the value of `significance`."), LOGGED_WHEN_GIVEN]
LabelShiftHoldoutInflationParam = Annotated[float, Field(
    **BOUNDS["label_shift_holdout_inflation"].constraints(),
    description="How many times over the label-shift test counts the labelled holdout's own error in its reference "
                f"law, {BOUNDS['label_shift_holdout_inflation'].describe()}: 2 (default) keeps its false 'Not label "
                "shift' calls near the level for the one holdout your model is compared with, batch after batch; 1 "
                "is the test valid only on average over holdouts, which catches violations as small as the "
                "holdout's own error (a new class at 10% of the target, with a 500-row holdout) far more often. "
                "See docs/label_shift_test.md, 'Given one holdout'.")]
NBootstrapParam = Annotated[int, Field(**BOUNDS["n_bootstrap"].constraints(), description=(
    f"Bootstrap resamples (`interval='bootstrap'`), {BOUNDS['n_bootstrap'].describe()}."))]
SeedParam = Annotated[int, Field(**BOUNDS["seed"].constraints(), description="Seed of the bootstrap.")]
TrackingParam = Annotated[str | None, Field(
    description="MLflow tracking URI; default MLFLOW_TRACKING_URI, else the local SQLite store."), NOT_LOGGED]
ExperimentParam = Annotated[str, Field(min_length=1, description="MLflow experiment of the re-estimation runs."),
                            NOT_LOGGED]
MaxWidthParam = Annotated[float | None, Field(
    **BOUNDS["max_interval_width"].constraints(), description="Threshold: the estimate is also untrustworthy when the interval on some weight w_y is wider "
                        "than this (1.0 = as wide as the whole no-shift weight). When not set: no width check.")]
OnChangedParam = Annotated[Literal["error", "reprocess"], Field(
    description="A batch already counted whose content changed under the same key: 'error' (default) fails the run "
                "naming it; 'reprocess' counts its new content in place of the old."), NOT_LOGGED]
OnInvalidParam = Annotated[Literal["quarantine", "error"], Field(
    description="A new batch that fails its checks (not a .npy array, wrong dtype or shape, NaN, corrupt): "
                "'quarantine' (default) records it in the watermark as rejected, with its reason, and goes on with "
                "the good batches (it is tried again once its content changes); 'error' fails the run, naming every "
                "bad batch, and counts nothing.")]
BatchSizeParam = Annotated[int, Field(ge=1, le=1_000_000, description="Rows per forward pass of the model."),
                           NOT_LOGGED]
RegisterCorrectedParam = Annotated[bool, Field(
    description="On a 'Shifted' verdict (trusted, label shift not rejected), register a new version of the corrected "
                "model in the MLflow registry -- the deployed model (or, for prediction logs, its outputs) with its "
                "calibrator and the estimated weights, as a pyfunc returning p_t(y|x) -- and move its alias "
                "'shift-corrected' to it. Never under any other verdict. See docs/serving.md."), NOT_LOGGED]
CorrectedModelNameParam = Annotated[str | None, Field(
    min_length=1, pattern=r"^[^/@:]+$",
    description="Registry name of the corrected model (with register_corrected). A registered model of that name "
                "must not exist yet or be one this flow made (tag labelshift.kind = shift-corrected). When not set: "
                "<deployed model's name>-shift-corrected."), NOT_LOGGED]

SegmentColumnParam = Annotated[str | None, Field(
    min_length=1,
    description="A column of the Parquet batches (prediction logs or tabular inputs) whose value names each row's "
                "segment (e.g. region): besides the pooled estimate, one estimate per segment -- verdict, interval, "
                "label-shift test, accuracy -- against the shared holdout, logged as segment.<name>.* metrics, a "
                "table and a figure. Every row needs a value; not for .npy batches. The pooled verdict alone drives "
                "the outputs, the watermark, the alerts and the corrected model. See docs/reestimation.md."),
    LOGGED_WITH_SEGMENTS]
MinSegmentSizeParam = Annotated[int, Field(
    **SEGMENT_BOUNDS["min_size"].constraints(),
    description=f"Segments with fewer rows are reported as too small (with their size) instead of assessed (with "
                f"segment_column); {SEGMENT_BOUNDS['min_size'].describe()}. See docs/reestimation.md for why 200."),
    LOGGED_WITH_SEGMENTS]
SegmentProcessesParam = Annotated[int, Field(
    **SEGMENT_BOUNDS["processes"].constraints(),
    description=f"Worker processes that assess the segments (with segment_column): 0 = automatic -- one per CPU "
                f"the run may use (at most one per segment) once the assessed segments hold {PROCESS_ROWS:,} rows "
                "in all, else none; 1 = none (each segment in its task's thread); N = N. The results are the same "
                "either way. See docs/reestimation.md."), NOT_LOGGED]
SegmentCorrectionParam = Annotated[Literal[CORRECTIONS], Field(
    description="How the segments' tests are read over the run (with segment_column): their p-values adjusted "
                "across the segments, and the adjusted values decide each segment's verdict. 'holm' (default): "
                "aims to hold the chance of any segment wrongly called Not label shift (or Shifted) in a run to the "
                "level, whatever the segments' dependence (measured with 100 segments: 10% of runs at 5%, as the "
                "label-shift test's smallest p-values are too small); 'bh' (Benjamini-Hochberg): at most that share of the "
                "flagged segments wrongly flagged, more of the failing ones found when many fail (assumes the "
                "segments' tests positively dependent); 'none': each segment at the single-test level (about 5 "
                "in 100 label-shifted segments called Not label shift by chance). See docs/reestimation.md."),
    LOGGED_WITH_SEGMENTS]


def _scheduler_address(address: str | None) -> str | None:
    """A given Dask address checked and normalized (:func:`runtime.environment.dask_scheduler_address`)."""
    return None if address is None else dask_scheduler_address(address, "dask; CLI: --dask")


DaskParam = Annotated[str | None, Field(
    description="Run the rows of this re-estimation on a Dask cluster: its scheduler's address (tcp://host:8786) "
                "or 'local' (a cluster of this machine). Each worker reads its new batches from the target itself, "
                "calibrates them and writes their corrected outputs beside them; every pass of the assessment is a "
                "map over the batches there and a sum here; the report is that of one process. For prediction logs "
                "(a registered reference) only, and a batch that fails its checks fails the run (no quarantine); "
                "segment_column and targets whose rows repeat are not supported there yet. When not set: one "
                "process, as always. See docs/operations.md."),
    AfterValidator(_scheduler_address), LOGGED_WHEN_GIVEN]


class ReestimateParameters(BaseModel):
    """All parameters of the ``reestimate`` flow, validated together: the one definition the flow's signature, the
    ``labelshift estimate`` options, the deployment's form and the run's MLflow params are built from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelParam = DEFAULT_MODEL
    target: TargetParam = None
    calibrator: CalibratorParam = "BCTS"
    estimator: EstimatorParam = ASSESSMENT.estimator
    cross_check: CrossCheckParam = list(ASSESSMENT.cross_check)
    interval: IntervalParam = ASSESSMENT.interval
    level: LevelParam = ASSESSMENT.level
    significance: SignificanceParam = ASSESSMENT.significance
    label_shift_significance: LabelShiftSignificanceParam = ASSESSMENT.label_shift_significance
    label_shift_holdout_inflation: LabelShiftHoldoutInflationParam = ASSESSMENT.label_shift_holdout_inflation
    n_bootstrap: NBootstrapParam = ASSESSMENT.n_bootstrap
    seed: SeedParam = ASSESSMENT.seed
    tracking_uri: TrackingParam = None
    mlflow_experiment: ExperimentParam = REESTIMATE_EXPERIMENT
    batch_size: BatchSizeParam = 1024
    max_interval_width: MaxWidthParam = ASSESSMENT.max_interval_width
    on_changed: OnChangedParam = "error"
    on_invalid: OnInvalidParam = "quarantine"
    register_corrected: RegisterCorrectedParam = False
    corrected_model_name: CorrectedModelNameParam = None
    segment_column: SegmentColumnParam = None
    min_segment_size: MinSegmentSizeParam = MIN_SEGMENT_SIZE
    segment_processes: SegmentProcessesParam = SEGMENT_PROCESSES
    segment_correction: SegmentCorrectionParam = SEGMENT_CORRECTION
    dask: DaskParam = None

    def assessment(self) -> AssessmentSettings:
        """The statistical settings, whole, as the domain takes them."""
        return AssessmentSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AssessmentSettings)
                                     if f.name in type(self).model_fields})

    def segments(self) -> SegmentSettings | None:
        """The segment settings, whole; None without a segment column."""
        return SegmentSettings(self.segment_column, self.min_segment_size, self.segment_processes,
                               self.segment_correction) if self.segment_column else None

    def as_mlflow_params(self) -> dict[str, object]:
        """The parameters a re-estimation run logs to MLflow, as each field's :class:`Logged` mark says."""
        out = {}
        for name, info in type(self).model_fields.items():
            when = next((m.when for m in info.metadata if isinstance(m, Logged)), "always")
            value = getattr(self, name)
            if when == "never" or (when == "given" and value is None) or (when == "segments" and
                                                                          not self.segment_column):
                continue
            out[name] = ",".join(map(str, value)) if isinstance(value, list) else value
        return out

    @model_validator(mode="after")
    def _fits_the_cluster(self) -> "ReestimateParameters":
        """Settings the cluster path cannot do yet are refused with ``dask``, naming the fix."""
        if self.dask and self.segment_column:
            raise ValueError(f"segment_column ({self.segment_column!r}) is not supported on a Dask cluster yet "
                             f"(dask={self.dask!r}); run without dask (CLI: without --dask) to get the estimates "
                             "per segment, or without segment_column on the cluster")
        return self

    @model_validator(mode="after")
    def _settings_fit_together(self) -> "ReestimateParameters":
        """The domain's settings made of these parameters, checked there (an interval the estimator cannot give)."""
        try:
            self.assessment()
        except InputError as exc:
            raise PydanticCustomError(INTERVAL_ERROR, str(exc),
                                      {"estimator": self.estimator, "interval": self.interval}) from None
        return self
