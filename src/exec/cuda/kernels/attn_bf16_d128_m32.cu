// Attention kernel instantiation: bf16, head_dim 128, Q tile m=32 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(1, 0, 128, 32)
