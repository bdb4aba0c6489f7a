// A stand-in CUDA device for fake-tensor dry runs on a CPU-only build of PyTorch (tests/fake_cuda).
//
// FakeTensorMode gives tensors a fake "cuda:0" device, but on a CPU-only build two parts of torch
// still need a CUDA backend once those tensors require gradients:
//   * every autograd node records the stream of its inputs' device (InputMetadata), through the
//     device guard registered for that device type; none is registered for CUDA here (torch's own
//     ensureCUDADeviceGuardSet only fills it in on CUDA builds without a GPU);
//   * the backward engine asks at::accelerator for the current accelerator, which reads the CUDA
//     hooks' isBuilt(): false in a CPU-only build.
// This library registers torch's own c10::impl::FakeGuardImpl for CUDA (no-op streams and events)
// and CUDA hooks that say "built, one device". It allocates nothing and runs no kernel: every
// tensor on "cuda" stays a fake tensor. It must be loaded (ctypes.CDLL, RTLD_GLOBAL) before
// `import torch`, because torch reads the hooks once and keeps them.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);

namespace at {
struct FakeCUDAHooks : CUDAHooksInterface {
  explicit FakeCUDAHooks(CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex deviceCount() const override { return 1; }
};
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", FakeCUDAHooks);
}  // namespace at
