// Attention kernel instantiation: bf16 with fp8_e4m3 K/V, head_dim 128, Q tile m=16 with 32-token K/V tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_MN(1, 1, 128, 16, 32)
