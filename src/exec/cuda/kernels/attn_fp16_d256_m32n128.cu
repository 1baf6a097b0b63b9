// Attention kernel instantiation: fp16, head_dim 256, Q tile m=32 with 128-token K/V tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_INSTANCE_MN(0, 0, 256, 32, 128)
