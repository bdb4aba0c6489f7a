"""The training loop: the :class:`~transformer.training.loop.trainer.Trainer` (its ``fit`` owns the
loop: batches, updates, validation, saves, stop signals), the training state a checkpoint saves
beside the weights and a resume restores (:mod:`.train_state`), the validation loss and BLEU of a
translated split (:mod:`.validation`), and one validation round with its best and patience decisions
(:mod:`.validation_round`). Imports :mod:`transformer.training.step`,
:mod:`~transformer.training.checkpoint`, :mod:`~transformer.training.distributed`,
:mod:`~transformer.training.monitoring` and :mod:`transformer.training.stopping`.
"""
