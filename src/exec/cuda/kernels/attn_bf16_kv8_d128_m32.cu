// Attention kernel instantiation: bf16 with fp8_e4m3 K/V, head_dim 128, Q tile m=32 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(1, 1, 128, 32)
