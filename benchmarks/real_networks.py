"""Real networks on real images for the statistics' benchmarks: train a network on Fashion-MNIST and keep its logits
on the validation images (the holdout pool), the test images (the target pool) and the test images shifted in
their look (the violations of label shift the label-shift test must see).

Fashion-MNIST comes from Debian's ``dataset-fashion-mnist`` (/usr/share/datasets/fashion-mnist, MNIST's idx format;
``make setup`` installs it), split as the ``fashion-mnist`` dataset of the registry does: 50,000 training and
10,000 validation images of the 60,000 (stratified, seed 0), the 10,000 test images as the target pool.

Networks: ``mlp`` (784-256-10, ReLU; 8 epochs of Adam, CPU), ``lenet`` (the registry's LeNet; 8 epochs of Adam,
CPU), ``resnet18`` (the registry's ResNet-18 in its CIFAR form; 15 epochs of SGD with crop augmentation, for a GPU:
``benchmarks/gpu_fashion_resnet.py``).

Image shifts of the 10,000 test images (uint8 pixels): ``darker`` (x 0.5), ``noisier`` (+ N(0, 40^2), clipped),
``rotated`` (20 degrees, bilinear), ``class-look`` (the T-shirt/top images, class 0, turned upside down; the other
classes as they are: one class's look changed).

    outputs = network_outputs("mlp")            # a dict of arrays: valid_logits, valid_labels, test_logits, ...
    np.savez(path, **outputs)
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
SHIFTS = ("darker", "noisier", "rotated", "class-look")
MEAN, STD = 0.2860, 0.3530          # Fashion-MNIST's training pixels (the registry's values)
SETTINGS = {
    "mlp": dict(epochs=8, batch_size=128, lr=1e-3, optimizer="adam", schedule="cosine", augment="none"),
    "lenet": dict(epochs=8, batch_size=128, lr=1e-3, optimizer="adam", schedule="cosine", augment="none"),
    "resnet18": dict(epochs=15, batch_size=128, lr=0.05, optimizer="sgd", momentum=0.9, weight_decay=5e-4,
                     schedule="cosine", augment="crop", crop_padding=2),
}


def fashion_splits(folder: Path = FASHION_DIR, seed: int = 0):
    """((train x, y), (valid x, y), (test x, y)): 50,000 / 10,000 stratified of the training file, the test file."""
    from labelshift.experiments.datasets.readers import read_mnist_folder

    data = read_mnist_folder(folder)
    x, y = data["train"]
    rng = np.random.default_rng(seed)
    valid = np.concatenate([rng.choice(np.flatnonzero(y == c), int(round(np.sum(y == c) / 6)), replace=False)
                            for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), valid)
    return (x[train], y[train]), (x[valid], y[valid]), data["test"]


def shifted_images(x: np.ndarray, y: np.ndarray, name: str, seed: int = 0) -> np.ndarray:
    """The test images (N, 28, 28) uint8 with the look changed as ``name`` says (module docstring)."""
    from scipy.ndimage import rotate

    xf = x.astype(np.float32)
    if name == "darker":
        out = xf * 0.5
    elif name == "noisier":
        out = xf + np.random.default_rng(seed).normal(0.0, 40.0, size=x.shape)
    elif name == "rotated":
        out = rotate(xf, 20.0, axes=(1, 2), reshape=False, order=1, mode="constant", cval=0.0)
    elif name == "class-look":
        out = xf.copy()
        out[y == 0] = out[y == 0][:, ::-1, :]
    else:
        raise ValueError(f"unknown shift {name!r}; one of {SHIFTS}")
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _mlp():
    from torch import nn

    from labelshift.experiments.models import Standardize

    return nn.Sequential(Standardize([MEAN], [STD]), nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def build(name: str, seed: int = 0):
    """The untrained network ``name`` (``mlp``, ``lenet`` or ``resnet18``) for 1 x 28 x 28 images."""
    import torch

    from labelshift.experiments.models import build_model

    if name == "mlp":
        torch.manual_seed(seed)
        return _mlp()
    return build_model(name, 10, 1, 28, mean=[MEAN], std=[STD], seed=seed)


def network_outputs(name: str, device: str | None = None, folder: Path = FASHION_DIR, log=print) -> dict:
    """Train ``name`` on the 50,000 training images and return its logits (float32) on the validation and test
    images and on each shift of the test images, with the labels, the test accuracy and the training time."""
    from labelshift.experiments.training import accuracy, predict_logits, train

    (xtr, ytr), (xva, yva), (xte, yte) = fashion_splits(folder)
    t0 = time.perf_counter()
    result = train(build(name), xtr, ytr, seed=0, device=device, valid=(xva, yva),
                   on_epoch=lambda e, m: log(f"{name} epoch {e}: valid accuracy {m.get('valid_accuracy', 0):.4f}"),
                   **SETTINGS[name])
    seconds = time.perf_counter() - t0
    model = result.model
    out = {"valid_logits": predict_logits(model, xva, device=device), "valid_labels": yva.astype(np.int64),
           "test_logits": predict_logits(model, xte, device=device), "test_labels": yte.astype(np.int64)}
    for shift in SHIFTS:
        out[f"{shift}_logits"] = predict_logits(model, shifted_images(xte, yte, shift), device=device)
    out = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in out.items()}
    out["test_accuracy"] = np.array(accuracy(out["test_logits"], yte))
    out["train_seconds"] = np.array(seconds)
    log(f"{name}: test accuracy {float(out['test_accuracy']):.4f}, trained in {seconds:.0f} s")
    return out


def load_pools(path: str, holdout: str = "valid", target: str = "test"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(holdout-pool logits, labels, target-pool logits, labels) from a saved outputs file; ``holdout`` is ``valid``
    or ``test``, ``target`` is ``test`` or a shift's name (the test images, shifted). Cached per process."""
    key = (path, holdout, target)
    if key not in _CACHE:
        with np.load(path) as d:
            _CACHE[key] = (d[f"{holdout}_logits"].astype(np.float64), d[f"{holdout}_labels"],
                           d[f"{target}_logits"].astype(np.float64), d["test_labels"])
    return _CACHE[key]


_CACHE: dict = {}
