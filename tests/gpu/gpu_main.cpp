// main() of treeattn_gpu_tests: exits 77 (ctest's SKIP_RETURN_CODE) when no
// CUDA device is visible, so CPU-only machines report the suite as skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess || n == 0) {
    std::printf("treeattn_gpu_tests: no CUDA device (%s); skipping\n",
                st == cudaSuccess ? "0 devices" : cudaGetErrorString(st));
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("treeattn_gpu_tests: device 0 = %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
