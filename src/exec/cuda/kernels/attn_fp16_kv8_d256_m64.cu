// Attention kernel instantiation: fp16 with fp8_e4m3 K/V, head_dim 256, Q tile m=64 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(0, 1, 256, 64)
