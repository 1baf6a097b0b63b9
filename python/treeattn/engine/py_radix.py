"""PyRadixCache: a small pure-Python stand-in for treeattn.RadixCache (same API), a
page-granular radix tree over token ids with a page allocator, reference counts and LRU
eviction. Used by tests until the C++ cache is wired; simple over fast. As the C++ cache,
it checks every argument before it changes anything: an error (ValueError) leaves it as
it was, and a page is at any time exactly one of free, cached (by one node) or handed
out (by alloc), so a double free or a page inserted twice is refused, not handed out twice."""
import itertools
import numbers

import numpy as np


class Node:
    __slots__ = ("key", "pages", "children", "parent", "ref", "locks", "last_used", "alive")

    def __init__(self, key=(), pages=(), parent=None):
        self.key = tuple(key)          # tokens, a whole number of pages
        self.pages = list(pages)       # len(key) == len(pages) * page_size
        self.children = {}             # first page of a child's key -> child
        self.parent = parent
        self.ref = 0                   # locks on this node or a descendant
        self.locks = 0                 # lock() calls on this node not yet unlocked
        self.last_used = 0
        self.alive = True              # False once evicted


class PyRadixCache:
    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages/page_size: expected >= 1, got {num_pages}/{page_size}")
        self.num_pages, self.page_size = num_pages, page_size
        self.root = Node()
        self._free = list(range(num_pages - 1, -1, -1))   # pop() hands out low ids first
        self._is_free = bytearray(b"\x01") * num_pages
        self._owner = {}                                   # cached page -> its node
        self._clock = itertools.count(1)

    # -- tree ---------------------------------------------------------------------------
    def _page_key(self, tokens, i):
        return tuple(tokens[i * self.page_size:(i + 1) * self.page_size])

    def _common_pages(self, node, tokens, start_page):
        """Number of whole leading pages of node.key equal to tokens from start_page."""
        n = 0
        while (n < len(node.pages) and (start_page + n + 1) * self.page_size <= len(tokens)
               and self._page_key(node.key, n) == self._page_key(tokens, start_page + n)):
            n += 1
        return n

    def _split(self, node, n):
        """Cut node after its n-th page; the returned upper half takes node's place."""
        ps = self.page_size
        upper = Node(node.key[:n * ps], node.pages[:n], node.parent)
        upper.ref, upper.last_used = node.ref, node.last_used
        for p in upper.pages:
            self._owner[p] = upper
        node.parent.children[upper.key[:ps]] = upper
        node.key, node.pages, node.parent = node.key[n * ps:], node.pages[n:], upper
        upper.children[node.key[:ps]] = node
        return upper

    def _walk(self, tokens, pages=None):
        """Follow tokens page by page (splitting a partly matched node); with pages, free
        the caller's copies of pages already cached. Returns (node, matched pages)."""
        node, i, now = self.root, 0, next(self._clock)
        while (i + 1) * self.page_size <= len(tokens):
            child = node.children.get(self._page_key(tokens, i))
            if child is None:
                break
            n = self._common_pages(child, tokens, i)
            if n < len(child.pages):
                child = self._split(child, n)
            if pages is not None:   # duplicates are freed, the cached copy stays
                self._release([p for p, c in zip(pages[i:i + n], child.pages) if p != c])
            child.last_used = now
            node, i = child, i + n
        return node, i

    def match_prefix(self, tokens):
        node, n = self._walk(list(tokens))
        return node, n * self.page_size, np.array(self._path_pages(node), dtype=np.int32)

    def _path(self, node):
        path = []
        while node is not self.root:
            path.append(node)
            node = node.parent
        return path[::-1]

    def _path_pages(self, node):
        return [p for n in self._path(node) for p in n.pages]

    def _peek(self, tokens):
        """The pages of the longest cached prefix of tokens (whole pages), changing nothing."""
        node, i, pages = self.root, 0, []
        while (i + 1) * self.page_size <= len(tokens):
            child = node.children.get(self._page_key(tokens, i))
            if child is None:
                break
            n = self._common_pages(child, tokens, i)
            pages += child.pages[:n]
            i += n
            if n < len(child.pages):
                break
            node = child
        return pages

    def insert(self, tokens, pages):
        tokens, pages = list(tokens), [int(p) for p in pages]
        if len(tokens) != len(pages) * self.page_size:
            raise ValueError(f"insert: {len(tokens)} tokens need exactly "
                             f"{len(tokens) // self.page_size} whole pages of {self.page_size}, "
                             f"got {len(pages)} pages")
        # Every page before anything changes: where the prefix is cached, the cached page
        # itself or a handed-out duplicate (freed); beyond it, a handed-out page.
        cached, seen = self._peek(tokens), set()
        for i, p in enumerate(pages):
            if not 0 <= p < self.num_pages:
                raise ValueError(f"insert: pages[{i}] = {p} is out of range [0, {self.num_pages})")
            if p in seen:
                raise ValueError(f"insert: pages[{i}] = {p} is listed twice")
            seen.add(p)
            if i < len(cached) and cached[i] == p:
                continue
            if self._is_free[p]:
                raise ValueError(f"insert: pages[{i}] = {p} is free (not handed out by alloc)")
            if p in self._owner:
                raise ValueError(f"insert: pages[{i}] = {p} is cached by another node"
                                 + (f" but this position caches page {cached[i]}" if i < len(cached) else ""))
        node, i = self._walk(tokens, pages)
        if i < len(pages):
            child = Node(tokens[i * self.page_size:], pages[i:], node)
            child.last_used = next(self._clock)
            node.children[child.key[:self.page_size]] = child
            for p in child.pages:
                self._owner[p] = child
            node = child
        return node

    def _live(self, node, what):
        if not isinstance(node, Node) or not node.alive:
            raise ValueError(f"{what}: {node!r} is not a live node (evicted, or never returned by "
                             f"match_prefix/insert)")

    def lock(self, node):
        self._live(node, "lock")
        node.locks += 1
        for n in self._path(node):
            n.ref += 1

    def unlock(self, node):
        self._live(node, "unlock")
        if node.locks == 0:
            raise ValueError("unlock: node is not locked"
                             + (f" (locks held on nodes below it: {node.ref})" if node.ref else ""))
        node.locks -= 1
        for n in self._path(node):
            n.ref -= 1

    # -- pages --------------------------------------------------------------------------
    def num_free_pages(self):
        return len(self._free)

    def num_cached_pages(self):
        return len(self._owner)

    def num_evictable_pages(self):
        """Pages of unlocked nodes: what evicting everything would free."""
        return sum(len(x.pages) for x in self._nodes() if x.ref == 0)

    @staticmethod
    def _count(n, what):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{what}: expected an int, got {type(n).__name__}")
        if n < 0:
            raise ValueError(f"{what} of {n} pages (must be >= 0)")
        return int(n)

    def alloc(self, n: int):
        n = self._count(n, "alloc")
        evictable = self.num_evictable_pages()
        if n > len(self._free) + evictable:   # checked before evicting: a refused alloc changes nothing
            raise ValueError(f"alloc: {n} pages requested, {len(self._free)} free + {evictable} evictable "
                             f"(num_pages={self.num_pages})")
        if n > len(self._free):
            self.evict(n - len(self._free))
        out = np.array([self._free.pop() for _ in range(n)], dtype=np.int32)
        for p in out:
            self._is_free[p] = 0
        return out

    def free(self, pages):
        """Returns pages handed out by alloc; ValueError (nothing freed) on a page out of range,
        free already, cached by a node, or listed twice."""
        pages, seen = [int(p) for p in pages], set()
        for i, p in enumerate(pages):
            if not 0 <= p < self.num_pages:
                raise ValueError(f"free: pages[{i}] = {p} is out of range [0, {self.num_pages})")
            if self._is_free[p] or p in seen:
                raise ValueError(f"free: pages[{i}] = {p} is already free (double free)")
            if p in self._owner:
                raise ValueError(f"free: pages[{i}] = {p} is cached; only pages handed out by alloc "
                                 f"can be freed")
            seen.add(p)
        self._release(pages)

    def _release(self, pages):
        for p in pages:
            self._owner.pop(p, None)
            self._is_free[p] = 1
        self._free.extend(pages)

    def evict(self, n: int):
        """Free at least n pages from least recently used unlocked leaves, if there are."""
        n = self._count(n, "evict")
        freed = 0
        while freed < n:
            leaves = [x for x in self._nodes() if not x.children and x.ref == 0]
            if not leaves:
                break
            leaf = min(leaves, key=lambda x: x.last_used)
            del leaf.parent.children[leaf.key[:self.page_size]]
            leaf.alive = False
            self._release(leaf.pages)
            freed += len(leaf.pages)
        return freed

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def check(self):
        cached = [p for n in self._nodes() for p in n.pages]
        free = set(self._free)
        assert len(free) == len(self._free), "free list holds a page twice"
        assert len(set(cached)) == len(cached), "a page is cached twice"
        assert not free & set(cached), "a cached page is also free"
        assert all(self._is_free[p] == (p in free) for p in range(self.num_pages)), "free flags disagree"
        assert len(self._owner) == len(cached), "page owners disagree with the nodes' pages"
        for n in self._nodes():
            assert n.alive, "an evicted node is in the tree"
            assert n.pages and len(n.key) == len(n.pages) * self.page_size, "node not page-whole"
            assert n.parent.children[n.key[:self.page_size]] is n, "child under a wrong key"
            assert all(self._owner.get(p) is n for p in n.pages), "page owner is another node"
            assert n.locks >= 0 and n.ref == n.locks + sum(c.ref for c in n.children.values()), \
                "ref is not locks + children's refs"

    def export_tree(self, nodes):
        """Forest of the root->node paths: (parents, num_tokens, page_offsets, page_ids,
        node_index); parents come before children; node_index[i] is -1 for the root."""
        index, parents, num_tokens, offsets, page_ids = {}, [], [], [0], []
        for node in nodes:
            for n in self._path(node):
                if id(n) in index:
                    continue
                index[id(n)] = len(parents)
                parents.append(index[id(n.parent)] if n.parent is not self.root else -1)
                num_tokens.append(len(n.key))
                page_ids.extend(n.pages)
                offsets.append(len(page_ids))
        node_index = [index.get(id(n), -1) for n in nodes]
        as32 = lambda a: np.array(a, dtype=np.int32)
        return (as32(parents), as32(num_tokens), as32(offsets), as32(page_ids), as32(node_index))
