// nlohmann::json helpers for the builders that read JSON files (src/tree only;
// public headers never expose nlohmann). Every accessor takes the field path
// used in error messages, e.g. "nodes[3].parent".
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// The member `key` of object `obj` (whose own path is `where`, "" for the top).
inline std::string member_field(const std::string& where, std::string_view key) {
  return where.empty() ? std::string(key) : where + "." + std::string(key);
}

// Deepest nesting of lists/objects any treeattn file may have. Our formats
// need 4 (a ToT file: list > task > data > node > children); the margin is for
// files we have not met. Deeper input is refused by parse_json.
inline constexpr int kMaxJsonDepth = 64;

// Builds the DOM as json::parse does (through json::sax_parse, the json_sax
// interface) and refuses, as it meets them, what json::parse accepts but a
// treeattn file must not have:
// - nesting past kMaxJsonDepth, before the deeper value exists: recursive code
//   (dump(), the error messages' brief()) must never meet a 100000-deep value;
// - a key repeated in one object (json::parse keeps the last value silently).
// Not through json::parse's parser callback: with one installed, each closing
// '}' scans its whole enclosing array, quadratic in a list of objects (a
// 200000-node tree file took 30 s to load); this handler is linear.
class JsonDomBuilder {
 public:
  explicit JsonDomBuilder(const std::string& what) : what_(what) {}
  json root;

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(v); }
  bool string(json::string_t& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json(std::move(v))); }
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  // Every member before this key is already in the object (put() and open()
  // add a value as soon as it starts), so one lookup finds a repeat.
  bool key(json::string_t& k) {
    Level& top = stack_.back();
    if (top.value->contains(k)) {
      const std::string where = path();
      throw Error(what_ + ": duplicate key " + brief(json(k)) + " in " + (where.empty() ? "the top level" : where));
    }
    top.key = std::move(k);
    return true;
  }
  // Syntax errors (json::parse_error) and numbers out of double's range
  // (json::out_of_range) are thrown as json::parse would; parse_json words them.
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;
  }

 private:
  struct Level {
    json* value;      // the open list or object
    std::string key;  // an object's member being read
  };
  std::vector<Level> stack_;
  std::string what_;

  // Adds v to the open list or object (or as the root); its address stays
  // valid while it is open: nothing is added to its parent until it closes.
  json* add(json&& v) {
    if (stack_.empty()) return &(root = std::move(v));
    Level& top = stack_.back();
    if (top.value->is_array()) {
      top.value->push_back(std::move(v));
      return &top.value->back();
    }
    return &((*top.value)[top.key] = std::move(v));
  }
  bool put(json&& v) {
    add(std::move(v));
    return true;
  }
  bool open(json::value_t t) {
    if (stack_.size() >= size_t(kMaxJsonDepth))
      throw Error(what_ + ": nesting deeper than " + std::to_string(kMaxJsonDepth) +
                  " lists/objects (kMaxJsonDepth) is not a treeattn file");
    json* v = add(json(t));
    stack_.push_back({v, {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  // The open object's field path as the readers' messages write it: "nodes[3]".
  std::string path() const {
    std::string p;
    for (size_t i = 1; i < stack_.size(); ++i) {
      const Level& parent = stack_[i - 1];
      p = parent.value->is_array() ? p + "[" + std::to_string(parent.value->size() - 1) + "]"
                                   : member_field(p, parent.key);
    }
    return p;
  }
};

// Parses text; a syntax error becomes Error "<what>: parse error at byte N: ...",
// nesting past kMaxJsonDepth Error "<what>: nesting deeper than 64 ...", a
// repeated key Error "<what>: duplicate key "K" in nodes[3]".
inline json parse_json(std::string_view text, const std::string& what) {
  JsonDomBuilder builder(what);
  try {
    json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const json::parse_error& e) {
    throw Error(what + ": parse error at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {
    // Not only syntax: a number out of double's range ("1e400") is
    // out_of_range.406 (found by fuzz/fuzz_json_tree).
    throw Error(what + ": " + e.what());
  }
  return std::move(builder.root);
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
