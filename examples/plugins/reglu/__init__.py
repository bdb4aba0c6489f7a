"""ReGLU: a gated feed-forward block with a ReLU gate (Shazeer 2020, "GLU Variants Improve
Transformer", Table 1: ``FFN_ReGLU(x) = (max(0, x W) * x V) W2``), as a plugin.

It is the zoo's own :class:`~transformer.modules.ffn.GatedFeedForward` (the SwiGLU block) with
``F.relu`` as its gate's activation, so it takes SwiGLU's sizes (hidden ``2/3 d_ff`` with
``model.ffn.glu_match_params``) and can be a mixture-of-experts expert (``model.ffn.expert=reglu``).

    python scripts/train.py plugins=[examples/plugins/reglu] model/ffn=reglu
    python scripts/train.py plugins=[examples/plugins/reglu] experiment=branches ladder=step5_reglu seed=1
"""

import torch.nn.functional as F

from transformer.modules.ffn import GatedFeedForward
from transformer.registry import register_ffn

register_ffn("reglu", GatedFeedForward, activation=F.relu)
