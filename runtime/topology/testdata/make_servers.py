#!/usr/bin/env python3
"""Writes the hwloc XML topologies of this folder: server shapes that the machine-topology tests and
docs use without owning the hardware. Run it from this folder; the files are committed.

  server_8x8.xml        2 sockets; 4 PCIe switches (2 per socket), each with 2 accelerators and 2 NICs
  server_8x8_split.xml  the same, with socket 1's second switch seen as two: one with both of its
                        accelerators and one NIC, the other with the second NIC alone
  workstation_4x1.xml   1 socket; 4 accelerators on root ports of their own, one NIC on the chipset
  remote_nic.xml        2 sockets; 2 accelerators behind a switch on socket 0, the only NIC on socket 1
  two_nic_host.xml      1 socket; 2 switches, each with an accelerator and a NIC, the NICs named against
                        the accelerators' order (eth1 beside the first, eth0 beside the second): the
                        namespace hosts of tests/cluster, whose NICs are eth0 and eth1
"""
import itertools

gp = itertools.count(100)
CPUS_PER_SOCKET = 4


def mask(bits):
    return "0x%08x" % sum(1 << b for b in bits)


class Bus:
    """Hands out PCI bus numbers in depth-first order, as a BIOS would."""

    def __init__(self, domain_bus):
        self.next = domain_bus

    def take(self):
        b = self.next
        self.next += 1
        return b


def osdev(name, kind, subtype=None):
    types = {"gpu": 1, "net": 2, "ofed": 3, "coproc": 5}
    sub = f' subtype="{subtype}"' if subtype else ""
    return f'<object type="OSDev" gp_index="{next(gp)}" name="{name}"{sub} osdev_type="{types[kind]}"/>'


def accelerator(bus, index):
    return (f'<object type="PCIDev" gp_index="{next(gp)}" pci_busid="0000:{bus:02x}:00.0" '
            f'pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.507692">'
            + osdev(f"cuda{index}", "coproc", "CUDA") + "</object>")


def nic(bus, interface, rdma):
    inner = osdev(interface, "net") + (osdev(rdma, "ofed") if rdma else "")
    return (f'<object type="PCIDev" gp_index="{next(gp)}" pci_busid="0000:{bus:02x}:00.0" '
            f'pci_type="0200 [15b3:1021] [15b3:0041] 00" pci_link_speed="31.507692">' + inner + "</object>")


def bridge(bus, first, last, depth, children):
    return (f'<object type="Bridge" gp_index="{next(gp)}" bridge_type="1-1" depth="{depth}" '
            f'bridge_pci="0000:[{first:02x}-{last:02x}]" pci_busid="0000:{bus:02x}:00.0" '
            f'pci_type="0604 [1000:c030] [0000:0000] b0" pci_link_speed="31.507692">' + "".join(children) + "</object>")


def switch(bus, items, parent_depth):
    """A root port, the switch's upstream port below it, a downstream port per item.
    items: callables taking a bus number and returning the device's XML."""
    rp_bus = bus.take()
    up_bus = bus.take()
    downs = []
    for item in items:
        port_bus = bus.take()
        dev_bus = bus.take()
        downs.append(bridge(port_bus, dev_bus, dev_bus, parent_depth + 3, [item(dev_bus)]))
    last = bus.next - 1
    up = bridge(up_bus, up_bus + 1, last, parent_depth + 2, downs)
    return bridge(rp_bus, up_bus, last, parent_depth + 1, [up])


def root_port(bus, item, parent_depth):
    rp_bus = bus.take()
    dev_bus = bus.take()
    return bridge(rp_bus, dev_bus, dev_bus, parent_depth + 1, [item(dev_bus)])


def host_bridge(first, children_fn):
    bus = Bus(first + 1)
    children = children_fn(bus)
    return (f'<object type="Bridge" gp_index="{next(gp)}" bridge_type="0-1" depth="0" '
            f'bridge_pci="0000:[{first:02x}-{bus.next - 1:02x}]">' + "".join(children) + "</object>")


def package(index, host_bridges):
    cpus = range(index * CPUS_PER_SOCKET, (index + 1) * CPUS_PER_SOCKET)
    sets = f'cpuset="{mask(cpus)}" complete_cpuset="{mask(cpus)}" nodeset="{mask([index])}" complete_nodeset="{mask([index])}"'
    cores = "".join(
        f'<object type="Core" os_index="{c}" {sets.replace(mask(cpus), mask([c]))} gp_index="{next(gp)}">'
        f'<object type="PU" os_index="{c}" {sets.replace(mask(cpus), mask([c]))} gp_index="{next(gp)}"/></object>'
        for c in cpus)
    numa = f'<object type="NUMANode" os_index="{index}" {sets} gp_index="{next(gp)}" local_memory="274877906944"/>'
    return (f'<object type="Package" os_index="{index}" {sets} gp_index="{next(gp)}">' + numa + cores
            + "".join(host_bridges) + "</object>")


def machine(name, packages):
    sockets = len(packages)
    cpus = range(sockets * CPUS_PER_SOCKET)
    sets = (f'cpuset="{mask(cpus)}" complete_cpuset="{mask(cpus)}" allowed_cpuset="{mask(cpus)}" '
            f'nodeset="{mask(range(sockets))}" complete_nodeset="{mask(range(sockets))}" '
            f'allowed_nodeset="{mask(range(sockets))}"')
    body = "".join(package(i, hbs) for i, hbs in enumerate(packages))
    xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n'
           '<topology version="2.0">\n'
           f'<object type="Machine" os_index="0" {sets} gp_index="1">'
           f'<info name="HostName" value="{name}"/>' + body + "</object>\n</topology>\n")
    with open(name + ".xml", "w") as f:
        f.write(xml)


def acc(i):
    return lambda b: accelerator(b, i)


def net(i):
    return lambda b: nic(b, f"eth{i + 1}", f"mlx5_{i}")


def server(split):
    def sw(k, first):
        a, n = 2 * k, 2 * k
        if split and k == 3:
            return host_bridge(first, lambda bus: [switch(bus, [acc(a), acc(a + 1), net(n)], 0),
                                                    switch(bus, [net(n + 1)], 0)])
        return host_bridge(first, lambda bus: [switch(bus, [acc(a), net(n), acc(a + 1), net(n + 1)], 0)])

    return [[sw(0, 0x00), sw(1, 0x20)], [sw(2, 0x80), sw(3, 0xa0)]]


machine("server_8x8", server(False))
machine("server_8x8_split", server(True))
machine("workstation_4x1",
        [[host_bridge(0x00, lambda bus: [root_port(bus, acc(i), 0) for i in range(4)]
                      + [root_port(bus, lambda b: nic(b, "enp9s0", None), 0)])]])
machine("remote_nic",
        [[host_bridge(0x00, lambda bus: [switch(bus, [acc(0), acc(1)], 0)])],
         [host_bridge(0x80, lambda bus: [root_port(bus, lambda b: nic(b, "eth1", "mlx5_0"), 0)])]])
machine("two_nic_host",
        [[host_bridge(0x00, lambda bus: [switch(bus, [acc(0), lambda b: nic(b, "eth1", None)], 0)]),
          host_bridge(0x80, lambda bus: [switch(bus, [acc(1), lambda b: nic(b, "eth0", None)], 0)])]])
