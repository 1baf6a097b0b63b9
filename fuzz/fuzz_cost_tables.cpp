// libFuzzer target: the JSON files the planners' cost models read (the auto
// cost model, calibrate --auto's samples, the forge cost table, PAT's tile
// rules). The first byte picks the parser, the rest is the text. Oracle: a
// parser throws treeattn::Error or returns a value that its to_json writes
// back and parses again to the same text (nothing read is lost or invented);
// samples that parse are fitted (fit_auto_cost_model), which throws Error or
// gives a model that validates and predicts finite times for them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "treeattn/cost_models.hpp"

namespace {

[[noreturn]] void oracle_failure(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_cost_tables oracle: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// to_json(parse(to_json(x))) == to_json(x): what the first parse kept survives a round trip.
template <class T, class Parse>
void round_trip(const T& x, Parse parse) {
  const std::string a = treeattn::to_json(x);
  std::string b;
  try {
    b = treeattn::to_json(parse(a));
  } catch (const treeattn::Error& e) {
    oracle_failure("a value's own JSON does not parse", std::string(e.what()) + "\n" + a);
  }
  if (a != b) oracle_failure("the JSON changed in a round trip", a + "\n---\n" + b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 * 1024) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        round_trip(treeattn::parse_auto_cost_model(text), treeattn::parse_auto_cost_model);
        break;
      case 1: {
        const treeattn::AutoCostSamples s = treeattn::parse_auto_cost_samples(text);
        round_trip(s, treeattn::parse_auto_cost_samples);
        if (s.samples.size() > 200) break;  // the fit is O(samples), but keep executions fast
        treeattn::AutoCostModel m;
        try {
          m = treeattn::fit_auto_cost_model(s.samples);
        } catch (const treeattn::Error&) {
          break;
        }
        m.validate();  // throws Error (a failure of the fit's own check) if it is not
        for (const treeattn::AutoCostSample& x : s.samples)
          if (!std::isfinite(m.predict(x.node)) && std::isfinite(x.node_us))
            oracle_failure("a fitted model predicts a non-finite time", x.config);
        break;
      }
      case 2:
        round_trip(treeattn::parse_forge_cost_table(text), treeattn::parse_forge_cost_table);
        break;
      default:
        round_trip(treeattn::parse_pat_tile_rules(text), treeattn::parse_pat_tile_rules);
        break;
    }
  } catch (const treeattn::Error&) {
  }
  return 0;
}
