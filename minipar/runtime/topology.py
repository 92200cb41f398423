"""Where the devices sit: nodes of `gpus_per_node` devices, one link class inside a node and
one between nodes, each an alpha-beta link (latency alpha in seconds, bandwidth beta^-1 in
bytes per second).

Bandwidths are *per device, per direction*: what one GPU can push into the fabric while
it also receives at the same rate. NVLink 4 on H100 is marketed as 900 GB/s, the sum of
both directions, so it is 450 GB/s here; an NDR InfiniBand NIC is 400 Gb/s = 50 GB/s, and
DGX-class nodes give each GPU its own NIC. Latencies are the effective cost of one step
of a collective on that link class, not the wire latency alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checks import MAX_RANKS, positive, whole
from .device import DeviceSpec, GB

US = 1e-6


@dataclass(frozen=True)
class Link:
    """An alpha-beta link: sending V bytes costs `latency + V / bandwidth` seconds."""

    name: str
    bandwidth: float  # bytes per second, one direction
    latency: float  # seconds

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"a Link's name is a string, got {self.name!r}")
        positive(self.bandwidth, f"Link {self.name!r} bandwidth (bytes/s)")
        positive(self.latency, f"Link {self.name!r} latency (seconds)", allow_zero=True)

    def time(self, nbytes: float) -> float:
        """t(V) = alpha + V / B."""
        return self.latency + nbytes / self.bandwidth

    @staticmethod
    def nvlink4() -> "Link":
        """H100 NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction, ~1 us."""
        return Link("NVLink4", 450 * GB, 1 * US)

    @staticmethod
    def nvlink3() -> "Link":
        """A100 NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction, ~1 us."""
        return Link("NVLink3", 300 * GB, 1 * US)

    @staticmethod
    def infiniband_ndr() -> "Link":
        """InfiniBand NDR, 400 Gb/s per GPU = 50 GB/s per direction, ~5 us per step."""
        return Link("IB-NDR400", 50 * GB, 5 * US)

    @staticmethod
    def infiniband_hdr() -> "Link":
        """InfiniBand HDR, 200 Gb/s per GPU = 25 GB/s per direction, ~5 us per step."""
        return Link("IB-HDR200", 25 * GB, 5 * US)

    @staticmethod
    def ethernet_100g() -> "Link":
        """100 Gb Ethernet (RoCE) = 12.5 GB/s per direction, ~10 us per step."""
        return Link("Ethernet-100G", 12.5 * GB, 10 * US)


@dataclass(frozen=True)
class Topology:
    """`num_nodes` nodes of `gpus_per_node` identical devices; rank r sits on node
    r // gpus_per_node (ranks fill a node before the next, as launchers place them)."""

    num_nodes: int
    gpus_per_node: int
    device: DeviceSpec = field(default_factory=DeviceSpec.h100_sxm)
    intra: Link = field(default_factory=Link.nvlink4)
    inter: Link = field(default_factory=Link.infiniband_ndr)

    def __post_init__(self):
        for what in ("num_nodes", "gpus_per_node"):  # whole numbers: a rank sits on one node
            object.__setattr__(self, what, whole(
                getattr(self, what), f"Topology({what}={getattr(self, what)!r}): {what}",
                maximum=MAX_RANKS))
        if self.num_nodes * self.gpus_per_node > MAX_RANKS:
            raise ValueError(f"Topology of {self.num_nodes} x {self.gpus_per_node} = "
                             f"{self.num_nodes * self.gpus_per_node} devices is more than "
                             f"minipar lays out ({MAX_RANKS}); is it a typo?")
        for what, kind, e in (("device", DeviceSpec, "DeviceSpec.h100_sxm()"),
                              ("intra", Link, "Link.nvlink4()"),
                              ("inter", Link, "Link.infiniband_ndr()")):
            if not isinstance(getattr(self, what), kind):
                raise TypeError(f"Topology({what}=...) takes a {kind.__name__} such as {e}, "
                                f"got {type(getattr(self, what)).__name__}")

    @staticmethod
    def nodes(num_nodes: int, gpus_per_node: int = 8, device: DeviceSpec | None = None,
              intra: Link | None = None, inter: Link | None = None) -> "Topology":
        """`num_nodes` nodes of `gpus_per_node` devices (H100, NVLink 4, IB NDR by default)."""
        return Topology(num_nodes, gpus_per_node, device or DeviceSpec.h100_sxm(),
                        intra or Link.nvlink4(), inter or Link.infiniband_ndr())

    @staticmethod
    def single_node(gpus: int, device: DeviceSpec | None = None) -> "Topology":
        """One node of `gpus` devices joined by NVLink."""
        return Topology.nodes(1, gpus, device)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, a: int, b: int) -> Link:
        """The link between ranks a and b: intra-node if they share a node, else inter."""
        return self.intra if self.node_of(a) == self.node_of(b) else self.inter

    def slowest_link(self, ranks) -> Link:
        """The slowest link a ring over `ranks` crosses: inter-node once it spans nodes."""
        return self.intra if len({self.node_of(r) for r in ranks}) <= 1 else self.inter

    def describe(self) -> str:
        return (f"{self.num_nodes} node(s) x {self.gpus_per_node} {self.device.name}; "
                f"intra {self.intra.name} {self.intra.bandwidth / GB:g} GB/s, "
                f"inter {self.inter.name} {self.inter.bandwidth / GB:g} GB/s")
