// Suite files: every built-in suite parses and each of its workloads builds;
// bad suite files name the line; the markdown report computes its means.
#include <gtest/gtest.h>

#include <filesystem>

#include "bench/suite.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {
std::string resolve(const std::string& spec) {
  // Recorded-workload files are named relative to data/workloads/.
  for (const char* f : {"tot:", "medusa:"})
    if (spec.rfind(f, 0) == 0) return f + std::string(TREEATTN_SOURCE_DIR) + "/data/workloads/" + spec.substr(strlen(f));
  return spec;
}
}  // namespace

TEST(Suites, BuiltInSuitesBuildEveryWorkload) {
  const std::pair<const char*, size_t> expected[] = {{"fasttree", 15}, {"pat", 20}, {"flashforge", 0}, {"deft", 0}, {"forests", 19}};
  for (const auto& [name, count] : expected) {
    const bench::Suite s = bench::load_suite(name, std::string(TREEATTN_SOURCE_DIR) + "/data");
    if (count) EXPECT_EQ(s.entries.size(), count) << name;
    int quick = 0;
    for (const auto& e : s.entries) {
      quick += e.quick;
      WorkloadParams p;
      p.heads = s.heads.front();
      p.page_size = s.page_size;
      p.dtype = s.dtype;
      EXPECT_NO_THROW(make_workload(resolve(e.spec), p)) << name << ": " << e.spec;
    }
    EXPECT_GE(quick, 1) << name;
  }
}

TEST(Suites, BadSuiteFilesNameTheLine) {
  try {
    bench::parse_suite("heads: 32/8\nfasttree:N=1,4:C=8,8\nwhat is this\n", "mine");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("suite mine line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bench::parse_suite("heads: 30/8\nfasttree:N=1:C=8\n", "x"), Error);
  EXPECT_THROW(bench::parse_suite("heads: 32/8\n", "x"), Error);
  EXPECT_THROW(bench::load_suite("no-such-suite", "/nonexistent"), Error);
}

TEST(Suites, ReportGeomeans) {
  nlohmann::json recs = nlohmann::json::array();
  auto rec = [](const char* wl, const char* pl, double us, double floor_us) {
    return nlohmann::json{{"workload", wl}, {"planner", pl}, {"num_qo_heads", 32}, {"num_kv_heads", 8},
                          {"us", us}, {"floor_us", floor_us}, {"device", "test"}, {"commit", "abc"},
                          {"bandwidth_gbps", 3000.0}};
  };
  recs.push_back(rec("a", "per-query", 100, 10));
  recs.push_back(rec("a", "node", 25, 10));
  recs.push_back(rec("b", "per-query", 90, 30));
  recs.push_back(rec("b", "node", 10, 5));
  const std::string md = bench::markdown_report(recs, "t");
  // node speedups 4x and 9x: geomean 6x; floor fractions 40% and 50%: geomean 44.7%.
  EXPECT_NE(md.find("| node | 44.7% | 6.00x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `a @32/8` | 100.0 · 10% · 1.00x | 25.0 · 40% · 4.00x |"), std::string::npos) << md;
}
