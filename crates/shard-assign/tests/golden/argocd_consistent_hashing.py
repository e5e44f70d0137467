#!/usr/bin/env python3
"""Golden vectors for shardwise's `argocd-consistent-hashing` strategy.

Source: Argo CD v3.5.1, commit 109ca7ca71139e514114499d294a492e7910a965, sharding algorithm
`consistent-hashing` (common/common.go:157). Files read:

- controller/sharding/consistent/consistent.go: the ring (`Add` l.69-83, `GetLeast` l.117-149,
  `UpdateLoad` l.152-162, `loadOK` l.245-264, `hash` l.270-273).
- controller/sharding/sharding.go: `ConsistentHashingWithBoundedLoadsDistributionFunction`
  l.171-201, `createConsistentHashingWithBoundLoads` l.203-239, `getAppDistribution` l.241-253,
  `getSortedClustersList` l.280-286.
- controller/sharding/cache.go: `NewClusterSharding` l.39-57 (one replica: no sharding, shard 0)
  and `updateDistribution` l.148-173 (pins, and pins to missing shards going to shard 0).

The algorithm is unchanged from v3.4.7 to v3.5.1 (the only diff in these files is a log message)
and at the newest commit read (37ee0097cf851bc2dd7665fc081bbce61a7e836e, 2026-08-22: comments).

These vectors come from this script, an independent reimplementation written from reading that
code; it shares no code with the Rust strategy. No Go toolchain is available here, so Argo CD
itself was not run: the vectors are as faithful as the reading. What this script mirrors:

- Shards are named "0".."N-1"; each adds 1000 virtual nodes keyed "<name><i>" (no separator), in
  shard order. A key's point is the first 8 bytes, little-endian, of its unkeyed BLAKE2b-512
  digest. Keys that coincide ("1"+"10" and "11"+"0", from 12 shards on) give one point, owned by
  the shard added last, as Go's map assignment and B-tree replace leave it.
- Clusters are taken in byte order of their id (the Secret's UID), pins included. Each one
  starts at the first point strictly after the hash of its id (wrapping to the smallest), and
  walks on to the first shard whose load is under
  ceil(1.25 * max(1, (total + 1) div N)) in float64, where total is the apps placed so far.
- A cluster adds its app count to the load of the shard the ring gave it, even when a pin sends
  it elsewhere.
- Result: a pin below N wins; a pin at N or above gives shard 0; otherwise the ring's shard. With
  one shard everything is on shard 0.

What this does not model: the app count of a cluster is an input here. Argo CD counts the
Applications in its cache (keyed by metadata.name) whose spec.destination.server is the
cluster's server URL, so an app that names its destination only counts for no cluster.

Usage: python3 argocd_consistent_hashing.py > argocd_consistent_hashing.json
"""

import bisect
import hashlib
import json
import math
import random
import sys

ARGO_CD_VERSION = "v3.5.1"
ARGO_CD_COMMIT = "109ca7ca71139e514114499d294a492e7910a965"
REPLICATION_FACTOR = 1000


def point(key: str) -> int:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=64).digest()
    return int.from_bytes(digest[:8], "little")


class BoundedLoadRing:
    """consistent.Consistent, as far as the sharding code uses it."""

    def __init__(self):
        self.owner = {}  # point -> shard name (servers)
        self.points = []  # sorted, unique (the B-tree)
        self.load = {}  # shard name -> load (loadMap)
        self.total = 0

    def add(self, name: str):
        if name in self.load:
            return
        self.load[name] = 0
        for i in range(REPLICATION_FACTOR):
            h = point(f"{name}{i}")
            self.owner[h] = name
            at = bisect.bisect_left(self.points, h)
            if at == len(self.points) or self.points[at] != h:
                self.points.insert(at, h)

    def load_ok(self, name: str) -> bool:
        if self.total < 0:
            self.total = 0
        avg = float((self.total + 1) // len(self.load))
        if avg == 0:
            avg = 1.0
        avg = math.ceil(avg * 1.25)
        return float(self.load[name]) < avg

    def get_least(self, client: str) -> str:
        h = point(client)
        while True:
            at = bisect.bisect_right(self.points, h)
            found = self.points[at] if at < len(self.points) else self.points[0]
            name = self.owner[found]
            if self.load_ok(name):
                return name
            h = found

    def first_choice(self, client: str) -> str:
        """Where get_least starts, load aside: for the statistics."""
        at = bisect.bisect_right(self.points, point(client))
        return self.owner[self.points[at] if at < len(self.points) else self.points[0]]

    def update_load(self, name: str, load: int):
        self.total -= self.load[name]
        self.load[name] = load
        self.total += load


def ring_shards(replicas, clusters):
    """createConsistentHashingWithBoundLoads: cluster id -> (ring shard, unbounded choice)."""
    ring = BoundedLoadRing()
    apps_by_shard = {}
    for i in range(replicas):
        ring.add(str(i))
        apps_by_shard[str(i)] = 0
    result = {}
    for c in sorted(clusters, key=lambda c: c["id"].encode("utf-8")):
        unbounded = ring.first_choice(c["id"])
        name = ring.get_least(c["id"])
        result[c["id"]] = (int(name), int(unbounded))
        apps_by_shard[name] += c["apps"]
        ring.update_load(name, apps_by_shard[name])
    return result


def distribute(replicas, clusters):
    """updateDistribution over every cluster: cluster id -> shard, and how many walked on."""
    if replicas <= 1:
        return {c["id"]: 0 for c in clusters}, 0
    ring = ring_shards(replicas, clusters)
    shards = {}
    for c in clusters:
        pin = c.get("pin")
        if pin is not None:
            shards[c["id"]] = pin if pin < replicas else 0
        else:
            shards[c["id"]] = ring[c["id"]][0]
    walked = sum(1 for bounded, unbounded in ring.values() if bounded != unbounded)
    return shards, walked


def uid(rng):
    h = "%032x" % rng.getrandbits(128)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}"


def fleet(rng, count, apps):
    return [{"id": uid(rng), "apps": apps(rng)} for _ in range(count)]


def skewed(rng):
    # Most clusters small, a few very large: the shape that makes the load cap bite.
    return int(rng.paretovariate(1.2) * 10) - 10 + rng.randrange(3)


def fleets():
    rng = random.Random(20261124)
    yield "three-shards-ten-clusters", 3, fleet(rng, 10, lambda r: r.randrange(0, 200))
    yield "one-shard", 1, fleet(rng, 6, lambda r: r.randrange(0, 50))
    yield "more-shards-than-clusters", 8, fleet(rng, 3, lambda r: r.randrange(1, 30))
    yield "five-shards-hundred-clusters", 5, fleet(rng, 100, skewed)
    yield "zero-apps", 4, fleet(rng, 20, lambda r: 0)
    mixed = fleet(rng, 30, lambda r: r.choice([0, 0, 1, 5, 40, 300]))
    yield "four-shards-some-empty-clusters", 4, mixed

    pinned = fleet(rng, 16, lambda r: r.randrange(5, 120))
    pinned[0]["apps"] = 900
    pinned[0]["pin"] = 3
    pinned[1]["pin"] = 0
    pinned[2]["apps"] = 400
    pinned[2]["pin"] = 1
    pinned[3]["pin"] = 9  # not a shard: Argo CD uses shard 0
    pinned[4]["pin"] = 4  # equal to the replica count: shard 0 as well
    yield "four-shards-with-pins", 4, pinned

    # From 12 shards on some ring keys coincide; at this size the owner rule of those points
    # decides the shard of several clusters.
    yield "thirteen-shards-colliding-ring-keys", 13, fleet(rng, 200, skewed)

    # Ids that are ring keys themselves: "17" is virtual node 7 of shard "1", so its hash is that
    # point exactly and the walk must start past it. "" is the in-cluster without a Secret.
    special = [{"id": i, "apps": a} for i, a in [("", 12), ("00", 3), ("17", 8), ("2999", 5)]]
    yield "ids-equal-to-ring-keys", 3, special + fleet(rng, 8, lambda r: r.randrange(0, 20))

    heavy = fleet(rng, 24, lambda r: r.randrange(1, 10))
    heavy[5]["apps"] = 10_000
    yield "one-huge-cluster", 4, heavy

    # The fleet of Argo CD's TestConsistentHashingWhenClusterIsAddedAndRemoved (133 clusters,
    # ids "%06d", no app on any of them), at 3 and at 2 replicas.
    upstream = [{"id": "%06d" % i, "apps": 0} for i in range(133)]
    yield "upstream-test-fleet-three-shards", 3, upstream
    yield "upstream-test-fleet-two-shards", 2, upstream


def render(value, indent=0):
    """JSON with every object or list of scalars on one line: one cluster per line."""
    nested = isinstance(value, (dict, list)) and any(
        isinstance(v, (dict, list)) for v in (value.values() if isinstance(value, dict) else value)
    )
    if not nested:
        return json.dumps(value)
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {render(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + render(v, indent + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def main():
    vectors = []
    for name, shards, clusters in fleets():
        expected, walked = distribute(shards, clusters)
        cases = [{**c, "expected_shard": expected[c["id"]]} for c in clusters]
        vectors.append(
            {
                "name": name,
                "shards": shards,
                "walked_past_first_choice": walked,
                "clusters": cases,
            }
        )
    document = {
        "about": (
            "Placements of Argo CD's consistent-hashing sharding for shards 0..N-1, generated by "
            "argocd_consistent_hashing.py, an independent reimplementation written from reading "
            "Argo CD's source (not run: no Go toolchain here). walked_past_first_choice counts "
            "the clusters the load cap sent past the first shard on the ring."
        ),
        "argo_cd_version": ARGO_CD_VERSION,
        "argo_cd_commit": ARGO_CD_COMMIT,
        "files_read": [
            "controller/sharding/consistent/consistent.go",
            "controller/sharding/sharding.go",
            "controller/sharding/cache.go",
        ],
        "vectors": vectors,
    }
    sys.stdout.write(render(document) + "\n")


if __name__ == "__main__":
    main()
