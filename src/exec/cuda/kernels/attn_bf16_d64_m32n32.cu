// Attention kernel instantiation: bf16, head_dim 64, Q tile m=32 with 32-token K/V tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_MN(1, 0, 64, 32, 32)
