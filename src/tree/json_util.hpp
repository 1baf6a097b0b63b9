// nlohmann::json helpers for the builders that read JSON files (src/tree only;
// public headers never expose nlohmann). Every accessor takes the field path
// used in error messages, e.g. "nodes[3].parent".
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "treeattn/types.hpp"

namespace treeattn::detail {

using json = nlohmann::json;

// A short rendering of a JSON value for messages (long values are cut).
inline std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);  // a string of invalid UTF-8 too
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Deepest nesting of lists/objects any treeattn file may have. Our formats
// need 4 (a ToT file: list > task > data > node > children); the margin is for
// files we have not met. Deeper input is refused before it is parsed, before the
// nested value exists: recursive code (dump(), the error messages' brief())
// must never meet a 100000-deep value.
inline constexpr int kMaxJsonDepth = 64;

// Parses text; a syntax error becomes Error "<what>: parse error at byte N: ...",
// nesting past kMaxJsonDepth Error "<what>: nesting deeper than 64 ...".
inline json parse_json(std::string_view text, const std::string& what) {
  // Depth first, in one pass over the text (brackets inside strings do not
  // count). Not through nlohmann's parser callback: with one installed, each
  // closing '}' scans its whole enclosing array, quadratic in a list of
  // objects (a 200000-node tree file took 30 s to load).
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character is never a quote that ends the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(what + ": nesting deeper than " + std::to_string(kMaxJsonDepth) +
                    " lists/objects (kMaxJsonDepth) is not a treeattn file");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw Error(what + ": parse error at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {
    // Not only syntax: a number out of double's range ("1e400") is
    // out_of_range.406 (found by fuzz/fuzz_json_tree).
    throw Error(what + ": " + e.what());
  }
}

// An integer in [lo, hi]; throws Error naming `field` otherwise.
inline int64_t get_int(const json& v, const std::string& field,
                       int64_t lo = std::numeric_limits<int32_t>::min(),
                       int64_t hi = std::numeric_limits<int32_t>::max()) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      throw Error(field + " = " + brief(v) + " is out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
    x = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    throw Error(field + " = " + brief(v) + " is not an integer");
  }
  if (x < lo || x > hi)
    throw Error(field + " = " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return x;
}

// The member `key` of object `obj` (whose own path is `where`, "" for the top).
inline std::string member_field(const std::string& where, std::string_view key) {
  return where.empty() ? std::string(key) : where + "." + std::string(key);
}

inline const json& require(const json& obj, std::string_view key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) throw Error(member_field(where, key) + ": missing");
  return *it;
}

inline void require_object(const json& v, const std::string& field) {
  if (!v.is_object()) throw Error(field + " = " + brief(v) + " is not an object");
}
inline void require_array(const json& v, const std::string& field) {
  if (!v.is_array()) throw Error(field + " = " + brief(v) + " is not a list");
}

// The string member `key` of `obj`, or `fallback` where it is missing; Error
// "<field> = X is not a string" where it is another type (json::value() would
// throw a type_error instead). `field` names the member in the message.
inline std::string optional_string(const json& obj, std::string_view key, const std::string& field,
                                   std::string fallback = {}) {
  const auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_string()) throw Error(field + " = " + brief(*it) + " is not a string");
  return it->get<std::string>();
}

// The "format" member of a table file: Error "<what>: format = X (expected
// "FORMAT")" unless it is that string.
inline void require_format(const json& obj, std::string_view format, const std::string& what) {
  const auto it = obj.find("format");
  if (it == obj.end() || !it->is_string() || it->get<std::string>() != format)
    throw Error(what + ": format = " + (it == obj.end() ? std::string("(missing)") : brief(*it)) + " (expected \"" +
                std::string(format) + "\")");
}

// Rejects keys outside `allowed` (typos must not be ignored silently).
template <size_t K>
void check_keys(const json& obj, const std::string& where, const std::string_view (&allowed)[K]) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      throw Error(member_field(where, it.key()) + ": unknown key (expected one of " + list + ")");
    }
  }
}

}  // namespace treeattn::detail

#include "treeattn/workloads.hpp"

namespace treeattn::detail {

// The optional shape keys shared by the JSON files (tree and block-table
// formats): "heads" {qo, kv, head_dim}, "page_size", "dtype". Missing keys keep
// the defaults; errors name the JSON field ("heads.kv = 3 ...").
WorkloadParams parse_shape_keys(const json& top, const WorkloadParams& defaults);

}  // namespace treeattn::detail
