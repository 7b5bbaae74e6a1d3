"""The ``reestimate`` flow: re-estimate the target label distribution from the batches that arrived since last time.

The operator's side of the system. A deployed classifier, registered in MLflow with its calibrator,
meets new unlabelled data in object storage; on a schedule this flow

1. lists the target batches (``*.npy`` or ``*.parquet`` under ``target``: model inputs, or, for a registered
   reference, the model's logged outputs; :mod:`labelshift.monitoring.batches`, :mod:`tasks.references`) that are not
   yet in the watermark (``<target>/_labelshift/watermark.json``, :mod:`labelshift.monitoring.watermark`);
2. loads the model version and its calibrator and source holdout from the registry
   (:func:`tasks.reestimation.load_bundle`), checks every new batch against the model's input signature, and
   computes calibrated probabilities f(x);
3. estimates the importance weights w and the target prior p_t(y) = w(y) p_s(y) on the pooled new rows with MLLS
   (Garg et al., NeurIPS 2020, eq. (mlls-sample)) -- BBSE alongside as a cross-check -- with a confidence
   interval per class (by default source-aware: it includes the error of the calibrator and p_s fit on the labelled
   holdout; the target-only Fisher interval or a bootstrap by name), a test of the label-shift assumption itself
   (:mod:`labelshift.inference.shift_detection`), a two-sample test of "no shift" (w = 1: the mean calibrated prediction
   on the new data against the source holdout's) and the identifiability report (Hessian minimum eigenvalue,
   confusion-matrix conditioning; :mod:`labelshift.inference.uncertainty`); with ``segment_column``, the same on
   each segment's rows besides (``assess-segment`` tasks, :mod:`tasks.segments`; the column is read and checked
   before the MLflow run starts) -- the pooled estimate and its verdict alone drive the steps below;
4. logs to MLflow (experiment ``reestimation``): a child run per re-estimation with the prior, the interval, the
   p-value, the identifiability numbers and a figure;
5. writes corrected predictions p_t(y|x) proportional to w_y f_y(x) beside each batch (``NAME.corrected.npy``),
   then a summary (``NAME.summary.json``), each atomically -- except under "Not label shift", when the weights mean
   nothing and no outputs are written;
6. moves the watermark -- only now, after all of the above succeeded: a run that fails anywhere before leaves it
   as it was and the next run takes the same batches again (their outputs are rewritten, never counted twice);
7. then, as bookkeeping that cannot fail the run any more: brings the series of the monitor run (whose metrics
   chart the prior over time, one point per successful run) up to date from the watermark's history, ends the
   child run FINISHED, and ends in a Prefect state named for the verdict (what each means and their order:
   ``docs/operations.md``) with a markdown artifact that says it at a glance.

Run it once with ``labelshift estimate --model models:/NAME@ALIAS --target s3://bucket/prefix/``; schedule it
with ``labelshift serve --cron "0 6 * * *"`` or the ``reestimate`` deployment of ``prefect.yaml``.
"""
# no `from __future__ import annotations`: Prefect builds the parameter model of a deployment's run from the
# annotations of a module it loads by file path, where string annotations naming this module's aliases would not
# resolve
import time

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Completed

from flows.links import flow_run_info, prefect_flow_run_url
from flows.params import (BatchSizeParam, CalibratorParam, CrossCheckParam, EstimatorParam, ExperimentParam,
                          IntervalParam, LabelShiftSignificanceParam, LevelParam, MaxWidthParam, ModelParam,
                          NBootstrapParam, OnChangedParam, OnInvalidParam, ReestimateParameters, SeedParam,
                          SignificanceParam, TargetParam, TrackingParam, RegisterCorrectedParam,
                          CorrectedModelNameParam, SegmentColumnParam, MinSegmentSizeParam, SegmentProcessesParam,
                          SegmentCorrectionParam, documented)
from flows.params import DEFAULT_MODEL  # noqa: F401 - re-exported
from flows.summary import headline as _headline
from flows.summary import summary_markdown
from flows.user_errors import install as _log_user_errors_once
from labelshift.errors import InputError
from labelshift.estimation.registry import check_interval
from labelshift.inference.report import ShiftReport, Verdict, check_holdout
from labelshift.inference.segments import correction_record
from labelshift.rows import joined
from labelshift.monitoring.listing import find_new_batches
from labelshift.monitoring.watermark import commit_watermark, read_watermark
from labelshift.storage import open_store
from runtime import environment as settings_mod
from tasks.reestimation import (catch_up_monitor, end_run, estimate_shift, history_record, log_reestimation,
                                log_rejections, parse_model_uri, render_figure, start_reestimation_run,
                                sync_monitor)
from tasks.alerts import emit_verdict
from tasks.references import class_names_of, load_for_reestimation, score_for_reestimation, write_for_reestimation
from tasks.segments import assess_segments, check_segmentable, log_segments, read_segment_values, segment_values_of
from tasks.serving import check_corrected_name, register_if_shifted
from tasks.tracking import check_tracking_server, git_commit, run_url

_log_user_errors_once()

__all__ = ["reestimate", "DEFAULT_MODEL", "DEFAULTS", "target_uri_for", "summary_markdown"]

#: the defaults of every parameter (also those of ``labelshift estimate`` and of the deployment's form)
DEFAULTS = ReestimateParameters()


def target_uri_for(target: str | None, store_uri: str) -> str:
    """The target location: as given, else ``<store>/target``."""
    if target:
        return target
    return f"{store_uri.rstrip('/')}/target"


def _commit(store, watermark, batches, record, mlflow_run_id, rejected=()):
    """Move the watermark. If the commit raises after its write landed (e.g. the store failed while it read the
    watermark back), the batches are counted all the same: then the watermark's last entry is this run's, and the run
    goes on as committed instead of failing with its batches counted."""
    try:
        return commit_watermark(store, watermark, batches, record, rejected=rejected)
    except Exception:
        try:
            current = read_watermark(store)
        except Exception:
            current = None
        if current is not None and current.history and \
                current.history[-1].get("mlflow_run_id") == mlflow_run_id:
            return current
        raise


def _publish(summary: dict, description: str, logger) -> None:
    """The run's markdown artifact; a failure to create it is a warning, never the run's failure."""
    try:
        create_markdown_artifact(markdown=summary_markdown(summary), key="reestimate", description=description)
    except Exception as exc:
        warning = f"the Prefect artifact was not created ({type(exc).__name__}: {exc})"
        if "warnings" in summary:
            summary["warnings"].append(warning)
        logger.warning(warning)


# -- 1. what is new -------------------------------------------------------------------------------------------------
def _no_new_data(store, watermark, p: ReestimateParameters, env, logger) -> Completed:
    """Nothing new under the target: catch up on the MLflow bookkeeping an earlier run still owes (best effort)
    and complete as "No new data"."""
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
            check_tracking_server(env.tracking_uri, timeout_s=2.0)     # never MLflow's minutes of retries
            catch_up_monitor(env.tracking_uri, env.experiment_name, parse_model_uri(p.model)[0], store.uri,
                             watermark.history)
        except Exception as exc:
            logger.warning("MLflow bookkeeping of earlier runs skipped (%s: %s); the next run tries again",
                           type(exc).__name__, exc)
    data = {"verdict": Verdict.NO_NEW_DATA, "target": store.uri, "batches": [], "sequence": watermark.sequence}
    create_markdown_artifact(markdown=summary_markdown({**data, "headline": message}), key="reestimate",
                             description="re-estimation verdict")
    return Completed(name=Verdict.NO_NEW_DATA, message=message, data=data)


# -- 2. the model and the MLflow run -----------------------------------------------------------------------------------
def _load_model(p: ReestimateParameters, env, logger):
    """The model, its calibrator and source holdout from the registry, with its class names; a holdout that cannot
    carry this re-estimation fails here, before anything is written."""
    bundle = load_for_reestimation(p.model, tracking_uri=env.tracking_uri, calibrator=p.calibrator)
    classes = class_names_of(bundle)
    check_holdout(bundle.source_labels, bundle.n_classes, interval=p.interval, calibrator=bundle.calibrator)
    logger.info("model %s -> version %s (run %s, %s), input %s, classes %s, calibrator %s", p.model, bundle.version,
                bundle.run_id, getattr(bundle, "mode", "pytorch"), bundle.input_shape, ", ".join(classes),
                p.calibrator)
    return bundle, classes


def _start_run(p: ReestimateParameters, env, store, bundle, watermark, n_batches: int) -> dict:
    """The MLflow child run of this re-estimation, with the run's parameters and tags (its ids, and the run's
    ``sequence`` and ``flow_run_id``)."""
    sequence = watermark.sequence + 1
    flow_run_id, flow_run_name = flow_run_info()
    params = dict(model=p.model, model_version=bundle.version, target=store.uri, calibrator=p.calibrator,
                  estimator=p.estimator, cross_check=",".join(p.cross_check), interval=p.interval, level=p.level,
                  significance=p.significance, n_bootstrap=p.n_bootstrap, seed=p.seed, n_batches=n_batches,
                  max_interval_width=p.max_interval_width, on_invalid=p.on_invalid,
                  # logged only when given, so that runs without it log the parameters they always did
                  **({"label_shift_significance": p.label_shift_significance}
                     if p.label_shift_significance is not None else {}),
                  **({"segment_column": p.segment_column, "min_segment_size": p.min_segment_size,
                      "segment_correction": p.segment_correction} if p.segment_column else {}))
    tags = {"prefect.flow_run_id": flow_run_id or "", "prefect.flow_run_name": flow_run_name or "",
            "labelshift.sequence": str(sequence)}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    runs = start_reestimation_run(env.tracking_uri, env.experiment_name, env.artifact_root, model_name=bundle.name,
                                  target_url=store.uri, run_name=f"reestimate-{sequence}",
                                  params=params, tags=tags, history=watermark.history)
    return dict(runs, sequence=sequence, flow_run_id=flow_run_id)


def _end_failed_run(exc: BaseException, env, runs: dict, logger) -> None:
    """Cancelled (Prefect's termination signal, Ctrl-C) or failed: the MLflow run ends KILLED or FAILED with the
    cause (the watermark did not move)."""
    status = "FAILED" if isinstance(exc, Exception) else "KILLED"
    try:
        end_run(env.tracking_uri, runs["run_id"], status, f"{type(exc).__name__}: {exc}")
    except Exception as close_exc:
        logger.error("could not mark MLflow run %s %s: %s", runs["run_id"], status, close_exc)


# -- 3. scoring -------------------------------------------------------------------------------------------------------
def _score(p: ReestimateParameters, bundle, target_uri: str, batches):
    """Calibrated probabilities of every new row, batch by batch (nothing is written until all are read; every bad
    batch is found in this one pass), and the rejected batches; with ``on_invalid="error"`` a bad batch fails the
    run, naming every one."""
    scored = score_for_reestimation(bundle, target_uri, batches, batch_size=p.batch_size,
                                    log_rejections=p.on_invalid != "error")
    rejected = [{"key": r.key, "reason": r.reason} for r in scored.rejected]
    if rejected and p.on_invalid == "error":
        raise InputError(
            f"{len(rejected)} of {len(batches)} new batch(es) failed their checks: "
            + " ".join(f"[{r['key']}] {r['reason']}" for r in rejected)
            + " Nothing was counted. Fix or delete these batches and run again, or run with "
              "on_invalid='quarantine' (CLI: without --fail-on-invalid) to go on with the good ones.")
    return scored, rejected


def _no_valid_data(store, watermark, scored, rejected, env, runs, t0, logger, bundle):
    """No new batch passed its checks: record the rejected ones (if any) in the watermark, list them in MLflow and
    the artifact, end the MLflow run, emit the verdict's event, and complete as "No valid data"."""
    names = ", ".join(r["key"] for r in [*rejected, *scored.skipped])
    headline = (f"No valid data: none of the {len(rejected) + len(scored.skipped)} new batch(es) under {store.uri} "
                f"could be used ({names}). " + ("Rejected batches are recorded in the watermark and not tried again "
                                                "until their content changes: fix (write them again) or delete them. "
                                                if rejected else "")
                + ("Skipped batches were deleted or replaced while the run read them; the next run lists them "
                   "again." if scored.skipped else ""))
    summary = {"verdict": Verdict.NO_VALID_DATA, "headline": headline.strip(), "target": store.uri, "batches": [],
               "sequence": watermark.sequence + bool(rejected), "rejected": rejected, "skipped": scored.skipped,
               "mlflow": {"tracking_uri": env.tracking_uri, "experiment_id": runs["experiment_id"],
                          "run_id": runs["run_id"], "monitor_run_id": runs["monitor_run_id"]},
               "seconds": time.perf_counter() - t0}
    log_rejections(env.tracking_uri, runs["run_id"], rejected, summary)
    if scored.rejected:
        record = {"model": None, "mlflow_run_id": runs["run_id"]}
        summary["sequence"] = _commit(store, watermark, [], record, runs["run_id"], rejected=scored.rejected).sequence
    try:  # the rejections are recorded now: closing the MLflow run may not fail the run any more
        end_run(env.tracking_uri, runs["run_id"], "FINISHED")
    except Exception as exc:
        logger.warning("MLflow run %s could not be marked FINISHED (%s: %s)", runs["run_id"], type(exc).__name__, exc)
    logger.warning(summary["headline"])
    _publish(summary, f"re-estimation verdict: {Verdict.NO_VALID_DATA}", logger)
    emit_verdict(summary, model=bundle.describe(), prefect_run_url=prefect_flow_run_url(runs["flow_run_id"]))
    return Completed(name=Verdict.NO_VALID_DATA, message=summary["headline"], data=summary)


# -- 4. the estimate, logged -------------------------------------------------------------------------------------------
def _settings(p: ReestimateParameters) -> dict:
    """The statistical settings of one assessment, as :func:`tasks.reestimation.estimate_shift` takes them (the
    pooled rows and every segment's are assessed with the same)."""
    return dict(estimator=p.estimator, cross_check=list(p.cross_check), interval=p.interval, level=p.level,
                significance=p.significance, n_bootstrap=p.n_bootstrap, seed=p.seed,
                max_interval_width=p.max_interval_width, label_shift_significance=p.label_shift_significance)


def _assess(p: ReestimateParameters, bundle, classes, scored, rejected, store, env, runs) -> tuple[ShiftReport, dict]:
    """The estimate, its uncertainty and identifiability, and the test of label shift itself; and the summary of
    the run (its state's data and the artifact's source)."""
    report = estimate_shift(bundle, scored.probs, outputs=scored.outputs, class_names=classes, **_settings(p))
    summary = {
        "verdict": report.verdict, "headline": _headline(report, classes), "sequence": runs["sequence"],
        "classes": classes, "model": bundle.describe(), "target": store.uri,
        "batches": [b.key for b in scored.batches], "result": report.to_dict(),
        "mlflow": {"tracking_uri": env.tracking_uri, "experiment_id": runs["experiment_id"],
                   "run_id": runs["run_id"], "monitor_run_id": runs["monitor_run_id"],
                   "ui": run_url(env.tracking_uri, runs["experiment_id"], runs["run_id"])},
        "prefect_flow_run_id": runs["flow_run_id"], "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rejected": rejected, "skipped": scored.skipped,
    }
    return report, summary


def _read_segments(p: ReestimateParameters, store, target_uri: str, batches) -> dict | None:
    """With a segment column: every new batch's segment values, read and checked (the column exists, every row has
    a value; Parquet batches only) before the MLflow run starts -- bad input fails here with nothing written."""
    if not p.segment_column:
        return None
    check_segmentable(batches, p.segment_column, store.uri)
    return read_segment_values(target_uri, batches, p.segment_column)


def _per_segment(p: ReestimateParameters, bundle, classes, scored, values, summary: dict, env, runs) -> None:
    """One estimate per segment besides the pooled one (``assess-segment`` tasks), into the summary
    (``summary["segments"]``) and the MLflow run (metrics, figure). The pooled estimate and its verdict are untouched:
    they alone drive the outputs, the watermark, the alerts and the corrected model."""
    if values is None:
        return
    outputs = joined(scored.outputs) if scored.outputs else None
    segments = assess_segments(bundle, segment_values_of(values, scored), joined(scored.probs), outputs,
                               _settings(p), classes, p.min_segment_size, p.segment_processes,
                               p.segment_correction)
    correction = correction_record(segments)        # how the segments' tests were read over the run
    summary["segments"] = {"column": p.segment_column, "min_size": p.min_segment_size,
                           **({"correction": correction} if correction else {}),
                           "items": [s.to_dict() for s in segments]}
    named = None if classes == [str(c) for c in range(len(classes))] else classes
    log_segments(env.tracking_uri, runs["run_id"], segments, bundle.source_prior.tolist(), named, p.level,
                 runs["sequence"], f"{bundle.name} v{bundle.version}: target prior per {p.segment_column}, "
                                   f"run {runs['sequence']}")


def _log(report: ShiftReport, summary: dict, bundle, classes, watermark, env, runs, rejected) -> dict:
    """The child run's metrics, tags, figure and summary; returns the watermark's record of this run."""
    named = None if classes == [str(c) for c in range(len(classes))] else classes
    record = history_record(report, runs["run_id"], bundle.name, named)
    sequence = runs["sequence"]
    figure = render_figure(report, [*watermark.history, dict(record, sequence=sequence)], report.interval.level,
                           f"{bundle.name} v{bundle.version}: target prior, run {sequence}", named)
    log_reestimation(env.tracking_uri, runs, report, summary, figure, step=sequence, class_names=named)
    log_rejections(env.tracking_uri, runs["run_id"], rejected)
    return record


# -- 5. outputs -------------------------------------------------------------------------------------------------------
def _write_outputs(report: ShiftReport, summary: dict, bundle, target_uri: str, scored) -> None:
    """Corrected predictions beside each batch, atomically -- none when the data are not label-shifted (the weights
    mean nothing), and the summary says why."""
    if report.verdict == Verdict.NOT_LABEL_SHIFT:
        summary["outputs"] = []
        summary["outputs_withheld"] = (
            "the label-shift test rejected the assumption the correction rests on. The batches are counted in "
            "the watermark (they were examined); after fixing the cause, write the fixed batches under new "
            "names, or rewrite them and run with on_changed='reprocess' (CLI: --reprocess-changed).")
    else:
        summary["outputs"] = write_for_reestimation(bundle, target_uri, scored.batches, scored.probs,
                                                    report.weights.tolist(), summary)


# -- 7. bookkeeping after the commit -----------------------------------------------------------------------------------
def _after_commit(summary: dict, committed, bundle, env, runs, logger) -> None:
    """The batches are counted now: what follows is bookkeeping, and a failure in it must not fail the run (its
    retry would find no new data and the run would look lost). The monitor run's series is synchronised from the
    watermark's history, so a point missed here is added by the next run. Failures become the summary's warnings."""
    summary["warnings"] = []
    try:
        sync_monitor(env.tracking_uri, runs["monitor_run_id"], committed.history, bundle.name)
    except Exception as exc:
        summary["warnings"].append(f"the monitor run's series was not updated ({type(exc).__name__}: {exc}); the "
                                   "next run with new data adds the missing point")
    try:
        end_run(env.tracking_uri, runs["run_id"], "FINISHED")
    except Exception as exc:
        summary["warnings"].append(f"MLflow run {runs['run_id']} could not be marked FINISHED "
                                   f"({type(exc).__name__}: {exc})")
    for warning in summary["warnings"]:
        logger.warning(warning)


def _complete(summary: dict, store, env, runs, t0: float, logger) -> Completed:
    """The final state, named for the verdict, with the summary as its data and the markdown artifact."""
    summary["seconds"] = time.perf_counter() - t0
    summary["links"] = {"MLflow run": summary["mlflow"]["ui"] or f"run {runs['run_id']} in experiment "
                                                                  f"'{env.experiment_name}'",
                        "watermark": store.url("_labelshift/watermark.json"),
                        **({"corrected model": summary["corrected_model"]["version_uri"]}
                           if summary.get("corrected_model") else {})}
    word = summary["verdict"]
    _publish(summary, f"re-estimation verdict: {word}", logger)
    emit_verdict(summary, prefect_run_url=prefect_flow_run_url(runs["flow_run_id"]))   # alerts: never fails the run
    logger.info("%s -- %s", word, summary["headline"])
    return Completed(name=word, message=summary["headline"], data=summary)


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
):
    """Re-estimate the target label distribution from the target batches that arrived since the last success.

    Returns (as the data of its final state) the summary dict: verdict, model, target, batches, sequence, the
    estimate with intervals, test and identifiability, the MLflow ids and the output locations.
    """
    check_interval(estimator, interval)
    p = ReestimateParameters(**{k: v for k, v in locals().items() if k in ReestimateParameters.model_fields})
    logger, t0 = get_run_logger(), time.perf_counter()
    env = settings_mod.resolve(tracking_uri=p.tracking_uri, experiment_name=p.mlflow_experiment)
    target_uri = target_uri_for(p.target, env.store_uri)

    # 1. what is new (fails on an empty or missing target; reads only)
    store = open_store(target_uri)
    batches, watermark = find_new_batches(store, on_changed=p.on_changed)
    if not batches:
        return _no_new_data(store, watermark, p, env, logger)
    logger.info("%d new batch(es) under %s: %s", len(batches), store.uri,
                ", ".join(b.key for b in batches[:10]) + (" ..." if len(batches) > 10 else ""))

    # 2. MLflow reachable before any work; model, calibrator and source holdout from the registry; the child run
    check_tracking_server(env.tracking_uri)
    bundle, classes = _load_model(p, env, logger)
    # the corrected model's registry name, checked before anything is written (docs/serving.md)
    corrected_as = (check_corrected_name(env.tracking_uri, p.model, p.corrected_model_name)
                    if p.register_corrected else None)
    segment_values = _read_segments(p, store, target_uri, batches)     # checked before anything is written
    runs = _start_run(p, env, store, bundle, watermark, len(batches))
    try:
        # 3. calibrated probabilities of every new row
        scored, rejected = _score(p, bundle, target_uri, batches)
        if not scored.batches:
            return _no_valid_data(store, watermark, scored, rejected, env, runs, t0, logger, bundle)
        # 4. the estimate and its tests, logged to MLflow
        report, summary = _assess(p, bundle, classes, scored, rejected, store, env, runs)
        _per_segment(p, bundle, classes, scored, segment_values, summary, env, runs)    # never the pooled verdict
        record = _log(report, summary, bundle, classes, watermark, env, runs, rejected)
        # 5. outputs beside each batch; then -- only then -- 6. the watermark, which counts the batches either way
        _write_outputs(report, summary, bundle, target_uri, scored)
        if corrected_as:    # before the commit: a failed registration fails the run and the watermark stays
            summary["corrected_model"] = register_if_shifted(bundle, report, tracking_uri=env.tracking_uri,
                                                             name=corrected_as, run_id=runs["run_id"],
                                                             target=store.uri, sequence=runs["sequence"])
        committed = _commit(store, watermark, scored.batches, record, runs["run_id"], rejected=scored.rejected)
    except BaseException as exc:
        _end_failed_run(exc, env, runs, logger)
        raise

    # 7. bookkeeping that cannot fail the run any more, then the verdict
    _after_commit(summary, committed, bundle, env, runs, logger)
    return _complete(summary, store, env, runs, t0, logger)
