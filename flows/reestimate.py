"""The ``reestimate`` flow: re-estimate the target label distribution from the batches that arrived since last time.

The operator's side of the system. A deployed classifier, registered in MLflow with its calibrator,
meets new unlabelled data in object storage; on a schedule this flow

1. lists the target batches (``*.npy`` or ``*.parquet`` under ``target``: model inputs, or, for a registered
   reference, the model's logged outputs; :mod:`labelshift.monitoring.batches`, :mod:`tasks.references`) that are not yet in the
   watermark (``<target>/_labelshift/watermark.json``, :mod:`labelshift.monitoring.watermark`);
2. loads the model version and its calibrator and source holdout from the registry
   (:func:`tasks.reestimation.load_bundle`), checks every new batch against the model's input signature, and
   computes calibrated probabilities f(x);
3. estimates the importance weights w and the target prior p_t(y) = w(y) p_s(y) on the pooled new rows with MLLS
   (Garg et al., NeurIPS 2020, eq. (mlls-sample)) -- BBSE alongside as a cross-check -- with a confidence
   interval per class (by default source-aware: it includes the error of the calibrator and p_s fit on the labelled
   holdout; the target-only Fisher interval or a bootstrap by name), a test of the label-shift assumption itself
   (:mod:`labelshift.inference.shift_detection`), a two-sample test of "no shift" (w = 1: the mean calibrated prediction on the new data against the source holdout's) and the identifiability report (Hessian minimum eigenvalue, confusion-matrix conditioning;
   :mod:`labelshift.inference.uncertainty`);
4. logs to MLflow (experiment ``reestimation``): a child run per re-estimation with the prior, the interval, the
   p-value, the identifiability numbers and a figure;
5. writes corrected predictions p_t(y|x) proportional to w_y f_y(x) beside each batch (``NAME.corrected.npy``),
   then a summary (``NAME.summary.json``), each atomically -- except under "Not label shift", when the weights mean
   nothing and no outputs are written;
6. moves the watermark -- only now, after all of the above succeeded: a run that fails anywhere before leaves it
   as it was and the next run takes the same batches again (their outputs are rewritten, never counted twice);
7. then, as bookkeeping that cannot fail the run any more: brings the series of the monitor run (whose metrics
   chart the prior over time, one point per successful run) up to date from the watermark's history, ends the
   child run FINISHED, and ends in a Prefect state named for the verdict -- ``Not label shift``,
   ``Untrustworthy``, ``Shifted``, ``No shift`` (in that precedence), ``No valid data`` or ``No new data`` -- with a markdown artifact that says it at a glance.

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

from stack import settings as settings_mod
from flows.params import REESTIMATE_EXPERIMENT as DEFAULT_EXPERIMENT
from flows.params import (DEFAULT_MODEL, BatchSizeParam, CalibratorParam, CrossCheckParam, EstimatorParam,
                          ExperimentParam, IntervalParam, LabelShiftSignificanceParam, LevelParam, MaxWidthParam,
                          ModelParam, NBootstrapParam, OnChangedParam, OnInvalidParam, SeedParam, SignificanceParam,
                          TargetParam, TrackingParam)
from labelshift.errors import InputError
from labelshift.monitoring.watermark import commit_watermark, find_new_batches, read_watermark
from labelshift.estimation.registry import check_interval
from labelshift.inference.report import NOT_LABEL_SHIFT, ShiftReport, check_holdout, finite
from labelshift.storage import open_store
from tasks.reestimation import (catch_up_monitor, end_run, estimate_shift, history_record, log_reestimation,
                                log_rejections, parse_model_uri, render_figure, start_reestimation_run,
                                sync_monitor)
from tasks.alerts import emit_verdict
from tasks.references import class_names_of, load_for_reestimation, score_for_reestimation, write_for_reestimation
from tasks.tracking import check_tracking_server, git_commit, run_url
from flows.links import prefect_flow_run_url
from flows.user_errors import install as _log_user_errors_once

_log_user_errors_once()

__all__ = ["reestimate", "DEFAULT_MODEL", "target_uri_for", "summary_markdown"]


def target_uri_for(target: str | None, store_uri: str) -> str:
    """The target location: as given, else ``<store>/target``."""
    if target:
        return target
    return f"{store_uri.rstrip('/')}/target"


def _flow_run_info() -> tuple[str | None, str | None]:
    try:
        from prefect.runtime import flow_run

        return flow_run.id, flow_run.name
    except Exception:
        return None, None


def format_p(p: float) -> str:
    """A p-value for people, with its relation sign: "= 0.0312", or "< 1e-16" below what double precision
    resolves."""
    return "< 1e-16" if p < 1e-16 else f"= {p:.3g}"


def _fmt_prior(values) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def rejected_markdown(summary: dict) -> list[str]:
    """The batches a run rejected or skipped, one line each with the reason (markdown lines; none if none)."""
    lines = []
    for title, items, what in (("Rejected batches", summary.get("rejected", []),
                                "not counted, recorded in the watermark; tried again once their content changes"),
                               ("Skipped batches", summary.get("skipped", []),
                                "gone or replaced since the listing; the next run lists them again")):
        if items:
            lines += ["", f"**{title}** ({len(items)}: {what}):", ""]
            lines += [f"- `{item['key']}`: {item['reason']}" for item in items]
    return lines


def summary_markdown(summary: dict) -> str:
    """The Prefect artifact: the verdict first, then a table per class, then the numbers behind the verdict."""
    if "result" not in summary:  # no estimate: every new batch was rejected or skipped
        return "\n".join([f"# ❌ {summary['verdict']}: {summary['target']}", "", f"**{summary['headline']}**",
                          *rejected_markdown(summary)]) + "\n"
    res = ShiftReport.from_dict(summary["result"])
    names = summary.get("classes") or [str(c) for c in range(res.n_classes)]
    ci, test, ident = res.interval, res.no_shift_test, res.identifiability
    word = summary["verdict"]
    icon = {"Shifted": "⚠️", "No shift": "✅", "Untrustworthy": "❓", NOT_LABEL_SHIFT: "🚫"}.get(word, "")
    change = res.largest_change
    lines = [f"# {icon} {word}: {summary['model']['uri']} on {summary['target']}", "",
             f"**{summary['headline']}**", "",
             f"- new batches: {len(summary['batches'])} ({res.n_target} rows), run sequence "
             f"{summary['sequence']}",
             f"- no-shift test ({test.method}, {test.dof} dof): statistic {test.statistic:.2f}, "
             f"p {format_p(test.p_value)} (shifted when p < {res.significance})",
             f"- total variation between source and target prior: {res.total_variation:.3f}; largest change: "
             f"class {names[change.label]} {change.source:.3f} -> {change.target:.3f}",
             f"- identifiability: min Hessian eigenvalue {ident.min_hessian_eigenvalue:.3g}"
             + (f", confusion-matrix condition {ident.confusion_condition:.3g}"
                if finite(ident.confusion_condition) else "")
             + ("" if res.trustworthy else " -- **not trustworthy**: " + "; ".join(res.reasons)),
             *[f"- note: {note}" for note in ident.notes],
             f"- interval: {ci.method}" + (" (includes the labelled holdout's error: calibrator and p_s)"
                                           if ci.method == "source-aware" else " (target sampling error only)"),
             *_label_shift_markdown(res, names),
             "", f"| class | source p_s | target p_t ({res.method}) | {ci.level:.0%} {ci.method} interval | w |",
             "|---|---|---|---|---|"]
    for c in range(res.n_classes):
        lines.append(f"| {names[c]} | {res.source_prior[c]:.4f} | {res.target_prior[c]:.4f} | "
                     f"[{ci.lower[c]:.4f}, {ci.upper[c]:.4f}] | {res.weights[c]:.3f} |")
    for method, check in res.cross_check.items():
        lines.append("")
        lines.append(f"Cross-check {method}: " + (_fmt_prior(check.target_prior) if check.ok
                                                  else f"failed ({check.error})"))
    lines += _accuracy_markdown(res, names)
    if summary.get("outputs_withheld"):
        lines += ["", f"**No corrected outputs were written:** {summary['outputs_withheld']}"]
    lines += rejected_markdown(summary)
    links = summary.get("links", {})
    if links:
        lines += ["", *[f"- {k}: {v}" for k, v in links.items()]]
    return "\n".join(lines) + "\n"


def _accuracy_markdown(res: ShiftReport, names) -> list[str]:
    """What the shift costs: the deployed model's accuracy on the holdout and expected on the target (per-class
    recall on the holdout weighted by the estimated prior), and that of the corrected predictions."""
    acc = res.accuracy
    if acc is None or res.verdict == NOT_LABEL_SHIFT:
        return []
    level = f"{acc.level:.0%}"
    lines = ["", "What the shift costs in accuracy (per-class recall on the holdout, weighted by the estimated "
                 "target prior; docs/accuracy.md):", "",
             f"| predictions | accuracy on the source | expected on the target | {level} interval |", "|---|---|---|---|",
             f"| deployed model | {acc.source:.3f} | {acc.expected:.3f} | [{acc.lower:.3f}, {acc.upper:.3f}] |",
             f"| corrected to the target | | {acc.corrected:.3f} | [{acc.corrected_lower:.3f}, "
             f"{acc.corrected_upper:.3f}] |", "",
             "The corrected figure's interval is short when the calibrator is misspecified (benchmarks/README.md).",
             "", "| class | recall on the holdout | target p_t |", "|---|---|---|"]
    lines += [f"| {names[c]} | {acc.per_class_recall[c]:.3f} | {res.target_prior[c]:.4f} |"
              for c in range(res.n_classes)]
    return lines


def _label_shift_markdown(res: ShiftReport, names) -> list[str]:
    """The label-shift test's lines of the artifact: its one-line summary and, when it rejects, a table of the
    output regions where the target disagrees with the holdout reweighted by class."""
    if not res.label_shift_tested:
        return []
    lines = [f"- label-shift test: {res.label_shift_summary}"]
    lst = res.label_shift
    if lst is not None and res.label_shift_ok is False:
        lines += ["", "Where the target disagrees with the holdout reweighted by class (output regions):", "",
                  "| region | target fraction | expected under label shift | z |", "|---|---|---|---|"]
        lines += [f"| {r.name} | {r.observed:.3f} | {r.expected:.3f} | {r.z:+.1f} |" for r in lst.disagreeing()]
        lines += ["", "The estimate below assumes label shift and is **not meaningful** for these data; see "
                      "\"What an operator should do\" in docs/label_shift_test.md.", ""]
    return lines


def _headline(report: ShiftReport, class_names=None) -> str:
    """One sentence for the verdict of ``report``."""
    p = format_p(report.no_shift_test.p_value)
    change = report.largest_change
    label = class_names[change.label] if class_names else change.label
    if report.verdict == NOT_LABEL_SHIFT:
        return (f"The new data are not label-shifted source data ({report.label_shift_summary}); the estimated "
                "weights mean nothing and no corrected outputs were written: find the cause (a new class, input "
                "drift, a broken feature pipeline) before acting on this target.")
    cost = f" The deployed model's {report.accuracy_summary}." if report.accuracy is not None else ""
    if report.verdict == "Untrustworthy":
        return "The estimate cannot be trusted: " + "; ".join(report.reasons) + f" (p {p})."
    if report.verdict == "Shifted":
        return (f"The label distribution has shifted (p {p}): total variation {report.total_variation:.3f}, "
                f"largest change class {label} {change.source:.3f} -> {change.target:.3f}.{cost}")
    return f"No significant shift (p {p}); total variation {report.total_variation:.3f}.{cost}"


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


def _no_valid_data(store, watermark, scored, rejected, env, runs, t0, logger):
    """No new batch passed its checks: record the rejected ones (if any) in the watermark, list them in MLflow and
    the artifact, end the MLflow run, and complete as "No valid data"."""
    names = ", ".join(r["key"] for r in [*rejected, *scored.skipped])
    headline = (f"No valid data: none of the {len(rejected) + len(scored.skipped)} new batch(es) under {store.uri} "
                f"could be used ({names}). " + ("Rejected batches are recorded in the watermark and not tried again "
                                                "until their content changes: fix (write them again) or delete them. "
                                                if rejected else "")
                + ("Skipped batches were deleted or replaced while the run read them; the next run lists them "
                   "again." if scored.skipped else ""))
    summary = {"verdict": "No valid data", "headline": headline.strip(), "target": store.uri, "batches": [],
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
    try:
        create_markdown_artifact(markdown=summary_markdown(summary), key="reestimate",
                                 description="re-estimation verdict: No valid data")
    except Exception as exc:
        logger.warning("the Prefect artifact was not created (%s: %s)", type(exc).__name__, exc)
    return Completed(name="No valid data", message=summary["headline"], data=summary)


@flow(name="reestimate", log_prints=False)
def reestimate(
    model: ModelParam = DEFAULT_MODEL,
    target: TargetParam = None,
    calibrator: CalibratorParam = "BCTS",
    estimator: EstimatorParam = "MLLS",
    cross_check: CrossCheckParam = ["BBSE-soft"],     # noqa: B006 - Prefect copies parameter defaults
    interval: IntervalParam = "source-aware",
    level: LevelParam = 0.95,
    significance: SignificanceParam = 0.05,
    label_shift_significance: LabelShiftSignificanceParam = None,
    n_bootstrap: NBootstrapParam = 200,
    seed: SeedParam = 0,
    tracking_uri: TrackingParam = None,
    mlflow_experiment: ExperimentParam = DEFAULT_EXPERIMENT,
    batch_size: BatchSizeParam = 1024,
    max_interval_width: MaxWidthParam = None,
    on_changed: OnChangedParam = "error",
    on_invalid: OnInvalidParam = "quarantine",
):
    """Re-estimate the target label distribution from the target batches that arrived since the last success.

    Returns (as the data of its final state) the summary dict: verdict, model, target, batches, sequence, the
    estimate with intervals, test and identifiability, the MLflow ids and the output locations.
    """
    logger = get_run_logger()
    check_interval(estimator, interval)
    env = settings_mod.resolve(tracking_uri=tracking_uri, experiment_name=mlflow_experiment)
    target_uri = target_uri_for(target, env.store_uri)
    t0 = time.perf_counter()

    # 1. what is new (fails on an empty or missing target; reads only)
    store = open_store(target_uri)
    batches, watermark = find_new_batches(store, on_changed=on_changed)
    if not batches:
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
                catch_up_monitor(env.tracking_uri, env.experiment_name, parse_model_uri(model)[0], store.uri,
                                 watermark.history)
            except Exception as exc:
                logger.warning("MLflow bookkeeping of earlier runs skipped (%s: %s); the next run tries again",
                               type(exc).__name__, exc)
        create_markdown_artifact(markdown=f"# No new data\n\n{message}\n", key="reestimate",
                                 description="re-estimation verdict")
        return Completed(name="No new data", message=message,
                         data={"verdict": "No new data", "target": store.uri, "batches": [],
                               "sequence": watermark.sequence})
    logger.info("%d new batch(es) under %s: %s", len(batches), store.uri,
                ", ".join(b.key for b in batches[:10]) + (" ..." if len(batches) > 10 else ""))

    # 2. MLflow reachable before any work; model, calibrator and source holdout from the registry
    check_tracking_server(env.tracking_uri)
    bundle = load_for_reestimation(model, tracking_uri=env.tracking_uri, calibrator=calibrator)
    classes = class_names_of(bundle)
    # a holdout that cannot carry this re-estimation fails here, before anything is written
    check_holdout(bundle.source_labels, bundle.n_classes, interval=interval, calibrator=bundle.calibrator)
    logger.info("model %s -> version %s (run %s, %s), input %s, classes %s, calibrator %s", model, bundle.version,
                bundle.run_id, getattr(bundle, "mode", "pytorch"), bundle.input_shape, ", ".join(classes), calibrator)
    sequence = watermark.sequence + 1
    flow_run_id, flow_run_name = _flow_run_info()
    params = dict(model=model, model_version=bundle.version, target=store.uri, calibrator=calibrator,
                  estimator=estimator, cross_check=",".join(cross_check), interval=interval, level=level,
                  significance=significance, n_bootstrap=n_bootstrap, seed=seed, n_batches=len(batches),
                  max_interval_width=max_interval_width, on_invalid=on_invalid,
                  # logged only when given, so that runs without it log the parameters they always did
                  **({"label_shift_significance": label_shift_significance}
                     if label_shift_significance is not None else {}))
    tags = {"prefect.flow_run_id": flow_run_id or "", "prefect.flow_run_name": flow_run_name or "",
            "labelshift.sequence": str(sequence)}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    runs = start_reestimation_run(env.tracking_uri, env.experiment_name, env.artifact_root, model_name=bundle.name,
                                  target_url=store.uri, run_name=f"reestimate-{sequence}",
                                  params=params, tags=tags, history=watermark.history)
    try:
        # 3. calibrated probabilities of every new row, batch by batch (nothing is written until all are read); every
        #    bad batch is found in this one pass
        scored = score_for_reestimation(bundle, target_uri, batches, batch_size=batch_size,
                                        log_rejections=on_invalid != "error")
        rejected = [{"key": r.key, "reason": r.reason} for r in scored.rejected]
        if rejected and on_invalid == "error":
            raise InputError(
                f"{len(rejected)} of {len(batches)} new batch(es) failed their checks: "
                + " ".join(f"[{r['key']}] {r['reason']}" for r in rejected)
                + " Nothing was counted. Fix or delete these batches and run again, or run with "
                  "on_invalid='quarantine' (CLI: without --fail-on-invalid) to go on with the good ones.")
        if not scored.batches:
            state = _no_valid_data(store, watermark, scored, rejected, env, runs, t0, logger)
            emit_verdict(state.data, model=bundle.describe(), prefect_run_url=prefect_flow_run_url(flow_run_id))
            return state
        batches, probs = scored.batches, scored.probs
        # 4. the estimate, its uncertainty and identifiability, and the test of label shift itself
        report = estimate_shift(bundle, probs, estimator=estimator, cross_check=list(cross_check),
                                interval=interval, level=level, significance=significance,
                                n_bootstrap=n_bootstrap, seed=seed, max_interval_width=max_interval_width,
                                outputs=scored.outputs, class_names=classes,
                                label_shift_significance=label_shift_significance)
        word = report.verdict
        ui = run_url(env.tracking_uri, runs["experiment_id"], runs["run_id"])
        summary = {
            "verdict": word, "headline": _headline(report, classes), "sequence": sequence, "classes": classes,
            "model": bundle.describe(), "target": store.uri, "batches": [b.key for b in batches],
            "result": report.to_dict(),
            "mlflow": {"tracking_uri": env.tracking_uri, "experiment_id": runs["experiment_id"],
                       "run_id": runs["run_id"], "monitor_run_id": runs["monitor_run_id"], "ui": ui},
            "prefect_flow_run_id": flow_run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rejected": rejected, "skipped": scored.skipped,
        }
        named = None if classes == [str(c) for c in range(len(classes))] else classes
        record = history_record(report, runs["run_id"], bundle.name, named)
        figure = render_figure(report, [*watermark.history, dict(record, sequence=sequence)], report.interval.level,
                               f"{bundle.name} v{bundle.version}: target prior, run {sequence}", named)
        log_reestimation(env.tracking_uri, runs, report, summary, figure, step=sequence, class_names=named)
        log_rejections(env.tracking_uri, runs["run_id"], rejected)
        # 5. outputs beside each batch, atomically (none when the data are not label-shifted: the weights mean
        #    nothing); then -- only then -- the watermark, which counts the batches either way (they were examined)
        if word == NOT_LABEL_SHIFT:
            summary["outputs"] = []
            summary["outputs_withheld"] = (
                "the label-shift test rejected the assumption the correction rests on. The batches are counted in "
                "the watermark (they were examined); after fixing the cause, write the fixed batches under new "
                "names, or rewrite them and run with on_changed='reprocess' (CLI: --reprocess-changed).")
        else:
            summary["outputs"] = write_for_reestimation(bundle, target_uri, batches, probs,
                                                        report.weights.tolist(), summary)
        committed = _commit(store, watermark, batches, record, runs["run_id"], rejected=scored.rejected)
    except BaseException as exc:
        # cancelled (Prefect's termination signal, Ctrl-C) or failed: the watermark did not move
        status = "FAILED" if isinstance(exc, Exception) else "KILLED"
        try:
            end_run(env.tracking_uri, runs["run_id"], status, f"{type(exc).__name__}: {exc}")
        except Exception as close_exc:
            logger.error("could not mark MLflow run %s %s: %s", runs["run_id"], status, close_exc)
        raise

    # 6. the batches are counted now: what follows is bookkeeping, and a failure in it must not fail the run (its
    #    retry would find no new data and the run would look lost). The monitor run's series is synchronised from
    #    the watermark's history, so a point missed here is added by the next run.
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

    summary["seconds"] = time.perf_counter() - t0
    links = {"MLflow run": ui or f"run {runs['run_id']} in experiment '{env.experiment_name}'",
             "watermark": store.url("_labelshift/watermark.json")}
    summary["links"] = links
    try:
        create_markdown_artifact(markdown=summary_markdown(summary), key="reestimate",
                                 description=f"re-estimation verdict: {word}")
    except Exception as exc:
        summary["warnings"].append(f"the Prefect artifact was not created ({type(exc).__name__}: {exc})")
        logger.warning(summary["warnings"][-1])
    emit_verdict(summary, prefect_run_url=prefect_flow_run_url(flow_run_id))   # alerts: never fails the run
    logger.info("%s -- %s", word, summary["headline"])
    return Completed(name=word, message=summary["headline"], data=summary)
