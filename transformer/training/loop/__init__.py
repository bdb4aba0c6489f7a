"""The training loop: the :class:`~transformer.training.loop.trainer.Trainer` (its ``fit`` owns the
loop: batches, updates, validation rounds, saves, stop signals; it saves and restores its own
training state), and the validation loss and BLEU of a translated split (:mod:`.validation`). Imports :mod:`transformer.training.step`,
:mod:`~transformer.training.checkpoint`, :mod:`~transformer.training.distributed`,
:mod:`~transformer.training.monitoring` and :mod:`transformer.training.stopping`.
"""
