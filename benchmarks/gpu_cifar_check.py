"""GPU check of the CIFAR-10 training path: ResNet-18 (CIFAR form) on synthetic CIFAR-shaped data.

For a lent GPU machine without internet (so no real CIFAR-10): it builds 50,000 random 3x32x32 uint8 images whose
classes differ by a faint per-class colour tint (so the loss has something to learn), trains the ResNet-18 of
``labelshift.experiments.models`` with ``labelshift.experiments.training.train`` -- the same code path as real CIFAR-10
runs: mixed precision (float16 autocast + GradScaler), channels-last, SGD 0.1 / cosine, crop + flip augmentation on the
GPU -- and prints the time per epoch, images per second and peak GPU memory, then times ``predict_logits`` on 10,000
images. The first epoch includes cuDNN's autotuning; the later epochs are the steady state.

    python benchmarks/gpu_cifar_check.py                 # 2 epochs of 50,000 images, batch 128
    python benchmarks/gpu_cifar_check.py --epochs 1 --batch-size 512

On a machine without CUDA it prints a message and exits 0 at once. A JSON summary is printed last (and written to
``$OUT/gpu_cifar_check.json`` when ``$OUT`` is set). From the steady-state epoch time, a full CIFAR-10 run with
the defaults of ``labelshift.experiments.training.TRAINING_DEFAULTS['cifar10']`` (40 epochs of 40,000 images) takes
about 40 * 0.8 * (seconds per epoch here).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def synthetic_cifar(n: int, n_classes: int = 10, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    tint = rng.integers(-24, 25, size=(n_classes, 3, 1, 1))  # a weak class signal under the noise
    x = rng.integers(64, 192, size=(n, 3, 32, 32), dtype=np.int16) + tint[y]
    return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--n", type=int, default=50_000, help="training images (CIFAR-10 has 50,000)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--no-amp", action="store_true", help="train in float32 instead of mixed precision")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_cifar_check: no CUDA GPU here (torch.cuda.is_available() is False); nothing to measure.")
        return 0

    from labelshift.experiments.models import build_model
    from labelshift.experiments.training import predict_logits, train

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    print(f"device: {props.name}, {props.total_memory / 2**30:.1f} GiB; torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}", flush=True)

    t0 = time.perf_counter()
    x, y = synthetic_cifar(args.n)
    x_test, y_test = synthetic_cifar(10_000, seed=1)
    print(f"synthetic data: {x.shape} uint8 in {time.perf_counter() - t0:.1f} s", flush=True)

    model = build_model("resnet18", 10, 3, 32, mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                        seed=0)
    torch.cuda.reset_peak_memory_stats(device)

    def report(epoch, m):
        print(f"epoch {epoch}/{args.epochs}: {m['seconds']:.2f} s, {m['images_per_s']:,.0f} images/s, "
              f"loss {m['train_loss']:.4f}, train accuracy {m['train_accuracy']:.3f}, "
              f"peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB", flush=True)

    t0 = time.perf_counter()
    result = train(model, x, y, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=0, device=device,
                   optimizer="sgd", momentum=0.9, weight_decay=5e-4, schedule="cosine", augment="crop-flip",
                   crop_padding=4, amp=not args.no_amp, on_epoch=report)
    total = time.perf_counter() - t0

    torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    logits = predict_logits(result.model, x_test, batch_size=1024, device=device)
    predict_s = time.perf_counter() - t1
    test_acc = float((logits.argmax(1) == y_test).mean())

    epochs = result.history
    steady = epochs[-1]["seconds"] if len(epochs) > 1 else epochs[0]["seconds"]
    summary = {
        "device": props.name,
        "torch": torch.__version__,
        "amp": not args.no_amp,
        "batch_size": args.batch_size,
        "images_per_epoch": args.n,
        "epoch_seconds": [round(h["seconds"], 3) for h in epochs],
        "images_per_s_steady": round(args.n / steady, 1),
        "train_total_s": round(total, 2),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3),
        "final_train_loss": round(epochs[-1]["train_loss"], 4),
        "synthetic_test_accuracy": round(test_acc, 4),
        "predict_10k_s": round(predict_s, 3),
        "estimated_cifar10_default_run_s": round(40 * 0.8 * steady * 50_000 / args.n, 1),
    }
    print(json.dumps(summary), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_cifar_check.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
