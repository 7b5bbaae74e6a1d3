"""Image datasets for the paper's Section 6 experiments, kept in an object store in one canonical layout.

* :mod:`.readers` -- readers for MNIST's idx files and CIFAR-10's python batches (own code, restricted unpickler);
* :mod:`.sources` -- the registry :data:`DATASETS` (mnist, fashion-mnist, cifar10, mnist-5k, digits): sources, splits,
  normalisation;
* :mod:`.layout` -- :func:`push_dataset` / :func:`load_dataset`: arrays plus a manifest, verified on every read.

Typical use::

    from labelshift.storage import open_store
    from labelshift.experiments.datasets import push_dataset, load_dataset

    store = open_store("s3://bucket/data")
    push_dataset("mnist-5k", store, "mnist-5k")
    ds = load_dataset(store, "mnist-5k", expected_name="mnist-5k")
    ds.train.x.shape   # (3000, 28, 28) uint8
"""
from .layout import (FORMAT_VERSION, MANIFEST, SPLITS, Dataset, Split, build_splits, dataset_fingerprint,
                     load_dataset, push_dataset, read_manifest)
from .readers import (parse_cifar_batch, parse_idx, read_cifar10_folder, read_cifar_batch, read_idx,
                      read_mnist_folder, read_mnist_pair)
from .sources import DATASETS, DatasetSpec, get_spec, stratified_split

__all__ = [
    "DATASETS", "Dataset", "DatasetSpec", "FORMAT_VERSION", "MANIFEST", "SPLITS", "Split", "build_splits",
    "dataset_fingerprint",
    "get_spec", "load_dataset", "parse_cifar_batch", "parse_idx", "push_dataset", "read_cifar10_folder",
    "read_cifar_batch", "read_idx", "read_manifest", "read_mnist_folder", "read_mnist_pair", "stratified_split",
]
