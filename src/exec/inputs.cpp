// Host tensors: element access by dtype, seeded random inputs, error metrics.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "treeattn/executor.hpp"
#include "treeattn/numeric.hpp"

namespace treeattn {

float effective_scale(const Workload& w, float scale) {
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(w.heads.head_dim));
}

void check_scales(const AttentionArgs& a) {
  if (!(a.scale == 0.f || (a.scale > 0.f && std::isfinite(a.scale))))
    throw Error("scale: expected 0 (1/sqrt(head_dim)) or a positive finite number, got " + std::to_string(a.scale));
  for (const auto& [value, name] : {std::pair{a.k_scale, "k_scale"}, std::pair{a.v_scale, "v_scale"}})
    if (!(value > 0.f && std::isfinite(value)))
      throw Error(std::string(name) + ": expected a positive finite number, got " + std::to_string(value));
}

Strides resolve_strides(const Workload& w, const AttentionArgs& a) {
  const int64_t row = int64_t(w.heads.num_kv_heads) * w.heads.head_dim;
  const int64_t q = int64_t(w.heads.num_qo_heads) * w.heads.head_dim;
  Strides s{a.q_stride ? a.q_stride : q, a.out_stride ? a.out_stride : q, a.kv_token_stride ? a.kv_token_stride : row,
            0};
  if (a.kv_page_stride != 0) {
    s.kv_page = a.kv_page_stride;
  } else if (__builtin_mul_overflow(s.kv_token, int64_t(w.layout.page_size), &s.kv_page)) {
    throw Error("kv_token_stride = " + std::to_string(s.kv_token) + ": a page of " +
                std::to_string(w.layout.page_size) + " tokens spans more elements than int64 offsets reach");
  }
  return s;
}

float load_element(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::fp16: return half_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::fp32: return static_cast<const float*>(data)[i];
    case DType::fp8_e4m3: {
      static const std::array<float, 256> decoded = [] {
        std::array<float, 256> d{};
        for (int b = 0; b < 256; ++b) d[size_t(b)] = fp8_e4m3_bits_to_float(uint8_t(b));
        return d;
      }();
      return decoded[static_cast<const uint8_t*>(data)[i]];
    }
  }
  return 0.f;
}

void store_element(void* data, DType t, int64_t i, float value) {
  switch (t) {
    case DType::fp16: static_cast<uint16_t*>(data)[i] = float_to_half_bits(value); break;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = float_to_bf16_bits(value); break;
    case DType::fp32: static_cast<float*>(data)[i] = value; break;
    case DType::fp8_e4m3: static_cast<uint8_t*>(data)[i] = float_to_fp8_e4m3_bits(value); break;
  }
}

AttentionArgs HostTensors::args(float scale) {
  AttentionArgs a{q.data(), k.data(), v.data(), out.data(), scale};
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  return a;
}

HostTensors make_random_inputs(const Workload& w, uint64_t seed) {
  const size_t es = dtype_size(w.layout.dtype), kv_es = dtype_size(w.layout.kv_type());
  const int64_t q_elems = int64_t(w.num_queries()) * w.heads.num_qo_heads * w.heads.head_dim;
  const int64_t kv_elems = w.layout.num_pages * w.layout.page_size * w.heads.num_kv_heads * w.heads.head_dim;
  HostTensors t{w.layout.dtype, {}, {}, {}, {}};
  t.kv_dtype = w.layout.kv_type();
  if (t.kv_dtype == DType::fp8_e4m3) {
    // Stored as quantised (value / scale), so that the scales are exercised:
    // K and V still dequantise to uniform(-1, 1) (fp8-rounded).
    t.k_scale = 0.3f;
    t.v_scale = 0.7f;
  }
  t.q.resize(q_elems * es);
  t.k.resize(kv_elems * kv_es);
  t.v.resize(kv_elems * kv_es);
  t.out.resize(q_elems * es);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (int64_t i = 0; i < q_elems; ++i) store_element(t.q.data(), t.dtype, i, uni(rng));
  for (int64_t i = 0; i < kv_elems; ++i) store_element(t.k.data(), t.kv_dtype, i, uni(rng) / t.k_scale);
  for (int64_t i = 0; i < kv_elems; ++i) store_element(t.v.data(), t.kv_dtype, i, uni(rng) / t.v_scale);
  t.poison_out();
  return t;
}

void HostTensors::poison_out() {
  const int64_t n = int64_t(out.size() / dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) store_element(out.data(), dtype, i, std::numeric_limits<float>::quiet_NaN());
}

double relative_error(const Workload& w, const void* out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = load_element(out, w.layout.dtype, static_cast<int64_t>(i));
    if (!std::isfinite(o)) return std::numeric_limits<double>::infinity();
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  if (den == 0) return std::sqrt(num);  // all-zero reference (empty contexts)
  return std::sqrt(num / den);
}

}  // namespace treeattn
