// Dependencies between the kernels of a chained run.
//
// Programmatic dependent launch (sm_90+): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every CTA
// of the kernel before it in the stream has called launch_dependents() (or
// exited), instead of after that kernel has finished. A no-op in a kernel
// launched without the attribute, and on older targets.
//
// The data dependency itself goes through counters in global memory: the
// producer publishes with a release add, the consumer polls with acquire
// loads (gpu scope).
#pragma once

namespace treeattn::cuda {

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned int ld_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Release: every write that precedes it (including other threads' writes
// ordered before it by a CTA barrier) is visible to whoever acquires the sum.
__device__ __forceinline__ void red_release_add(unsigned int* p, unsigned int v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int atom_acq_rel_add(unsigned int* p, unsigned int v) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

}  // namespace treeattn::cuda
