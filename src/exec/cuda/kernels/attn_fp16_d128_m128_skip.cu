// Attention kernel instantiation: fp16, head_dim 128, Q tile m=128, the variant that skips unseen masked tiles.
#include "exec/cuda/attention_instance.cuh"
TREEATTN_ATTENTION_SKIP_INSTANCE(0, 128)
