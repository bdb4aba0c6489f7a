"""A beam search's finished hypotheses, kept on the device until the search ends: at most ``K`` per
sentence, best first by length-penalised score, ties in finishing order (fairseq's
``SequenceGenerator`` list), as fixed-shape tensors merged by a stable sort every step."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.generation.common import Hypothesis, to_device

__all__ = ["Finished"]


class Finished:
    """The finished hypotheses of a beam search over ``bsz`` sentences, ``K`` per sentence, at most
    ``width`` tokens each (EOS included). The active sentences' lists follow the search
    (:meth:`select`); :meth:`store` copies a leaving sentence's list to its slot; :meth:`read` reads all.

    Attributes:
        tokens: ``(n, K, 1 + width)`` long: the length (0: an empty slot), then the tokens.
        scores: ``(n, K, 2)`` float64: the penalised score (``-inf``: empty), then the summed log-probability.
    """

    def __init__(self, bsz: int, K: int, width: int, device: torch.device) -> None:
        self.K, self.width, self.device = K, width, device
        self.tokens = torch.zeros(bsz, K, 1 + width, dtype=torch.long, device=device)
        self.scores = torch.full((bsz, K, 2), float("-inf"), dtype=torch.float64, device=device)
        self._out_tokens, self._out_scores = self.tokens.clone(), self.scores.clone()

    def add(
        self, fin: Tensor, logprob: Tensor, penalty: Tensor, history: Tensor, parents: Tensor, step: int, eos: int
    ) -> None:
        """Merge the hypotheses that finish at this step into each sentence's list.

        Args:
            fin: ``(n, K)`` bool, the candidates that finish here.
            logprob: ``(n, K)`` float32 summed log-probabilities (EOS included).
            penalty: 0-dim float64 length penalty of ``step + 1`` tokens.
            history: ``(n, K, step)`` tokens of the running beams before this step.
            parents: ``(n, K)`` the beam each candidate extends.
        """
        n, K = fin.shape
        ninf = float("-inf")
        lp = logprob.double()
        new_scores = torch.stack((torch.where(fin, lp / penalty, ninf), lp), -1)  # (n, K, 2)
        new_tokens = self.tokens.new_zeros(n, K, 1 + self.width)
        new_tokens[..., 0] = fin.long() * (step + 1)
        if step:
            new_tokens[..., 1 : 1 + step] = history.gather(1, parents[..., None].expand(n, K, step))
        new_tokens[..., 1 + step] = eos
        # the old list, then the new hypotheses in candidate order; a stable sort keeps that order on ties
        both = torch.cat((self.scores, new_scores), 1)  # (n, 2K, 2)
        order = both[..., 0].sort(dim=1, descending=True, stable=True).indices[:, :K]  # (n, K)
        self.scores = both.gather(1, order[..., None].expand(n, K, 2))
        self.tokens = torch.cat((self.tokens, new_tokens), 1).gather(1, order[..., None].expand(n, K, 1 + self.width))

    def kth(self, nbest: int) -> Tensor:
        """``(n,)`` float64: each sentence's ``nbest``-th best score, ``-inf`` while it has fewer."""
        return self.scores[:, nbest - 1, 0]

    def select(self, keep: Tensor) -> None:
        """Follow the active sentences: keep rows ``keep`` (``(n',)`` long, on the device)."""
        self.tokens, self.scores = self.tokens.index_select(0, keep), self.scores.index_select(0, keep)

    def store(self, rows: list[int], sentences: list[int]) -> None:
        """Copy the lists of active rows ``rows`` to the slots of original sentences ``sentences``."""
        if rows:
            src, dst = to_device(rows, self.device), to_device(sentences, self.device)
            self._out_tokens.index_copy_(0, dst, self.tokens.index_select(0, src))
            self._out_scores.index_copy_(0, dst, self.scores.index_select(0, src))

    def read(self, nbest: int) -> list[list[Hypothesis]]:
        """Every sentence's best ``nbest`` stored hypotheses (one host read: the tokens, then the
        bits of the float64 scores)."""
        n = self._out_tokens.numel()
        packed = torch.cat((self._out_tokens.view(-1), self._out_scores.view(torch.int64).view(-1))).cpu()
        tokens = packed[:n].view(self._out_tokens.shape).tolist()
        scores = packed[n:].view(torch.float64).view(self._out_scores.shape).tolist()
        return [
            [Hypothesis(tokens=t[1 : 1 + t[0]], score=s[0], logprob=s[1]) for t, s in zip(ts, ss) if t[0] > 0][:nbest]
            for ts, ss in zip(tokens, scores)
        ]
