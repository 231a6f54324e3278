"""A cluster's network as two link classes: the links between the ranks of one node (NVLink,
PCIe, loopback) and the links between nodes (InfiniBand, Ethernet).

DDP's allreduce over ``N = nodes x per_node`` ranks, modelled as the hierarchical allreduce
NCCL and gloo rings approach on such a cluster: a reduce-scatter and an all-gather inside each
node (a ring of ``p = per_node`` ranks over the intra-node links) and, between them, an
allreduce across the ``n`` nodes of each rank's ``1/p`` share, the ``p`` shares in parallel
through the node's links::

    t(N) = 2 (p-1)/p * bytes / bw_intra + 2 (p-1) * latency_intra * buckets
         + 2 (n-1)/n * bytes / bw_inter + 2 (n-1) * latency_inter * buckets

``bw_intra`` and ``bw_inter`` are bus bandwidths in nccl-tests' terms: what an allreduce
sustains inside one node, and across nodes with one rank per node. On one node only the first
line remains (the ring of :func:`workbench.analysis.model.network.ring_allreduce_time`); with one
rank per node only the second. The larger of the two lines *bounds* the allreduce: that link
class is the one to buy.

A measured point's link class
(:func:`~workbench.analysis.measured.links.point_link_class`) is what its allreduce crossed:
none for one rank, the links within a node for ranks on one node, the links across nodes (and
within them) for ranks on several. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workbench.analysis.measured.links import INTER, INTRA
from workbench.analysis.model.network import NetworkModel, ring_allreduce_time


def nodes_for(world_size: int, per_node: int | None) -> int:
    """Nodes of ``per_node`` ranks that ``world_size`` ranks fill (one node without
    ``per_node``)."""
    if per_node is None or per_node < 1:
        return 1
    return max(1, -(-int(world_size) // int(per_node)))


@dataclass(frozen=True)
class ClusterNetwork(NetworkModel):
    """Two link classes and how many ranks share a node. Its own ``bandwidth_bytes_per_s`` and
    ``latency_s`` are the inter-node class's (the scarce one), for readers of one class."""

    intra: NetworkModel | None = None
    inter: NetworkModel | None = None
    per_node: int = 1

    @classmethod
    def of(cls, intra: NetworkModel, inter: NetworkModel, per_node: int) -> ClusterNetwork:
        """The cluster of ``per_node`` ranks a node, ``intra`` inside one and ``inter`` across."""
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise ValueError(f"per_node: ranks per node, a whole number >= 1; got {per_node!r}")
        within = (
            "no link within a node"
            if per_node == 1
            else f"within a node: {intra.description or intra.name}"
        )
        ranks = "1 rank a node" if per_node == 1 else f"{per_node} ranks a node"
        return cls(
            name="cluster",
            bandwidth_bytes_per_s=inter.bandwidth_bytes_per_s,
            latency_s=inter.latency_s,
            description=f"{ranks}; {within}; across nodes: {inter.description or inter.name}",
            intra=intra,
            inter=inter,
            per_node=per_node,
        )

    def parts(
        self, nbytes: float, world_size: Sequence[int] | np.ndarray, buckets: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Seconds of the intra-node and of the inter-node part of each allreduce."""
        assert self.intra is not None and self.inter is not None
        n = np.asarray(world_size, dtype="int64")
        ranks = np.minimum(n, self.per_node)  # on one node when N fits on it
        nodes = -(-n // self.per_node)  # ceil
        intra = ring_allreduce_time(
            nbytes, ranks, self.intra.bandwidth_bytes_per_s, self.intra.latency_s, buckets
        )
        inter = ring_allreduce_time(
            nbytes, nodes, self.inter.bandwidth_bytes_per_s, self.inter.latency_s, buckets
        )
        return np.atleast_1d(intra), np.atleast_1d(inter)

    def bound_by(
        self, nbytes: float, world_size: Sequence[int] | np.ndarray, buckets: int
    ) -> list[str]:
        """Per world size, the link class whose part of the allreduce is the longer."""
        intra, inter = self.parts(nbytes, world_size, buckets)
        return [INTER if b > a else INTRA for a, b in zip(intra, inter, strict=True)]


def allreduce_time(
    network: NetworkModel, nbytes: float, world_size: Sequence[int] | np.ndarray, buckets: int
) -> np.ndarray:
    """Seconds for DDP's allreduce of ``nbytes`` in ``buckets`` over each ``world_size``: the
    ring over one link class, or the two parts over a :class:`ClusterNetwork`."""
    if isinstance(network, ClusterNetwork):
        intra, inter = network.parts(nbytes, world_size, buckets)
        return intra + inter
    n = np.asarray(world_size, dtype="int64")
    return np.asarray(
        ring_allreduce_time(nbytes, n, network.bandwidth_bytes_per_s, network.latency_s, buckets)
    )
