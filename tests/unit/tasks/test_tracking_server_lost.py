"""MLflow's client giving up on a tracking server mid-run becomes one error naming the server and the fix."""
from mlflow.exceptions import MlflowException

from labelshift.errors import ServiceUnavailableError
from tasks.tracking import tracking_server_lost

SERVER = "http://127.0.0.1:5000"


def test_a_refused_or_timed_out_request_names_the_server_and_the_fix():
    refused = MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed with "
                              "exception HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded")
    timed_out = MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/update failed with timeout "
                                "exception Read timed out.")
    for exc, cause in ((refused, "refused"), (timed_out, "timed out")):
        error = tracking_server_lost(exc, SERVER)
        assert isinstance(error, ServiceUnavailableError)
        assert f"MLflow tracking server at {SERVER} stopped answering" in str(error) and cause in str(error)
        assert "labelshift stack up" in str(error) and "MLFLOW_TRACKING_URI" in str(error)


def test_other_errors_and_local_stores_are_left_alone():
    assert tracking_server_lost(MlflowException("API request to endpoint /api/2.0/mlflow/runs/get failed with error "
                                                "code 500 != 200"), SERVER) is None
    assert tracking_server_lost(ValueError("bad"), SERVER) is None
    assert tracking_server_lost(MlflowException("API request to http://x failed with exception boom"),
                                "sqlite:///m.db") is None


def test_a_server_answering_errors_points_at_its_store():
    error = tracking_server_lost(MlflowException(
        "API request to http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/1/x/summary.json failed with "
        "exception HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded with url: ... (Caused by "
        "ResponseError('too many 500 error responses'))"), SERVER)
    assert "answered every try of a request with a server error" in str(error)
    assert "artifact store (the S3 server" in str(error) and "labelshift stack status" in str(error)


def test_an_artifact_request_that_timed_out_points_at_the_store_too():
    """A frozen S3 behind MLflow's artifact proxy: the server waits on it, and MLflow's request times out."""
    error = tracking_server_lost(MlflowException(
        "API request to http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/1/x/summary.json failed with "
        "timeout exception Read timed out."), SERVER)
    assert "stopped answering" in str(error) and "timed out" in str(error)
    assert "artifact store (the S3 server" in str(error) and "labelshift stack status" in str(error)
    runs_update = tracking_server_lost(MlflowException(
        "API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/update failed with timeout exception Read timed "
        "out."), SERVER)
    assert "artifact store" not in str(runs_update)
