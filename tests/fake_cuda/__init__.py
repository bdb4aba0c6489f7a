"""A fake-CUDA dry run of the training step, checkpoints and decoding on a CPU-only machine.

PyTorch's fake tensors (:class:`torch._subclasses.fake_tensor.FakeTensorMode`) carry a device but no
data: a kernel's output device follows its inputs, and an operator given a ``cuda:0`` tensor and a
(non-scalar) CPU tensor raises ``FakeTensorDeviceMismatchError``, as the real CUDA kernel would.
That is the first thing a CPU-tested project meets on a GPU: a tensor made on the CPU inside the
GPU path. The pieces:

* ``fake_cuda_device.cpp``: a stand-in CUDA backend for autograd (no kernels, no memory), compiled
  once by :mod:`tests.fake_cuda.build` and loaded before ``import torch``;
* :mod:`tests.fake_cuda.harness`: :class:`~tests.fake_cuda.harness.FakeCuda`, the mode that runs
  the project's own code on fake ``cuda:0`` tensors and answers its host syncs;
* :mod:`tests.fake_cuda.cases`: the cases, derived from the option tables;
* :mod:`tests.fake_cuda.runner`: the child process that runs them (``python -m
  tests.fake_cuda.runner``), started by ``tests/test_fake_cuda.py``.

Nothing here imports torch at package import: the runner must load the stand-in backend first.
"""
