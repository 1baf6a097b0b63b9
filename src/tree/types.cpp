// Element types and head shapes: parsing and checks.
#include "treeattn/types.hpp"

#include <charconv>
#include <string>

namespace treeattn {

size_t dtype_size(DType t) { return t == DType::fp32 ? 4 : t == DType::fp8_e4m3 ? 1 : 2; }

std::string_view to_string(DType t) {
  switch (t) {
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::fp32: return "fp32";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

DType parse_dtype(std::string_view name, std::string_view field) {
  if (name == "fp16" || name == "half" || name == "float16") return DType::fp16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp32" || name == "float" || name == "float32") return DType::fp32;
  if (name == "fp8_e4m3" || name == "float8_e4m3fn" || name == "fp8") return DType::fp8_e4m3;
  throw Error(std::string(field) + ": unknown element type '" + std::string(name) +
              "' (expected fp16, bf16, fp32 or fp8_e4m3)");
}

bool is_supported_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

void check_pool_size(int64_t num_pages, int page_size, const HeadConfig& heads) {
  const __int128 elems = __int128(num_pages) * page_size * heads.num_kv_heads * heads.head_dim;
  if (elems > (__int128(1) << 46))
    throw Error("num_pages: " + std::to_string(num_pages) + " pages of " + std::to_string(page_size) + " tokens x " +
                std::to_string(heads.num_kv_heads) + " kv heads x " + std::to_string(heads.head_dim) +
                " exceed the supported pool size (2^46 elements)");
}

void HeadConfig::validate() const {
  if (num_kv_heads <= 0 || num_kv_heads > 1024)
    throw Error("num_kv_heads: " + std::to_string(num_kv_heads) + " is out of range [1, 1024]");
  if (num_qo_heads <= 0 || num_qo_heads > 4096)
    throw Error("num_qo_heads: " + std::to_string(num_qo_heads) + " is out of range [1, 4096]");
  if (num_qo_heads % num_kv_heads != 0)
    throw Error("num_qo_heads: " + std::to_string(num_qo_heads) +
                " is not a multiple of num_kv_heads " + std::to_string(num_kv_heads));
  if (group_size() > 128)
    throw Error("num_qo_heads / num_kv_heads: group size " + std::to_string(group_size()) +
                " exceeds the largest Q tile (128 rows)");
  if (!is_supported_head_dim(head_dim))
    throw Error("head_dim: " + std::to_string(head_dim) + " is not supported (64, 128 or 256)");
}

static int parse_positive(std::string_view s, std::string_view field, std::string_view whole) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v <= 0)
    throw Error(std::string(field) + ": '" + std::string(whole) + "' is not of the form Q/KV with positive integers");
  return v;
}

HeadConfig parse_heads(std::string_view text, int head_dim) {
  auto slash = text.find('/');
  if (slash == std::string_view::npos)
    throw Error("heads: '" + std::string(text) + "' is not of the form Q/KV (e.g. 32/8)");
  HeadConfig h;
  h.num_qo_heads = parse_positive(text.substr(0, slash), "heads", text);
  h.num_kv_heads = parse_positive(text.substr(slash + 1), "heads", text);
  h.head_dim = head_dim;
  h.validate();
  return h;
}

}  // namespace treeattn
