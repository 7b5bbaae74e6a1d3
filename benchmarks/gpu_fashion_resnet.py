"""ResNet-18 on Fashion-MNIST on a lent GPU: the training path of ``labelshift reproduce`` (the registry's ResNet-18,
``labelshift.experiments.training.train``, mixed precision on CUDA) trained on the 50,000 training images, then its
logits on the validation, test and shifted test images (:mod:`real_networks`), saved for the statistics' benchmark
(``bench_real_networks.py`` reads ``fashion_resnet18_outputs.npz`` as a third real network).

    python benchmarks/gpu_fashion_resnet.py --data DIR       # DIR holds Fashion-MNIST's four idx(.gz) files

Writes ``$OUT/fashion_resnet18_outputs.npz`` (or ./fashion_resnet18_outputs.npz) and prints the accuracy, the time
and a JSON line. Without CUDA it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the idx files")
    parser.add_argument("--epochs", type=int, default=None, help="override the 15 epochs of real_networks.SETTINGS")
    args = parser.parse_args(argv)
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    import real_networks

    if args.epochs:
        real_networks.SETTINGS["resnet18"]["epochs"] = args.epochs
    t0 = time.perf_counter()
    out = real_networks.network_outputs("resnet18", device="cuda", folder=Path(args.data),
                                        log=lambda s: print(s, flush=True))
    dest = Path(os.environ.get("OUT", ".")) / "fashion_resnet18_outputs.npz"
    np.savez_compressed(dest, **out)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "epochs": real_networks.SETTINGS["resnet18"]["epochs"],
                      "test_accuracy": round(float(out["test_accuracy"]), 4),
                      "train_seconds": round(float(out["train_seconds"]), 1),
                      "total_seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
