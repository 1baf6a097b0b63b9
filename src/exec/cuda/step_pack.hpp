// The host half of CudaStepExecutor::set_plan (step_executor.cpp): a plan's
// kernel arrays written, packed, into a staging buffer, and the ranges that
// place them in the executor's plan buffer (copy_ranges.cu). Host-only, so
// it is benchmarked without a GPU (bench/planning: step/pack).
// Internal to src/exec/cuda.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/cuda/attention_params.hpp"
#include "exec/cuda/kernels.hpp"
#include "treeattn/cuda_executor.hpp"

namespace treeattn::cuda {

// Byte offsets of the arrays in a step executor's plan buffer: a header of
// per-launch (first unit, unit count) pairs and the merge count, then every
// array at the offset its capacity gives it (16-byte aligned).
struct StepLayout {
  size_t counts, units, segs, entry_query, entry_mask, entry_slot, page_ids, query_slots, merges, total;
  static StepLayout make(const StepCapacity& c, int num_launches);
};

// The launch each plan unit runs on, by its tile (kTileConfigs index): the
// launch of the smallest m that holds the tile's rows (n only sets the K/V
// tile length; -1: no launch holds them). `masked`, for units some entry of
// which does not see a segment (UnitDesc::any_missing != 0): the same, but
// those of the 128-row launch run on its skip variant's launch where the
// executor has one (the variant computes any unit; it is faster only for
// masked ones, and its per-tile test would slow the others).
struct UnitLaunches {
  std::vector<int> tiles;  // each launch's tile, in launch order (the skip variant's: the 128-row tile)
  int skip_launch = -1;    // the skip variant's launch (-1: none)
  std::array<int8_t, kTileConfigs.size()> unmasked{}, masked{};
  int count() const { return int(tiles.size()); }
  // A launch per tile of `tiles`, in order, and where `skip` and the
  // 128-row tile is among them, its skip variant's right after it (left out
  // of a graph, its units then run on the plain launch before it).
  static UnitLaunches of(std::vector<int> tiles, bool skip = false);
};

// The step executor's default launch tiles: the n = 64 tiles that fit
// head_dim, largest m first (a tree's shared nodes are the long units of
// many rows, and must not queue behind a wave of short leaves).
std::vector<int> default_step_tiles(int head_dim);

// Host memory a pack reuses from step to step (no allocation once grown).
struct StepPackScratch {
  std::vector<int32_t> node_page_offset;
  std::vector<uint64_t> unit_order;  // the last pack's sorted unit keys: the next sort starts from their order
  std::vector<uint64_t> sort_tmp;    // the radix sort's scratch
  std::vector<int8_t> unit_launch;
  std::vector<UnitDesc> desc;
  std::vector<int32_t> counts;  // the header, made here, then stored
  int32_t num_merges = 0;       // of the last pack
};

// Writes plan p of tree w (validated, within the capacities of `layout`)
// into `host` (room for layout.total bytes): the header, the units grouped
// by launch (`launches`, by tile and mask; -1: no launch holds it, an Error) and
// longest first within each, segments, entries, the tree's page table,
// merge slots and descriptors, each array's used part 16-byte aligned one
// after another. Returns the ranges that place them (src/dst left null).
// `pages`: w's page table flat (checked by the caller), copied in one piece;
// null: gathered from w's nodes. `keep_entries`: p's entries, slots and
// merge lists are those of the last plan packed with this scratch, and are
// left out (their device copies stay as they are).
CopyRanges pack_step_plan(const Workload& w, const Plan& p, const StepLayout& layout,
                          const UnitLaunches& launches, uint8_t* host, StepPackScratch& scratch, const PageTableView* pages = nullptr,
                          bool keep_entries = false);

// Why a captured run may not record only the launches of `mask` (with
// launch 0, which it always records), empty where it may: each left-out
// launch's units run on the nearest recorded launch before it, which must
// hold as many rows (launch_m: each launch's tile rows, in launch order). The
// default order (m descending) allows every mask; another order
// (CudaStepOptions::tiles) may not.
std::string graph_launches_error(const std::vector<int>& launch_m, uint32_t mask);

}  // namespace treeattn::cuda
