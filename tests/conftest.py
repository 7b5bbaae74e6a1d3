"""Project-wide pytest configuration: real servers on loopback are provided by the fixture plugins below."""
import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

pytest_plugins = ["tests.fixtures.seaweed", "tests.fixtures.prefect", "tests.fixtures.mlflow_server",
                  "tests.fixtures.health"]


@pytest.fixture(autouse=True)
def _restore_environ():
    """Every test gets the environment back as it found it: the CLI exports its settings (LABELSHIFT_*,
    MLFLOW_TRACKING_URI...) into os.environ, which would otherwise leak into later tests and the servers they
    start. Session fixtures are set up before this snapshot, so what they export stays."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
