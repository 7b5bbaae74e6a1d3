"""The store side of scheduled re-estimation; it knows nothing about models or estimators.

* :mod:`.watermark` -- the target's batches, the outputs written beside them, and the watermark of what was counted;
* :mod:`.batches` -- the batch formats (``.npy``, Parquet prediction logs, tabular), read in streamed chunks.
"""
