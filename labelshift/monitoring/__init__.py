"""The store side of scheduled re-estimation; it knows nothing about models or estimators.

* :mod:`.layout` -- which keys of a target are input batches, outputs and state; a batch as listed or rejected;
* :mod:`.listing` -- the target's batches listed with their checksums, and those not counted yet;
* :mod:`.watermark` -- the watermark of what was counted: read, and committed by compare-and-swap;
* :mod:`.inputs` -- an input batch (``.npy`` of model inputs) read and checked;
* :mod:`.batches` -- the batch formats (``.npy``, Parquet prediction logs, tabular), read in streamed chunks;
* :mod:`.outputs` -- the corrected predictions and the summary written beside each batch.
"""
