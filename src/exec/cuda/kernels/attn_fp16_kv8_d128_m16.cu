// Attention kernel instantiation: fp16 with fp8_e4m3 K/V, head_dim 128, Q tile m=16 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(0, 1, 128, 16)
