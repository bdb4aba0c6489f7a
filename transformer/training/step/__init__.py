"""One training step and its parts: the label-smoothed loss and the model's loss (:mod:`.criterion`),
the compiled step (:mod:`.compiled`), the optimizer (:mod:`.optim`) and learning-rate schedules
(:mod:`.schedules`), the moving
average of the weights (:mod:`.ema`), MoE routing statistics (:mod:`.routing`), the numbers logged for
an update (:mod:`.update_stats`) and the non-finite checks (:mod:`.divergence`).

The lowest room of :mod:`transformer.training`: it imports none of the others (only
:mod:`transformer.training.errors`).
"""
