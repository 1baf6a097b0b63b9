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
const cuda::UnitLaunches& default_launches() {
  static const cuda::UnitLaunches l = cuda::UnitLaunches::of(cuda::default_step_tiles(64));
  return l;
}

// Packs (w, p) into a zeroed buffer; returns the packed bytes.
std::vector<uint8_t> pack(const Workload& w, const Plan& p, const cuda::StepLayout& layout,
                          cuda::StepPackScratch& scratch, const PageTableView* pages, cuda::CopyRanges& ranges,
                          bool keep_entries = false, const cuda::UnitLaunches& launches = default_launches()) {
  std::vector<uint8_t> host(layout.total, 0);
  ranges = cuda::pack_step_plan(w, p, layout, launches, host.data(), scratch, pages, keep_entries);
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

// Which launch a unit runs on: the launch of the smallest m that holds its
// tile (n aside), in any launch order; with a skip launch, the masked units
// of the 128-row launch go to it and no unmasked unit does; no launch that
// holds a tile: -1.
TEST(StepPack, UnitLaunchesTakeTheSmallestTileThatHoldsTheRows) {
  constexpr int t16 = tile_index(16, 64), t32 = tile_index(32, 64), t64 = tile_index(64, 64),
                t128 = tile_index(128, 64), t16n32 = tile_index(16, 32), t32n128 = tile_index(32, 128);
  EXPECT_EQ(cuda::default_step_tiles(128), (std::vector<int>{t128, t64, t32, t16}));
  const cuda::UnitLaunches d = default_launches();
  EXPECT_EQ(d.count(), 4);
  EXPECT_EQ(d.skip_launch, -1);
  EXPECT_EQ(d.unmasked[t128], 0);
  EXPECT_EQ(d.unmasked[t64], 1);
  EXPECT_EQ(d.unmasked[t16n32], 3);
  EXPECT_EQ(d.unmasked[t32n128], 2);
  EXPECT_EQ(d.masked, d.unmasked);
  const cuda::UnitLaunches s = cuda::UnitLaunches::of(cuda::default_step_tiles(64), true);
  EXPECT_EQ(s.tiles, (std::vector<int>{t128, t128, t64, t32, t16}));
  EXPECT_EQ(s.skip_launch, 1);
  EXPECT_EQ(s.unmasked[t128], 0);
  EXPECT_EQ(s.masked[t128], 1);
  EXPECT_EQ(s.unmasked[t64], 2);
  EXPECT_EQ(s.masked[t64], 2);  // a 64-row unit keeps its own tile, masked or not
  EXPECT_EQ(s.masked[t16], 4);
  // Out of order, and without a launch of 64 rows: m64 units take m128's,
  // masked ones its skip variant.
  const cuda::UnitLaunches o = cuda::UnitLaunches::of({t16, t128}, true);
  EXPECT_EQ(o.skip_launch, 2);
  EXPECT_EQ(o.unmasked[t64], 1);
  EXPECT_EQ(o.masked[t64], 2);
  EXPECT_EQ(o.unmasked[t32], 1);
  EXPECT_EQ(o.unmasked[t16], 0);
  const cuda::UnitLaunches small = cuda::UnitLaunches::of({t32, t16}, true);  // no 128-row tile: no skip launch
  EXPECT_EQ(small.skip_launch, -1);
  EXPECT_EQ(small.unmasked[t128], -1);
  EXPECT_EQ(small.masked[t64], -1);
}

// A pack with a skip launch: the masked units of the 128-row tile go to it,
// every other unit where the default launches put it; the plan buffer is
// otherwise that of the pack without it. A unit whose tile no launch holds
// is refused before anything is written.
TEST(StepPack, MaskedUnitsOfTheLargestTileGoToTheSkipLaunch) {
  WorkloadParams wp;
  wp.heads = {32, 8, 64};
  wp.page_size = 16;
  const Workload w = make_workload("fasttree:N=1,2,64:C=512,300,24", wp);
  PlanOptions opt;  // the root in four unmasked 128-row units, each subtree one masked one
  opt.extra["flat_rows"] = 128;
  opt.extra["compact_stretch"] = 1000;
  const Plan p = make_plan("node", w, opt);
  constexpr int t128 = tile_index(128, 64);
  int masked128 = 0, plain128 = 0;
  for (int32_t u = 0; u < p.num_units(); ++u)
    if (p.unit_tile[u] == t128) (p.unit_masked[u] ? masked128 : plain128) += 1;
  ASSERT_GT(masked128, 0) << "the plan has masked 128-row units";
  ASSERT_GT(plain128, 0) << "the plan has unmasked 128-row units";
  const cuda::UnitLaunches skip = cuda::UnitLaunches::of(cuda::default_step_tiles(64), true);
  StepCapacity cap;
  cap.max_units = p.num_units();
  cap.max_segments = int32_t(p.segments.size());
  cap.max_entries = int32_t(p.entry_query.size());
  cap.max_slots = std::max(1, p.num_slots);
  cap.max_page_refs = w.layout.num_pages;
  const cuda::StepLayout l4 = cuda::StepLayout::make(cap, 4), l5 = cuda::StepLayout::make(cap, 5);
  cuda::StepPackScratch s4, s5;
  cuda::CopyRanges r4, r5;
  const std::vector<uint8_t> b4 = pack(w, p, l4, s4, nullptr, r4);
  const std::vector<uint8_t> b5 = pack(w, p, l5, s5, nullptr, r5, false, skip);
  const auto* c4 = reinterpret_cast<const int32_t*>(b4.data() + r4.src_off[0]);
  const auto* c5 = reinterpret_cast<const int32_t*>(b5.data() + r5.src_off[0]);
  EXPECT_EQ(c4[1], masked128 + plain128);
  EXPECT_EQ(c5[1], plain128);
  EXPECT_EQ(c5[2], plain128);  // the skip launch's first unit
  EXPECT_EQ(c5[3], masked128);
  for (int l = 1; l < 4; ++l) EXPECT_EQ(c5[2 * l + 3], c4[2 * l + 1]) << "launch " << l;
  EXPECT_EQ(c5[10], c4[8]);  // the merges
  const auto* units = reinterpret_cast<const cuda::UnitDesc*>(b5.data() + r5.src_off[1]);
  for (int32_t i = 0; i < c5[1] + c5[3]; ++i)
    EXPECT_EQ(units[i].any_missing != 0, i >= c5[1]) << "unit " << i << " of the 128-row launches";
  // Past the header, the same bytes (the units in another order).
  ASSERT_EQ(r4.count, r5.count);
  for (int i = 2; i < r4.count; ++i)
    EXPECT_TRUE(std::equal(b4.begin() + r4.src_off[i], b4.begin() + (i + 1 < r4.count ? r4.src_off[i + 1] : b4.size()),
                           b5.begin() + r5.src_off[i]))
        << "range " << i;
  const cuda::UnitLaunches none = cuda::UnitLaunches::of({tile_index(32, 64), tile_index(16, 64)});
  cuda::StepPackScratch s2;
  cuda::CopyRanges r2;
  try {
    pack(w, p, cuda::StepLayout::make(cap, 2), s2, nullptr, r2, false, none);
    FAIL() << "no launch holds the 128-row units";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs tile m=128, larger than any tile this executor launches"),
              std::string::npos)
        << e.what();
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
