"""Project-wide pytest configuration: real servers on loopback are provided by the fixture plugins below."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

pytest_plugins = ["tests.fixtures.seaweed", "tests.fixtures.prefect", "tests.fixtures.mlflow_server"]
