// Suite files: every built-in suite parses and each of its workloads builds;
// bad suite files name the line; the markdown report computes its means.
#include <gtest/gtest.h>

#include <filesystem>

#include <unistd.h>

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
  const std::pair<const char*, size_t> expected[] = {{"fasttree", 15}, {"pat", 20}, {"flashforge", 0}, {"deft", 0}, {"forests", 19}, {"offsuite", 46}};
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
  // The error names every suite of the data directory, offsuite too.
  try {
    bench::load_suite("no-such-suite", std::string(TREEATTN_SOURCE_DIR) + "/data");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deft fasttree flashforge forests offsuite pat"), std::string::npos) << e.what();
  }
}

// `bench --suite pat --out pat --resume` from the same directory: the run's
// own output directory, named like the suite, is not read as a suite file.
TEST(Suites, ADirectoryNamedLikeTheSuiteIsNotASuiteFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("treeattn_suite_dir_" + std::to_string(::getpid()));
  fs::create_directories(dir / "pat");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  bench::Suite s;
  EXPECT_NO_THROW(s = bench::load_suite("pat", std::string(TREEATTN_SOURCE_DIR) + "/data"));
  EXPECT_EQ(s.name, "pat");
  EXPECT_EQ(s.entries.size(), 20u);
  fs::current_path(cwd);
  fs::remove_all(dir);
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

// A resumed suite run keeps the leading configs whose records are all there,
// in planner order, and refuses a document of another run by name.
TEST(Suites, ResumeKeepsTheConfigsFinishedInFull) {
  const bench::SuiteRunKey key{"mine", "abc1234", "GPU X", "treeattn bench --suite mine --verify 2"};
  const std::vector<HeadConfig> heads = {{32, 8}, {32, 8}, {16, 1}};
  const std::vector<std::string> planners = {"per-query", "auto"};
  const std::vector<std::string> workloads = {"a", "b", "a"};  // a @32/8, b @32/8, a @16/1
  const auto name = [&](size_t i) { return workloads[i]; };
  auto rec = [](const char* wl, const char* pl, int hq, int hkv) {
    return nlohmann::json{{"workload", wl}, {"planner", pl}, {"num_qo_heads", hq}, {"num_kv_heads", hkv}};
  };
  nlohmann::json doc = {{"suite", key.suite}, {"commit", key.commit}, {"device", key.device},
                        {"command", key.command}, {"records", nlohmann::json::array()}};
  auto& r = doc["records"];
  EXPECT_EQ(bench::completed_configs(doc, key, heads, name, planners), 0u);
  r.push_back(rec("a", "per-query", 32, 8));
  EXPECT_EQ(bench::completed_configs(doc, key, heads, name, planners), 0u);  // cut off midway
  r.push_back(rec("a", "auto", 32, 8));
  r.push_back(rec("b", "per-query", 32, 8));
  r.push_back(rec("b", "auto", 32, 8));
  r.push_back(rec("a", "per-query", 16, 1));
  EXPECT_EQ(bench::completed_configs(doc, key, heads, name, planners), 2u);
  r.push_back(rec("a", "auto", 16, 1));
  EXPECT_EQ(bench::completed_configs(doc, key, heads, name, planners), 3u);
  // A record of another planner order, workload or head config ends the prefix there.
  nlohmann::json swapped = doc;
  swapped["records"][2]["planner"] = "auto";
  swapped["records"][3]["planner"] = "per-query";
  EXPECT_EQ(bench::completed_configs(swapped, key, heads, name, planners), 1u);
  nlohmann::json other_heads = doc;
  other_heads["records"][5]["num_kv_heads"] = 8;
  EXPECT_EQ(bench::completed_configs(other_heads, key, heads, name, planners), 2u);
  nlohmann::json other_workload = doc;
  other_workload["records"][0]["workload"] = "b";
  EXPECT_EQ(bench::completed_configs(other_workload, key, heads, name, planners), 0u);
  // Another run's document is refused, naming the field and both values.
  for (const char* field : {"suite", "commit", "device", "command"}) {
    nlohmann::json other = doc;
    other[field] = "other";
    try {
      bench::completed_configs(other, key, heads, name, planners);
      ADD_FAILURE() << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("results.json's ") + field + " is 'other'"), std::string::npos)
          << e.what();
    }
  }
  nlohmann::json no_records = doc;
  no_records.erase("records");
  EXPECT_THROW(bench::completed_configs(no_records, key, heads, name, planners), Error);
}
