// Attention kernel instantiation: bf16 with fp8_e4m3 K/V, head_dim 256, Q tile m=32 with 32-token K/V tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_MN(1, 1, 256, 32, 32)
