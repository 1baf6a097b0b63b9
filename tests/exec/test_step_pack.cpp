// The CUDA step executor's host pack (src/exec/cuda/step_pack.cpp), which
// needs no GPU: in a decode loop it starts the units' sort from the last
// pack's order, copies the page table flat from the caller's arrays, and
// leaves out what a plan extension keeps; all must leave the plan buffer
// exactly as a pack from scratch does.
#if defined(TREEATTN_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "exec/cuda/step_pack.hpp"
#include "tests/support/tree_arrays.hpp"
#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

using test_support::Arrays;

// The step executor's default launches (m 128, 64, 32, 16 at n = 64).
constexpr int kLaunches = 4;
std::array<int8_t, kTileConfigs.size()> launch_of_tile() {
  std::array<int8_t, kTileConfigs.size()> l{};
  for (size_t t = 0; t < kTileConfigs.size(); ++t)
    l[t] = int8_t(kTileConfigs[t].m >= 128 ? 0 : kTileConfigs[t].m >= 64 ? 1 : kTileConfigs[t].m >= 32 ? 2 : 3);
  return l;
}

// Packs (w, p) into a zeroed buffer; returns the packed bytes.
std::vector<uint8_t> pack(const Workload& w, const Plan& p, const cuda::StepLayout& layout,
                          cuda::StepPackScratch& scratch, const PageTableView* pages, cuda::CopyRanges& ranges,
                          bool keep_entries = false) {
  std::vector<uint8_t> host(layout.total, 0);
  ranges = cuda::pack_step_plan(w, p, layout, launch_of_tile(), kLaunches, host.data(), scratch, pages, keep_entries);
  host.resize(ranges.src_bytes);
  return host;
}

// What copy_ranges does on the device: each 16-byte chunk of the packed
// bytes to its range's place in the plan buffer `plan`.
void place(const std::vector<uint8_t>& packed, const cuda::CopyRanges& r, std::vector<uint8_t>& plan) {
  for (size_t at = 0; at < r.src_bytes; at += 16) {
    int k = 0;
    while (k + 1 < r.count && r.src_off[k + 1] <= at) ++k;
    std::memcpy(plan.data() + r.dst_off[k] + (at - r.src_off[k]), packed.data() + at, 16);
  }
}

// Decode steps through the CPU runtime (most extend the last plan, so unit
// lengths change a little each step and pass each other; some are fresh
// plans with other units): each step's plan packed with one scratch kept across steps and
// the caller's flat page table, and again from a new scratch with the pages
// gathered node by node. Equal bytes and ranges, and the units in the
// packed descriptors grouped by launch, longest first within one. A third
// pack leaves out an extension's entries, slots and merges (as set_plan
// does under PlanCheck::extension): placed on the last step's plan buffer,
// it makes the same buffer as the full pack.
TEST(StepPack, KeptSortOrderFlatPageTableAndKeptEntriesPlaceTheSameBytes) {
  WorkloadParams wp;
  wp.heads = {8, 2, 64};
  wp.page_size = 4;
  for (const char* spec : {"fewshot:prompt=300:branches=24:len=9", "kary:arity=3:depth=3:total=300", "pat:B=1,4,16:L=60,20,7"}) {
    const Workload w0 = make_workload(spec, wp);
    Arrays a(w0);
    TreeAttentionConfig c;
    c.heads = wp.heads;
    c.page_size = wp.page_size;
    c.num_pages = w0.layout.num_pages + 64 * 40;
    c.device = Device::cpu;
    c.max_extension_tokens = 8;
    TreeAttention ta(c);
    const cuda::StepLayout layout = cuda::StepLayout::make(ta.config().step_capacity(), kLaunches);
    cuda::StepPackScratch kept, kept_entries;
    std::vector<uint8_t> plan_full(layout.total, 0), plan_kept(layout.total, 0);  // two executors' plan buffers
    int64_t extended = 0, smaller = 0;
    int32_t next_page = int32_t(w0.layout.num_pages);
    std::vector<char> grows(a.parents.size(), 0);
    for (const int32_t v : a.query_nodes) grows[size_t(v)] = 1;
    for (int step = 0; step < 40; ++step) {
      ta.plan_tree(a.view());
      const Workload& w = ta.workload();
      const Plan& p = ta.plan();
      const PageTableView flat{a.page_ids, a.page_offsets};
      cuda::StepPackScratch fresh;
      cuda::CopyRanges r1, r2;
      const std::vector<uint8_t> b1 = pack(w, p, layout, kept, &flat, r1);
      const std::vector<uint8_t> b2 = pack(w, p, layout, fresh, nullptr, r2);
      ASSERT_EQ(r1.count, r2.count) << spec << " step " << step;
      for (int i = 0; i < r1.count; ++i) {
        ASSERT_EQ(r1.src_off[i], r2.src_off[i]) << spec << " step " << step << " range " << i;
        ASSERT_EQ(r1.dst_off[i], r2.dst_off[i]) << spec << " step " << step << " range " << i;
      }
      ASSERT_EQ(b1.size(), b2.size()) << spec << " step " << step;
      const auto diff = std::mismatch(b1.begin(), b1.end(), b2.begin());
      ASSERT_TRUE(diff.first == b1.end()) << spec << " step " << step << ": the packs differ from byte "
                                          << (diff.first - b1.begin()) << " of " << b1.size();
      // Range 1 holds the unit descriptors, range 0 the per-launch counts.
      const auto* units = reinterpret_cast<const cuda::UnitDesc*>(b1.data() + r1.src_off[1]);
      const auto* counts = reinterpret_cast<const int32_t*>(b1.data() + r1.src_off[0]);
      int32_t seen = 0;
      for (int l = 0; l < kLaunches; ++l) {
        ASSERT_EQ(counts[2 * l], seen) << spec << " step " << step;
        for (int32_t i = 1; i < counts[2 * l + 1]; ++i)
          ASSERT_GE(units[seen + i - 1].len, units[seen + i].len) << spec << " step " << step << " launch " << l;
        seen += counts[2 * l + 1];
      }
      ASSERT_EQ(seen, p.num_units()) << spec << " step " << step;
      const bool extension = ta.plan_stats().extended > extended;
      extended = ta.plan_stats().extended;
      cuda::CopyRanges r3;
      const std::vector<uint8_t> b3 = pack(w, p, layout, kept_entries, &flat, r3, extension);
      place(b1, r1, plan_full);
      place(b3, r3, plan_kept);
      smaller += extension && b3.size() < b1.size();
      ASSERT_TRUE(plan_full == plan_kept) << spec << " step " << step << (extension ? " (extension)" : "");
      // The next step: query node v 0, 1 or 2 tokens longer (v mod 3), pages
      // added as its last fills, so that units' lengths pass each other.
      std::vector<int32_t> pages, offsets{0};
      for (size_t v = 0; v < a.parents.size(); ++v) {
        pages.insert(pages.end(), a.page_ids.begin() + a.page_offsets[v], a.page_ids.begin() + a.page_offsets[v + 1]);
        if (grows[v]) {
          a.num_tokens[v] += int32_t(v % 3);
          for (int64_t have = a.page_offsets[v + 1] - a.page_offsets[v];
               a.first_slots[v] + a.num_tokens[v] > have * wp.page_size; ++have)
            pages.push_back(next_page++);
        }
        offsets.push_back(int32_t(pages.size()));
      }
      a.page_ids = pages;
      a.page_offsets = offsets;
    }
    EXPECT_GE(ta.plan_stats().extended, 20) << spec;
    EXPECT_EQ(smaller, ta.plan_stats().extended) << spec;  // every extension's pack left its entries out
    EXPECT_GE(ta.plan_stats().planned, 3) << spec;
  }
}

// A captured run's launch masks (CudaStepExecutor::set_graph_launches): in
// the default order (m descending) every mask is allowed; in another order a
// mask that leaves out a launch after one of fewer rows is refused, naming
// both; a bit past the last launch is refused.
TEST(StepPack, GraphLaunchMasksKeepEveryUnitOnATileThatHoldsIt) {
  const std::vector<int> descending = {128, 64, 32, 16};
  for (uint32_t mask = 0; mask < 16; ++mask) EXPECT_EQ(cuda::graph_launches_error(descending, mask), "") << mask;
  EXPECT_NE(cuda::graph_launches_error(descending, 16).find("graph launches 16 name a launch past the last (4"),
            std::string::npos);
  const std::vector<int> other = {16, 128, 32};  // e.g. CudaStepOptions::tiles = {m16, m128, m32}
  EXPECT_EQ(cuda::graph_launches_error(other, 0b010), "");  // launch 2 (m32) runs on launch 1 (m128)
  EXPECT_EQ(cuda::graph_launches_error(other, 0b111), "");
  const std::string e = cuda::graph_launches_error(other, 0b100);
  EXPECT_NE(e.find("leave out launch 1 (m 128), whose units would run on launch 0 (m 16)"), std::string::npos) << e;
  EXPECT_NE(cuda::graph_launches_error(other, 0).find("leave out launch 1"), std::string::npos);
}

}  // namespace
}  // namespace treeattn
#endif
