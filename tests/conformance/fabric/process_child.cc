// Rank 1 of the cross-process tests (process_test.cc is rank 0): this binary started again with
// --fabric-child=<fabric>:<scenario>:<fd>. The control socket (fd) carries the handles and the
// verdict as lines; every step is bounded by kChildTimeoutSeconds.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "runtime/device/registry.h"
#include "runtime/core/unique_fd.h"
#include "tests/conformance/fabric/fabric_conformance.h"

namespace kizuna::fabric::conformance {
namespace {

struct ChildSpec {
  std::string fabric;
  std::string scenario;
  int fd = -1;
};

Result<ChildSpec> ParseSpec(std::string_view spec) {
  const size_t last = spec.rfind(':');
  const size_t mid = last == std::string_view::npos || last == 0 ? std::string_view::npos : spec.rfind(':', last - 1);
  if (mid == std::string_view::npos || mid == 0)
    return InvalidArgument(fmt::format("{}'{}': expected <fabric>:<scenario>:<fd>", kChildFlag, spec));
  ChildSpec out{std::string(spec.substr(0, mid)), std::string(spec.substr(mid + 1, last - mid - 1)), -1};
  const std::string fd(spec.substr(last + 1));
  char* end = nullptr;
  const long f = std::strtol(fd.c_str(), &end, 10);
  if (fd.empty() || *end != '\0' || f < 0 || f > 1 << 20) return InvalidArgument(fmt::format("bad fd '{}'", fd));
  out.fd = static_cast<int>(f);
  return out;
}

// "handle <dev> <hex>" -> (dev, handle)
Result<std::pair<int, Handle>> ParseHandleLine(const std::string& line) {
  if (!line.starts_with("handle ")) return InvalidArgument(fmt::format("expected a handle line, got \"{}\"", line));
  const size_t space = line.find(' ', 7);
  if (space == std::string::npos) return InvalidArgument(fmt::format("malformed handle line \"{}\"", line));
  const int dev = std::atoi(line.substr(7, space - 7).c_str());
  KZ_ASSIGN_OR_RETURN(Handle h, Handle::FromHex(line.substr(space + 1)));
  return std::pair<int, Handle>(dev, h);
}

// This rank's device whose link reaches (peer_rank, peer_dev); device 0 on switched fabrics.
Result<int> DeviceTowards(const Fabric& fabric, int peer_rank, int peer_dev) {
  for (int d = 0; d < fabric.device_count(); ++d) {
    KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, fabric.properties(d));
    if (!p.point_to_point) return 0;
    if (p.link_peer.has_value() && p.link_peer->rank == peer_rank && p.link_peer->port == peer_dev) return d;
  }
  return NotSupported(fmt::format("no device reaches rank {} device {}", peer_rank, peer_dev));
}

Status Body(const ChildSpec& spec, int ctl, const Config& config, const Options& options, Deadline deadline) {
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, CreateFabric(spec.fabric, config, RankContext(1)));
  // Rank 0 listens first; this side connects to it, then listens for rank 0's connection.
  KZ_ASSIGN_OR_RETURN(std::string line, ReceiveLine(ctl, deadline));
  KZ_ASSIGN_OR_RETURN(auto parent, ParseHandleLine(line));
  KZ_ASSIGN_OR_RETURN(int dev, DeviceTowards(*fabric, 0, parent.first));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<SendComm> send, fabric->Connect(dev, parent.second, deadline));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<ListenComm> listen, fabric->Listen(dev));
  KZ_RETURN_IF_ERROR(SendLine(ctl, fmt::format("handle {} {}", dev, listen->handle().ToHex()), deadline));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<RecvComm> recv, listen->Accept(deadline));

  KZ_ASSIGN_OR_RETURN(FabricDeviceProperties props, fabric->properties(dev));
  const uint64_t max = std::min<uint64_t>(options.max_bytes, props.max_message_bytes);

  if (spec.scenario == "die") {
    HostBuffer buf(max);
    if (!buf.ok()) return OutOfMemory(fmt::format("{} bytes of host memory", max));
    KZ_ASSIGN_OR_RETURN(Registration * reg, recv->Register(MemoryDescriptor::Host(buf.data(), max)));
    KZ_ASSIGN_OR_RETURN(Request * r, recv->Recv(buf.data(), max, 1, reg));
    if (r == nullptr) return Internal("the first receive was refused as busy");
    // Take part of the message, then stop and wait to be killed.
    for (int i = 0; i < 20; ++i) {
      KZ_ASSIGN_OR_RETURN(Completion c, recv->Test(r));
      if (c.done) return Internal("the whole message arrived before the parent killed this process");
    }
    KZ_RETURN_IF_ERROR(SendLine(ctl, "ready", deadline));
    (void)ReceiveLine(ctl, deadline);
    return Internal("still alive: the parent was to kill this process");
  }

  const bool fd = spec.scenario == "echo-fd";
  if (!fd && spec.scenario != "echo") return InvalidArgument(fmt::format("unknown scenario '{}'", spec.scenario));
  const size_t bytes = std::max<uint64_t>(max, 1);
  HostBuffer host(fd ? 0 : bytes);
  std::unique_ptr<device::DeviceRegistry> devices;
  std::unique_ptr<device::Buffer> dbuf;
  device::ExportedMemory exported;
  MemoryDescriptor memory;
  if (fd) {
    devices = device::DeviceRegistry::Create(config);
    device::Backend* b = devices->Find("host_emulated");
    if (b == nullptr || b->device_count() == 0) return Unavailable("no emulated device in the child");
    device::Device* d = b->device(0);
    KZ_ASSIGN_OR_RETURN(dbuf, d->Allocate(bytes));
    KZ_ASSIGN_OR_RETURN(exported, d->Export(*dbuf));
    memory = MemoryDescriptor::FromExport(dbuf->data(), exported, d->properties().host_accessible);
  } else {
    if (!host.ok()) return OutOfMemory(fmt::format("{} bytes of host memory", bytes));
    memory = MemoryDescriptor::Host(host.data(), bytes);
  }
  auto* data = static_cast<uint8_t*>(memory.data);
  KZ_ASSIGN_OR_RETURN(Registration * rreg, recv->Register(memory));
  KZ_ASSIGN_OR_RETURN(Registration * sreg, send->Register(memory));
  for (uint64_t size : EchoSizes(max)) {
    KZ_ASSIGN_OR_RETURN(Request * r, recv->Recv(data, size, 1, size > 0 ? rreg : nullptr));
    if (r == nullptr) return Internal("a receive was refused as busy with nothing in flight");
    KZ_ASSIGN_OR_RETURN(size_t got, recv->Wait(r, deadline));
    if (got != size) return Internal(fmt::format("received {} bytes, expected {}", got, size));
    if (!HasPattern(data, size, size)) return Internal(fmt::format("the {}-byte message arrived corrupted", size));
    KZ_ASSIGN_OR_RETURN(Request * s, send->Send(data, size, 1, size > 0 ? sreg : nullptr));
    if (s == nullptr) return Internal("a send was refused as busy with nothing in flight");
    KZ_ASSIGN_OR_RETURN(size_t sent, send->Wait(s, deadline));
    if (sent != size) return Internal(fmt::format("sent {} bytes, expected {}", sent, size));
  }
  if (fd && (send->stats().staged_bytes != 0 || recv->stats().staged_bytes != 0))
    return Internal(fmt::format("fd-registered transfers were staged ({} bytes sending, {} receiving)",
                                send->stats().staged_bytes, recv->stats().staged_bytes));
  return Status::Ok();
}

}  // namespace

int RunChild(std::string_view spec_text, const Config& config, const Options& options) {
  const Deadline deadline = Deadline::AfterSeconds(kChildTimeoutSeconds);
  Result<ChildSpec> spec = ParseSpec(spec_text);
  if (!spec.ok()) {
    std::fprintf(stderr, "fabric child: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  UniqueFd ctl(spec->fd);
  const Status s = Body(*spec, ctl.get(), config, options, deadline);
  if (!s.ok()) std::fprintf(stderr, "fabric child (%s): %s\n", spec->scenario.c_str(), s.ToString().c_str());
  const Status sent = SendLine(ctl.get(), s.ok() ? std::string("ok") : "fail: " + s.ToString(), deadline);
  return s.ok() && sent.ok() ? 0 : 1;
}

}  // namespace kizuna::fabric::conformance
