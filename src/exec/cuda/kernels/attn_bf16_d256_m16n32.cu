// Attention kernel instantiation: bf16, head_dim 256, Q tile m=16 with 32-token K/V tiles (2 warps).
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_SHORT(1, 256)
