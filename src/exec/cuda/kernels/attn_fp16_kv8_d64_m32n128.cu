// Attention kernel instantiation: fp16 with fp8_e4m3 K/V, head_dim 64, Q tile m=32 with 128-token K/V tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_MN(0, 1, 64, 32, 128)
