// CTA timelines, for diagnosis (CudaExecutorOptions::trace): thread 0 of each
// CTA stamps %globaltimer (ns) at its phase boundaries and stores the stamps
// at its end. Compiled in only with TREEATTN_CTA_TRACE (CMake option of the
// same name); otherwise every call is empty, so the kernels of an ordinary
// build carry no extra registers.
#pragma once

#include "exec/cuda/attention_params.hpp"

namespace treeattn::cuda {

struct CtaTrace {
#if defined(TREEATTN_CTA_TRACE)
  unsigned long long t[kTracePoints] = {};
  __device__ __forceinline__ void mark(TracePoint i) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t[i])::"memory");
  }
  // dst: this CTA's kTracePoints stamps (nullptr: not traced).
  __device__ __forceinline__ void store(unsigned long long* dst) const {
    if (dst)
      for (int i = 0; i < kTracePoints; ++i) dst[i] = t[i];
  }
#else
  __device__ __forceinline__ void mark(TracePoint) {}
  __device__ __forceinline__ void store(unsigned long long*) const {}
#endif
};

}  // namespace treeattn::cuda
