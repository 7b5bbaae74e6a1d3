"""The Prefect tasks of scheduled re-estimation (the ``reestimate`` flow, ``labelshift estimate``, serving, alerts),
by concept: loading the registered model (:mod:`.model`; references and models of other flavours:
:mod:`.references`), scoring the target's batches (:mod:`.scoring`), assessing the shift (:mod:`.assessment`),
writing the corrected outputs (:mod:`.outputs`), the MLflow bookkeeping of the child and monitor runs (:mod:`.runs`),
the corrected model to serve (:mod:`.serving`), estimates per segment (:mod:`.segments`) and the verdict's event
(:mod:`.alerts`)."""
