// PAT's planner with its lazy plan update (PAT, ASPLOS'26 §5): a small cache
// keyed by the batch's tree structure, so a decode step whose batch did not
// change reuses its plan, and a step where only the leaves grew (every
// sequence appended tokens) reuses the TreeHeuristic grouping and only redoes
// the long-KV split and the tile selection. The registered `pat` planner is the
// same computation without a cache.
//
// Also here: the view the multi-stream executor needs. PAT launches one kernel
// per tile config, each on its own stream; `pat` emits its units grouped by
// tile config, and tile_runs() lists those groups.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "treeattn/cost_models.hpp"

namespace treeattn {

// Maximal runs of consecutive units with the same tile config, in plan order.
struct TileRun {
  int tile;       // index into kTileConfigs
  int32_t begin;  // first unit
  int32_t end;    // one past the last unit
};
std::vector<TileRun> tile_runs(const Plan& p);

// Not thread-safe: one instance per planning thread (a serving loop owns one).
class PatPlanner {
 public:
  // rules == nullptr: default_pat_tile_rules() at construction.
  explicit PatPlanner(std::shared_ptr<const PatTileRules> rules = nullptr, size_t capacity = 4);
  ~PatPlanner();
  PatPlanner(const PatPlanner&) = delete;
  PatPlanner& operator=(const PatPlanner&) = delete;

  // Same result as plan_pat_with(w, opt, rules) for every input.
  Plan plan(const Workload& w, const PlanOptions& opt = {});

  struct Stats {
    int64_t reused = 0;       // identical batch: cached plan returned
    int64_t incremental = 0;  // only leaf lengths changed: grouping reused
    int64_t rebuilt = 0;      // structure changed or not cached: full planning
  };
  const Stats& stats() const { return stats_; }
  void clear();

 private:
  struct Entry;
  std::shared_ptr<const PatTileRules> rules_;
  size_t capacity_;
  std::list<std::unique_ptr<Entry>> entries_;  // most recently used first
  Stats stats_;
};

}  // namespace treeattn
