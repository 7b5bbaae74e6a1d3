"""A small registered classifier with a known truth, for the re-estimation tests.

Three classes of 2-D unit-variance Gaussians with means on a circle. The "network" is a torch ``nn.Linear`` whose
weights are set to the Bayes log-posterior (for N(mu_y, I) classes and source prior p_s,
log p_s(y|x) = mu_y . x - |mu_y|^2 / 2 + log p_s(y) + const), so its softmax is exactly p_s(y|x): canonically
calibrated, MLLS is consistent, and the intervals' coverage can be checked against the true target prior.
It is registered in MLflow like a deployed model (``mlflow.pytorch.log_model``, pt2 with a tensor signature), with
a BCTS calibrator fit on a labelled source holdout and that holdout logged beside it
(:func:`labelshift_mlflow.artifacts.log_reestimation_reference`).
"""
from __future__ import annotations

import io

import numpy as np

K = 3
RADIUS = 2.0
MEANS = RADIUS * np.stack([np.cos(2 * np.pi * np.arange(K) / K), np.sin(2 * np.pi * np.arange(K) / K)], axis=1)
SOURCE_PRIOR = np.array([0.4, 0.35, 0.25])
SHIFTED_PRIOR = np.array([0.15, 0.25, 0.6])


def draw(prior, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """m points of the mixture with class prior ``prior``: float32 inputs (m, 2) and labels (m,)."""
    y = rng.choice(K, size=m, p=prior)
    x = MEANS[y] + rng.standard_normal((m, 2))
    return x.astype(np.float32), y


def bayes_logits(x: np.ndarray) -> np.ndarray:
    return x @ MEANS.T - 0.5 * (MEANS ** 2).sum(axis=1) + np.log(SOURCE_PRIOR)


def register_model(tracking_uri: str, name: str, *, alias: str = "production", n_holdout: int = 4000,
                   seed: int = 0, experiment: str = "models", calibrator_classes: int | None = None,
                   trusted: bool = True) -> dict:
    """Register the Bayes classifier as ``name`` (alias ``alias``) with BCTS and its source holdout.

    ``calibrator_classes``: log a calibrator fit for that many classes instead (to test the mismatch check).
    ``trusted``: record the version's digest, as the project does for the versions it registers
    (:func:`labelshift_mlflow.trusted.record_digest`); False leaves it as a version registered by other means.
    Returns {"model_uri", "version", "run_id"}.
    """
    import mlflow
    import torch
    from mlflow import MlflowClient

    from labelshift.calibration import BCTS
    from labelshift_mlflow.artifacts import log_reestimation_reference

    rng = np.random.default_rng(seed)
    net = torch.nn.Linear(2, K)
    with torch.no_grad():
        net.weight.copy_(torch.tensor(MEANS, dtype=torch.float32))
        net.bias.copy_(torch.tensor(-0.5 * (MEANS ** 2).sum(axis=1) + np.log(SOURCE_PRIOR), dtype=torch.float32))
    x, y = draw(SOURCE_PRIOR, n_holdout, rng)
    with torch.no_grad():
        logits = net(torch.from_numpy(x)).numpy().astype(np.float64)
    client = MlflowClient(tracking_uri=tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        # a SQLite store keeps the artifacts beside its database (not in ./mlruns of the working folder)
        location = None
        if tracking_uri.startswith("sqlite:///"):
            from pathlib import Path

            location = (Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
        exp_id = client.create_experiment(experiment, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    run_id = client.create_run(exp_id, run_name=f"train-{name}").info.run_id
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(net, name="model", registered_model_name=name, input_example=x[:8],
                                        serialization_format="pt2", await_registration_for=60)
    if calibrator_classes is None:
        cal = BCTS(input_kind="logits").fit(logits, y)
        log_reestimation_reference(client, run_id, cal, logits, y)
    else:
        other = rng.standard_normal((200, calibrator_classes))
        cal = BCTS(input_kind="logits").fit(other, np.arange(200) % calibrator_classes)
        log_reestimation_reference(client, run_id, cal, logits, y)
    client.set_terminated(run_id)
    version = str(info.registered_model_version)
    if trusted:
        from labelshift_mlflow.trusted import record_digest

        record_digest(client, name, version)
    client.set_registered_model_alias(name, alias, version)
    return {"model_uri": f"models:/{name}@{alias}", "version": version, "run_id": run_id}


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()
