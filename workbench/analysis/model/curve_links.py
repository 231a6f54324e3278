"""A scaling curve's points and their links: the node count is an axis, like the world size.

A curve is a config (its group columns, never ``nodes`` or ``tasks_per_node``); its points are
``(world_size, nodes)``, each with the link class its allreduce crossed
(:func:`workbench.analysis.measured.links.point_link_class`): none at one rank, within a node,
across nodes. The scaling model predicts each point on the network of its class: the one given,
or the one the runs that crossed that class measured (their allreduce micro-benchmark, else a
fit to their traces), pooled over the study (the links belong to the machine, not to a config).
World sizes asked beyond the measured ones are laid out as the curve was heading: on nodes of
the ranks per node of its widest run. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workbench.analysis.measured.links import INTER, INTRA, NO_LINK, point_link_class
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.model.cluster_network import ClusterNetwork, nodes_for
from workbench.analysis.model.network import NetworkFit, NetworkModel, network_fit

#: The columns that say where a point is, after ``world_size``.
POINT_COLUMNS = ("nodes", "link_class")


def with_links(per_run: pd.DataFrame) -> pd.DataFrame:
    """``per_run`` (one row per run, with ``world_size``) with ``nodes`` (1 where the runs frame
    has none: RunConfig's default) and ``link_class``."""
    nodes = per_run["nodes"] if "nodes" in per_run.columns else pd.Series(1, index=per_run.index)
    nodes = pd.to_numeric(nodes, errors="coerce").fillna(1).astype("int64")
    links = [point_link_class(w, n) for w, n in zip(per_run["world_size"], nodes, strict=True)]
    return per_run.assign(nodes=nodes, link_class=pd.Series(links, index=per_run.index))


def base_point(curve: pd.DataFrame) -> tuple[int, int]:
    """The curve's base: its smallest world size, on the fewest nodes there."""
    base_n = int(curve["world_size"].min())
    return base_n, int(curve.loc[curve["world_size"] == base_n, "nodes"].min())


def ranks_per_node(curve: pd.DataFrame) -> int | None:
    """The ranks a node of the curve's widest run (most nodes, then most ranks); ``None`` when
    every run is on one node (asked world sizes stay on one node)."""
    widest = curve.sort_values(["nodes", "world_size"], kind="stable").iloc[-1]
    if int(widest["nodes"]) <= 1:
        return None
    return max(1, int(widest["world_size"]) // int(widest["nodes"]))


def curve_points(
    curve: pd.DataFrame, world_sizes: Sequence[int], per_node: int | None
) -> pd.DataFrame:
    """The curve's measured points ``(world_size, nodes)`` and each asked world size on
    :func:`~workbench.analysis.model.cluster_network.nodes_for` ``per_node`` (where not measured
    so); with ``link_class``, sorted by world size and nodes."""
    measured = curve[["world_size", "nodes"]].drop_duplicates().astype("int64")
    asked = sorted({int(n) for n in world_sizes})
    extra = pd.DataFrame({"world_size": asked, "nodes": [nodes_for(n, per_node) for n in asked]})
    points = pd.concat([measured, extra.astype("int64")], ignore_index=True).drop_duplicates()
    points = points.sort_values(["world_size", "nodes"], kind="stable").reset_index(drop=True)
    return with_links(points)


@dataclass
class CurveNetworks:
    """The network of each link class for one study: the one given (every point on it), or
    measured per class on the runs that crossed it (:meth:`of`)."""

    given: NetworkFit | None
    runs: pd.DataFrame | None
    steps: pd.DataFrame | StoredSteps
    fits: dict[str, NetworkFit] = field(default_factory=dict)

    def of(self, link: str) -> NetworkFit:
        """The network of ``link`` (:data:`INTRA` or :data:`INTER`), measured once."""
        if self.given is not None:
            return self.given
        if link not in self.fits:
            self.fits[link] = network_fit(None, self.steps, self.runs, link=link)
        return self.fits[link]

    def per_node(self) -> int | None:
        """The ranks a node of a given cluster (asked points are laid out on it), else None."""
        model = self.given.model if self.given is not None else None
        return model.per_node if isinstance(model, ClusterNetwork) else None

    def for_point(
        self, link: str, classes: Sequence[str], world_size: int, nodes: int
    ) -> NetworkFit:
        """The network a point of ``link`` (``world_size`` ranks on ``nodes``) is predicted on:
        a given cluster laid out as the point is, another given network as it is, else its
        class's measured one. One rank moves nothing, so it takes the first of ``classes``
        (the curve's) with a model, for its name."""
        model = self.given.model if self.given is not None else None
        if isinstance(model, ClusterNetwork) and model.intra and model.inter:
            laid = ClusterNetwork.of(model.intra, model.inter, -(-world_size // max(nodes, 1)))
            return NetworkFit(laid, laid.description)
        if link != NO_LINK:
            return self.of(link)
        for other in [*classes, INTRA, INTER]:
            if other != NO_LINK and self.of(other).model is not None:
                return self.of(other)
        return self.of(INTRA)


def bound_by(network: NetworkModel, nbytes: float, world_size: int, buckets: int) -> object:
    """Which link class bounds the allreduce on a given cluster (NaN for any other network)."""
    if isinstance(network, ClusterNetwork):
        return network.bound_by(nbytes, [world_size], buckets)[0]
    return np.nan


#: Link classes as people say them.
LINK_WORDS = {INTRA: "within a node", INTER: "across nodes"}


def networks_text(nets: CurveNetworks, links: Sequence[str]) -> str:
    """What the points of ``links`` were predicted on, for people: the given network, or each
    measured class's model (``within a node: ...; across nodes: ...``), or why it has none."""
    if nets.given is not None:
        model = nets.given.model
        return (model.description or model.name) if model is not None else nets.given.note
    parts = []
    for link in (INTRA, INTER):
        if link in links:
            fit = nets.of(link)
            said = fit.model.description or fit.model.name if fit.model is not None else fit.note
            parts.append(f"{LINK_WORDS[link]}: {said}")
    return "; ".join(parts)
