// Attention kernel instantiation: bf16, head_dim 64, Q tile m=128 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(1, 0, 64, 128)
