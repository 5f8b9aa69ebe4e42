"""A network namespace per frontend, and the kernel's own tools to hurt its link to NATS.

Every namespace hangs off one Linux bridge that exists only on this machine: the bridge holds
the test's own link-local address (``169.254.<n>.1``), where the soak's nats-server listens, and
each namespace gets ``169.254.<n>.<10 + i>`` on a veth whose other end is a bridge port. No
address outside loopback and these is ever used. A partition is ``iptables`` DROP inside the
namespace (both directions), random loss its ``statistic`` match, and a slow link ``tc tbf`` on
both ends of the namespace's veth (``tc netem`` is not in this kernel). :meth:`close` removes
everything even after a failure; names carry the process id so two runs never share one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

__all__ = ["NetLab", "run_tool", "tools_missing"]

_TOOLS = ("ip", "iptables", "tc", "nsenter")


def tools_missing() -> list[str]:
    """The kernel tools this module needs that are not on the PATH (root is needed too)."""
    return [tool for tool in _TOOLS if shutil.which(tool) is None]


def run_tool(*argv: str) -> None:
    """Run one of the kernel's tools; its stderr in one line when it fails."""
    completed = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=20)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {completed.stderr.strip()}")


@dataclass
class NetLab:
    """The bridge, the namespaces and the rules now in force, by frontend index."""

    count: int
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    subnet: int = field(default_factory=lambda: 100 + os.getpid() % 100)
    faults: dict[int, str] = field(default_factory=dict)
    _made: list[tuple[str, str]] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"wsk{self.tag}b"

    @property
    def host_address(self) -> str:
        """The soak's own address on the bridge: nats-server listens here."""
        return f"169.254.{self.subnet}.1"

    def namespace(self, index: int) -> str:
        return f"wsk{self.tag}-{index}"

    def address(self, index: int) -> str:
        return f"169.254.{self.subnet}.{10 + index}"

    def _veth(self, index: int) -> tuple[str, str]:
        return f"wsk{self.tag}h{index}", f"wsk{self.tag}n{index}"

    def prefix(self, index: int) -> list[str]:
        """The argv prefix that runs a command inside frontend ``index``'s namespace."""
        return ["nsenter", f"--net=/run/netns/{self.namespace(index)}", "--"]

    def open(self) -> NetLab:
        try:
            run_tool("ip", "link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            run_tool("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            run_tool("ip", "link", "set", self.bridge, "up")
            for index in range(self.count):
                self._add(index)
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, index: int) -> None:
        ns = self.namespace(index)
        host, inner = self._veth(index)
        run_tool("ip", "netns", "add", ns)
        self._made.append(("netns", ns))
        run_tool("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        self._made.append(("link", host))
        run_tool("ip", "link", "set", host, "master", self.bridge)
        run_tool("ip", "link", "set", host, "up")
        run_tool("ip", "link", "set", inner, "netns", ns)
        run_tool("ip", "-n", ns, "addr", "add", f"{self.address(index)}/24", "dev", inner)
        run_tool("ip", "-n", ns, "link", "set", inner, "up")
        run_tool("ip", "-n", ns, "link", "set", "lo", "up")

    # -- faults ------------------------------------------------------------------------------

    def _iptables(self, index: int, *rule: str) -> None:
        run_tool("ip", "netns", "exec", self.namespace(index), "iptables", *rule)

    def partition(self, index: int) -> None:
        """Drop every packet between the namespace and the soak's address, both ways."""
        self._iptables(index, "-A", "OUTPUT", "-d", self.host_address, "-j", "DROP")
        self._iptables(index, "-A", "INPUT", "-s", self.host_address, "-j", "DROP")
        self.faults[index] = "partition"

    def lose(self, index: int, probability: float) -> None:
        """Drop that share of packets at random, both ways."""
        chance = f"{probability:.3f}"
        for chain, side in (("OUTPUT", "-d"), ("INPUT", "-s")):
            self._iptables(
                index, "-A", chain, side, self.host_address, "-m", "statistic",
                "--mode", "random", "--probability", chance, "-j", "DROP",
            )  # fmt: skip
        self.faults[index] = "loss"

    def throttle(self, index: int, rate: str) -> None:
        """Shape both directions of the namespace's link to ``rate`` (a ``tc`` rate: 64kbit)."""
        host, inner = self._veth(index)
        shape = ("root", "tbf", "rate", rate, "burst", "4kb", "latency", "400ms")
        run_tool(
            "ip", "netns", "exec", self.namespace(index), "tc", "qdisc", "add", "dev", inner, *shape
        )
        run_tool("tc", "qdisc", "add", "dev", host, *shape)
        self.faults[index] = "throttle"

    def heal(self, index: int) -> None:
        """Remove whatever fault the namespace's link has."""
        kind = self.faults.pop(index, None)
        if kind in ("partition", "loss"):
            self._iptables(index, "-F", "INPUT")
            self._iptables(index, "-F", "OUTPUT")
        elif kind == "throttle":
            host, inner = self._veth(index)
            run_tool(
                "ip",
                "netns",
                "exec",
                self.namespace(index),
                "tc",
                "qdisc",
                "del",
                "dev",
                inner,
                "root",
            )
            run_tool("tc", "qdisc", "del", "dev", host, "root")

    def close(self) -> None:
        """Delete every link and namespace made, newest first; errors do not stop the rest."""
        for kind, name in reversed(self._made):
            argv = ("ip", "link", "del", name) if kind == "link" else ("ip", "netns", "del", name)
            subprocess.run(argv, capture_output=True, check=False, timeout=20)
        self._made.clear()
        self.faults.clear()
