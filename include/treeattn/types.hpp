// Basic vocabulary shared by every layer: errors, element types, head shapes,
// the paged KV layout. No dependencies beyond the standard library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace treeattn {

// Every bad input raises this; the message names the field and the value.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// fp8_e4m3 (OCP E4M3FN, as torch.float8_e4m3fn and vLLM's fp8 KV cache
// store it: no infinities, max 448) is a storage type of K/V pools only,
// scaled per tensor by AttentionArgs::k_scale / v_scale.
enum class DType : uint8_t { fp16, bf16, fp32, fp8_e4m3 };

size_t dtype_size(DType t);
std::string_view to_string(DType t);
// "fp16" | "bf16" | "fp32" | "fp8_e4m3" (and their aliases); Error naming
// `field` and the value otherwise.
DType parse_dtype(std::string_view name, std::string_view field = "dtype");

// Attention shape. With grouped-query attention qo head h reads kv head
// h / group_size().
struct HeadConfig {
  int num_qo_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;

  int group_size() const { return num_qo_heads / num_kv_heads; }
  void validate() const;  // throws Error
};

// Head dims the executors support (the CUDA kernels are compiled for these).
bool is_supported_head_dim(int head_dim);

// Storage of the K and V pools: each shaped
// [num_pages, page_size, num_kv_heads, head_dim] ("NHD"), element type
// kv_type(): dtype (that of q and out) unless kv_dtype names another (fp8_e4m3).
struct KvLayout {
  int page_size = 16;
  int64_t num_pages = 0;
  DType dtype = DType::fp16;
  std::optional<DType> kv_dtype;
  DType kv_type() const { return kv_dtype.value_or(dtype); }
};

// A K/V pool of num_pages x page_size x kv heads x head_dim elements: at
// most 2^46, so that element offsets fit 64 bits with room. Throws Error
// naming num_pages and the sizes otherwise.
void check_pool_size(int64_t num_pages, int page_size, const HeadConfig& heads);

// Parses "32/8" into (32, 8); throws Error naming `field` on bad text.
HeadConfig parse_heads(std::string_view text, int head_dim);

}  // namespace treeattn
