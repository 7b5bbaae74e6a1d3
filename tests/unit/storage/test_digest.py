"""The digest of a set of named files (labelshift.storage.digest) and the switch that requires it
(runtime.environment.require_trusted_models)."""
from __future__ import annotations

import json

import pytest

from labelshift.storage.digest import changes, digest_files, digest_folder
from runtime.environment import ENV_REQUIRE_TRUSTED, require_trusted_models


def _files(tmp_path, contents: dict) -> dict:
    out = {}
    for name, data in contents.items():
        path = tmp_path / name.replace("/", "_")
        path.write_bytes(data)
        out[name] = path
    return out


def test_the_digest_is_independent_of_order_and_changes_with_names_and_contents(tmp_path):
    files = _files(tmp_path, {"model/MLmodel": b"flavors: x", "run/calibration/BCTS.json": b"{}"})
    d = digest_files(files)
    assert d.value.startswith("sha256:") and len(d.value) == len("sha256:") + 64
    assert digest_files(dict(reversed(list(files.items())))).value == d.value
    renamed = {"model/MLmodel2" if n == "model/MLmodel" else n: p for n, p in files.items()}
    assert digest_files(renamed).value != d.value
    files["run/calibration/BCTS.json"].write_bytes(b"{ }")
    changed = digest_files(files)
    assert changed.value != d.value
    assert changes(json.loads(d.manifest()), changed.files) == ["run/calibration/BCTS.json changed"]
    del files["model/MLmodel"]
    assert changes(d.files, digest_files(files).files) == ["model/MLmodel removed", "run/calibration/BCTS.json "
                                                                                    "changed"]
    with pytest.raises(ValueError, match="nothing to digest"):
        digest_files({})


def test_a_folder_names_its_files_by_their_relative_paths(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "model.pt2").write_bytes(b"w")
    (tmp_path / "MLmodel").write_bytes(b"m")
    assert list(digest_folder(tmp_path, "model/")) == ["model/MLmodel", "model/data/model.pt2"]
    assert digest_folder(tmp_path / "absent") == {}


def test_a_long_manifest_is_left_out_rather_than_cut(tmp_path):
    files = _files(tmp_path, {f"f{i:04d}": b"x" for i in range(300)})
    assert digest_files(files).manifest(max_chars=4000) is None


@pytest.mark.parametrize("value, expected", [(None, False), ("0", False), ("no", False), ("1", True),
                                             ("TRUE", True), (" yes ", True)])
def test_require_trusted_models_reads_the_switch(value, expected):
    assert require_trusted_models({} if value is None else {ENV_REQUIRE_TRUSTED: value}) is expected


def test_a_typo_in_the_switch_is_refused_by_name():
    with pytest.raises(ValueError, match=f"{ENV_REQUIRE_TRUSTED}='on': set it to 1"):
        require_trusted_models({ENV_REQUIRE_TRUSTED: "on"})
