"""transformer-zoo: the Transformer family, from Vaswani et al. 2017 to Llama-style, as Hydra switches.

Shape notation, one for the whole package: docstrings write a tensor's shape as a tuple of the names
below, e.g. ``(batch, seq_len, d_model)``; code comments and a few compact docstrings use the short
form in brackets, e.g. ``(B, T, d_model)``.

* ``batch`` (B): sentences in a batch; while decoding, sentences x beams.
* ``seq_len`` (T): positions of one sequence; ``src_len`` (S) of the source, ``tgt_len`` (T) of
  the target, ``L`` of a decoder-only ``source <sep> target`` row.
* ``q_len``, ``k_len`` (Tq, Tk): query and key positions of one attention call (keys: cached plus
  new; ``cached_len`` for the cache alone).
* ``d_model``: model width; ``d_ff`` / ``hidden``: feed-forward hidden width.
* ``n_heads`` (H), ``n_kv_heads`` (Hkv), ``head_dim`` (hd): query heads, key/value heads, width of
  one head.
* ``vocab`` (V): vocabulary size.
* ``N``: rows of a flattened ``(batch, seq_len)`` (losses); ``C``: a chunk of them.
* ``n_experts`` (E), ``top_k`` (k): experts of a mixture-of-experts block, and how many each token uses.
* ``a | b``: either size, e.g. ``(batch | 1, ...)`` broadcasts over the batch.

Package layout and the direction of imports: see "How the code is laid out" and "The import order"
in docs/contributing.md.
"""

__version__ = "0.1.0"
