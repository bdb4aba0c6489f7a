"""One training run around the loop: :func:`~transformer.training.job.run.train` (the run
folder, data, model, resume, the Trainer, ``results.json``), the resume read and checked before
anything is written (:mod:`.resume`), a run finished elsewhere recognised (:mod:`.finished_runs`),
``results.json`` and the final test (:mod:`.results`) and the CPU allocator's settings
(:mod:`.allocator`). The highest room: :mod:`transformer.training.command` (``scripts/train.py``'s
work) calls it.
"""
