// Attention kernel instantiation: fp16, head_dim 256, Q tile m=128 (n from kTileConfigs).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE(0, 0, 256, 128)
