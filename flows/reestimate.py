"""The ``reestimate`` flow: re-estimate the target label distribution from the batches that arrived since last time
(docs/reestimation.md). On a schedule it

1. finds the model's registered version first, whatever the target holds: a wrong model fails the run;
2. lists the target batches not yet in the watermark (:mod:`labelshift.monitoring.watermark`; a target belongs to
   the model whose runs it counts), loads the model, its calibrator and source holdout, checks every new batch
   against the model's input signature and computes calibrated probabilities f(x);
3. estimates the weights w and the target prior p_t(y) = w(y) p_s(y) with MLLS (Garg et al., NeurIPS 2020,
   eq. (mlls-sample)), BBSE alongside, with intervals, the label-shift test, the "no shift" test and the
   identifiability report; with ``segment_column``, the same per segment besides (the pooled verdict alone drives
   the steps below);
4. logs it to a child run of the MLflow experiment ``reestimation``;
5. writes corrected predictions p_t(y|x) proportional to w_y f_y(x) and a summary beside each batch, atomically --
   none under "Not label shift";
6. moves the watermark -- only now: a run that fails before leaves it, and the next run takes the same batches;
7. then, as bookkeeping that cannot fail the run: updates the monitor run's series, ends the child run FINISHED,
   and ends in a Prefect state named for the verdict (docs/operations.md) with a markdown artifact.
"""
# no `from __future__ import annotations`: Prefect builds the parameter model of a deployment's run from the
# annotations of a module it loads by file path, where string annotations naming this module's aliases would not
# resolve
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Completed

from flows.links import flow_run_info, prefect_flow_run_url
from flows.params import (BatchSizeParam, CalibratorParam, CrossCheckParam, EstimatorParam, ExperimentParam,
                          LabelShiftHoldoutInflationParam, IntervalParam, LabelShiftSignificanceParam, LevelParam,
                          MaxWidthParam, ModelParam, NBootstrapParam, OnChangedParam, OnInvalidParam,
                          ReestimateParameters, SeedParam, SignificanceParam, TargetParam, TrackingParam,
                          RegisterCorrectedParam, CorrectedModelNameParam, SegmentColumnParam, MinSegmentSizeParam,
                          SegmentProcessesParam, SegmentCorrectionParam, DaskParam, documented, parameters_of)
from flows.params import DEFAULT_MODEL  # noqa: F401 - re-exported
from flows.summary import RunSummary, headline, summary_markdown
from flows.user_errors import install as _log_user_errors_once
from labelshift.errors import InputError
from labelshift.inference.holdout import Target
from labelshift.inference.report import ShiftReport, Verdict, check_holdout
from labelshift.inference.segments import SegmentSettings, correction_record
from labelshift.inference.settings import AssessmentSettings
from labelshift.rows import joined
from labelshift.monitoring.listing import NoBatchError, find_new_batches
from labelshift.monitoring.watermark import Watermark, check_owner, commit_watermark, read_watermark
from labelshift.storage import open_store
from labelshift.storage.base import Store
from labelshift_mlflow.references import ReferenceBundle
from labelshift_mlflow.registry import ModelBundle, parse_model_uri, registered_name
from runtime import environment as settings_mod
from runtime.environment import Settings
from runtime.signals import stops_held, stops_outside
from tasks.reestimation.alerts import emit_verdict
from tasks.reestimation.assessment import estimate_shift
from tasks.reestimation.on_cluster import (calibrated_target, check_clusterable, cluster_client, cluster_target,
                                           not_partitioned_yet, write_on_cluster)
from tasks.reestimation.outputs import write_for_reestimation
from tasks.reestimation.references import load_for_reestimation
from tasks.reestimation.runs import (ReestimationRun, catch_up_monitor, end_run, history_record, log_reestimation,
                                     log_rejections, render_figure, start_reestimation_run, sync_monitor)
from tasks.reestimation.scoring import expected_batches, score_for_reestimation
from tasks.reestimation.segments import (assess_segments, check_segmentable, log_segments, read_segment_values,
                                         segment_values_of)
from tasks.reestimation.serving import check_corrected_name, register_if_shifted
from tasks.tracking import (FLOW_RUN_TAG, check_tracking_server, end_runs_of_flow_run, ended_status, git_commit_tag,
                            tracking_server_lost)

_log_user_errors_once()

__all__ = ["reestimate", "DEFAULT_MODEL", "DEFAULTS", "target_uri_for", "summary_markdown", "last_committed_sequence"]

#: the defaults of every parameter (also those of ``labelshift estimate`` and of the deployment's form)
DEFAULTS = ReestimateParameters()


def target_uri_for(target: str | None, store_uri: str) -> str:
    """The target location: as given, else ``<store>/target``."""
    return target or f"{store_uri.rstrip('/')}/target"


@dataclass
class RunContext:
    """One re-estimation run as its steps share it: the parameters and the settings made from them once, the
    resolved services, the target and its watermark as read; the model and the MLflow run once loaded/started."""

    params: ReestimateParameters
    settings: AssessmentSettings
    segments: SegmentSettings | None
    env: Settings               # the resolved services
    model_name: str             # the registered model's name (step 1)
    store: Store
    target_uri: str
    logger: logging.Logger | logging.LoggerAdapter
    started: float
    watermark: Watermark | None = None       # as read by step 2
    bundle: ModelBundle | ReferenceBundle | None = None
    mlflow: ReestimationRun | None = None

    @property
    def tracking_uri(self) -> str:
        return self.env.tracking_uri

    def seconds(self) -> float:
        return time.perf_counter() - self.started


#: the steps that read or write MLflow's store: a stop that lands inside its database driver waits for the step's
#: end (runtime/signals.py)
_talks_to_mlflow = stops_outside()

#: the sequence number of the last watermark a run in this process committed (``labelshift estimate`` says, when
#: its Prefect server is lost, whether the run had committed first)
_LAST_COMMITTED: dict[str, int | str] = {}


def last_committed_sequence() -> int | None:
    """The sequence number of the last commit of a run in this process, or None."""
    return _LAST_COMMITTED.get("sequence")


def _commit(store, watermark, batches, record, mlflow_run_id, rejected=()):
    """Move the watermark. If the commit raises after its write landed (the watermark's last entry is this run's),
    the run goes on as committed. That check reads once, without retries (the commit spent them)."""
    with stops_held():                              # the commit and its record are not cut in two
        try:
            committed = commit_watermark(store, watermark, batches, record, rejected=rejected)
        except Exception:
            try:
                current = read_watermark(store.tried_once())
            except Exception:
                current = None
            if current is None or not current.history or \
                    current.history[-1].get("mlflow_run_id") != mlflow_run_id:
                raise
            committed = current
        _LAST_COMMITTED.update(sequence=committed.sequence, mlflow_run_id=mlflow_run_id)
    return committed


def _publish(summary: RunSummary, description: str, logger) -> None:
    """The run's markdown artifact; a failure to create it is a warning, never the run's failure."""
    try:
        create_markdown_artifact(markdown=summary_markdown(summary.to_dict()), key="reestimate",
                                 description=description)
    except Exception as exc:
        warning = f"the Prefect artifact was not created ({type(exc).__name__}: {exc})"
        if summary.warnings is not None:
            summary.warnings.append(warning)
        logger.warning(warning)


# -- 1.-2. the run's context, the model's version, what is new, the model's files -------------------------------------
@_talks_to_mlflow
def _begin(p: ReestimateParameters) -> RunContext:
    """The run's context: its settings (made once) and the environment (resolved once); then step 1, whatever the
    target holds: MLflow reachable and the model's registered version found."""
    started, logger, settings = time.perf_counter(), get_run_logger(), p.assessment()
    env = settings_mod.resolve(tracking_uri=p.tracking_uri, experiment_name=p.mlflow_experiment)
    check_tracking_server(env.tracking_uri)
    model_name = registered_name(p.model, env.tracking_uri)
    target_uri = target_uri_for(p.target, env.store_uri)
    return RunContext(p, settings, p.segments(), env, model_name, open_store(target_uri), target_uri, logger,
                      started)


def _new_batches(run: RunContext) -> list:
    """Step 2: the batches not yet in the watermark (read into ``run.watermark``); an empty or missing target
    fails, its error naming the batches this model takes, and a target another model's runs count is refused."""
    p = run.params
    try:
        batches, run.watermark = find_new_batches(run.store, on_changed=p.on_changed)
    except NoBatchError as exc:         # said for this model's kind of batches, when the model loads
        raise _for_model(exc, p, run.settings, run.tracking_uri, run.store.uri, run.logger) from None
    check_owner(run.watermark, run.model_name, run.store.uri)
    if batches:
        run.logger.info("%d new batch(es) under %s: %s", len(batches), run.store.uri,
                        ", ".join(b.key for b in batches[:10]) + (" ..." if len(batches) > 10 else ""))
    return batches


@dataclass
class _Plan:
    """What step 3 checked before anything is written: the new batches, their segment values (with a segment
    column) and the corrected model's registry name (with register_corrected)."""

    batches: list
    segment_values: dict | None
    corrected_as: str | None


@_talks_to_mlflow
def _prepare(run: RunContext, batches) -> _Plan:
    """Step 2 once there is new data: the model's files, the corrected model's name and the segment column checked
    before anything is written (the MLflow run starts next, inside the block that ends it on a failure)."""
    p = run.params
    run.bundle = _load_model(p, run.settings, run.tracking_uri, run.logger)
    corrected_as = (check_corrected_name(run.tracking_uri, p.model, p.corrected_model_name)
                    if p.register_corrected else None)       # docs/serving.md
    if p.dask:                 # what the cluster path cannot do yet, refused before the MLflow run
        check_clusterable(run.bundle, run.target_uri, batches, run.settings.interval)
    return _Plan(batches, _read_segments(run, batches), corrected_as)


@contextmanager
def _ends_the_mlflow_run_on_failure(run: RunContext, *, before_commit: bool):
    """A failure or a stop inside the block ends the MLflow run (:func:`_end_failed_run`: FAILED or KILLED, FINISHED
    after the commit) and is raised again -- before the commit as a lost MLflow server's sentence when it is one."""
    try:
        yield
    except BaseException as exc:
        _end_failed_run(exc, run)
        if before_commit:
            _raise_if_mlflow_lost(exc, run.tracking_uri)
        raise


# -- 2. nothing new ---------------------------------------------------------------------------------------------------
@_talks_to_mlflow
def _no_new_data(run: RunContext) -> Completed:
    """Nothing new under the target: catch up on the MLflow bookkeeping an earlier run still owes (best effort)
    and complete as "No new data"."""
    store, watermark, logger = run.store, run.watermark, run.logger
    message = (f"No new data: all {len(watermark.processed)} batch(es) under {store.uri} were processed "
               f"(last run {watermark.sequence} at {watermark.updated_at}).")
    if watermark.rejected:
        held = sorted(watermark.rejected)
        message += (f" {len(held)} batch(es) rejected earlier are left alone until their content changes: "
                    + ", ".join(held[:10]) + (" ..." if len(held) > 10 else "")
                    + "; fix (write them again) or delete them.")
    logger.info(message)
    if watermark.history:       # best effort: bookkeeping a killed or cut-off earlier run still owes
        try:
            check_tracking_server(run.tracking_uri, timeout_s=2.0)     # never MLflow's minutes of retries
            catch_up_monitor(run.tracking_uri, run.env.experiment_name, parse_model_uri(run.params.model)[0],
                             store.uri, watermark.history)
        except Exception as exc:
            logger.warning("MLflow bookkeeping of earlier runs skipped (%s: %s); the next run tries again",
                           type(exc).__name__, exc)
    data = {"verdict": Verdict.NO_NEW_DATA, "target": store.uri, "batches": [], "sequence": watermark.sequence,
            **({"held_rejected": sorted(watermark.rejected)} if watermark.rejected else {})}
    create_markdown_artifact(markdown=summary_markdown({**data, "headline": message}), key="reestimate",
                             description="re-estimation verdict")
    return Completed(name=Verdict.NO_NEW_DATA, message=message, data=data)


# -- 2. the model and the MLflow run -----------------------------------------------------------------------------------
def _load_model(p: ReestimateParameters, settings: AssessmentSettings, tracking_uri: str, logger):
    """The model, its calibrator and source holdout; a holdout that cannot carry this re-estimation fails here."""
    bundle = load_for_reestimation(p.model, tracking_uri=tracking_uri, calibrator=p.calibrator)
    holdout = bundle.holdout
    check_holdout(holdout.labels, holdout.n_classes, interval=settings.interval, calibrator=holdout.calibrator)
    logger.info("model %s -> version %s (run %s, %s), input %s, classes %s, calibrator %s", p.model,
                bundle.version, bundle.run_id, getattr(bundle, "mode", "pytorch"), bundle.input_shape,
                ", ".join(holdout.names), p.calibrator)
    return bundle


def _for_model(exc: NoBatchError, p: ReestimateParameters, settings: AssessmentSettings, tracking_uri: str,
               target: str, logger) -> NoBatchError:
    """An empty target's error saying which batches this model takes (as it was when the model cannot load)."""
    try:
        return exc.for_model(expected_batches(_load_model(p, settings, tracking_uri, logger), target))
    except Exception as load_exc:
        logger.warning("the model could not be loaded to say which batches it takes (%s: %s)",
                       type(load_exc).__name__, load_exc)
        return exc


@_talks_to_mlflow
def _start_run(run: RunContext, n_batches: int) -> ReestimationRun:
    """The MLflow child run of this re-estimation, with the run's parameters and tags (called inside
    :func:`_ends_the_mlflow_run_on_failure`: MLflow lost as the runs are created is said as such, like any later
    loss)."""
    p, bundle = run.params, run.bundle
    sequence = run.watermark.sequence + 1
    flow_run_id, flow_run_name = flow_run_info()
    params = dict(p.as_mlflow_params(), model_version=bundle.version, target=run.store.uri, n_batches=n_batches)
    tags = {FLOW_RUN_TAG: flow_run_id or "", "prefect.flow_run_name": flow_run_name or "",
            "labelshift.sequence": str(sequence), **git_commit_tag()}
    return start_reestimation_run(run.tracking_uri, run.env.experiment_name, run.env.artifact_root,
                                  model_name=bundle.name, target_url=run.store.uri,
                                  run_name=f"reestimate-{sequence}", params=params, tags=tags,
                                  history=run.watermark.history, sequence=sequence, flow_run_id=flow_run_id)


def _raise_if_mlflow_lost(exc: BaseException, tracking_uri: str) -> None:
    """Raise the lost MLflow server's sentence in place of ``exc`` when it is one (else the caller re-raises)."""
    lost = tracking_server_lost(exc, tracking_uri)
    if lost is not None:
        raise lost from exc


def _end_failed_run(exc: BaseException, run: RunContext) -> None:
    """The MLflow run ends KILLED (cancelled) or FAILED with the cause, FINISHED when stopped right after its commit.
    A lost MLflow server is not asked again: the run stays RUNNING until the next run ends it KILLED
    (:func:`tasks.reestimation.runs.end_orphaned_runs`). Stopped while the run was being created (before its id
    came back), the runs of this flow run still RUNNING are ended KILLED by their tag."""
    if run.mlflow is None:
        if not isinstance(exc, Exception) and tracking_server_lost(exc, run.tracking_uri) is None:
            _end_unreturned_run(exc, run)
        return
    if tracking_server_lost(exc, run.tracking_uri) is not None:
        run.logger.warning("MLflow run %s is left RUNNING (its server stopped answering); the next run ends it "
                           "KILLED", run.mlflow.run_id)
        return
    committed = _LAST_COMMITTED.get("mlflow_run_id") == run.mlflow.run_id     # stopped after its commit
    status = "FINISHED" if committed else ended_status(exc)
    try:
        end_run(run.tracking_uri, run.mlflow.run_id, status, f"{type(exc).__name__}: {exc}")
    except Exception as close_exc:
        run.logger.error("could not mark MLflow run %s %s: %s", run.mlflow.run_id, status, close_exc)


def _end_unreturned_run(exc: BaseException, run: RunContext) -> None:
    """End KILLED the runs of this flow run that a stop left RUNNING before their id came back (best effort)."""
    flow_run_id, _ = flow_run_info()
    try:
        ended = end_runs_of_flow_run(run.tracking_uri, flow_run_id or "", ended_status(exc))
    except Exception as close_exc:
        run.logger.error("could not end the MLflow run of flow run %s: %s", flow_run_id, close_exc)
    else:
        if ended:
            run.logger.warning("MLflow run(s) %s ended %s (stopped as they were created)", ", ".join(ended),
                               ended_status(exc))


# -- 2. scoring (the model's calibrated probabilities) ----------------------------------------------------------------
def _score(run: RunContext, batches):
    """Calibrated probabilities of every new row and the rejected batches (all found in one pass, before any write);
    with ``on_invalid="error"`` a bad batch fails the run, naming every one."""
    p = run.params
    scored = score_for_reestimation(run.bundle, run.target_uri, batches, batch_size=p.batch_size,
                                    log_rejections=p.on_invalid != "error")
    _refuse_rejected(p, scored, len(batches))
    return scored


def _refuse_rejected(p: ReestimateParameters, scored, n_batches: int) -> None:
    """With ``on_invalid="error"``, an InputError naming every batch that failed its checks."""
    if scored.rejected and p.on_invalid == "error":
        raise InputError(
            f"{len(scored.rejected)} of {n_batches} new batch(es) failed their checks: "
            + " ".join(f"[{r.key}] {r.reason}" for r in scored.rejected)
            + " Nothing was counted. Fix or delete these batches and run again, or run with "
              "on_invalid='quarantine' (CLI: without --fail-on-invalid) to go on with the good ones.")


def _rejected(scored) -> list[dict]:
    """The rejected batches as the summary lists them (key and reason)."""
    return [{"key": r.key, "reason": r.reason} for r in scored.rejected]


@_talks_to_mlflow
def _record_no_valid_data(run: RunContext, scored) -> RunSummary:
    """No new batch passed its checks: the rejected ones listed in MLflow and recorded in the watermark; the summary."""
    rejected, store, ml = _rejected(scored), run.store, run.mlflow
    names = ", ".join(r["key"] for r in [*rejected, *scored.skipped])
    headline = (f"No valid data: none of the {len(rejected) + len(scored.skipped)} new batch(es) under {store.uri} "
                f"could be used ({names}). " + ("Rejected batches are recorded in the watermark and not tried again "
                                                "until their content changes: fix (write them again) or delete them. "
                                                if rejected else "")
                + ("Skipped batches were deleted or replaced while the run read them; the next run lists them "
                   "again." if scored.skipped else ""))
    summary = RunSummary(verdict=Verdict.NO_VALID_DATA, headline=headline.strip(),
                         sequence=run.watermark.sequence + bool(rejected), target=store.uri, batches=[],
                         mlflow=ml.summary(run.tracking_uri), rejected=rejected, skipped=scored.skipped,
                         seconds=run.seconds())
    log_rejections(run.tracking_uri, ml.run_id, rejected, summary.to_dict())
    if scored.rejected:
        record = {"model": None, "mlflow_run_id": ml.run_id}
        summary.sequence = _commit(store, run.watermark, [], record, ml.run_id, rejected=scored.rejected).sequence
    return summary


@_talks_to_mlflow
def _no_valid_data(run: RunContext, summary: RunSummary) -> Completed:
    """After :func:`_record_no_valid_data`: end the MLflow run, publish, emit the event, complete as "No valid data"."""
    ml = run.mlflow
    try:  # the rejections are recorded now: closing the MLflow run may not fail the run any more
        end_run(run.tracking_uri, ml.run_id, "FINISHED")
    except Exception as exc:
        run.logger.warning("MLflow run %s could not be marked FINISHED (%s: %s)", ml.run_id, type(exc).__name__,
                           exc)
    run.logger.warning(summary.headline)
    _publish(summary, f"re-estimation verdict: {Verdict.NO_VALID_DATA}", run.logger)
    return Completed(name=Verdict.NO_VALID_DATA, message=summary.headline,
                     data=_emit(summary, ml.flow_run_id, model=run.bundle.describe()))


def _emit(summary: RunSummary, flow_run_id, **model) -> dict:
    """The state's data, after the verdict's event (never fails the run); a warning when no alert can be delivered."""
    data = summary.to_dict()
    warning = emit_verdict(data, **model, prefect_run_url=prefect_flow_run_url(flow_run_id),
                           alerts_missed=settings_mod.alerts_missed())
    if warning:                                       # the CLI shows the run's warnings
        data["warnings"] = [*data.get("warnings", []), warning]
    return data


# -- 3.-4. the estimate, logged ---------------------------------------------------------------------------------------
def _assess(run: RunContext, scored, target: Target) -> tuple[ShiftReport, RunSummary]:
    """The estimate, its uncertainty and identifiability, and the test of label shift itself; and the summary of
    the run (its state's data and the artifact's source)."""
    bundle, ml = run.bundle, run.mlflow
    report = estimate_shift(bundle.holdout, target, run.settings)
    classes = bundle.holdout.names
    summary = RunSummary(verdict=report.verdict, headline=headline(report, classes), sequence=ml.sequence,
                         target=run.store.uri, batches=[b.key for b in scored.batches],
                         mlflow=ml.summary(run.tracking_uri), rejected=_rejected(scored),
                         skipped=scored.skipped, classes=classes, model=bundle.describe(), result=report.to_dict(),
                         prefect_flow_run_id=ml.flow_run_id,
                         time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return report, summary


def _read_segments(run: RunContext, batches) -> dict | None:
    """With a segment column: every new batch's segment values, read and checked before the MLflow run starts."""
    if run.segments is None:
        return None
    check_segmentable(batches, run.segments.column, run.store.uri)
    return read_segment_values(run.target_uri, batches, run.segments.column)


@_talks_to_mlflow
def _per_segment(run: RunContext, scored, target: Target, values, summary: RunSummary) -> None:
    """One estimate per segment besides the pooled one, into the summary and the MLflow run; the pooled estimate
    and its verdict alone drive the outputs, the watermark, the alerts and the corrected model."""
    settings = run.segments
    if values is None or settings is None:
        return
    bundle, ml = run.bundle, run.mlflow
    segments, warning = assess_segments(bundle.holdout, target, segment_values_of(values, scored), run.settings,
                                        settings)
    correction = correction_record(segments)        # how the segments' tests were read over the run
    summary.segments = {"column": settings.column, "min_size": settings.min_size,
                        **({"correction": correction} if correction else {}),
                        **({"warning": warning} if warning else {}),
                        "items": [s.to_dict() for s in segments]}
    if warning:
        run.logger.warning(warning)
    log_segments(run.tracking_uri, ml.run_id, segments, bundle.source_prior.tolist(), bundle.holdout.class_names,
                 run.settings.level, ml.sequence,
                 f"{bundle.name} v{bundle.version}: target prior per {settings.column}, run {ml.sequence}")


@_talks_to_mlflow
def _log(run: RunContext, report: ShiftReport, summary: RunSummary) -> dict:
    """The child run's metrics, tags, figure and summary; returns the watermark's record of this run."""
    bundle, ml = run.bundle, run.mlflow
    named = bundle.holdout.class_names
    record = history_record(report, ml.run_id, bundle.name, named)
    figure = render_figure(report, [*run.watermark.history, dict(record, sequence=ml.sequence)],
                           report.interval.level, f"{bundle.name} v{bundle.version}: target prior, run {ml.sequence}",
                           named)
    log_reestimation(run.tracking_uri, ml, report, summary.to_dict(), figure, class_names=named)
    log_rejections(run.tracking_uri, ml.run_id, summary.rejected)
    return record


# -- 5. outputs -------------------------------------------------------------------------------------------------------
def _write_outputs(run: RunContext, report: ShiftReport, summary: RunSummary, scored) -> None:
    """Corrected predictions beside each batch, atomically -- none when the data are not label-shifted (the weights
    mean nothing), and the summary says why."""
    if not _withheld(report, summary):
        summary.outputs = write_for_reestimation(run.bundle, run.target_uri, scored.batches, scored.probs,
                                                 report.weights.tolist(), summary.to_dict(), scored.ids or None)


def _withheld(report: ShiftReport, summary: RunSummary) -> bool:
    """Under "Not label shift" no corrected outputs are written (the weights mean nothing): the summary says why, and
    True; else False."""
    if report.verdict != Verdict.NOT_LABEL_SHIFT:
        return False
    summary.outputs = []
    summary.outputs_withheld = (
        "the label-shift test rejected the assumption the correction rests on. The batches are counted in "
        "the watermark (they were examined); after fixing the cause, write the fixed batches under new "
        "names, or rewrite them and run with on_changed='reprocess' (CLI: --reprocess-changed).")
    return True


# -- 7. bookkeeping after the commit -----------------------------------------------------------------------------------
@_talks_to_mlflow
def _after_commit(run: RunContext, summary: RunSummary, committed) -> None:
    """The batches are counted now: a failure in this bookkeeping must not fail the run (its retry would find no new
    data); it becomes a warning of the summary, and the next run adds a missed point of the monitor's series."""
    summary.warnings = []
    ml = run.mlflow
    lost = None
    try:
        sync_monitor(run.tracking_uri, ml.monitor_run_id, committed.history, run.bundle.name)
    except Exception as exc:
        summary.warnings.append(f"the monitor run's series was not updated ({type(exc).__name__}: {exc}); the "
                                "next run with new data adds the missing point")
        lost = tracking_server_lost(exc, run.tracking_uri)
    if lost is not None:              # not asked again (a frozen server would take as long once more)
        summary.warnings.append(f"MLflow run {ml.run_id} is left RUNNING (its server stopped answering, see "
                                "above; not asked again); the next run ends it FINISHED")
        return _warn(run, summary)
    try:
        end_run(run.tracking_uri, ml.run_id, "FINISHED")
    except Exception as exc:
        summary.warnings.append(f"MLflow run {ml.run_id} could not be marked FINISHED ({type(exc).__name__}: {exc})")
    _warn(run, summary)


def _warn(run: RunContext, summary: RunSummary) -> None:
    for warning in summary.warnings:
        run.logger.warning(warning)


def _complete(run: RunContext, summary: RunSummary) -> Completed:
    """The final state, named for the verdict, with the summary as its data and the markdown artifact."""
    ml = run.mlflow
    summary.seconds = run.seconds()
    summary.links = {"MLflow run": summary.mlflow["ui"] or f"run {ml.run_id} in experiment "
                                                           f"'{run.env.experiment_name}'",
                     "watermark": run.store.url("_labelshift/watermark.json"),
                     **({"corrected model": summary.corrected_model["version_uri"]}
                        if summary.corrected_model else {})}
    word = summary.verdict
    _publish(summary, f"re-estimation verdict: {word}", run.logger)
    data = _emit(summary, ml.flow_run_id)
    run.logger.info("%s -- %s", word, summary.headline)
    return Completed(name=word, message=summary.headline, data=data)


@dataclass
class _Outcome:
    """What steps 2-6 left: the run's summary and the watermark as committed (None: no batch could be used, the
    summary is "No valid data")."""

    summary: RunSummary
    committed: Watermark | None = None


@_talks_to_mlflow
def _register(run: RunContext, report: ShiftReport, summary: RunSummary, plan: _Plan) -> None:
    """With a corrected model's name: the corrected model registered when the data are shifted (into the summary)."""
    if plan.corrected_as:
        ml = run.mlflow
        summary.corrected_model = register_if_shifted(run.bundle, report, tracking_uri=run.tracking_uri,
                                                      name=plan.corrected_as, run_id=ml.run_id, target=run.store.uri,
                                                      sequence=ml.sequence)


def _assess_and_commit(run: RunContext, plan: _Plan) -> _Outcome:
    """Steps 2 (scoring) to 6 inside the MLflow run: score, assess (pooled and per segment), log, write the outputs,
    register the corrected model, commit the watermark; "No valid data" when no batch could be used."""
    if run.params.dask:
        return _assess_and_commit_on_cluster(run, plan)
    scored = _score(run, plan.batches)
    if not scored.batches:
        return _Outcome(_record_no_valid_data(run, scored))
    target = Target(joined(scored.probs), joined(scored.outputs) if scored.outputs else None)   # pooled once
    report, summary = _assess(run, scored, target)
    _per_segment(run, scored, target, plan.segment_values, summary)      # never the pooled verdict
    record = _log(run, report, summary)
    _write_outputs(run, report, summary, scored)
    _register(run, report, summary, plan)      # before the commit: a failed registration leaves the watermark
    return _Outcome(summary, _commit(run.store, run.watermark, scored.batches, record, run.mlflow.run_id,
                                     rejected=scored.rejected))


def _assess_and_commit_on_cluster(run: RunContext, plan: _Plan) -> _Outcome:
    """Steps 2-6 with the rows on the Dask cluster of ``run.params.dask`` (:mod:`tasks.reestimation.on_cluster`):
    the workers read, check and calibrate the batches and write their corrected outputs; here the same assessment
    (each pass a map over the batches there), the logging, the corrected model and one commit once every batch
    succeeded. A batch that fails its checks is quarantined (rejected in the watermark) or, with
    ``on_invalid="error"``, fails the run naming it, as in one process; nothing is committed on any failure."""
    p, ml = run.params, run.mlflow
    with cluster_client(p.dask) as client:
        run.logger.info("rows on the Dask cluster at %s: %d batch(es) read by its workers", p.dask, len(plan.batches))
        rows, scored = cluster_target(client, run.bundle, run.store, plan.batches, run.logger,
                                      log_rejections=p.on_invalid != "error")
        _refuse_rejected(p, scored, len(plan.batches))
        if rows is None:
            return _Outcome(_record_no_valid_data(run, scored))
        target = calibrated_target(rows, run.bundle)
        with not_partitioned_yet():
            report, summary = _assess(run, scored, target)
        record = _log(run, report, summary)
        if not _withheld(report, summary):
            summary.outputs = write_on_cluster(target, run.bundle, run.store.uri, scored.batches,
                                               report.weights.tolist(), summary.to_dict())
    _register(run, report, summary, plan)
    return _Outcome(summary, _commit(run.store, run.watermark, scored.batches, record, ml.run_id,
                                     rejected=scored.rejected))


@flow(name="reestimate", log_prints=False)
@documented(ReestimateParameters)
def reestimate(
    model: ModelParam = DEFAULTS.model,
    target: TargetParam = DEFAULTS.target,
    calibrator: CalibratorParam = DEFAULTS.calibrator,
    estimator: EstimatorParam = DEFAULTS.estimator,
    cross_check: CrossCheckParam = DEFAULTS.cross_check,
    interval: IntervalParam = DEFAULTS.interval,
    level: LevelParam = DEFAULTS.level,
    significance: SignificanceParam = DEFAULTS.significance,
    label_shift_significance: LabelShiftSignificanceParam = DEFAULTS.label_shift_significance,
    label_shift_holdout_inflation: LabelShiftHoldoutInflationParam = DEFAULTS.label_shift_holdout_inflation,
    n_bootstrap: NBootstrapParam = DEFAULTS.n_bootstrap,
    seed: SeedParam = DEFAULTS.seed,
    tracking_uri: TrackingParam = DEFAULTS.tracking_uri,
    mlflow_experiment: ExperimentParam = DEFAULTS.mlflow_experiment,
    batch_size: BatchSizeParam = DEFAULTS.batch_size,
    max_interval_width: MaxWidthParam = DEFAULTS.max_interval_width,
    on_changed: OnChangedParam = DEFAULTS.on_changed,
    on_invalid: OnInvalidParam = DEFAULTS.on_invalid,
    register_corrected: RegisterCorrectedParam = DEFAULTS.register_corrected,
    corrected_model_name: CorrectedModelNameParam = DEFAULTS.corrected_model_name,
    segment_column: SegmentColumnParam = DEFAULTS.segment_column,
    min_segment_size: MinSegmentSizeParam = DEFAULTS.min_segment_size,
    segment_processes: SegmentProcessesParam = DEFAULTS.segment_processes,
    segment_correction: SegmentCorrectionParam = DEFAULTS.segment_correction,
    dask: DaskParam = DEFAULTS.dask,
):
    """Re-estimate the target label distribution from the target batches that arrived since the last success.

    Returns (as the data of its final state) the summary dict (:class:`flows.summary.RunSummary`): verdict, model,
    target, batches, sequence, the estimate with intervals, test and identifiability, the MLflow ids and the output
    locations.
    """
    run = _begin(parameters_of(ReestimateParameters, {k: v for k, v in locals().items()
                                                      if k in ReestimateParameters.model_fields}))
    batches = _new_batches(run)                                     # 2. what is new for this model
    if not batches:
        return _no_new_data(run)
    plan = _prepare(run, batches)                                   # 2. its files and checks
    with _ends_the_mlflow_run_on_failure(run, before_commit=True):
        run.mlflow = _start_run(run, len(plan.batches))             # 2. the MLflow run
        outcome = _assess_and_commit(run, plan)                     # 2.-6. score ... move the watermark
    if outcome.committed is None:
        return _no_valid_data(run, outcome.summary)
    with _ends_the_mlflow_run_on_failure(run, before_commit=False):
        _after_commit(run, outcome.summary, outcome.committed)      # 7. bookkeeping that cannot fail the run
    return _complete(run, outcome.summary)
