// The Plan IR: what every planner produces and every executor consumes.
// Flat arrays (CSR) that upload to the GPU as they are; see DESIGN.md.
//
// A unit is one CTA's work per kv head: a list of KV segments and a set of
// queries. Its Q tile rows are (its queries) x (the qo heads of one kv head).
// Each (unit, query) entry carries a bit mask over the unit's segments (bit s:
// the query sees segment s) and a partial slot: -1 when the query is covered
// by this unit alone (output written directly, no merge).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "treeattn/tree.hpp"

namespace treeattn {

inline constexpr int kMaxSegmentsPerUnit = 64;

// Q tile rows (m) x KV tile tokens (n). The set is fixed at compile time: the
// CUDA executor instantiates exactly these, and planners pick among them.
// Indices 0..3 are the n = 64 tiles (what smallest_tile_for_rows returns, and
// what planners that only count rows use); the others are KV-tile variants
// that PAT's tile selector picks by KV length (data/pat_tile_rules.json), and
// that the CUDA executor uses for m = 16 launches of units of <= 32 tokens.
// The CPU executor ignores n.
struct TileConfig {
  int m;
  int n;
};
inline constexpr int kDefaultKvTile = 64;
inline constexpr std::array<TileConfig, 9> kTileConfigs = {{
    {16, 64}, {32, 64}, {64, 64}, {128, 64},  // the default (n = 64) tiles, by m
    {16, 32}, {32, 32}, {64, 32},             // short KV
    {16, 128}, {32, 128},                     // long KV, decode-size Q tiles
}};
inline constexpr int kMaxTileRows = 128;
int num_tile_configs();
// Smallest compiled n = 64 tile whose m holds `rows`; throws Error if none does.
int smallest_tile_for_rows(int rows);
// Whether a CTA of tile t can run at head_dim: Q plus a two-stage K/V
// pipeline of 16-bit elements, and ~8 KB of bookkeeping, within the 227 KB
// of shared memory one CTA may use on sm_90 (the n = 128 tiles do not at
// head_dim 256). The validator rejects plans that use a tile that cannot.
constexpr bool tile_fits_head_dim(int t, int head_dim) {
  return (kTileConfigs[t].m + 4 * kTileConfigs[t].n) * head_dim * 2 + 8 * 1024 <= 227 * 1024;
}
// Index of the compiled tile (m, n) in kTileConfigs; -1 if it is not compiled.
constexpr int tile_index(int m, int n) {
  for (int i = 0; i < int(kTileConfigs.size()); ++i)
    if (kTileConfigs[i].m == m && kTileConfigs[i].n == n) return i;
  return -1;
}

// Tokens [begin, end) of a node.
struct Segment {
  int32_t node;
  int32_t begin;
  int32_t end;
  int32_t size() const { return end - begin; }
};

struct Plan {
  std::string planner;

  // Units (CSR). unit u owns segments[unit_segment_offset[u] .. [u+1]) and the
  // entries unit_query_offset[u] .. [u+1) of the three parallel arrays below.
  std::vector<int32_t> unit_segment_offset{0};
  std::vector<Segment> segments;
  std::vector<int32_t> unit_query_offset{0};
  std::vector<int32_t> entry_query;    // query id
  std::vector<uint64_t> entry_mask;    // bit s: sees segment s of the unit
  std::vector<int32_t> entry_slot;     // partial slot, -1: write output directly
  std::vector<uint8_t> unit_tile;      // index into kTileConfigs
  std::vector<uint8_t> unit_masked;    // 1 when some entry's mask is not full

  // Merge lists (CSR over queries): slots of query q are
  // query_slots[query_slot_offset[q] .. [q+1]); empty for single-unit queries.
  std::vector<int32_t> query_slot_offset{0};
  std::vector<int32_t> query_slots;
  int32_t num_slots = 0;

  int32_t num_units() const { return static_cast<int32_t>(unit_tile.size()); }
  int32_t unit_num_segments(int32_t u) const {
    return unit_segment_offset[u + 1] - unit_segment_offset[u];
  }
  int32_t unit_num_queries(int32_t u) const {
    return unit_query_offset[u + 1] - unit_query_offset[u];
  }
};

inline uint64_t full_mask(int num_segments) {
  return num_segments >= 64 ? ~0ull : ((1ull << num_segments) - 1);
}

// Builds a Plan unit by unit and derives the slots and merge lists, so that
// planners only say which segments and queries go together.
class PlanBuilder {
 public:
  // reuse: a plan whose arrays are cleared and refilled (their capacity kept).
  PlanBuilder(const Workload& w, std::string planner_name, Plan&& reuse = Plan{});
  // Starts a unit; tile < 0 picks the smallest tile that holds its rows at end.
  void begin_unit(int tile = -1);
  void add_segment(int32_t node, int32_t begin, int32_t end);
  // mask defaults to "sees every segment of this unit".
  void add_query(int32_t query, uint64_t mask = ~0ull);
  // Many at once: segments; queries with their masks (same length).
  void add_segments(std::span<const Segment> segs);
  void add_queries(std::span<const int32_t> queries, std::span<const uint64_t> masks);
  void end_unit();
  // Whole units at once, each ended as end_unit does (tiles picked by rows):
  // unit i has segments [seg_end[i - 1], seg_end[i]) of `segs` and entries
  // [query_end[i - 1], query_end[i]) of `queries` and `masks` (0 before the first).
  void add_units(std::span<const Segment> segs, std::span<const int32_t> seg_end, std::span<const int32_t> queries,
                 std::span<const uint64_t> masks, std::span<const int32_t> query_end);
  // Assigns partial slots (only queries in more than one unit get them).
  Plan finish();

 private:
  // Ends the unit that runs from the last unit's end to these ends.
  void close_unit(int32_t seg_end, int32_t entry_end, int tile);
  // Unit u, its offsets set: its masks made explicit (~0: every segment),
  // whether it is masked, and its tile (tile < 0: the smallest for its rows).
  void settle_unit(size_t u, int tile);

  const Workload& w_;
  Plan plan_;
  int pending_tile_ = -1;
  bool open_ = false;
};

struct PlanSummary {
  std::string planner;
  int64_t units = 0;
  int64_t rows = 0;          // sum over units of queries x group size, per kv head
  int64_t segments = 0;
  int64_t kv_bytes = 0;      // KV bytes the plan loads (all kv heads)
  int64_t unique_kv_bytes = 0;
  int64_t partial_bytes = 0; // partials written + read by the merge
  int64_t padded_rows = 0;   // tile rows wasted by padding, per kv head
  int64_t masked_units = 0;
  int64_t max_unit_tokens = 0;
  // Useful attention FLOPs, whatever the plan: per query, per qo head, per
  // token of its path, 2·head_dim for q·k and 2·head_dim for p·v (padded tile
  // rows and masked-out entries not counted). Over the tensor-core rate it
  // is the compute floor of bench (GpuTiming::compute_floor_us).
  int64_t flops = 0;
};
// p: a plan of w that passed validate_plan (its offsets are read unchecked).
PlanSummary summarize(const Workload& w, const Plan& p);

// Reusable memory of validate_plan. Per query its entries and slots, the
// last unit it was seen in, the depths of its path it saw whole or in pieces,
// the tokens it saw and whether its ranges need the sorted check; per
// (query, node of its path) a cell, by depth: the token where its next piece
// of that node must start; per slot its owner. The rest serves the sorted
// check (ranges gathered by query, a path) and callers that pass no index.
struct ValidatePlanScratch {
  struct Query {
    int32_t units, last_unit, slots, unsure;
    int32_t key, first_cell;  // key: its node's query_begin in the tree index
    uint64_t whole, pieces;   // bit d: its path node at depth d (< 64) was seen whole / in pieces
    int64_t tokens;
  };
  std::vector<Query> queries;
  std::vector<int32_t> cells, slot_owner;
  std::vector<int32_t> range_offset, range_fill, path;
  std::vector<Segment> ranges;
  TreeIndex index;
};

// Checks DESIGN.md's invariants (coverage, capacity, segments <= 64, masks,
// merge slots); throws Error describing the first violation found. O(units +
// entries x segments per unit + path lengths), given `index`: w's tree index
// (TreeIndex::build of w's tree and queries, as Workload::validate leaves it
// in its scratch); without one, one is built (O(nodes)). scratch: memory a
// caller that validates every decode step keeps between calls (no
// allocation once it has grown to the largest plan).
void validate_plan(const Workload& w, const Plan& p, ValidatePlanScratch* scratch = nullptr,
                   const TreeIndex* index = nullptr);

}  // namespace treeattn
