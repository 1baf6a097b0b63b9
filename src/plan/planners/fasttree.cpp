// fasttree (FastTree, MLSys'25 §4): a greedy pass over the radix tree decides,
// edge by edge, whether a child's queries take the parent's KV along into their
// own group ("concatenate", SplitQ) or keep the parent as a separate group that
// all of them share ("split KV"), by comparing a cost of padded tile slots
// (alpha, beta) and of extra partial results (gamma). The resulting virtual
// nodes are processed in two phases with different Q tiles (large groups near
// the root first, small groups near the leaves), and long virtual nodes are
// split along KV: at kv_split_long (1024) tokens always, at kv_split_short (128)
// in a phase whose grid would not fill the SMs. Then, if one phase still has too
// little parallelism, both phases use the same Q tile and the tree is
// re-partitioned. All constants are those of the authors' artifact; the SM
// thresholds scale with opt.num_sms (132 and 528 on an H100).
#include <cmath>

#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn {

int FastTreeParams::q_tile_queries(int phase) const { return std::max(1, q_tile_rows[phase] / group_size); }

FastTreeParams FastTreeParams::from(const Workload& w, const PlanOptions& opt) {
  FastTreeParams p;
  p.alpha = opt.get("alpha", p.alpha);
  p.beta = opt.get("beta", p.beta);
  p.gamma = opt.get("gamma", p.gamma);
  p.group_size = w.heads.group_size();
  p.head_dim = w.heads.head_dim;
  const char* qkeys[2] = {"q_tile0", "q_tile1"};
  const char* kvkeys[2] = {"kv_tile0", "kv_tile1"};
  for (int ph = 0; ph < 2; ++ph) {
    const double rows = opt.get(qkeys[ph], p.q_tile_rows[ph]);
    if (!(rows >= 1 && rows <= kMaxTileRows))
      throw Error(std::string("fasttree: ") + qkeys[ph] + " = " + std::to_string(rows) + " is out of range [1, " +
                  std::to_string(kMaxTileRows) + "]");
    p.q_tile_rows[ph] = static_cast<int>(rows);
    const int tile = smallest_tile_for_rows(std::max(p.q_tile_rows[ph], p.group_size));
    const double kv = opt.get(kvkeys[ph], kTileConfigs[tile].n);
    if (!(kv >= 1)) throw Error(std::string("fasttree: ") + kvkeys[ph] + " = " + std::to_string(kv) + " must be >= 1");
    p.kv_tile[ph] = static_cast<int>(kv);
  }
  return p;
}

int64_t fasttree_pad(int64_t tile, int64_t n) {
  if (n <= 0) return 0;  // (N - 1) mod TS taken as in the artifact (Python's floor mod)
  return tile - ((n - 1) % tile + 1);
}

namespace {

// C_P with the per-phase constants hoisted: Algorithm 1 evaluates it eight
// times per edge, and the planner runs Algorithm 1 up to twice per plan.
struct PaddingModel {
  int64_t tq[2], tkv[2];
  double wq, wkv, wred;  // alpha * g * d, beta * g * d, gamma * d

  explicit PaddingModel(const FastTreeParams& p) {
    for (int ph = 0; ph < 2; ++ph) {
      tq[ph] = p.q_tile_queries(ph);
      tkv[ph] = p.kv_tile[ph];
    }
    wq = p.alpha * p.group_size * p.head_dim;
    wkv = p.beta * p.group_size * p.head_dim;
    wred = p.gamma * p.head_dim;
  }
  double cost(int64_t nq, int64_t len) const {
    if (nq <= 0 || len <= 0) return 0;
    const int ph = nq > tq[1] ? 0 : 1;
    const int64_t q_pad = tq[ph] - ((nq - 1) % tq[ph] + 1);
    const int64_t kv_pad = len >= tkv[ph] ? 0 : tkv[ph] - len;  // Pad(TS, min(len, TS))
    return wq * double(q_pad) * double(len) + wkv * double(nq) * double(kv_pad);
  }
  double split_kv(int64_t nq_curr, int64_t nq_l, int64_t len_v, int64_t len_l) const {
    return cost(nq_curr, len_v) + cost(nq_l, len_l) + wred * double(nq_l);
  }
  double split_q(int64_t nq_curr, int64_t nq_l, int64_t len_v, int64_t len_l) const {
    return cost(nq_curr - nq_l, len_v) + cost(nq_l, len_v + len_l);
  }
};

}  // namespace

double fasttree_padding_cost(const FastTreeParams& p, int64_t nq, int64_t len) { return PaddingModel(p).cost(nq, len); }

double fasttree_split_kv_cost(const FastTreeParams& p, int64_t nq_curr, int64_t nq_l, int64_t len_v, int64_t len_l) {
  return PaddingModel(p).split_kv(nq_curr, nq_l, len_v, len_l);
}

double fasttree_split_q_cost(const FastTreeParams& p, int64_t nq_curr, int64_t nq_l, int64_t len_v, int64_t len_l) {
  return PaddingModel(p).split_q(nq_curr, nq_l, len_v, len_l);
}

FastTreeAssignment fasttree_assign(const Workload& w, const TreeIndex& ix, const FastTreeParams& p) {
  const PaddingModel m(p);
  const size_t n = w.tree.nodes.size();
  FastTreeAssignment a;
  a.concat.assign(n, 0);
  a.virtual_len.resize(n);
  a.group_queries.assign(n, 0);
  for (size_t v = 0; v < n; ++v) a.virtual_len[v] = w.tree.nodes[v].num_tokens;
  // bfs_order visits a parent before its children, so L[v] is final when v is.
  for (const int32_t v : ix.bfs_order) {
    int64_t nq_curr = ix.subtree_queries[v];
    const int64_t len_v = a.virtual_len[v];
    for (int32_t k = ix.child_offset[v]; k < ix.child_offset[v + 1]; ++k) {
      const int32_t l = ix.children[k];
      const int64_t nq_l = ix.subtree_queries[l], len_l = a.virtual_len[l];
      if (m.split_kv(nq_curr, nq_l, len_v, len_l) > m.split_q(nq_curr, nq_l, len_v, len_l)) {
        a.concat[l] = 1;
        nq_curr -= nq_l;
        a.virtual_len[l] = len_l + len_v;
      }
    }
    a.group_queries[v] = nq_curr;
  }
  return a;
}

Plan plan_fasttree(const Workload& w, const PlanOptions& opt) {
  const planning::DfsView dv(w);
  const TreeIndex& ix = dv.ix;
  FastTreeParams p = FastTreeParams::from(w, opt);
  const int64_t split_long = static_cast<int64_t>(opt.get("kv_split_long", 1024));
  const int64_t split_short = static_cast<int64_t>(opt.get("kv_split_short", 128));
  if (split_long < 1 || split_short < 1)
    throw Error("fasttree: kv_split_long = " + std::to_string(split_long) + " and kv_split_short = " +
                std::to_string(split_short) + " must be >= 1");
  const int64_t sms = std::max(1, opt.num_sms);
  const std::array<int64_t, 2> thresh1 = {sms, 4 * sms}, thresh2 = {sms, sms};
  std::array<int64_t, 2> kv_split = {split_long, split_long};

  const int32_t n = static_cast<int32_t>(w.tree.nodes.size());
  std::vector<int64_t> req(n, 0);
  FastTreeAssignment a;
  std::array<int64_t, 2> par{};
  // Algorithm 1 depends on the tiles only; the KV split lengths only change
  // how the resulting groups count towards the parallelism.
  const auto partition = [&](bool reassign) {
    if (reassign) a = fasttree_assign(w, ix, p);
    par = {0, 0};
    for (int32_t v = 0; v < n; ++v) {
      req[v] = a.group_queries[v];
      if (req[v] == 0 || a.virtual_len[v] == 0) continue;
      const int ph = p.phase_of(req[v]);
      par[ph] += planning::ceil_div(req[v], p.q_tile_queries(ph)) * planning::ceil_div(a.virtual_len[v], kv_split[ph]);
    }
    for (auto& x : par) x *= w.heads.num_kv_heads;
  };

  // The artifact's three rounds: shorten KV splits of an under-filled phase;
  // then, if a phase is still under-filled, one Q tile for both phases.
  partition(true);
  bool changed = false;
  for (int ph = 0; ph < 2; ++ph)
    if (par[ph] > 0 && par[ph] < thresh1[ph]) kv_split[ph] = split_short, changed = true;
  if (changed) {
    partition(false);
    bool retile = true;
    if (par[0] > 0 && par[0] < thresh2[0]) {
      p.q_tile_rows = {p.q_tile_rows[1], p.q_tile_rows[1]};
      p.kv_tile = {p.kv_tile[1], p.kv_tile[1]};
    } else if (par[1] > 0 && par[1] < thresh2[1]) {
      p.q_tile_rows = {p.q_tile_rows[0], p.q_tile_rows[0]};
      p.kv_tile = {p.kv_tile[0], p.kv_tile[0]};
    } else {
      retile = false;
    }
    if (retile) partition(true);
  }

  // Units: phase 0 first, then phase 1; within a phase in preorder.
  const int g = w.heads.group_size();
  std::array<int, 2> per_unit, tile;
  for (int ph = 0; ph < 2; ++ph) {
    per_unit[ph] = p.q_tile_queries(ph);
    tile[ph] = smallest_tile_for_rows(std::max(p.q_tile_rows[ph], per_unit[ph] * g));
  }
  PlanBuilder b(w, "fasttree");
  std::vector<int32_t> chain, qs;
  std::vector<Segment> segs;
  for (int phase = 0; phase < 2; ++phase) {
    for (const int32_t v : dv.preorder) {
      if (req[v] == 0 || a.virtual_len[v] == 0 || p.phase_of(req[v]) != phase) continue;
      chain.clear();
      for (int32_t x = v;; x = w.tree.nodes[x].parent) {
        chain.push_back(x);
        if (!a.concat[x]) break;
      }
      std::reverse(chain.begin(), chain.end());
      planning::chain_segments(w, chain.data(), chain.size(), segs);
      qs.assign(dv.queries.begin() + dv.q_begin[v], dv.queries.begin() + dv.q_begin[v] + dv.own[v]);
      for (int32_t k = ix.child_offset[v]; k < ix.child_offset[v + 1]; ++k) {
        const int32_t c = ix.children[k];
        if (!a.concat[c]) qs.insert(qs.end(), dv.queries.begin() + dv.q_begin[c], dv.queries.begin() + dv.q_end[c]);
      }
      planning::for_each_piece(segs.data(), segs.size(), kv_split[phase], [&](const Segment* s, int ns, int64_t) {
        planning::emit_query_groups(b, s, ns, qs.data(), static_cast<int64_t>(qs.size()), per_unit[phase], tile[phase]);
      });
    }
  }
  return b.finish();
}

}  // namespace treeattn
