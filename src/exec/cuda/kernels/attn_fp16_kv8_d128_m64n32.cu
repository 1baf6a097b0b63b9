// Attention kernel instantiation: fp16 with fp8_e4m3 K/V, head_dim 128, Q tile m=64 with 32-token K/V tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_MN(0, 1, 128, 64, 32)
