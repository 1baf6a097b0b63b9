// CudaStepExecutor's plan pack (step_pack.hpp).
#include "exec/cuda/step_pack.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "exec/cuda/plan_upload.hpp"
#include "exec/radix_sort.hpp"

namespace treeattn::cuda {

StepLayout StepLayout::make(const StepCapacity& c, int num_launches) {
  StepLayout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at = (at + bytes + 15) / 16 * 16;
    return off;
  };
  l.counts = take(sizeof(int32_t) * (2 * size_t(num_launches) + 1));  // + the merge count
  l.units = take(sizeof(UnitDesc) * size_t(c.max_units));
  l.segs = take(sizeof(SegDesc) * size_t(c.max_segments));
  l.entry_query = take(sizeof(int32_t) * size_t(c.max_entries));
  l.entry_mask = take(sizeof(uint64_t) * size_t(c.max_entries));
  l.entry_slot = take(sizeof(int32_t) * size_t(c.max_entries));
  l.page_ids = take(sizeof(int32_t) * size_t(c.max_page_refs));
  l.query_slots = take(sizeof(int32_t) * size_t(c.max_slots));
  l.merges = take(sizeof(MergeDesc) * size_t(c.max_queries));
  l.total = std::max<size_t>(at, 16);
  return l;
}

UnitLaunches UnitLaunches::of(std::vector<int> tiles, bool skip) {
  constexpr int kTile128 = tile_index(kMaxTileRows, kDefaultKvTile);
  UnitLaunches l;
  if (const auto at = std::find(tiles.begin(), tiles.end(), kTile128); skip && at != tiles.end()) {
    l.skip_launch = int(at - tiles.begin()) + 1;
    tiles.insert(tiles.begin() + l.skip_launch, kTile128);
  }
  l.tiles = std::move(tiles);
  for (size_t t = 0; t < kTileConfigs.size(); ++t) {
    int8_t& at = l.unmasked[t];
    at = -1;
    for (int i = 0; i < l.count(); ++i)
      if (i != l.skip_launch && kTileConfigs[l.tiles[i]].m >= kTileConfigs[t].m &&
          (at < 0 || kTileConfigs[l.tiles[i]].m < kTileConfigs[l.tiles[at]].m))
        at = int8_t(i);
    l.masked[t] = l.skip_launch >= 0 && at == l.skip_launch - 1 ? int8_t(l.skip_launch) : at;
  }
  return l;
}

std::vector<int> default_step_tiles(int head_dim) {
  std::vector<int> tiles;
  for (int t = int(kTileConfigs.size()) - 1; t >= 0; --t)
    if (kTileConfigs[t].n == kDefaultKvTile && tile_fits_head_dim(t, head_dim)) tiles.push_back(t);
  return tiles;  // (the n = 64 tiles come first in kTileConfigs, by m ascending)
}

CopyRanges pack_step_plan(const Workload& w, const Plan& p, const StepLayout& ly, const UnitLaunches& launches,
                          uint8_t* host, StepPackScratch& sc, const PageTableView* pages, bool keep_entries) {
  const int U = p.num_units(), L = launches.count();
  sc.desc.resize(size_t(U));
  sc.unit_launch.resize(size_t(U));
  for (int u = 0; u < U; ++u) {
    sc.unit_launch[u] = launches.unmasked[p.unit_tile[u]];
    if (sc.unit_launch[u] < 0)
      throw Error("step executor: unit " + std::to_string(u) + " needs tile m=" +
                  std::to_string(kTileConfigs[p.unit_tile[u]].m) + ", larger than any tile this executor launches");
  }

  // Each array's used part, packed in the order staged; each fits its
  // capacity, so the packed bytes never exceed layout.total.
  CopyRanges ranges;
  auto stage = [&](size_t placed_at, size_t bytes) {
    const size_t at = ranges.src_bytes;
    ranges.src_off[ranges.count] = at;
    ranges.dst_off[ranges.count] = placed_at;
    ++ranges.count;
    ranges.src_bytes = (at + bytes + 15) / 16 * 16;
    return host + at;
  };
  auto* counts = reinterpret_cast<int32_t*>(stage(ly.counts, sizeof(int32_t) * (2 * L + 1)));
  auto* units = reinterpret_cast<UnitDesc*>(stage(ly.units, sizeof(UnitDesc) * U));
  auto* segs = reinterpret_cast<SegDesc*>(stage(ly.segs, sizeof(SegDesc) * p.segments.size()));
  auto copy = [&](size_t placed_at, const auto& v) {
    uint8_t* to = stage(placed_at, sizeof(v[0]) * v.size());
    if (!v.empty()) std::memcpy(to, v.data(), sizeof(v[0]) * v.size());
  };
  if (!keep_entries) {
    copy(ly.entry_query, p.entry_query);
    copy(ly.entry_mask, p.entry_mask);
    copy(ly.entry_slot, p.entry_slot);
    copy(ly.query_slots, p.query_slots);
  }
  // The tree's page table: every node's pages, concatenated.
  const int32_t* node_page_offset = nullptr;
  if (pages) {
    copy(ly.page_ids, pages->ids);
    node_page_offset = pages->node_offsets.data();
  } else {
    int64_t refs = 0;
    for (const Node& n : w.tree.nodes) refs += int64_t(n.pages.size());
    auto* page_ids = reinterpret_cast<int32_t*>(stage(ly.page_ids, sizeof(int32_t) * size_t(refs)));
    sc.node_page_offset.resize(w.tree.nodes.size() + 1);
    sc.node_page_offset[0] = 0;
    for (size_t v = 0; v < w.tree.nodes.size(); ++v) {
      const std::vector<int32_t>& ids = w.tree.nodes[v].pages;
      if (!ids.empty()) std::memcpy(page_ids + sc.node_page_offset[v], ids.data(), sizeof(int32_t) * ids.size());
      sc.node_page_offset[v + 1] = sc.node_page_offset[v] + int32_t(ids.size());
    }
    node_page_offset = sc.node_page_offset.data();
  }
  build_unit_descs(w, p, node_page_offset, sc.desc.data(), segs);
  if (launches.masked != launches.unmasked)
    for (int u = 0; u < U; ++u)
      if (sc.desc[u].any_missing != 0) sc.unit_launch[u] = launches.masked[p.unit_tile[u]];
  // Last, as its size is known only once written: at most one per query.
  if (!keep_entries) {
    const size_t merges_at = ranges.src_bytes;
    sc.num_merges = build_merge_descs(p, w.num_queries(), reinterpret_cast<MergeDesc*>(stage(ly.merges, 0)));
    ranges.src_bytes = merges_at + sizeof(MergeDesc) * size_t(sc.num_merges);  // a multiple of 16
  }

  // Units by launch, longest first within each (the tail is short ones),
  // ties in plan order: one sort of (launch, longest first, unit) keys,
  // distinct by their unit. Where the last pack had as many units, its order
  // is the start: in a decode loop the plan is the last one with some units
  // a token longer, nearly sorted, and an insertion sort finishes in about a
  // pass. Otherwise (or if that would take more than a move per unit) the
  // radix sort of the keys in unit order.
  static_assert(kMaxPathTokens < (int64_t(1) << 32) && kTileConfigs.size() < 16, "the key's fields");
  const auto key = [&](uint32_t u) {  // u < 2^24 (max_units)
    return uint64_t(sc.unit_launch[u]) << 60 | uint64_t(UINT32_MAX - uint32_t(sc.desc[u].len)) << 24 | uint64_t(u);
  };
  bool sorted = false;
  if (sc.unit_order.size() == size_t(U)) {
    for (uint64_t& k : sc.unit_order) k = key(uint32_t(k & 0xFFFFFF));
    sorted = insertion_sort_keys(sc.unit_order, size_t(U));
  }
  if (!sorted) {
    sc.unit_order.resize(size_t(U));
    for (int u = 0; u < U; ++u) sc.unit_order[u] = key(uint32_t(u));
    radix_sort_keys(sc.unit_order, sc.sort_tmp, 24);  // by (launch, length); unit order where equal
  }
  // The staging buffer (pinned memory) is written, never read back: the
  // counts are made in scratch, then stored.
  std::vector<int32_t>& count = sc.counts;
  count.assign(size_t(2 * L + 1), 0);
  for (int i = 0; i < U; ++i) {
    const uint64_t key = sc.unit_order[i];
    units[i] = sc.desc[key & 0xFFFFFF];
    ++count[2 * (key >> 60) + 1];
  }
  for (int l = 1; l < L; ++l) count[2 * l] = count[2 * l - 2] + count[2 * l - 1];
  count[2 * L] = sc.num_merges;
  std::memcpy(counts, count.data(), sizeof(int32_t) * (2 * L + 1));
  return ranges;
}

std::string graph_launches_error(const std::vector<int>& launch_m, uint32_t mask) {
  const int L = int(launch_m.size());
  if (L > 31 || (mask >> L) != 0)
    return "graph launches " + std::to_string(mask) + " name a launch past the last (" + std::to_string(L) +
           " launches: a mask below " + std::to_string(uint64_t(1) << L) + ")";
  const uint32_t recorded = mask | 1u;
  for (int j = 1, at = 0; j < L; ++j) {
    if (recorded >> j & 1) {
      at = j;
    } else if (launch_m[j] > launch_m[at]) {
      return "graph launches " + std::to_string(mask) + " leave out launch " + std::to_string(j) + " (m " +
             std::to_string(launch_m[j]) + "), whose units would run on launch " + std::to_string(at) + " (m " +
             std::to_string(launch_m[at]) + "): it holds fewer rows";
    }
  }
  return {};
}

}  // namespace treeattn::cuda
