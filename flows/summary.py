"""The summary of a ``reestimate`` run for people: one renderer, two fronts.

:func:`render` decides which parts of the run's summary dict are shown and hands each to a front that lays it out:
:data:`MARKDOWN` (the Prefect artifact, :func:`summary_markdown`) or :data:`PLAIN_TEXT` (what ``labelshift
estimate`` prints, :func:`format_summary`). :class:`RunSummary` is the summary as the flow builds it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labelshift.inference.multiplicity import correction_label
from labelshift.inference.report import ShiftReport, Verdict, finite

__all__ = ["RunSummary", "render", "summary_markdown", "format_summary", "headline", "format_p", "MARKDOWN", "PLAIN_TEXT"]


@dataclass(kw_only=True)
class RunSummary:
    """What one ``reestimate`` run did, for people and programs (``docs/operations.md`` reads it field by field);
    its dict is the data of the run's final state and the summary JSON stored beside each batch and in MLflow."""

    verdict: str
    headline: str
    sequence: int
    classes: list[str] | None = None
    model: dict | None = None
    target: str
    batches: list[str]
    result: dict | None = None
    mlflow: dict
    prefect_flow_run_id: str | None = None
    time: str | None = None
    rejected: list[dict] = dataclasses.field(default_factory=list)
    skipped: list[dict] = dataclasses.field(default_factory=list)
    segments: dict | None = None
    outputs: list[str] | None = None
    outputs_withheld: str | None = None
    corrected_model: dict | None = None
    warnings: list[str] | None = None
    seconds: float | None = None
    links: dict | None = None

    def to_dict(self) -> dict:
        """The fields that are set (not None), in the order declared above (the stored summaries' order)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def format_p(p: float) -> str:
    """A p-value for people, with its relation sign: "= 0.0312", or "< 1e-16" below double precision."""
    return "< 1e-16" if p < 1e-16 else f"= {p:.3g}"


def headline(report: ShiftReport, class_names=None) -> str:
    """One sentence for the verdict of ``report``."""
    p = format_p(report.no_shift_test.p_value)
    change = report.largest_change
    label = class_names[change.label] if class_names else change.label
    if report.verdict == Verdict.NOT_LABEL_SHIFT:
        return (f"The new data are not label-shifted source data ({report.label_shift_summary}); the estimated "
                "weights mean nothing and no corrected outputs were written: find the cause (a new class, input "
                "drift, a broken feature pipeline) before acting on this target.")
    cost = f" The deployed model's {report.accuracy_summary}." if report.accuracy is not None else ""
    if report.verdict == Verdict.UNTRUSTWORTHY:
        return "The estimate cannot be trusted: " + "; ".join(report.reasons) + f" (p {p})."
    if report.verdict == Verdict.SHIFTED:
        return (f"The label distribution has shifted (p {p}): total variation {report.total_variation:.3f}, "
                f"largest change class {label} {change.source:.3f} -> {change.target:.3f}.{cost}")
    return f"No significant shift (p {p}); total variation {report.total_variation:.3f}.{cost}"


def _identifiability(res: ShiftReport, condition: str, untrusted: str) -> str:
    """The identifiability numbers, and the reasons when the estimate is not trustworthy."""
    ident = res.identifiability
    return (f"identifiability: min Hessian eigenvalue {ident.min_hessian_eigenvalue:.3g}"
            + (f", {condition} {ident.confusion_condition:.3g}" if finite(ident.confusion_condition) else "")
            + ("" if res.trustworthy else untrusted + "; ".join(res.reasons)))


def _held(summary: dict) -> list[tuple[str, dict]]:
    """The batches the run did not count: ("rejected", item) and ("skipped", item), in that order."""
    return [("rejected", r) for r in summary.get("rejected", [])] + \
        [("skipped", r) for r in summary.get("skipped", [])]


def _segment_cells(item: dict) -> list[str]:
    """A segment's numbers as text (rows, verdict, TV, no-shift p, label-shift p, expected accuracy); a p-value
    adjusted over the segments follows the test's own in brackets, e.g. "= 0.004 (0.31)"."""
    if item["too_small"] or "target_prior" not in item:
        return [str(item["rows"]), "too small" if item["too_small"] else f"failed ({item['reason']})", "", "", "", ""]
    acc = item.get("accuracy")
    lsp = item.get("label_shift_p_value")
    return [str(item["rows"]), item["verdict"], f"{item['total_variation']:.3f}",
            _p_adjusted(item["no_shift_p_value"], item.get("no_shift_p_adjusted")),
            "not run" if lsp is None else _p_adjusted(lsp, item.get("label_shift_p_adjusted")),
            "" if acc is None else f"{acc['expected']:.3f} [{acc['lower']:.3f}, {acc['upper']:.3f}]"]


def _p_adjusted(p: float, adjusted: float | None) -> str:
    """``format_p(p)``, and the adjusted value in brackets when there is one that reads differently."""
    given = format_p(p)
    shown = None if adjusted is None else format_p(adjusted)
    return given if shown is None or shown == given else f"{given} ({shown.removeprefix('= ')})"


def _segment_note(segments: dict) -> str:
    correction = segments.get("correction")
    if correction is None:              # a summary written before the segments' tests were adjusted
        reading = ""
    elif correction["method"] == "none":
        reading = ("each segment's tests are read at the single-test level, with no correction for the number of "
                   "segments (about 1 in 20 label-shifted segments is called Not label shift by chance); ")
    else:
        ls, ns = correction["label_shift_tests"], correction["no_shift_tests"]
        over = f"the {ns} segments tested" if ls == ns else f"the segments tested ({ls} label-shift, {ns} no-shift)"
        reading = (f"the verdicts read each test's p-value {correction_label(correction['method'])}-adjusted over "
                   f"{over}, in brackets; ")
    return (f"Estimates per segment ({segments['column']}; each on its own rows against the shared holdout, so "
            f"their intervals are positively correlated -- docs/reestimation.md; {reading}segments under "
            f"{segments['min_size']} rows are too small to assess; the verdict above is the pooled one):")


def render(summary: dict, front) -> str:
    """The summary of a run (the data of the ``reestimate`` flow's final state) as ``front`` lays it out."""
    if summary.get("verdict") == Verdict.NO_NEW_DATA:
        return front.no_new_data(summary)
    held = _held(summary)
    if "result" not in summary:          # no estimate: every new batch was rejected or skipped
        return front.join([*front.no_estimate(summary, held), *front.warnings(summary.get("warnings", []))])
    res = ShiftReport.from_dict(summary["result"])
    names = summary.get("classes") or [str(c) for c in range(res.n_classes)]
    disagreeing = res.label_shift.disagreeing() if res.label_shift is not None and res.label_shift_ok is False \
        else None
    shows_accuracy = res.accuracy is not None and res.verdict != Verdict.NOT_LABEL_SHIFT
    parts = {
        "head": front.head(summary, res),
        "tests": front.tests(res, names),
        "label_shift": front.label_shift(res, disagreeing) if res.label_shift_tested else [],
        "classes": front.classes(res, names),
        "cross_checks": front.cross_checks(res),
        "accuracy": front.accuracy(res, names) if shows_accuracy else [],
        "segments": front.segments(summary["segments"], names) if summary.get("segments") else [],
        "withheld": front.withheld(summary["outputs_withheld"]) if summary.get("outputs_withheld") else [],
        "held": front.held(summary, held) if held else [],
        "warnings": front.warnings(summary.get("warnings", [])),
        "links": front.links(summary),
    }
    return front.join([line for part in front.order for line in parts[part]])


class _Markdown:
    """The Prefect artifact: the verdict first, then the numbers behind it, then a table per class."""

    order = ("head", "tests", "label_shift", "classes", "cross_checks", "accuracy", "segments", "withheld", "held",
             "links")
    icons = {Verdict.SHIFTED: "⚠️", Verdict.NO_SHIFT: "✅", Verdict.UNTRUSTWORTHY: "❓", Verdict.NOT_LABEL_SHIFT: "🚫"}

    @staticmethod
    def join(lines: list[str]) -> str:
        return "\n".join(lines) + "\n"

    def no_new_data(self, summary: dict) -> str:
        return self.join(["# No new data", "", summary["headline"]])

    def no_estimate(self, summary: dict, held) -> list[str]:
        return [f"# ❌ {summary['verdict']}: {summary['target']}", "", f"**{summary['headline']}**",
                *self.held(summary, held)]

    def head(self, summary: dict, res: ShiftReport) -> list[str]:
        word = summary["verdict"]
        return [f"# {self.icons.get(word, '')} {word}: {summary['model']['uri']} on {summary['target']}", "",
                f"**{summary['headline']}**", "",
                f"- new batches: {len(summary['batches'])} ({res.n_target} rows), run sequence {summary['sequence']}"]

    @staticmethod
    def tests(res: ShiftReport, names) -> list[str]:
        test, ci, change = res.no_shift_test, res.interval, res.largest_change
        return [f"- no-shift test ({test.method}, {test.dof} dof): statistic {test.statistic:.2f}, "
                f"p {format_p(test.p_value)} (shifted when p < {res.significance})",
                f"- total variation between source and target prior: {res.total_variation:.3f}; largest change: "
                f"class {names[change.label]} {change.source:.3f} -> {change.target:.3f}",
                "- " + _identifiability(res, "confusion-matrix condition", " -- **not trustworthy**: "),
                *[f"- note: {note}" for note in res.identifiability.notes],
                f"- interval: {ci.method}" + (" (includes the labelled holdout's error: calibrator and p_s)"
                                              if ci.method == "source-aware" else " (target sampling error only)"),
                *([f"- rows that repeat: {res.repeats_summary}"] if res.repeats_summary else [])]

    @staticmethod
    def label_shift(res: ShiftReport, disagreeing) -> list[str]:
        lines = [f"- label-shift test: {res.label_shift_summary}"]
        if disagreeing is not None:
            lines += ["", "Where the target disagrees with the holdout reweighted by class (output regions):", "",
                      "| region | target fraction | expected under label shift | z |", "|---|---|---|---|"]
            lines += [f"| {r.name} | {r.observed:.3f} | {r.expected:.3f} | {r.z:+.1f} |" for r in disagreeing]
            lines += ["", "The estimate below assumes label shift and is **not meaningful** for these data; see "
                          "\"What an operator should do\" in docs/label_shift_test.md.", ""]
        return lines

    @staticmethod
    def classes(res: ShiftReport, names) -> list[str]:
        ci = res.interval
        return ["", f"| class | source p_s | target p_t ({res.method}) | {ci.level:.0%} {ci.method} interval | w |",
                "|---|---|---|---|---|",
                *[f"| {names[c]} | {res.source_prior[c]:.4f} | {res.target_prior[c]:.4f} | "
                  f"[{ci.lower[c]:.4f}, {ci.upper[c]:.4f}] | {res.weights[c]:.3f} |" for c in range(res.n_classes)]]

    @staticmethod
    def cross_checks(res: ShiftReport) -> list[str]:
        lines = []
        for method, check in res.cross_check.items():
            prior = "[" + ", ".join(f"{v:.3f}" for v in check.target_prior) + "]" if check.ok else None
            lines += ["", f"Cross-check {method}: " + (prior if check.ok else f"failed ({check.error})")]
        return lines

    @staticmethod
    def accuracy(res: ShiftReport, names) -> list[str]:
        acc = res.accuracy
        return ["", "What the shift costs in accuracy (per-class recall on the holdout, weighted by the estimated "
                    "target prior; docs/accuracy.md):", "",
                f"| predictions | accuracy on the source | expected on the target | {acc.level:.0%} interval |",
                "|---|---|---|---|",
                f"| deployed model | {acc.source:.3f} | {acc.expected:.3f} | [{acc.lower:.3f}, {acc.upper:.3f}] |",
                f"| corrected to the target | | {acc.corrected:.3f} | [{acc.corrected_lower:.3f}, "
                f"{acc.corrected_upper:.3f}] |", "",
                "The corrected figure's interval is short when the calibrator is misspecified "
                "(benchmarks/README.md).", "", "| class | recall on the holdout | target p_t |", "|---|---|---|",
                *[f"| {names[c]} | {acc.per_class_recall[c]:.3f} | {res.target_prior[c]:.4f} |"
                  for c in range(res.n_classes)]]

    @staticmethod
    def segments(segments: dict, names) -> list[str]:
        head = ["segment", "rows", "verdict", "total variation", "no-shift p", "label-shift p", "expected accuracy",
                *[f"p_t({n})" for n in names]]
        rows = []
        for item in segments["items"]:
            priors = ([f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in
                       zip(item["target_prior"], item["lower"], item["upper"])] if "target_prior" in item
                      else [""] * len(names))
            rows.append("| " + " | ".join([item["name"], *_segment_cells(item), *priors]) + " |")
        return ["", _segment_note(segments), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows]

    @staticmethod
    def withheld(reason: str) -> list[str]:
        return ["", f"**No corrected outputs were written:** {reason}"]

    @staticmethod
    def held(summary: dict, held) -> list[str]:
        """The batches a run rejected or skipped, one line each with the reason."""
        lines = []
        for kind, title, what in (("rejected", "Rejected batches",
                                   "not counted, recorded in the watermark; tried again once their content changes"),
                                  ("skipped", "Skipped batches",
                                   "gone or replaced since the listing; the next run lists them again")):
            items = [item for k, item in held if k == kind]
            if items:
                lines += ["", f"**{title}** ({len(items)}: {what}):", ""]
                lines += [f"- `{item['key']}`: {item['reason']}" for item in items]
        return lines

    @staticmethod
    def warnings(warnings: list[str]) -> list[str]:
        return []                        # the run's log carries them

    @staticmethod
    def links(summary: dict) -> list[str]:
        links = summary.get("links", {})
        return ["", *[f"- {k}: {v}" for k, v in links.items()]] if links else []


class _PlainText:
    """The terminal: the verdict and its sentence, the label-shift test, a table per class, then the numbers."""

    order = ("head", "label_shift", "classes", "tests", "cross_checks", "accuracy", "segments", "held", "warnings",
             "links")

    @staticmethod
    def join(lines: list[str]) -> str:
        return "\n".join(lines)

    @staticmethod
    def no_new_data(summary: dict) -> str:
        held = summary.get("held_rejected") or []
        return (f"No new data under {summary['target']} (run sequence {summary.get('sequence')})."
                + (f"\n  {len(held)} batch(es) rejected earlier are left alone until their content changes: "
                   + ", ".join(held[:10]) + (" ..." if len(held) > 10 else "") + "; fix (write them again) or "
                   "delete them." if held else ""))

    def no_estimate(self, summary: dict, held) -> list[str]:
        line = summary.get("headline", "")          # "No valid data: ..." says the verdict itself
        if not line.startswith(summary["verdict"]):
            line = f"{summary['verdict']}: {line}"
        return [line, *self._held_lines(held)]

    @staticmethod
    def head(summary: dict, res: ShiftReport) -> list[str]:
        return [f"{summary['verdict']}: {summary['headline']}",
                f"  model {summary['model']['uri']} (version {summary['model']['version']}), "
                f"{len(summary['batches'])} new batch(es), {res.n_target} rows, run {summary['sequence']}", ""]

    @staticmethod
    def tests(res: ShiftReport, names) -> list[str]:
        test = res.no_shift_test
        return ["", f"  no-shift test: statistic {test.statistic:.2f} on {test.dof} dof, p {format_p(test.p_value)}",
                "  " + _identifiability(res, "confusion condition", "  NOT TRUSTWORTHY: "),
                *[f"  note: {note}" for note in res.identifiability.notes],
                *([f"  rows that repeat: {res.repeats_summary}"] if res.repeats_summary else [])]

    @staticmethod
    def label_shift(res: ShiftReport, disagreeing) -> list[str]:
        lines = [f"  label-shift test: {res.label_shift_summary}"]
        if disagreeing is not None:
            lines += [f"    {r.name}: {100 * r.observed:.1f}% of target vs {100 * r.expected:.1f}% expected "
                      f"(z = {r.z:+.1f})" for r in disagreeing]
            lines.append("    the estimate below assumes label shift: NOT MEANINGFUL for these data")
        return [*lines, ""]

    @staticmethod
    def classes(res: ShiftReport, names) -> list[str]:
        ci = res.interval
        width = max(5, *(len(n) for n in names))
        interval_label = f"{ci.level:.0%} {ci.method}"
        return [f"  {'class':>{width}}  {'source':>8}  {'target':>8}  {interval_label:>19}  {'w':>7}",
                *[f"  {names[c]:>{width}}  {res.source_prior[c]:8.4f}  {res.target_prior[c]:8.4f}  "
                  f"[{ci.lower[c]:.4f}, {ci.upper[c]:.4f}]  {res.weights[c]:7.3f}" for c in range(res.n_classes)]]

    @staticmethod
    def cross_checks(res: ShiftReport) -> list[str]:
        return [f"  cross-check {method}: " + " ".join(f"{v:.4f}" for v in check.target_prior)
                for method, check in res.cross_check.items() if check.ok]

    @staticmethod
    def accuracy(res: ShiftReport, names) -> list[str]:
        acc = res.accuracy
        return [f"  {res.accuracy_summary}; corrected predictions {acc.corrected:.2f} "
                f"[{acc.corrected_lower:.2f}, {acc.corrected_upper:.2f}]"]

    @staticmethod
    def segments(segments: dict, names) -> list[str]:
        width = max(7, *(len(item["name"]) for item in segments["items"]))
        lines = ["", "  " + _segment_note(segments),
                 f"  {'segment':>{width}}  {'rows':>7}  {'verdict':<16} {'TV':>6}  {'no-shift p':>18}  "
                 f"{'label-shift p':>18}  expected accuracy"]
        for item in segments["items"]:
            rows, verdict, tv, p, lsp, acc = _segment_cells(item)
            lines.append(f"  {item['name']:>{width}}  {rows:>7}  {verdict:<16} {tv:>6}  {p:>18}  {lsp:>18}  {acc}")
        return lines

    @staticmethod
    def withheld(reason: str) -> list[str]:
        return []                        # said on the outputs line (:meth:`links`)

    @staticmethod
    def _held_lines(held) -> list[str]:
        return [f"  {kind} {item['key']}: {item['reason']}" for kind, item in held]

    def held(self, summary: dict, held) -> list[str]:
        return ["", f"  {len(summary.get('rejected', []))} batch(es) rejected (recorded in the watermark, not "
                    "counted, tried again once their content changes), "
                    f"{len(summary.get('skipped', []))} skipped (gone or replaced while the run read them):",
                *self._held_lines(held)]

    @staticmethod
    def warnings(warnings: list[str]) -> list[str]:
        return [f"  warning: {warning}" for warning in warnings]

    @staticmethod
    def links(summary: dict) -> list[str]:
        ml, cm = summary.get("mlflow", {}), summary.get("corrected_model")
        n = len(summary.get("outputs", []))
        return [*([f"  corrected model: {cm['model_uri']} (version {cm['version']}; docs/serving.md)"] if cm else []),
                "", "Where to look:", *_mlflow_lines(ml),
                f"  outputs:    {_corrected_files(n)} beside the batches under {summary['target']}"
                + (f" -- none written: {summary['outputs_withheld']}" if summary.get("outputs_withheld") else
                   " (NAME.corrected.npy or .corrected.parquet: p_t(y|x) per row; NAME.summary.json: this run's "
                   "summary; in a local folder each file's checksum in NAME....sha256 beside it)" if n else ""),
                f"  state:      {summary['target'].rstrip('/')}/_labelshift/ (the watermark: which batches are "
                "counted) -- docs/reestimation.md, \"Layout\""]


def _mlflow_lines(ml: dict) -> list[str]:
    """Where the run's MLflow record is: its page, or the ``mlflow ui`` command for a local store; the figure."""
    run_id, uri = ml.get("run_id"), ml.get("tracking_uri") or ""
    if not run_id:
        return []
    figure = "  figure:     figures/target_prior.png in the run's artifacts"
    if ml.get("ui"):
        return [f"  MLflow run: {ml['ui']}", figure]
    if uri.startswith("sqlite:"):
        return [f"  MLflow run: {run_id}; to browse it, `mlflow ui --backend-store-uri {uri}` and open "
                f"http://127.0.0.1:5000/#/experiments/{ml.get('experiment_id')}/runs/{run_id}", figure]
    return [f"  MLflow run: {run_id} ({uri or 'the default tracking store'})", figure]


def _corrected_files(n: int) -> str:
    return f"{n} corrected file{'' if n == 1 else 's'}"


#: the fronts
MARKDOWN = _Markdown()
PLAIN_TEXT = _PlainText()


def summary_markdown(summary: dict) -> str:
    """The Prefect artifact of a run: the verdict first, then the numbers behind it, then a table per class."""
    return render(summary, MARKDOWN)


def format_summary(summary: dict) -> str:
    """The summary as a plain-text table for the terminal."""
    return render(summary, PLAIN_TEXT)
