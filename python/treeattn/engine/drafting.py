"""Draft token trees without a trained draft head: a topology (the recorded Medusa trees in
data/workloads, or a width x depth rule) filled with prompt-lookup / n-gram candidates
(continuations found in the request's own prompt and generated text).

A topology is a list of paths: path [i0, i1, ...] is the i0-th ranked candidate after the
request's last token, then the i1-th ranked candidate after that, and so on (Medusa's
`Tree_Structure`). Sorted lexicographically, the paths are a depth-first preorder with
siblings in rank order: parents come before children, and the all-top-ranked path
[0], [0, 0], [0, 0, 0], ... comes first, so when it is accepted its KV rows are already at
their final positions (speculative.py copies nothing for it)."""
import os
from dataclasses import dataclass

from .errors import InputError, read_json
from .recorded import is_int


@dataclass(frozen=True)
class Draft:
    """One request's draft tree: draft j is token tokens[j], a child of draft parents[j]
    (-1: of the request's pending token). Parents come first: parents[j] < j."""
    tokens: list
    parents: list

    def __len__(self):
        return len(self.tokens)


def check_parents(parents, name):
    """ValueError naming `name` unless parents[j] is -1 or an earlier index for every j
    (a parent outside the tree, a cycle and a child listed before its parent are told apart
    in the message). Returns the parents as a list of ints."""
    parents = [int(p) for p in parents]
    n = len(parents)
    for j, p in enumerate(parents):
        if not -1 <= p < n:
            raise ValueError(f"{name}[{j}]: parent {p} is outside the draft tree "
                             f"(-1 or 0..{n - 1})")
    for j, p in enumerate(parents):
        if p < j:
            continue
        seen, node = set(), j
        while node != -1 and node not in seen:   # walk up: a cycle returns to a seen node
            seen.add(node)
            node = parents[node]
        if node != -1:
            raise ValueError(f"{name}[{j}]: parent {p} makes a cycle through draft {node}")
        raise ValueError(f"{name}[{j}]: parent {p} is listed after its child; list "
                         f"parents first")
    return parents


class Topology:
    """A draft tree's shape: paths sorted into preorder; parents[i] (-1: under the pending
    token), ranks[i] (which ranked candidate after the parent) and depths[i] (1 under the
    pending token)."""

    def __init__(self, paths, name="Tree_Structure"):
        if not isinstance(paths, list) or not paths:
            raise InputError(f"{name}: expected a non-empty list of paths, got {paths!r:.80}")
        keys = []
        for i, path in enumerate(paths):
            if (not isinstance(path, list) or not path
                    or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                               for r in path)):
                raise InputError(f"{name}[{i}]: expected a non-empty list of ranks >= 0, "
                                 f"got {path!r}")
            keys.append(tuple(path))
        index = {}
        for i, key in enumerate(keys):
            if key in index:
                raise InputError(f"{name}[{i}]: path {list(key)} appears twice")
            index[key] = i
        for i, key in enumerate(keys):
            if len(key) > 1 and key[:-1] not in index:
                raise InputError(f"{name}[{i}]: path {list(key)} has no parent path "
                                 f"{list(key[:-1])} in the tree")
        self.paths = sorted(keys)
        position = {key: i for i, key in enumerate(self.paths)}
        self.parents = [position[p[:-1]] if len(p) > 1 else -1 for p in self.paths]
        self.ranks = [p[-1] for p in self.paths]
        self.depths = [len(p) for p in self.paths]
        # parent -> how many ranked candidates its children need
        self.fanout = {}
        for parent, rank in zip(self.parents, self.ranks):
            self.fanout[parent] = max(self.fanout.get(parent, 0), rank + 1)

    def __len__(self):
        return len(self.paths)

    @classmethod
    def width_depth(cls, width, depth):
        """`width` ranked candidates after the pending token, each continued by its top
        candidate down to `depth`: width x depth drafts in `width` chains (prompt lookup's
        several matches, each with its continuation)."""
        if width < 1 or depth < 1:
            raise InputError(f"tree: width x depth must be >= 1 x 1, got {width}x{depth}")
        return cls([[c] + [0] * k for c in range(width) for k in range(depth)], "tree")

    @classmethod
    def from_medusa(cls, record, name="Tree_Structure"):
        """A recorded Medusa tree: a dict with `Tree_Structure` (list of paths) and
        optionally `Token_Tree_size` (the paths plus the root token, as recorded, or the
        paths alone)."""
        if not isinstance(record, dict) or "Tree_Structure" not in record:
            raise InputError(f"{name}: expected an object with a Tree_Structure list")
        topology = cls(record["Tree_Structure"], name)
        size = record.get("Token_Tree_size", len(topology) + 1)
        if not is_int(size) or size not in (len(topology), len(topology) + 1):
            raise InputError(f"Token_Tree_size: {size!r} does not match the "
                             f"{len(topology)} paths of Tree_Structure (+1 for the root)")
        return topology


def default_workloads():
    """Where recorded topology files are looked up: $TREEATTN_WORKLOADS, else the
    repository's data/workloads (from the working directory or this source tree), if any."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../data/workloads")
    return os.environ.get("TREEATTN_WORKLOADS") or next(
        (d for d in ("data/workloads", os.path.normpath(here)) if os.path.isdir(d)), None)


def load_topology(spec):
    """tree=WxD (width x depth rule) or the path of a Medusa topology file (JSON)."""
    width, x, depth = spec.partition("x")
    if x and width.isdigit() and depth.isdigit():
        return Topology.width_depth(int(width), int(depth))
    return Topology.from_medusa(read_json(spec, "tree (WxD or a Medusa topology file)"))


class NgramIndex:
    """For each n-gram (n = 1..max_n) of a token list, the tokens that followed it, with
    how often and where last. extend() indexes appended tokens; candidates() ranks the
    continuations of a context's suffix."""

    def __init__(self, tokens, max_n=3):
        self.max_n = max_n
        self.tables = [dict() for _ in range(max_n + 1)]   # tables[n][ngram] = {next: [count, last]}
        self.tokens = []
        self.extend(tokens)

    def extend(self, tokens):
        t = self.tokens
        for token in tokens:
            j = len(t)            # token j follows the n-grams ending at j - 1
            for n in range(1, min(self.max_n, j) + 1):
                seen = self.tables[n].setdefault(tuple(t[j - n:j]), {})
                entry = seen.setdefault(token, [0, j])
                entry[0] += 1
                entry[1] = j
            t.append(int(token))

    def candidates(self, context, limit):
        """Up to `limit` distinct next tokens for `context` (a token list whose suffix is
        looked up): the continuations of its longest indexed suffix first, by frequency
        then recency, then those of shorter suffixes."""
        out = []
        for n in range(min(self.max_n, len(context)), 0, -1):
            seen = self.tables[n].get(tuple(context[-n:]))
            if not seen:
                continue
            ranked = sorted(seen.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
            out += [tok for tok, _ in ranked if tok not in out]
            if len(out) >= limit:
                break
        return out[:limit]


def draft_tree(topology, index, max_depth=None, fill=False):
    """The draft after the index's tokens (which end with the request's pending token):
    topology node i gets the ranks[i]-th candidate after its parent's path. A node with no
    such candidate is dropped with its subtree, unless `fill`, where it gets a filler token
    (its rank) so the full topology is verified (timing independent of acceptance).
    Nodes deeper than max_depth are dropped."""
    tokens, parents = [], []
    kept = {}            # topology index -> draft index
    ranked = {}          # draft index of a parent (-1: the pending token) -> its candidates
    path_of = {-1: []}   # draft index -> its tokens from the pending token down
    for i, (parent, rank, depth) in enumerate(zip(topology.parents, topology.ranks,
                                                  topology.depths)):
        if max_depth is not None and depth > max_depth:
            continue
        if parent != -1 and parent not in kept:
            continue     # its parent was dropped
        p = kept.get(parent, -1)
        if p not in ranked:
            context = index.tokens[-index.max_n:] + path_of[p]   # only its suffix is looked up
            ranked[p] = index.candidates(context, topology.fanout[parent])
        if rank < len(ranked[p]):
            token = ranked[p][rank]
        elif fill:
            token = rank
        else:
            continue
        kept[i] = len(tokens)
        path_of[len(tokens)] = path_of[p] + [token]
        tokens.append(token)
        parents.append(p)
    return Draft(tokens, parents)
