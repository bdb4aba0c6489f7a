"""transformer-zoo: the Transformer family, from Vaswani et al. 2017 to Llama-style, as Hydra switches."""

__version__ = "0.1.0"
