"""What a run shows and records while it trains: metrics loggers (:mod:`.loggers`: JSONL,
TensorBoard, W&B), memory peaks (:mod:`.memory`) and the progress bar (:mod:`.progress`). Imports
no other room of :mod:`transformer.training`.
"""
