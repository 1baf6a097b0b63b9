// Programmatic dependent launch (sm_90+): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every CTA
// of the kernel before it in the stream has called launch_dependents() (or
// exited), instead of after that kernel has finished. A no-op in a kernel
// launched without the attribute, and on older targets.
#pragma once

namespace treeattn::cuda {

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace treeattn::cuda
