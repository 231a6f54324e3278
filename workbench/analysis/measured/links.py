"""A measured point's link class: what the allreduce of its ranks crossed (none for one rank,
the links within a node for ranks on one node, the links across nodes for ranks on several).
Read by the scaling table and by the network model of each link class. Pure Python.
"""

from __future__ import annotations

INTRA, INTER = "intra-node", "inter-node"
#: The link class of one rank: its allreduce moves nothing.
NO_LINK = "none"


def nodes_link_class(nodes: object) -> str:
    """The links ranks on ``nodes`` nodes cross: :data:`INTRA` on one node (an unknown node
    count is one node, RunConfig's default), :data:`INTER` on more."""
    try:
        many = float(nodes) > 1  # type: ignore[arg-type]
    except (TypeError, ValueError):
        many = False
    return INTER if many else INTRA


def point_link_class(world_size: object, nodes: object) -> str:
    """What the allreduce of ``world_size`` ranks on ``nodes`` nodes crosses: :data:`NO_LINK`
    for one rank, else :func:`nodes_link_class`."""
    if int(world_size) <= 1:  # type: ignore[call-overload]
        return NO_LINK
    return nodes_link_class(nodes)
