"""Recorded tree-of-thoughts schedules: the ToT files of data/workloads (docmergeToT.json,
sorting128ToT.json, and any file of that format), parsed and checked into ToTTask objects,
and shrunk for tests by scaled().

The format (data/workloads/README.md): a JSON list of tasks, each an object with `data`
(node id string -> node), `prompt` (text) and `incompleted` (bool). A node has `id`,
`children` (node ids), `value` (its length in tokens; the root's is the prompt length),
`start` and `end` (the decoding iterations during which its tokens are generated,
inclusive; the root is the prefilled prompt and ends at iteration 0).

What load_tot_file() accepts, beyond the types: node ids equal to their keys, one root,
every other node listed as a child exactly once and reachable from the root (no cycle),
value >= 0 (root >= 1), value, start and end within +-(2**31 - 1), end - start + 1 >=
value (a node cannot generate more tokens than it has iterations), the root ends at 0 and
a child starts after its parent ends. Anything else raises InputError (a ValueError)
naming the file, the task index, the node and the field."""
import math
from dataclasses import dataclass

from .errors import InputError, read_json

NODE_FIELDS = ("id", "value", "start", "end", "children")
ITERATION_LIMIT = 2 ** 31 - 1   # |value|, |start|, |end|: far beyond any run, far inside int64


@dataclass(frozen=True)
class ToTNode:
    id: int
    value: int          # tokens it generates (the root: the prompt's length)
    start: int          # first iteration of its tokens (inclusive)
    end: int            # last iteration it is live (inclusive)
    children: tuple     # node ids, in the file's order
    parent: int         # node id; -1 for the root


@dataclass(frozen=True)
class ToTTask:
    index: int          # position in the file
    nodes: dict         # id -> ToTNode
    root: int
    incompleted: bool = False

    def generating_counts(self):
        """{iteration: nodes generating a token in it} (t in [start, start + value))."""
        counts = {}
        for n in self.nodes.values():
            if n.id != self.root:
                for t in range(n.start, n.start + n.value):
                    counts[t] = counts.get(t, 0) + 1
        return counts


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def load_tot_file(path, tasks=None):
    """The file's tasks (the first `tasks` of them when given), checked."""
    return parse_tot(read_json(path), path, tasks)


def parse_tot(raw, source="<tot>", tasks=None):
    """raw: the decoded JSON list; source names it in errors."""
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{source}: expected a non-empty JSON list of tasks, "
                         f"got {type(raw).__name__}")
    if tasks is not None:
        if not 1 <= tasks <= len(raw):
            raise InputError(f"{source}: tasks={tasks}, the file holds {len(raw)} tasks")
        raw = raw[:tasks]
    return [_parse_task(entry, i, source) for i, entry in enumerate(raw)]


def _parse_task(entry, index, source):
    where = f"{source}: task {index}"
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected an object, got {type(entry).__name__}")
    if "data" not in entry:
        raise InputError(f"{where}: missing field 'data'")
    for key, kind in (("prompt", str), ("incompleted", bool)):
        if key in entry and not isinstance(entry[key], kind):
            raise InputError(f"{where}: field '{key}' must be a {kind.__name__}, "
                             f"got {type(entry[key]).__name__}")
    data = entry["data"]
    if not isinstance(data, dict) or not data:
        raise InputError(f"{where}: field 'data' must be a non-empty object of nodes")
    fields = {key: _node_fields(node, key, f"{where}, node {key!r}") for key, node in data.items()}

    parent = {}
    for key, f in fields.items():
        for child in f["children"]:
            if str(child) not in data:
                raise InputError(f"{where}, node {key!r}: field 'children' names node {child}, "
                                 f"which is not in 'data'")
            if child in parent:
                raise InputError(f"{where}, node {key!r}: field 'children' names node {child}, "
                                 f"already a child of node {parent[child]}")
            parent[child] = f["id"]
    roots = [f["id"] for f in fields.values() if f["id"] not in parent]
    if len(roots) > 1:
        raise InputError(f"{where}, node '{roots[1]}': field 'children': no node lists it, "
                         f"so the task has {len(roots)} roots (node {roots[0]} too)")
    # with one root and one parent per other node, a node not reached from the root (or
    # any node when no root exists) lies on a cycle of parent links or below one
    reached = set(roots)
    stack = list(roots)
    while stack:
        for child in fields[str(stack.pop())]["children"]:
            reached.add(child)
            stack.append(child)
    if len(reached) != len(fields):
        lost = next(f["id"] for f in fields.values() if f["id"] not in reached)
        raise InputError(f"{where}, node '{_on_cycle(parent, lost)}': field 'children' makes "
                         f"a cycle (not reachable from a root)")
    root = roots[0]

    nodes = {f["id"]: ToTNode(f["id"], f["value"], f["start"], f["end"], tuple(f["children"]),
                              parent.get(f["id"], -1)) for f in fields.values()}
    for node in nodes.values():
        _check_times(node, nodes, f"{where}, node '{node.id}'")
    return ToTTask(index, nodes, root, bool(entry.get("incompleted", False)))


def _node_fields(node, key, where):
    if not isinstance(node, dict):
        raise InputError(f"{where}: expected an object, got {type(node).__name__}")
    for name in NODE_FIELDS:
        if name not in node:
            raise InputError(f"{where}: missing field '{name}'")
    for name in ("id", "value", "start", "end"):
        if not is_int(node[name]):
            raise InputError(f"{where}: field '{name}' must be an integer, got {node[name]!r}")
    for name in ("value", "start", "end"):   # token counts and iterations: NumPy int64 holds them
        if not -ITERATION_LIMIT <= node[name] <= ITERATION_LIMIT:
            raise InputError(f"{where}: field '{name}' = {node[name]} is out of range "
                             f"[-{ITERATION_LIMIT}, {ITERATION_LIMIT}]")
    children = node["children"]
    if not isinstance(children, list) or not all(is_int(c) for c in children):
        raise InputError(f"{where}: field 'children' must be a list of integer node ids, "
                         f"got {children!r}")
    if str(node["id"]) != key:
        raise InputError(f"{where}: field 'id' is {node['id']}, not the node's key")
    if node["value"] < 0:
        raise InputError(f"{where}: field 'value' must be >= 0, got {node['value']}")
    return node


def _on_cycle(parent, node):
    """A node on the cycle that following parent links from node runs into."""
    seen = []
    while node not in seen:
        seen.append(node)
        node = parent[node]
    return node


def _check_times(node, nodes, where):
    if node.end - node.start + 1 < node.value:
        raise InputError(f"{where}: fields 'start'/'end' ({node.start}..{node.end}) are "
                         f"inconsistent with 'value' {node.value}: fewer iterations than tokens")
    if node.parent < 0:
        if node.value < 1:
            raise InputError(f"{where}: field 'value' of the root (the prompt length) must be "
                             f">= 1, got {node.value}")
        if node.end != 0:
            raise InputError(f"{where}: field 'end' of the root must be 0 (the prompt is "
                             f"prefilled before iteration 1), got {node.end}")
    else:
        parent_end = nodes[node.parent].end
        if node.start <= parent_end:
            raise InputError(f"{where}: field 'start' ({node.start}) must come after its parent "
                             f"{node.parent} ends (iteration {parent_end})")


def scaled(task, factor):
    """task with every length (value, extra live iterations, gaps before a child's start)
    multiplied by factor (lengths >= 1 stay >= 1, 0 stays 0) and the iterations recomputed
    from the root down, so the shape and the order of events are kept in miniature."""
    if factor == 1:
        return task
    if not 0 < factor <= 1000:   # also refuses nan and inf: lengths must stay integers a run can hold
        raise InputError(f"scale: expected a number in (0, 1000], got {factor}")
    shrink = lambda n: math.ceil(n * factor) if n > 0 else 0
    nodes, order = {}, [task.root]
    for node_id in order:      # parents before children
        n = task.nodes[node_id]
        value, extra = shrink(n.value), shrink(n.end - n.start + 1 - n.value)
        if n.parent < 0:
            start = 1 - value - extra
        else:
            up, old_up = nodes[n.parent], task.nodes[n.parent]
            start = up.end + 1 + shrink(n.start - old_up.end - 1)
        nodes[node_id] = ToTNode(n.id, value, start, start + value + extra - 1, n.children,
                                 n.parent)
        order.extend(n.children)
    return ToTTask(task.index, nodes, task.root, task.incompleted)
