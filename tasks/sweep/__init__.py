"""The Prefect tasks of the sweep (the ``reproduce`` flow, :mod:`flows.reproduce`): the Gaussian estimation fan-out
(:mod:`.estimation`), the image experiments' datasets, training, calibration and estimation (:mod:`.images`), the
figures and tables (:mod:`.outputs`), the MLflow runs (:mod:`.runs`), the results in the object store
(:mod:`.storage`), the run summary (:mod:`.report`) and the results page read back from MLflow (:mod:`.results_page`).
What the sweep shares with re-estimation lives beside this package: :mod:`tasks.tracking`,
:mod:`labelshift_mlflow.artifacts`."""
