"""Training loop, prediction and checkpoints for the black-box predictors (Section 6 of the paper).

Plain PyTorch with no orchestration: the Prefect task around it logs the per-epoch metrics that :func:`train`
hands to its ``on_epoch`` callback.

* Device: CUDA when ``torch.cuda.is_available()`` (with mixed precision: ``torch.autocast`` in float16 plus a
  ``GradScaler``, channels-last memory), the CPU otherwise; ``device=`` overrides.
* Inputs: the uint8 images of :mod:`labelshift.experiments.datasets` ((N, H, W) or (N, C, H, W)), divided by 255 on the
  fly; the per-channel mean/std standardisation is the model's first layer
  (:class:`labelshift.experiments.models.Standardize`). Float inputs are taken as already scaled to [0, 1].
* Seeding: ``seed`` fixes the shuffling, the augmentation and any randomness inside the model (dropout), without
  touching the caller's global random state; the initial weights are fixed by ``build_model(..., seed=)``.
  On the CPU two runs with the same seeds give identical weights; on CUDA they agree up to cuDNN's
  non-deterministic kernels unless ``deterministic=True``.
* Optimiser: Adam or SGD with momentum (Nesterov), a per-step cosine learning-rate decay to 0 (or a constant
  rate), optional augmentation: ``"crop"`` (random translation by up to ``crop_padding`` pixels, zero fill) or
  ``"crop-flip"`` (that plus horizontal flips: the standard CIFAR-10 augmentation). :data:`TRAINING_DEFAULTS`
  holds the settings chosen per dataset.
* Checkpoints: ``torch.save`` of a dict of plain tensors and JSON strings, read back with
  ``torch.load(..., weights_only=True)`` so loading never runs pickled code.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import FormatError, InputError, ObjectNotFoundError

logger = logging.getLogger("labelshift.experiments.training")

CHECKPOINT_FORMAT = "labelshift-checkpoint"
CHECKPOINT_VERSION = 1

#: Training settings per dataset (keyword arguments of :func:`train`). ``mnist-5k`` is sized for a CPU budget of
#: under 2 minutes on 2 cores; ``fashion-mnist`` (LeNet on 50,000 images) for about 8 s an epoch on 2 idle cores
#: (benchmarks/README.md, "Fashion-MNIST at full scale"); ``cifar10`` is the usual ResNet-18 recipe (SGD 0.1,
#: momentum 0.9, weight decay 5e-4, cosine decay, crop + flip) shortened to 40 epochs for a GPU.
TRAINING_DEFAULTS: dict[str, dict] = {
    "mnist-5k": dict(epochs=20, batch_size=64, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="cosine",
                     augment="crop", crop_padding=2),
    "digits": dict(epochs=30, batch_size=32, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="cosine",
                   augment="none"),
    "mnist": dict(epochs=10, batch_size=128, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="cosine",
                  augment="crop", crop_padding=2),
    "fashion-mnist": dict(epochs=10, batch_size=128, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="cosine",
                          augment="crop", crop_padding=2),
    "cifar10": dict(epochs=40, batch_size=128, lr=0.1, optimizer="sgd", momentum=0.9, weight_decay=5e-4,
                    schedule="cosine", augment="crop-flip", crop_padding=4),
}


def training_defaults(dataset: str) -> dict:
    """A copy of :data:`TRAINING_DEFAULTS` for ``dataset`` (the ``mnist`` settings for unknown names)."""
    return dict(TRAINING_DEFAULTS.get(dataset, TRAINING_DEFAULTS["mnist"]))


class TrainingResult(NamedTuple):
    """What :func:`train` returns: the trained model (in eval mode) and one metrics dict per epoch."""

    model: nn.Module
    history: list[dict]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a torch.device; None means CUDA when available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("device='cuda' was asked for but no CUDA GPU is available; pass device=None or 'cpu'.")
    return device


def images_to_tensor(x, name: str = "x") -> torch.Tensor:
    """(N, H, W) or (N, C, H, W) images as a (N, C, H, W) tensor: uint8 stays uint8, floats become float32."""
    arr = np.asarray(x)
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4:
        raise InputError(f"{name} must hold images of shape (N, H, W) or (N, C, H, W), got shape {np.shape(x)}.")
    if arr.shape[0] == 0:
        raise InputError(f"{name} is empty.")
    if arr.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(arr))
    if not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"{name} must be uint8 images (0..255) or floats in [0, 1], got dtype {arr.dtype}.")
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


def _to_unit(xb: torch.Tensor) -> torch.Tensor:
    return xb.float().div_(255.0) if xb.dtype == torch.uint8 else xb.float()


def _augment(xb: torch.Tensor, mode: str | None, padding: int, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to ``padding`` pixels (zero fill), plus horizontal flips for ``crop-flip``."""
    if not mode or mode == "none":
        return xb
    b, c, h, w = xb.shape
    if padding > 0:
        padded = F.pad(xb, (padding, padding, padding, padding))
        off = torch.randint(0, 2 * padding + 1, (2, b), generator=gen).to(xb.device)
        rows = (off[0][:, None] + torch.arange(h, device=xb.device))[:, None, :, None]
        cols = (off[1][:, None] + torch.arange(w, device=xb.device))[:, None, None, :]
        batch = torch.arange(b, device=xb.device)[:, None, None, None]
        chan = torch.arange(c, device=xb.device)[None, :, None, None]
        xb = padded[batch, chan, rows, cols]
    if mode == "crop-flip":
        flip = (torch.rand(b, generator=gen) < 0.5).to(xb.device)
        xb = torch.where(flip[:, None, None, None], xb.flip(3), xb)
    return xb


def _check_labels(y, n: int, name: str) -> torch.Tensor:
    arr = np.asarray(y)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{name} must be {n} integer labels, got {arr.dtype} array of shape {arr.shape}.")
    if arr.size and arr.min() < 0:
        raise InputError(f"{name} has negative labels.")
    return torch.from_numpy(arr.astype(np.int64))


def _n_outputs(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return int(config["n_classes"]) if isinstance(config, dict) and "n_classes" in config else None


@torch.no_grad()
def _forward_all(model: nn.Module, x: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    model.eval()
    channels_last = device.type == "cuda"
    out = []
    for i in range(0, x.shape[0], batch_size):
        xb = _to_unit(x[i:i + batch_size].to(device, non_blocking=True))
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        out.append(model(xb).float())
    return torch.cat(out)


def predict_logits(model: nn.Module, x, batch_size: int = 512, device: str | torch.device | None = None) \
        -> np.ndarray:
    """Logits of ``model`` on images ``x`` (uint8 (N, H, W) / (N, C, H, W), or floats in [0, 1]).

    Runs in eval mode in full float32 precision (no autocast: calibration needs accurate logits) on ``device``
    (CUDA when available by default). Returns a float32 array of shape (N, n_classes).
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be positive, got {batch_size}.")
    device = resolve_device(device)
    xt = images_to_tensor(x)
    model.to(device)
    return _forward_all(model, xt, batch_size, device).cpu().numpy().astype(np.float32, copy=False)


def _make_optimizer(model: nn.Module, optimizer: str, lr: float, momentum: float, weight_decay: float):
    if optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=momentum > 0)
    raise InputError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}.")


class _Trainer(NamedTuple):
    """What one epoch of :func:`train` works with: the model and its optimiser, schedule and scaler, the training
    rows on the device and the batch settings."""
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    gen: torch.Generator
    x_dev: torch.Tensor
    y_dev: torch.Tensor
    device: torch.device
    on_cuda: bool
    amp: bool
    batch_size: int
    augment: str | None
    crop_padding: int


def _check_training_settings(epochs, batch_size, lr, schedule, augment) -> None:
    """InputError unless epochs and batch_size are positive, lr a positive number, schedule and augment known."""
    if int(epochs) < 1 or int(batch_size) < 1:
        raise InputError(f"epochs and batch_size must be positive, got {epochs} and {batch_size}.")
    if not (lr > 0 and math.isfinite(lr)):
        raise InputError(f"lr must be a positive number, got {lr}.")
    if schedule not in ("cosine", "constant"):
        raise InputError(f"schedule must be 'cosine' or 'constant', got {schedule!r}.")
    if augment not in (None, "none", "crop", "crop-flip"):
        raise InputError(f"augment must be None, 'none', 'crop' or 'crop-flip', got {augment!r}.")


def _schedule(opt, schedule: str, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule per step: cosine to 0 at ``total_steps``, or constant."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, (lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
        if schedule == "cosine" else (lambda s: 1.0))


def _train_epoch(tr: _Trainer, n: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One pass over the n training rows in a fresh random order, one optimiser step per batch. Returns (the sum
    of the batch losses times their sizes, the rows predicted right, the rows seen)."""
    device = tr.device
    tr.model.train()
    perm = torch.randperm(n, generator=tr.gen).to(device)
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    seen = 0
    for i in range(0, n, tr.batch_size):
        idx = perm[i:i + tr.batch_size]
        if idx.numel() < 2 and n >= 2:
            continue  # a batch of one breaks BatchNorm; its example comes back next epoch
        xb = _augment(_to_unit(tr.x_dev[idx]), tr.augment, tr.crop_padding, tr.gen)
        if tr.on_cuda:
            xb = xb.contiguous(memory_format=torch.channels_last)
        yb = tr.y_dev[idx]
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=tr.amp):
            logits = tr.model(xb)
            loss = F.cross_entropy(logits.float(), yb)
        tr.opt.zero_grad(set_to_none=True)
        tr.scaler.scale(loss).backward()
        tr.scaler.step(tr.opt)
        tr.scaler.update()
        tr.sched.step()
        loss_sum += loss.detach().double() * idx.numel()
        correct += (logits.detach().argmax(1) == yb).sum()
        seen += idx.numel()
    return loss_sum, correct, seen


def _epoch_metrics(tr: _Trainer, epoch: int, loss_sum, correct, seen: int, lr: float, valid, eval_batch_size: int,
                   start: float) -> dict:
    """The metrics of an epoch (train loss and accuracy, lr, validation loss and accuracy with ``valid`` = (x, y),
    seconds, images per second); FloatingPointError when the loss diverged."""
    train_loss = float(loss_sum) / max(seen, 1)
    if not math.isfinite(train_loss):
        raise FloatingPointError(
            f"training diverged at epoch {epoch} (loss {train_loss}); lower lr (now {lr}).")
    metrics = {"epoch": epoch, "train_loss": train_loss, "train_accuracy": float(correct) / max(seen, 1),
               "lr": tr.opt.param_groups[0]["lr"]}
    if valid is not None:
        vlogits = _forward_all(tr.model, valid[0], eval_batch_size, tr.device)
        vyd = valid[1].to(tr.device)
        metrics["valid_loss"] = float(F.cross_entropy(vlogits, vyd))
        metrics["valid_accuracy"] = float((vlogits.argmax(1) == vyd).float().mean())
    if tr.on_cuda:
        torch.cuda.synchronize(tr.device)
    metrics["seconds"] = time.perf_counter() - start
    metrics["images_per_s"] = seen / metrics["seconds"] if metrics["seconds"] > 0 else float("nan")
    return metrics


def train(model: nn.Module, train_x, train_y, *, epochs: int, batch_size: int, lr: float, seed: int,
          device: str | torch.device | None = None, valid: tuple | None = None,
          on_epoch: Callable[[int, dict], None] | None = None, optimizer: str = "adam", momentum: float = 0.9,
          weight_decay: float = 0.0, schedule: str = "cosine", augment: str | None = None, crop_padding: int = 4,
          amp: bool | None = None, deterministic: bool = False, eval_batch_size: int = 1024) -> TrainingResult:
    """Train ``model`` by minimising the cross-entropy on (``train_x``, ``train_y``).

    Args:
        model: a module from :func:`labelshift.experiments.models.build_model` (any module mapping [0, 1] images to
            logits).
        train_x: uint8 images (N, H, W) or (N, C, H, W) (floats in [0, 1] also accepted); train_y: N int labels.
        epochs, batch_size, lr: the usual; ``lr`` is the peak rate of the cosine schedule.
        seed: fixes shuffling, augmentation and in-model randomness (see the module docstring).
        device: None for CUDA when available, else the CPU.
        valid: optional (x, y) evaluated after every epoch (``valid_loss``, ``valid_accuracy``).
        on_epoch: called as ``on_epoch(epoch, metrics)`` after each epoch (epochs count from 1).
        optimizer: ``"adam"`` or ``"sgd"`` (with Nesterov momentum ``momentum``); weight_decay: L2 penalty.
        schedule: ``"cosine"`` (per step, to 0 at the end) or ``"constant"``.
        augment: None / ``"none"``, ``"crop"`` or ``"crop-flip"``; crop_padding: largest shift in pixels.
        amp: mixed precision (float16 autocast + GradScaler); None means on for CUDA, off on the CPU.
        deterministic: on CUDA, use deterministic cuDNN kernels (slower); the CPU is deterministic anyway.

    Returns:
        :class:`TrainingResult` (model, history): the model in eval mode, still on ``device``; ``history`` has one
        dict per epoch with ``epoch``, ``train_loss``, ``train_accuracy``, ``lr``, ``seconds``, ``images_per_s``
        and, with ``valid``, ``valid_loss`` and ``valid_accuracy``.
    """
    _check_training_settings(epochs, batch_size, lr, schedule, augment)
    device = resolve_device(device)
    x_all = images_to_tensor(train_x, "train_x")
    y_all = _check_labels(train_y, x_all.shape[0], "train_y")
    n_out = _n_outputs(model)
    if n_out is not None and int(y_all.max()) >= n_out:
        raise InputError(f"train_y has label {int(y_all.max())} but the model has {n_out} outputs.")
    if valid is not None:
        vx = images_to_tensor(valid[0], "valid x")
        valid = (vx, _check_labels(valid[1], vx.shape[0], "valid y"))
    n = x_all.shape[0]
    on_cuda = device.type == "cuda"
    amp = on_cuda if amp is None else bool(amp) and on_cuda

    model.to(device)
    if on_cuda:
        model.to(memory_format=torch.channels_last)
    x_dev, y_dev = x_all.to(device), y_all.to(device)  # uint8 on the device: 150 MB for all of CIFAR-10
    opt = _make_optimizer(model, optimizer, lr, momentum, weight_decay)
    total_steps = int(epochs) * max(1, math.ceil(n / batch_size))
    tr = _Trainer(model=model, opt=opt, sched=_schedule(opt, schedule, total_steps),
                  scaler=torch.amp.GradScaler("cuda", enabled=amp), gen=torch.Generator().manual_seed(int(seed)),
                  x_dev=x_dev, y_dev=y_dev, device=device, on_cuda=on_cuda, amp=amp, batch_size=batch_size,
                  augment=augment, crop_padding=crop_padding)
    history: list[dict] = []

    cudnn_flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    if on_cuda:
        torch.backends.cudnn.benchmark = not deterministic
        torch.backends.cudnn.deterministic = bool(deterministic)
    fork_devices = [device.index or 0] if on_cuda else []
    try:
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(int(seed))
            for epoch in range(1, int(epochs) + 1):
                start = time.perf_counter()
                loss_sum, correct, seen = _train_epoch(tr, n)
                metrics = _epoch_metrics(tr, epoch, loss_sum, correct, seen, lr, valid, eval_batch_size, start)
                history.append(metrics)
                logger.info("epoch %d/%d %s", epoch, epochs, " ".join(
                    f"{k}={v:.4g}" for k, v in metrics.items() if k != "epoch"))
                if on_epoch is not None:
                    on_epoch(epoch, dict(metrics))
    finally:
        if on_cuda:
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn_flags
    model.eval()
    return TrainingResult(model, history)


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(model: nn.Module, path: str | os.PathLike | io.IOBase, meta: dict | None = None) -> None:
    """Save ``model``'s weights, its ``config`` (to rebuild it) and JSON-able ``meta`` to ``path`` (a file path
    or a writable binary file object, e.g. ``io.BytesIO`` to push the bytes to a store)."""
    config = getattr(model, "config", None)
    if not isinstance(config, dict) or "name" not in config:
        raise InputError("model has no 'config'; build it with labelshift.experiments.models.build_model to checkpoint it.")
    try:
        meta_json = json.dumps(meta if meta is not None else {}, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"meta must be JSON-serialisable ({exc}).") from None
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": json.dumps(config, sort_keys=True),
        "meta": meta_json,
        "state_dict": {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()},
    }
    torch.save(payload, path)


def checkpoint_bytes(model: nn.Module, meta: dict | None = None) -> bytes:
    """:func:`save_checkpoint` into bytes (for ``store.put_bytes``)."""
    buf = io.BytesIO()
    save_checkpoint(model, buf, meta)
    return buf.getvalue()


def load_checkpoint(path: str | os.PathLike | io.IOBase | bytes, device: str | torch.device = "cpu") \
        -> tuple[nn.Module, dict]:
    """Rebuild a model saved by :func:`save_checkpoint`; returns (model in eval mode on ``device``, meta).

    Reads with ``torch.load(..., weights_only=True)``. ``path`` may also be the checkpoint's bytes.
    """
    from .models import build_model

    source = io.BytesIO(path) if isinstance(path, (bytes, bytearray)) else path
    where = "<bytes>" if isinstance(path, (bytes, bytearray)) else str(path)
    try:
        payload = torch.load(source, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ObjectNotFoundError(f"no checkpoint at {where}.") from None
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError... for bad files
        raise FormatError(f"{where}: not a readable checkpoint ({type(exc).__name__}: {exc}).") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise FormatError(f"{where}: not a labelshift checkpoint (save it with labelshift.experiments.training.save_checkpoint).")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise FormatError(f"{where}: checkpoint version {payload.get('version')!r}, this labelshift reads "
                          f"{CHECKPOINT_VERSION}; retrain or re-save the model.")
    config = json.loads(payload["config"])
    model = build_model(config.pop("name"), **config)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise FormatError(f"{where}: weights do not fit the {model.config['name']} model ({exc}).") from None
    model.to(resolve_device(device)).eval()
    return model, json.loads(payload["meta"])


def accuracy(logits: np.ndarray, y) -> float:
    """Share of rows whose argmax equals the label."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(y)))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Temporarily set ``torch.set_num_threads(n)`` (no-op for None)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
