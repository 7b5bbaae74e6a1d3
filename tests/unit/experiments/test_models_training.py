"""Models (shapes, layer sizes, seeding), the training loop (loss goes down, determinism, callbacks, augmentation),
prediction and checkpoints. CPU only, tiny subsets of the bundled ``digits``."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from labelshift.experiments.datasets import build_splits
from labelshift.errors import FormatError, InputError, ObjectNotFoundError
from labelshift.experiments.models import LeNet, ResNet18, build_model, lenet_padding
from labelshift.experiments.training import (_augment, checkpoint_bytes, load_checkpoint, predict_logits,
                                             save_checkpoint, train, training_defaults)


@pytest.fixture(scope="module")
def digits():
    arrays, manifest = build_splits("digits")
    return arrays, manifest


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def cross_entropy(logits, y):
    z = logits - logits.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


# ------------------------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("name,channels,size", [("lenet", 1, 28), ("lenet", 1, 8), ("lenet", 3, 32),
                                                ("resnet18", 3, 32), ("resnet18", 1, 28)])
def test_output_shapes(name, channels, size):
    model = build_model(name, 10, channels, size, seed=0).eval()
    with torch.no_grad():
        out = model(torch.rand(2, channels, size, size))
    assert out.shape == (2, 10) and out.dtype == torch.float32


def test_lenet_layer_sizes_follow_lipton_et_al():
    # conv 20@5x5 (520), conv 50@5x5 (25,050), dense 800->256 (205,056), dense 256->10 (2,570) on 28x28
    assert n_params(build_model("lenet", 10, 1, 28)) == 520 + 25_050 + 205_056 + 2_570
    assert lenet_padding(28) == 0 and lenet_padding(32) == 0 and lenet_padding(8) == 2
    # 8x8 with 'same' padding: 8 -> 8 -> 4 -> 4 -> 2, so the dense layer sees 50 * 2 * 2 features
    small = build_model("lenet", 10, 1, 8)
    assert small.classifier[1].in_features == 200 and small.features[0].padding == (2, 2)


def test_resnet18_is_the_cifar_variant():
    model = build_model("resnet18", 10, 3, 32)
    assert isinstance(model, ResNet18)
    stem = model.stem[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1) and stem.out_channels == 64
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert [len(s) for s in model.stages] == [2, 2, 2, 2]
    assert [s[0].conv1.out_channels for s in model.stages] == [64, 128, 256, 512]
    # 11,173,962 weights: the CIFAR ResNet-18 of kuangliu/pytorch-cifar used in the paper
    assert n_params(model) == 11_173_962


def test_build_model_seed_and_normalisation():
    state = torch.random.get_rng_state()
    a, b = build_model("lenet", 10, 1, 28, seed=7), build_model("lenet", 10, 1, 28, seed=7)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's random state is untouched
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = build_model("lenet", 10, 1, 28, seed=8)
    assert not torch.equal(a.features[0].weight, c.features[0].weight)
    m = build_model("lenet", 10, 3, 32, mean=(0.5,), std=(0.25,))
    assert m.standardize.mean.flatten().tolist() == [0.5] * 3
    x = torch.full((1, 3, 32, 32), 0.75)
    assert torch.allclose(m.standardize(x), torch.ones_like(x))
    with pytest.raises(InputError, match="unknown model 'vgg'"):
        build_model("vgg", 10, 1, 28)
    with pytest.raises(InputError, match="mean and std need 1 or 3 values"):
        build_model("lenet", 10, 3, 32, mean=(0.1, 0.2))
    with pytest.raises(InputError, match="too small"):
        LeNet(image_size=3)


# ---------------------------------------------------------------------------------------------------- training
def small_run(arrays, seed=0, n=512, **kw):
    x, y = arrays["train"][0][:n], arrays["train"][1][:n]
    model = build_model("lenet", 10, 1, 8, mean=(0.3053,), std=(0.3759,), seed=seed)
    args = dict(epochs=1, batch_size=16, lr=3e-3, seed=seed, device="cpu", optimizer="adam", schedule="constant")
    args.update(kw)
    return model, train(model, x, y, **args), (x, y)


def test_one_epoch_decreases_the_loss(digits):
    arrays, _ = digits
    x, y = arrays["train"][0][:512], arrays["train"][1][:512]
    before = cross_entropy(predict_logits(build_model("lenet", 10, 1, 8, mean=(0.3053,), std=(0.3759,), seed=0), x),
                           y)
    _, result, _ = small_run(arrays)
    after = cross_entropy(predict_logits(result.model, x), y)
    # an untrained 10-class network sits near log(10) = 2.30; 32 Adam steps at lr 3e-3 on these easy digits
    # bring it to about 0.6 (seed 0), so halving it is a safe bar that an unchanged model cannot pass
    assert before > 2.0
    assert after < 0.5 * before
    assert result.history[0]["train_loss"] < before


def test_training_is_deterministic_given_the_seed(digits):
    arrays, _ = digits
    test_x = arrays["test"][0][:64]
    _, r1, _ = small_run(arrays, seed=3, n=256, augment="crop", crop_padding=1)
    _, r2, _ = small_run(arrays, seed=3, n=256, augment="crop", crop_padding=1)
    _, r3, _ = small_run(arrays, seed=4, n=256, augment="crop", crop_padding=1)
    l1, l2, l3 = (predict_logits(r.model, test_x) for r in (r1, r2, r3))
    np.testing.assert_array_equal(l1, l2)
    assert not np.array_equal(l1, l3)
    assert r1.history[0]["train_loss"] == r2.history[0]["train_loss"]


def test_history_callback_and_validation(digits):
    arrays, _ = digits
    seen = []
    valid = (arrays["valid"][0][:50], arrays["valid"][1][:50])
    _, result, _ = small_run(arrays, epochs=2, schedule="cosine", valid=valid,
                             on_epoch=lambda e, m: seen.append((e, m)))
    assert [e for e, _ in seen] == [1, 2] and len(result.history) == 2
    keys = {"epoch", "train_loss", "train_accuracy", "valid_loss", "valid_accuracy", "lr", "seconds",
            "images_per_s"}
    assert set(result.history[1]) == keys and seen[1][1] == result.history[1]
    assert 0.0 <= result.history[1]["valid_accuracy"] <= 1.0
    # the cosine schedule ends at 0
    assert result.history[1]["lr"] == pytest.approx(0.0, abs=1e-12)
    assert result.history[0]["lr"] == pytest.approx(3e-3 * 0.5 * (1 + np.cos(np.pi / 2)))
    assert not result.model.training


def test_predict_accepts_uint8_and_unit_floats(digits):
    arrays, _ = digits
    model = build_model("lenet", 10, 1, 8, seed=0)
    x = arrays["test"][0][:20]
    a = predict_logits(model, x, batch_size=7)
    b = predict_logits(model, x.astype(np.float32) / 255.0)
    c = predict_logits(model, x[:, None], batch_size=7)  # (N, C, H, W) as well
    assert a.dtype == np.float32 and a.shape == (20, 10)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a, c)


def test_resnet_trains_a_step_on_cpu():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 3, 32, 32), dtype=np.uint8)
    y = np.arange(6) % 10
    model = build_model("resnet18", 10, 3, 32, seed=0)
    result = train(model, x, y, epochs=1, batch_size=3, lr=0.01, seed=0, device="cpu", optimizer="sgd",
                   augment="crop-flip", weight_decay=5e-4)
    assert np.isfinite(result.history[0]["train_loss"])
    assert predict_logits(result.model, x).shape == (6, 10)


def test_augmentation_translates_and_flips():
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(64, 1, 5, 5)
    x[:, 0, 2, 2] = 1.0  # one bright pixel in the centre
    out = _augment(x, "crop", 1, gen)
    assert out.shape == x.shape
    assert torch.all(out.sum((1, 2, 3)) == 1)  # a shift by at most the padding keeps the centre pixel inside
    where = out[:, 0].nonzero()[:, 1:]
    assert where.min() >= 1 and where.max() <= 3 and len({tuple(w.tolist()) for w in where}) > 1
    ramp = torch.arange(4.0).repeat(32, 1, 4, 1)
    flipped = _augment(ramp, "crop-flip", 0, gen)
    n_flipped = int((flipped[:, 0, 0, 0] == 3).sum())
    assert 0 < n_flipped < 32 and torch.all((flipped[:, 0, 0, 0] == 0) | (flipped[:, 0, 0, 0] == 3))
    assert torch.equal(_augment(x, None, 4, gen), x)


def test_training_argument_errors(digits):
    arrays, _ = digits
    x, y = arrays["train"][0][:32], arrays["train"][1][:32]
    model = build_model("lenet", 10, 1, 8)
    with pytest.raises(InputError, match="train_y must be 32 integer labels"):
        train(model, x, y[:10], epochs=1, batch_size=8, lr=1e-3, seed=0, device="cpu")
    with pytest.raises(InputError, match="model has 3 outputs"):
        train(build_model("lenet", 3, 1, 8), x, y, epochs=1, batch_size=8, lr=1e-3, seed=0, device="cpu")
    with pytest.raises(InputError, match="augment must be"):
        train(model, x, y, epochs=1, batch_size=8, lr=1e-3, seed=0, device="cpu", augment="mixup")
    with pytest.raises(InputError, match="optimizer must be"):
        train(model, x, y, epochs=1, batch_size=8, lr=1e-3, seed=0, device="cpu", optimizer="lbfgs")
    with pytest.raises(InputError, match=r"shape \(N, H, W\)"):
        predict_logits(model, np.zeros((8, 8), np.uint8))
    assert training_defaults("mnist-5k")["epochs"] > 0 and training_defaults("cifar10")["optimizer"] == "sgd"


# ------------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip_gives_identical_logits(digits, tmp_path):
    arrays, _ = digits
    _, result, _ = small_run(arrays)
    x = arrays["test"][0]
    expected = predict_logits(result.model, x)
    path = tmp_path / "model.pt"
    save_checkpoint(result.model, path, {"dataset": "digits", "epochs": 1, "history": result.history})
    model, meta = load_checkpoint(path)
    np.testing.assert_array_equal(predict_logits(model, x), expected)
    assert meta["dataset"] == "digits" and meta["history"][0]["epoch"] == 1
    assert model.config == result.model.config and not model.training
    model2, _ = load_checkpoint(checkpoint_bytes(result.model))
    np.testing.assert_array_equal(predict_logits(model2, x), expected)


def test_resnet_checkpoint_keeps_batchnorm_statistics(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (4, 3, 32, 32), dtype=np.uint8)
    model = build_model("resnet18", 10, 3, 32, seed=0)
    train(model, x, np.arange(4), epochs=1, batch_size=4, lr=0.01, seed=0, device="cpu", optimizer="sgd")
    buf = io.BytesIO()
    save_checkpoint(model, buf)
    loaded, meta = load_checkpoint(buf.getvalue())
    assert meta == {}
    assert torch.equal(loaded.stem[1].running_mean, model.stem[1].running_mean.cpu())
    np.testing.assert_array_equal(predict_logits(loaded, x), predict_logits(model, x))


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ObjectNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(FormatError, match="garbage.pt: not a readable checkpoint"):
        load_checkpoint(garbage)
    # weights_only=True refuses arbitrary objects instead of unpickling them
    evil = tmp_path / "evil.pt"
    torch.save({"format": "labelshift-checkpoint", "obj": np.random.default_rng(0)}, evil)
    with pytest.raises(FormatError, match="evil.pt: not a readable checkpoint"):
        load_checkpoint(evil)
    plain = tmp_path / "plain.pt"
    torch.save({"weights": torch.zeros(3)}, plain)
    with pytest.raises(FormatError, match="not a labelshift checkpoint"):
        load_checkpoint(plain)
    with pytest.raises(InputError, match="meta must be JSON-serialisable"):
        save_checkpoint(build_model("lenet", 10, 1, 8), tmp_path / "x.pt", {"bad": object()})
    with pytest.raises(InputError, match="model has no 'config'"):
        save_checkpoint(torch.nn.Linear(2, 2), tmp_path / "y.pt")
