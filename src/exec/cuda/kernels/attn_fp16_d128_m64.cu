// Attention kernel instantiation: fp16, head_dim 128, Q tile m=64 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(0, 0, 128, 64)
