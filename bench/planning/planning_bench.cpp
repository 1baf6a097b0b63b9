// Planning speed of every registered planner (and PAT's cached planner) on
// random radix trees of 100, 1 000 and 10 000 nodes with 256 queries, heads
// 32/8, d = 128, page 16. Planning runs on the host before every decode step,
// so the target is <= 100 us for the 1 000-node tree on one core.
//   treeattn_planning_bench [--benchmark_filter=/1000$]
#include <benchmark/benchmark.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "bench/planning/bench_tree.hpp"
#include "treeattn/pat_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"
#if defined(TREEATTN_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include <array>

#include "exec/cuda/step_pack.hpp"
#include "treeattn/cuda_executor.hpp"
#endif

using namespace treeattn;

namespace {

// The planner alone, as a pure function (it builds the tree's index) of a
// workload validated once: make_plan would validate it every call.
void plan_once(benchmark::State& state, const std::string& planner, int nodes) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  const PlanOptions opt;
  const PlannerFn plan = find_planner(planner).fn;
  for (auto _ : state) {
    Plan p = plan(w, opt);
    benchmark::DoNotOptimize(p.unit_tile.data());
  }
  state.counters["units"] = double(make_plan(planner, w, opt).num_units());
}

// A suite tree (spec at heads "Q/KV"): where auto prices more shapes of node
// (deep trees of many queries: its step 4 plans node at longer compact-subtree
// paths), against node's own plan of the same tree.
void plan_suite_tree(benchmark::State& state, const std::string& planner, const std::string& heads,
                     const std::string& spec) {
  WorkloadParams p;
  std::sscanf(heads.c_str(), "%d/%d", &p.heads.num_qo_heads, &p.heads.num_kv_heads);
  const Workload w = make_workload(spec, p);
  const PlanOptions opt;
  const PlannerFn fn = find_planner(planner).fn;
  for (auto _ : state) {
    Plan plan = fn(w, opt);
    benchmark::DoNotOptimize(plan.unit_tile.data());
  }
  state.counters["nodes"] = double(w.tree.nodes.size());
  state.counters["units"] = double(make_plan(planner, w, opt).num_units());
}

// PAT's lazy update: an unchanged batch (cache hit) and decode steps where
// only the leaves grew (incremental path).
void pat_cached(benchmark::State& state, int nodes, bool grow) {
  Workload a = bench::planning_bench_tree(nodes, 256, 42), b = a;
  std::vector<int> children(b.tree.nodes.size(), 0);
  for (const Node& n : b.tree.nodes)
    if (n.parent >= 0) ++children[n.parent];
  for (size_t v = 0; v < b.tree.nodes.size(); ++v)
    if (children[v] == 0) {
      Node& n = b.tree.nodes[v];
      n.num_tokens += 1;
      while (int64_t(n.pages.size()) * b.layout.page_size < n.num_tokens) n.pages.push_back(int32_t(b.layout.num_pages++));
    }
  b.validate();
  PatPlanner planner(nullptr, 1);
  const PlanOptions opt;
  bool flip = false;
  for (auto _ : state) {
    Plan p = planner.plan(grow && (flip = !flip) ? b : a, opt);
    benchmark::DoNotOptimize(p.unit_tile.data());
  }
}

// The runtime's whole plan step as an engine calls it: tree arrays in,
// Workload built and validated, planned ("auto"), plan validated, and (on the
// GPU) packed into pinned memory with its copies enqueued. Two cases:
// - the same tree every call, with plan extension off (max_extension_tokens
//   = 0), so each call plans it afresh;
// - `changing`: a branch forks or finishes every call (the tree alternates
//   with itself less its last leaf and that leaf's query), with the default
//   extension on, so each call is a fresh plan as an engine's batch change is,
//   including the extension's bookkeeping for the steps after it.
void runtime_plan(benchmark::State& state, int nodes, Device device, bool changing) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  struct Arrays {
    std::vector<int32_t> parents, num_tokens, offsets{0}, pages, queries;
  };
  Arrays full, less;
  const int32_t dropped = int32_t(w.tree.nodes.size()) - 1;  // the last node is a leaf, with one query
  for (size_t v = 0; v < w.tree.nodes.size(); ++v) {
    const Node& n = w.tree.nodes[v];
    for (Arrays* a : {&full, &less}) {
      if (a == &less && int32_t(v) == dropped) continue;
      a->parents.push_back(n.parent);
      a->num_tokens.push_back(n.num_tokens);
      a->pages.insert(a->pages.end(), n.pages.begin(), n.pages.end());
      a->offsets.push_back(int32_t(a->pages.size()));
    }
  }
  full.queries = w.query_nodes;
  for (const int32_t v : w.query_nodes)
    if (v != dropped) less.queries.push_back(v);
  TreeAttentionConfig c;
  c.heads = w.heads;
  c.dtype = w.layout.dtype;
  c.page_size = w.layout.page_size;
  c.num_pages = w.layout.num_pages;
  c.device = device;
  c.max_queries = 256;
  c.max_nodes = 16384;
  c.max_page_refs = int64_t(full.pages.size());
  if (!changing) c.max_extension_tokens = 0;  // the same tree each step: planned afresh, not extended
  TreeAttention ta(c);
  const auto arrays = [](const Arrays& a) {
    return TreeArrays{a.parents, a.num_tokens, a.offsets, a.pages, a.queries, {}};
  };
  const TreeArrays a = arrays(full), b = arrays(less);
  bool flip = false;
  for (auto _ : state) ta.plan_tree(changing && (flip = !flip) ? b : a, nullptr);
#if defined(TREEATTN_HAVE_CUDA)
  if (device == Device::cuda) cudaDeviceSynchronize();
#endif
  if (changing && ta.plan_stats().extended != 0) state.SkipWithError("a changing tree was extended, not planned");
  state.counters["units"] = double(ta.plan().num_units());
  state.counters["entries"] = double(ta.plan().entry_query.size());
  state.counters["segs"] = double(ta.plan().segments.size());
  state.counters["slots"] = double(ta.plan().num_slots);
  state.counters["pages"] = double(full.pages.size());
}

// The arrays of 128 decode steps of the planning benchmark's tree: every
// query's node one token longer each step (a page appended from the free pool
// when it fills); the config of a runtime on `device` that plans them.
struct DecodeSteps {
  static constexpr int kSteps = 128;
  struct Step {
    std::vector<int32_t> parents, num_tokens, offsets, pages;
  };
  Workload w;  // the first step's tree (the queries of all)
  std::vector<Step> steps;
  TreeAttentionConfig config;

  DecodeSteps(int nodes, Device device) : w(bench::planning_bench_tree(nodes, 256, 42)), steps(kSteps) {
    Workload grown = w;
    std::vector<char> grows(grown.tree.nodes.size(), 0);
    for (const int32_t v : grown.query_nodes) grows[v] = 1;
    int64_t next_page = grown.layout.num_pages;
    for (Step& st : steps) {
      st.offsets.push_back(0);
      for (size_t v = 0; v < grown.tree.nodes.size(); ++v) {
        Node& n = grown.tree.nodes[v];
        st.parents.push_back(n.parent);
        st.num_tokens.push_back(n.num_tokens);
        st.pages.insert(st.pages.end(), n.pages.begin(), n.pages.end());
        st.offsets.push_back(int32_t(st.pages.size()));
        if (grows[v] && ++n.num_tokens > int64_t(n.pages.size()) * grown.layout.page_size)
          n.pages.push_back(int32_t(next_page++));
      }
    }
    config.heads = w.heads;
    config.dtype = w.layout.dtype;
    config.page_size = w.layout.page_size;
    config.num_pages = next_page;
    config.device = device;
    config.max_queries = 256;
    config.max_nodes = 16384;
    config.max_page_refs = int64_t(steps.back().pages.size());
  }
  TreeArrays arrays(int i) const {
    const Step& st = steps[size_t(i)];
    return {st.parents, st.num_tokens, st.offsets, st.pages, w.query_nodes, {}};
  }
};

// Decode steps as an engine plans them (DecodeSteps), 128 steps, then the
// first step again (a new batch). With the default max_extension_tokens most
// steps extend the last plan; the fresh plans (the first step, and each time
// a unit outgrows the limit) are in the mean. The steps' arrays are made
// before the clock starts.
void runtime_decode_steps(benchmark::State& state, int nodes, Device device) {
  const DecodeSteps d(nodes, device);
  constexpr int kSteps = DecodeSteps::kSteps;
  TreeAttention ta(d.config);
  int i = 0;
  for (auto _ : state) {
    ta.plan_tree(d.arrays(i), nullptr);
    i = (i + 1) % kSteps;
  }
#if defined(TREEATTN_HAVE_CUDA)
  if (device == Device::cuda) cudaDeviceSynchronize();
#endif
  const PlanStats s = ta.plan_stats();
  state.counters["fresh_%"] = 100.0 * double(s.planned) / double(s.planned + s.extended);
}

// A vLLM-style engine's step: plan_block_tables for 256 sequences that share
// a 4000-token prompt (250 pages of 16), each with its own tail of 100 to
// 400 tokens; every step each sequence is a token longer (a page from the
// free pool when its last fills), 128 steps cycled. extend = false: every
// step planned afresh (max_extension_tokens = 0).
void runtime_block_tables(benchmark::State& state, bool extend) {
  constexpr int kSteps = 128, kSeqs = 256, kPrompt = 4000, kPage = 16;
  std::mt19937_64 rng(7);
  std::vector<std::vector<int32_t>> pages(kSeqs);
  std::vector<int32_t> lens(kSeqs);
  int32_t next_page = kPrompt / kPage;
  for (int s = 0; s < kSeqs; ++s) {
    lens[s] = kPrompt + 100 + int32_t(rng() % 301);
    for (int32_t k = 0; k < kPrompt / kPage; ++k) pages[s].push_back(k);
    while (int64_t(pages[s].size()) * kPage < lens[s]) pages[s].push_back(next_page++);
  }
  const int32_t width = (kPrompt + 400 + kSteps + kPage - 1) / kPage + 1;
  struct Step {
    std::vector<int32_t> table, lens;
  };
  std::vector<Step> steps(kSteps);
  for (Step& st : steps) {
    st.table.assign(size_t(kSeqs) * width, 0);
    for (int s = 0; s < kSeqs; ++s) std::copy(pages[s].begin(), pages[s].end(), st.table.begin() + int64_t(s) * width);
    st.lens = lens;
    for (int s = 0; s < kSeqs; ++s)
      if (++lens[s] > int64_t(pages[s].size()) * kPage) pages[s].push_back(next_page++);
  }
  TreeAttentionConfig c;
  c.heads = {32, 8, 128};
  c.page_size = kPage;
  c.num_pages = next_page;
  c.device = Device::cpu;
  c.max_queries = kSeqs;
  c.max_page_refs = int64_t(next_page);
  if (!extend) c.max_extension_tokens = 0;
  TreeAttention ta(c);
  size_t i = 0;
  for (auto _ : state) {
    const Step& st = steps[i];
    ta.plan_block_tables(st.table, kSeqs, width, st.lens, nullptr);
    i = (i + 1) % kSteps;
  }
  const PlanStats ps = ta.plan_stats();
  state.counters["fresh_%"] = 100.0 * double(ps.planned) / double(ps.planned + ps.extended);
  state.counters["nodes"] = double(ta.workload().tree.nodes.size());
}

// A speculative-decoding engine's step: plan_tree_queries for `requests`
// requests under a shared 1000-token system prompt, each with 2000 tokens of
// its own (16-token pages) and a draft tree of `drafts` tokens (each draft's
// parent a random earlier draft of its request, or the request's tail).
// Queries: the requests' pending tokens, then every draft. Every step is a
// fresh plan (the drafts change); 16 steps of other draft trees cycled.
// `planner`: the runtime's (auto, or another to compare with).
void runtime_tree_queries(benchmark::State& state, int requests, int drafts, const std::string& planner) {
  constexpr int kPage = 16, kPrompt = 1000, kOwn = 2000, kSteps = 16;
  std::vector<int32_t> parents{-1}, tokens{kPrompt}, offsets{0}, pages, queries;
  int32_t next_page = 0;
  const auto add_pages = [&](int n) {
    for (int k = 0; k < (n + kPage - 1) / kPage; ++k) pages.push_back(next_page++);
    offsets.push_back(int32_t(pages.size()));
  };
  add_pages(kPrompt);
  // The prompt is not a whole number of pages: each request's own tokens
  // start a page of their own (a node's tokens start at a page boundary).
  for (int r = 0; r < requests; ++r) {
    parents.push_back(0);
    tokens.push_back(kOwn);
    add_pages(kOwn);
    queries.push_back(int32_t(parents.size()) - 1);
  }
  struct Step {
    std::vector<int32_t> nodes, parents;
    std::vector<int64_t> rows;
  };
  std::mt19937_64 rng(11);
  std::vector<Step> steps(kSteps);
  const int64_t draft_row0 = int64_t(next_page) * kPage;
  for (Step& st : steps)
    for (int r = 0; r < requests; ++r)
      for (int j = 0; j < drafts; ++j) {
        st.nodes.push_back(queries[size_t(r)]);
        st.parents.push_back(j == 0 || rng() % 4 == 0 ? -1 : r * drafts + int32_t(rng() % uint64_t(j)));
        st.rows.push_back(draft_row0 + int64_t(st.rows.size()));
      }
  TreeAttentionConfig c;
  c.heads = {32, 8, 128};
  c.page_size = kPage;
  c.num_pages = next_page + (int64_t(requests) * drafts + kPage - 1) / kPage;
  c.device = Device::cpu;
  c.max_queries = requests * (drafts + 1);
  c.max_nodes = 1 + requests * (drafts + 1);
  c.max_page_refs = int64_t(pages.size()) + int64_t(requests) * drafts;  // a draft is a page ref of its own
  c.planner = planner;
  TreeAttention ta(c);
  const TreeArrays tree{parents, tokens, offsets, pages, queries, {}};
  size_t i = 0;
  for (auto _ : state) {
    const Step& st = steps[i];
    ta.plan_tree_queries(tree, DraftArrays{st.nodes, st.parents, st.rows}, nullptr);
    i = (i + 1) % kSteps;
  }
  state.counters["units"] = double(ta.plan().num_units());
  state.counters["entries"] = double(ta.plan().entry_query.size());
  state.counters["segs"] = double(ta.plan().segments.size());
  state.counters["slots"] = double(ta.plan().num_slots);
}

// The parts of a runtime plan step, each on its own with the memory a
// runtime keeps: the tree's validation, the plan (auto, into reused
// buffers), the plan's validation.
void step_validate_tree(benchmark::State& state, int nodes) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  ValidateScratch scratch;
  for (auto _ : state) w.validate(&scratch);
}

void step_plan(benchmark::State& state, int nodes) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  const PlannerInfo& info = find_planner("auto");
  PlanScratch scratch;
  Plan p;
  for (auto _ : state) {
    plan_reusing(info, w, ix, PlanOptions{}, scratch, p);
    benchmark::DoNotOptimize(p.unit_tile.data());
  }
}

// With the tree's index, as the runtime validates a fresh plan (its
// Workload::validate built it); `unindexed`: without, so validate_plan
// builds one.
void step_validate_plan(benchmark::State& state, int nodes, bool unindexed) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  const Plan p = make_plan("auto", w);
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  ValidatePlanScratch scratch;
  for (auto _ : state) validate_plan(w, p, &scratch, unindexed ? nullptr : &ix);
}

#if defined(TREEATTN_HAVE_CUDA)
// The step executor's capacities that plan p of tree w fills exactly.
StepCapacity capacity_of(const Workload& w, const Plan& p) {
  StepCapacity cap;
  cap.max_units = p.num_units();
  cap.max_segments = int32_t(p.segments.size());
  cap.max_entries = int32_t(p.entry_query.size());
  cap.max_slots = p.num_slots;
  cap.max_page_refs = 0;
  for (const Node& n : w.tree.nodes) cap.max_page_refs += int64_t(n.pages.size());
  return cap;
}

// The host half of a CUDA step's plan upload (CudaStepExecutor::set_plan
// past its checks): the plan's kernel arrays packed into a staging buffer
// (here pageable) for its one copy. Needs no GPU. A decode step on the CUDA
// path costs runtime/decode_steps/cpu (which validates nothing an extension
// keeps valid) + this + two driver calls (the copy and the placing launch).
// `decode_steps`: the plans of DecodeSteps' 128 steps (as the CPU runtime
// makes them, most by extension) packed in turn, so that the units' lengths
// change from one pack to the next as in a decode loop; else one plan of the
// tree packed again and again.
void step_pack(benchmark::State& state, int nodes, bool decode_steps) {
  std::vector<Workload> trees;
  std::vector<Plan> plans;
  if (decode_steps) {
    const DecodeSteps d(nodes, Device::cpu);
    TreeAttention ta(d.config);
    for (int i = 0; i < DecodeSteps::kSteps; ++i) {
      ta.plan_tree(d.arrays(i), nullptr);
      trees.push_back(ta.workload());
      plans.push_back(ta.plan());
    }
  } else {
    trees.push_back(bench::planning_bench_tree(nodes, 256, 42));
    plans.push_back(make_plan("auto", trees[0]));
  }
  StepCapacity cap = capacity_of(trees[0], plans[0]);
  for (size_t i = 1; i < plans.size(); ++i) {
    const StepCapacity c = capacity_of(trees[i], plans[i]);
    cap.max_units = std::max(cap.max_units, c.max_units);
    cap.max_segments = std::max(cap.max_segments, c.max_segments);
    cap.max_entries = std::max(cap.max_entries, c.max_entries);
    cap.max_slots = std::max(cap.max_slots, c.max_slots);
    cap.max_page_refs = std::max(cap.max_page_refs, c.max_page_refs);
  }
  const cuda::UnitLaunches launches = cuda::UnitLaunches::of(cuda::default_step_tiles(128), true);  // the executor's on sm_90
  const cuda::StepLayout layout = cuda::StepLayout::make(cap, launches.count());
  std::vector<uint8_t> host(layout.total);
  cuda::StepPackScratch scratch;
  size_t i = 0;
  for (auto _ : state) {
    const cuda::CopyRanges r =
        cuda::pack_step_plan(trees[i], plans[i], layout, launches, host.data(), scratch);
    benchmark::DoNotOptimize(r.src_bytes);
    i = (i + 1) % plans.size();
  }
  state.counters["bytes"] =
      double(cuda::pack_step_plan(trees[0], plans[0], layout, launches, host.data(), scratch).src_bytes);
}

// A CUDA decode step's host work without the GPU: the CPU runtime's step
// (runtime/decode_steps/cpu) and then the pack of the plan it made, the
// tree edited in place as the CUDA runtime keeps it (hot in cache, unlike
// step/pack/cuda/decode_steps' 128 stored plans), its page table flat from
// the step's arrays as the runtime passes it. The CUDA path on a GPU
// machine adds its driver calls (the copy and the placing launch).
void runtime_decode_steps_and_pack(benchmark::State& state, int nodes) {
  const DecodeSteps d(nodes, Device::cpu);
  TreeAttention ta(d.config);
  const cuda::UnitLaunches launches = cuda::UnitLaunches::of(cuda::default_step_tiles(128), true);
  const cuda::StepLayout layout = cuda::StepLayout::make(ta.config().step_capacity(), launches.count());
  std::vector<uint8_t> host(layout.total);
  cuda::StepPackScratch scratch;
  int i = 0;
  int64_t extended = 0;
  for (auto _ : state) {
    const TreeArrays t = d.arrays(i);
    ta.plan_tree(t, nullptr);
    const PageTableView pages{t.page_ids, t.page_offsets};  // the tree's, as the runtime hands them to set_plan
    const bool extension = ta.plan_stats().extended > extended;  // its entries left out, as set_plan does then
    extended = ta.plan_stats().extended;
    const cuda::CopyRanges r = cuda::pack_step_plan(ta.workload(), ta.plan(), layout, launches, host.data(),
                                                    scratch, &pages, extension);
    benchmark::DoNotOptimize(r.src_bytes);
    i = (i + 1) % DecodeSteps::kSteps;
  }
  const PlanStats s = ta.plan_stats();
  state.counters["fresh_%"] = 100.0 * double(s.planned) / double(s.planned + s.extended);
}

// The whole CUDA half of a step as TreeAttention does it for a plan it
// trusts: CudaStepExecutor::set_plan with PlanCheck::trusted, i.e. its
// checks, the wait for the staging buffer used two calls back, the pack into
// pinned memory, the copy and the placing launch; `validate`: with
// validate_plan first, as for a fresh plan. (An extension, PlanCheck::
// extension, packs less: runtime/decode_steps/cuda.) `legacy`: on the legacy default
// stream (stream 0, which PyTorch's current stream is by default), else on a
// non-blocking stream of its own. Needs a GPU.
void step_set_plan(benchmark::State& state, int nodes, bool validate, bool legacy) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  const Plan p = make_plan("auto", w);
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);  // as the runtime passes it
  const StepCapacity cap = capacity_of(w, p);
  CudaStepExecutor ex(w.heads, w.layout, cap);
  cudaStream_t stream = nullptr;
  if (!legacy) cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  int n = 0;
  for (auto _ : state) {
    ex.set_plan(w, p, stream, validate ? PlanCheck::validate : PlanCheck::trusted, nullptr, &ix);
    if (++n % 256 == 0) {  // keeps the stream's queue short, off the clock
      state.PauseTiming();
      cudaStreamSynchronize(stream);
      state.ResumeTiming();
    }
  }
  cudaStreamSynchronize(stream);
  if (stream) cudaStreamDestroy(stream);
}

// Host time of one run() of the C++ runtime (checks + launches, no GPU wait):
// the baseline of the Python binding's overhead. A one-query, 16-token tree so
// the GPU keeps up; the device is synchronised every 40 calls, off the clock.
void runtime_run(benchmark::State& state) {
  TreeAttentionConfig c;
  c.heads = {32, 8, 128};
  c.page_size = 16;
  c.num_pages = 4;
  c.device = Device::cuda;
  c.max_queries = 256;
  TreeAttention ta(c);
  const std::vector<int32_t> parents{-1}, tokens{16}, offsets{0, 1}, pages{2}, queries{0};
  ta.plan_tree({parents, tokens, offsets, pages, queries, {}}, nullptr);
  void *q, *kv, *out;
  cudaMalloc(&q, 32 * 128 * 2);
  cudaMalloc(&kv, 4 * 16 * 8 * 128 * 2);
  cudaMalloc(&out, 32 * 128 * 2);
  AttentionArgs a;
  a.q = q, a.k = kv, a.v = kv, a.out = out;
  int n = 0;
  for (auto _ : state) {
    ta.run(a, nullptr);
    if (++n % 40 == 0) {  // 200 launches: a full launch queue would block on the GPU and time it
      state.PauseTiming();
      cudaDeviceSynchronize();
      state.ResumeTiming();
    }
  }
  cudaDeviceSynchronize();
  cudaFree(q), cudaFree(kv), cudaFree(out);
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // A plan of a 1 000-node tree allocates a few hundred KB and frees it. By
  // default glibc hands free memory above 128 KB at the top of the heap back to
  // the OS on every free and page-faults it in again on the next plan, which
  // makes planning times bimodal (up to 10x). A serving process that plans every
  // decode step keeps its heap (or links jemalloc/tcmalloc); so does this one.
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
#endif
  for (const PlannerInfo& info : planners())
    for (const int nodes : {100, 1000, 10000})
      benchmark::RegisterBenchmark(("plan/" + info.name + "/" + std::to_string(nodes)).c_str(), plan_once, info.name, nodes)
          ->Unit(benchmark::kMicrosecond);
  for (const auto& [heads, spec] : {std::pair{"64/8", "pat:B=1,16,32,64,128,1024:L=256,128,64,32,32,32"},
                                    std::pair{"64/8", "pat:B=1,4,16,512:L=1024,256,128,32"},
                                    std::pair{"32/8", "fasttree:N=1,4,8,256:C=8,256,256,32"},
                                    std::pair{"32/8", "fasttree:N=1,1024:C=2048,32"}})
    for (const char* planner : {"node", "auto"})
      benchmark::RegisterBenchmark((std::string("plan/") + planner + "/suite/" + heads + "/" + spec).c_str(),
                                   plan_suite_tree, planner, heads, spec)
          ->Unit(benchmark::kMicrosecond);
  for (const int nodes : {100, 1000, 10000}) {
    benchmark::RegisterBenchmark(("plan/pat-cache-hit/" + std::to_string(nodes)).c_str(), pat_cached, nodes, false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("plan/pat-incremental/" + std::to_string(nodes)).c_str(), pat_cached, nodes, true)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const int nodes : {100, 1000, 10000}) {
    benchmark::RegisterBenchmark(("step/validate_tree/" + std::to_string(nodes)).c_str(), step_validate_tree, nodes)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("step/plan/" + std::to_string(nodes)).c_str(), step_plan, nodes)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("step/validate_plan/" + std::to_string(nodes)).c_str(), step_validate_plan, nodes,
                                 false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("step/validate_plan_unindexed/" + std::to_string(nodes)).c_str(),
                                 step_validate_plan, nodes, true)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const int nodes : {100, 1000, 10000})
    benchmark::RegisterBenchmark(("runtime/plan_tree/cpu/" + std::to_string(nodes)).c_str(), runtime_plan, nodes,
                                 Device::cpu, false)
        ->Unit(benchmark::kMicrosecond);
  for (const int nodes : {100, 1000, 10000})
    benchmark::RegisterBenchmark(("runtime/plan_tree_changing/cpu/" + std::to_string(nodes)).c_str(), runtime_plan,
                                 nodes, Device::cpu, true)
        ->Unit(benchmark::kMicrosecond);
  for (const int nodes : {100, 1000, 10000})
    benchmark::RegisterBenchmark(("runtime/decode_steps/cpu/" + std::to_string(nodes)).c_str(), runtime_decode_steps,
                                 nodes, Device::cpu)
        ->Unit(benchmark::kMicrosecond);
  for (const std::string planner : {"auto", "node", "per-query"})
    for (const auto& [requests, drafts] : {std::pair{1, 64}, std::pair{8, 64}, std::pair{32, 16}}) {
      const std::string name = "runtime/tree_queries/cpu/" + std::to_string(requests) + "x" + std::to_string(drafts) +
                               (planner == "auto" ? "" : "/" + planner);  // auto: the runtime's default
      benchmark::RegisterBenchmark(name.c_str(), runtime_tree_queries, requests, drafts, planner)
          ->Unit(benchmark::kMicrosecond);
    }
  benchmark::RegisterBenchmark("runtime/block_tables/cpu/decode_steps", runtime_block_tables, true)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("runtime/block_tables/cpu/afresh", runtime_block_tables, false)
      ->Unit(benchmark::kMicrosecond);
#if defined(TREEATTN_HAVE_CUDA)
  for (const int nodes : {100, 1000, 10000})
    benchmark::RegisterBenchmark(("step/pack/cuda/" + std::to_string(nodes)).c_str(), step_pack, nodes, false)
        ->Unit(benchmark::kMicrosecond);
  for (const int nodes : {1000, 10000})
    benchmark::RegisterBenchmark(("step/pack/cuda/decode_steps/" + std::to_string(nodes)).c_str(), step_pack, nodes, true)
        ->Unit(benchmark::kMicrosecond);
  for (const int nodes : {1000, 10000})
    benchmark::RegisterBenchmark(("runtime/decode_steps/cpu_and_pack/" + std::to_string(nodes)).c_str(),
                                 runtime_decode_steps_and_pack, nodes)
        ->Unit(benchmark::kMicrosecond);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0)
    for (const int nodes : {100, 1000, 10000})
      benchmark::RegisterBenchmark(("runtime/plan_tree/cuda/" + std::to_string(nodes)).c_str(), runtime_plan, nodes,
                                   Device::cuda, false)
          ->Unit(benchmark::kMicrosecond);
  if (gpus > 0)
    for (const int nodes : {100, 1000, 10000})
      benchmark::RegisterBenchmark(("runtime/plan_tree_changing/cuda/" + std::to_string(nodes)).c_str(), runtime_plan,
                                   nodes, Device::cuda, true)
          ->Unit(benchmark::kMicrosecond);
  if (gpus > 0)
    for (const int nodes : {100, 1000, 10000})
      benchmark::RegisterBenchmark(("runtime/decode_steps/cuda/" + std::to_string(nodes)).c_str(), runtime_decode_steps,
                                   nodes, Device::cuda)
          ->Unit(benchmark::kMicrosecond);
  if (gpus > 0) benchmark::RegisterBenchmark("runtime/run/cuda", runtime_run)->Unit(benchmark::kMicrosecond);
  if (gpus > 0)
    for (const int nodes : {1000, 10000})
      for (const bool legacy : {false, true}) {
        const std::string at = std::to_string(nodes) + (legacy ? "/legacy_stream" : "");
        benchmark::RegisterBenchmark(("step/set_plan/cuda/" + at).c_str(), step_set_plan, nodes, false, legacy)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("step/set_plan_validate/cuda/" + at).c_str(), step_set_plan, nodes, true, legacy)
            ->Unit(benchmark::kMicrosecond);
      }
#endif
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
