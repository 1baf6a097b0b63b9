// A device-side scatter of byte ranges (kernels.hpp): the step executor
// uploads a plan as one packed copy and places its arrays with this, one
// launch, instead of one copy per array (each cudaMemcpyAsync costs the host
// a driver call).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "exec/cuda/kernels.hpp"
#include "treeattn/cuda_executor.hpp"

namespace treeattn::cuda {

namespace {

constexpr int kCopyThreads = 256;
constexpr int64_t kMaxCopyCtas = 264;  // two per SM on an H100: enough for a plan of a few hundred KB

// 16-byte chunk c of the packed source lies in range k with
// src_off[k] <= 16 c < src_off[k] + bytes[k] rounded up to 16 (ranges are
// packed in order, each starting 16-byte aligned).
__global__ void __launch_bounds__(kCopyThreads) copy_ranges_kernel(const __grid_constant__ CopyRanges r) {
  const int64_t chunks = int64_t(r.src_bytes / 16);
  for (int64_t c = int64_t(blockIdx.x) * kCopyThreads + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * kCopyThreads) {
    const size_t at = size_t(c) * 16;
    int k = 0;
    while (k + 1 < r.count && r.src_off[k + 1] <= at) ++k;
    const uint4 v = *reinterpret_cast<const uint4*>(r.src + at);
    *reinterpret_cast<uint4*>(r.dst + r.dst_off[k] + (at - r.src_off[k])) = v;
  }
}

}  // namespace

void launch_copy_ranges(const CopyRanges& r, cudaStream_t stream) {
  if (r.src_bytes == 0) return;
  if (r.src_bytes % 16 != 0 || r.count < 1 || r.count > CopyRanges::kMax)
    throw Error("copy ranges: " + std::to_string(r.count) + " ranges of " + std::to_string(r.src_bytes) +
                " packed bytes (need 1.." + std::to_string(CopyRanges::kMax) + " ranges, a multiple of 16 bytes)");
  const int64_t chunks = int64_t(r.src_bytes / 16);
  const int64_t ctas = std::min<int64_t>(kMaxCopyCtas, (chunks + kCopyThreads - 1) / kCopyThreads);
  // The launch's own status (cudaGetLastError would also report an earlier,
  // unrelated failure of the caller's).
  void* args[] = {const_cast<CopyRanges*>(&r)};
  check_cuda(cudaLaunchKernel(reinterpret_cast<const void*>(&copy_ranges_kernel), dim3(unsigned(ctas)),
                              dim3(kCopyThreads), args, 0, stream),
             "copy ranges launch");
}

}  // namespace treeattn::cuda
