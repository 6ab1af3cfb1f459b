// Which host this process runs on, as a string every process of the host computes alike and no
// other host does: the host name and the kernel's boot id (two VMs cloned from one image share a
// host name but not a boot id; a container shares its host's boot id and, with host networking,
// its name). Also the CPUs this process may use, which the ranks of one host share.
#pragma once

#include <string>

namespace kizuna {

// "nodeA:3f2a9c1e". Never fails: a missing boot id leaves the host name alone.
std::string HostId();

// The machine (the kernel) of a host id: its boot id, or the whole id where it has none. Hosts
// made of containers or network namespaces on one kernel have host ids of their own but one
// machine, whose CPUs and memory their ranks share.
std::string MachineOf(const std::string& host_id);

// The CPUs this process may run on (its affinity mask); 0 when the kernel does not say.
int UsableCpuCount();

// This host runs more ranks than the CPUs they may use (a communicator's engine says so at
// creation, from the shape, counting the ranks of each machine: MachineOf). Waits that would poll
// a while before they sleep then give way: the tcp fabric's hub yields the CPU between its looks,
// directconnect's channels yield a few times, then sleep; a polling rank holds the CPU a peer
// needs to send what it waits for. Process-wide, and once set it stays set.
void SetHostOversubscribed();
bool HostOversubscribed();

}  // namespace kizuna
