// A rank program for kizuna-run: every rank exchanges data with each neighbour of its node in a
// direct-connect topology (KIZUNA_TOPOLOGY), over the links alone.
//
//   KIZUNA_TOPOLOGY=t.json kizuna-run -n 8 -- torus_exchange [--bytes N]
//
// Each rank bootstraps from kizuna-run's environment (runtime/bootstrap), creates the
// directconnect fabric for its node, listens on every linked port and shares the handles with an
// AllGather; then it connects each port to the port at the far end of its link and accepts the
// neighbours' connections. Two rounds move a message across every link in both directions: one
// from host memory, one from emulated device buffers registered by fd (single copy: no byte may be
// staged). Each message carries a pattern derived from (sender rank, sender port), so a message
// that took a wrong link is caught. Prints one line per round and a final "ok" line per rank.
// Exit status 0 when every check passed, 1 otherwise (the reason on stderr).

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/core/config.h"
#include "runtime/device/registry.h"
#include "runtime/core/logging.h"

namespace kizuna {
namespace {

using fabric::Completion;
using fabric::Handle;
using fabric::MemoryDescriptor;
using fabric::Registration;
using fabric::Request;

uint64_t Word(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + i + 1;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}
void Fill(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(Word(seed, i / 8) >> (8 * (i % 8)));
}
std::optional<size_t> FirstMismatch(const uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<uint8_t>(Word(seed, i / 8) >> (8 * (i % 8)))) return i;
  return std::nullopt;
}
uint64_t SeedOf(int rank, int port) { return static_cast<uint64_t>(rank) * 1000 + static_cast<uint64_t>(port); }

// One linked port: its connections both ways and the peer at the far end.
struct Link {
  int port = 0;
  fabric::LinkPeer peer;
  std::unique_ptr<fabric::ListenComm> listen;
  std::unique_ptr<fabric::SendComm> send;
  std::unique_ptr<fabric::RecvComm> recv;
};

// The AllGather blob: for every linked port, its index and its listener's handle.
std::vector<uint8_t> EncodeHandles(const std::vector<Link>& links) {
  std::vector<uint8_t> out;
  for (const Link& l : links) {
    const uint32_t port = static_cast<uint32_t>(l.port), size = l.listen->handle().size;
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&port), reinterpret_cast<const uint8_t*>(&port) + 4);
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&size), reinterpret_cast<const uint8_t*>(&size) + 4);
    const auto bytes = l.listen->handle().bytes();
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

Result<Handle> FindHandle(const std::vector<uint8_t>& blob, int port, int rank) {
  size_t at = 0;
  while (at + 8 <= blob.size()) {
    uint32_t p, size;
    std::memcpy(&p, blob.data() + at, 4);
    std::memcpy(&size, blob.data() + at + 4, 4);
    if (size > fabric::kHandleMaxBytes || at + 8 + size > blob.size())
      return InvalidArgument(fmt::format("rank {} sent a malformed handle table", rank));
    if (static_cast<int>(p) == port)
      return Handle::FromBytes(std::span<const uint8_t>(blob.data() + at + 8, size));
    at += 8 + size;
  }
  return InvalidArgument(fmt::format("rank {} listens on no port {} (its handle table lacks it)", rank, port));
}

// Moves one message across every link both ways; `memory` gives each link's send and receive
// regions. Drives all requests together, blocking in the fabric's wait when none advanced.
Status ExchangeRound(int rank, std::vector<Link>& links, size_t bytes,
                     const std::vector<std::pair<MemoryDescriptor, MemoryDescriptor>>& memory, Deadline deadline) {
  struct Pending {
    fabric::Comm* comm;
    Request* request;
    size_t link;
    bool receive;
  };
  std::vector<Pending> pending;
  for (size_t i = 0; i < links.size(); ++i) {
    Link& l = links[i];
    const MemoryDescriptor& out = memory[i].first;
    const MemoryDescriptor& in = memory[i].second;
    Fill(static_cast<uint8_t*>(out.data), bytes, SeedOf(rank, l.port));
    std::memset(in.data, 0, bytes);
    KZ_ASSIGN_OR_RETURN(Registration * sreg, l.send->Register(out));
    KZ_ASSIGN_OR_RETURN(Registration * rreg, l.recv->Register(in));
    KZ_ASSIGN_OR_RETURN(Request * r, l.recv->Recv(in.data, bytes, 0, rreg));
    KZ_ASSIGN_OR_RETURN(Request * s, l.send->Send(out.data, bytes, 0, sreg));
    if (r == nullptr || s == nullptr) return Internal("a post was refused as busy with nothing in flight");
    pending.push_back({l.recv.get(), r, i, true});
    pending.push_back({l.send.get(), s, i, false});
  }
  // Checks a completed request and drops it from `pending`.
  auto finish = [&](size_t k, size_t size) -> Status {
    if (size != bytes) return Internal(fmt::format("a transfer of {} bytes reported {}", bytes, size));
    if (pending[k].receive) {
      const Link& l = links[pending[k].link];
      const auto* in = static_cast<const uint8_t*>(memory[pending[k].link].second.data);
      if (auto bad = FirstMismatch(in, bytes, SeedOf(l.peer.rank, l.peer.port)))
        return Internal(fmt::format("port {}: byte {} of the message from rank {} port {} is wrong (a message from "
                                    "another link, or corrupted)",
                                    l.port, *bad, l.peer.rank, l.peer.port));
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
    return Status::Ok();
  };
  while (!pending.empty()) {
    bool advanced = false;
    for (size_t k = 0; k < pending.size();) {
      KZ_ASSIGN_OR_RETURN(Completion c, pending[k].comm->Test(pending[k].request));
      if (!c.done) {
        ++k;
        continue;
      }
      advanced = true;
      KZ_RETURN_IF_ERROR(finish(k, c.size));
    }
    if (pending.empty()) break;
    if (deadline.Expired()) return Timeout("the exchange did not finish by the deadline");
    // Nothing advanced: block in the fabric until the first pending request moves (or briefly).
    if (!advanced) {
      Result<size_t> w =
          pending.front().comm->Wait(pending.front().request, Deadline::After(std::chrono::milliseconds(2)));
      if (w.ok()) {
        KZ_RETURN_IF_ERROR(finish(0, *w));
      } else if (w.status().code() != StatusCode::kTimeout) {
        return w.status();
      }
    }
  }
  return Status::Ok();
}

// Kept whole: the test's script, step by step (bootstrap, connect every link, the host round, the device round).
int Main(int argc, char** argv) {
  CLI::App app{"torus_exchange: exchange data with every direct-link neighbour (run under kizuna-run)"};
  size_t bytes = (size_t{1} << 20) + 5;
  app.add_option("--bytes", bytes, "message size per link and direction")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto fail = [](const Status& s) {
    fmt::print(stderr, "torus_exchange: {}\n", s.ToString());
    return 1;
  };

  auto launch = bootstrap::DetectLaunch(bootstrap::ProcessEnvironment());
  if (!launch.ok()) return fail(launch.status());
  auto made = bootstrap::BootstrapFromEnvironment();
  if (!made.ok()) return fail(made.status().WithContext("bootstrap"));
  bootstrap::Bootstrap& boot = **made;
  const int rank = boot.rank();
  SetLogRank(rank);
  const Config& config = GlobalConfig();
  const Deadline deadline = Deadline::AfterSeconds(config.timeout_s);

  fabric::FabricContext ctx;
  ctx.rank = rank;
  ctx.world_size = boot.size();
  ctx.local_rank = launch->local_rank;
  auto made_fabric = fabric::CreateFabric("directconnect", config, ctx);
  if (!made_fabric.ok()) return fail(made_fabric.status());
  fabric::Fabric& fab = **made_fabric;

  std::vector<Link> links;
  for (int p = 0; p < fab.device_count(); ++p) {
    auto props = fab.properties(p);
    if (!props.ok()) return fail(props.status());
    if (!props->link_peer.has_value() || props->link_peer->rank < 0) continue;
    Link l;
    l.port = p;
    l.peer = *props->link_peer;
    auto listen = fab.Listen(p);
    if (!listen.ok()) return fail(listen.status());
    l.listen = std::move(listen).value();
    links.push_back(std::move(l));
  }
  auto tables = boot.AllGather(EncodeHandles(links), deadline);
  if (!tables.ok()) return fail(tables.status().WithContext("exchanging handles"));
  // Connecting does not wait for the peer's accept, so connect everything first, then accept.
  for (Link& l : links) {
    auto h = FindHandle((*tables)[static_cast<size_t>(l.peer.rank)], l.peer.port, l.peer.rank);
    if (!h.ok()) return fail(h.status());
    auto send = fab.Connect(l.port, *h, deadline);
    if (!send.ok()) return fail(send.status().WithContext(fmt::format("port {}", l.port)));
    l.send = std::move(send).value();
  }
  for (Link& l : links) {
    auto recv = l.listen->Accept(deadline);
    if (!recv.ok()) return fail(recv.status().WithContext(fmt::format("port {}", l.port)));
    l.recv = std::move(recv).value();
  }

  // Round 1: host memory.
  std::vector<std::vector<uint8_t>> host(2 * links.size(), std::vector<uint8_t>(bytes));
  std::vector<std::pair<MemoryDescriptor, MemoryDescriptor>> memory;
  for (size_t i = 0; i < links.size(); ++i)
    memory.emplace_back(MemoryDescriptor::Host(host[2 * i].data(), bytes),
                        MemoryDescriptor::Host(host[2 * i + 1].data(), bytes));
  if (Status s = ExchangeRound(rank, links, bytes, memory, deadline); !s.ok()) return fail(s.WithContext("host round"));
  std::string ports;
  for (const Link& l : links)
    ports += fmt::format("{}{}->{}:{}", ports.empty() ? "" : " ", l.port, l.peer.node, l.peer.port);
  fmt::print("rank {}: host round ok over {} links ({})\n", rank, links.size(), ports);

  // Round 2: emulated device buffers registered by fd, a single copy per message.
  auto devices = device::DeviceRegistry::Create(config);
  device::Backend* emu = devices->Find("host_emulated");
  if (emu == nullptr || emu->device_count() == 0) return fail(Unavailable("no emulated device"));
  device::Device* dev = emu->device(config.device.value_or(launch->local_rank) % emu->device_count());
  std::vector<std::unique_ptr<device::Buffer>> buffers;
  std::vector<device::ExportedMemory> exports;
  memory.clear();
  for (size_t i = 0; i < 2 * links.size(); ++i) {
    auto b = dev->Allocate(bytes);
    if (!b.ok()) return fail(b.status());
    auto e = dev->Export(**b);
    if (!e.ok()) return fail(e.status());
    buffers.push_back(std::move(b).value());
    exports.push_back(std::move(e).value());
  }
  std::vector<uint64_t> staged_before;
  for (size_t i = 0; i < links.size(); ++i) {
    memory.emplace_back(MemoryDescriptor::FromExport(buffers[2 * i]->data(), exports[2 * i], true),
                        MemoryDescriptor::FromExport(buffers[2 * i + 1]->data(), exports[2 * i + 1], true));
    staged_before.push_back(links[i].send->stats().staged_bytes + links[i].recv->stats().staged_bytes);
  }
  if (Status s = ExchangeRound(rank, links, bytes, memory, deadline); !s.ok())
    return fail(s.WithContext("device round"));
  for (size_t i = 0; i < links.size(); ++i) {
    const uint64_t staged =
        links[i].send->stats().staged_bytes + links[i].recv->stats().staged_bytes - staged_before[i];
    if (staged != 0)
      return fail(
          Internal(fmt::format("port {}: {} bytes of fd-registered device memory were staged", links[i].port, staged)));
  }
  fmt::print("rank {}: device round ok over {} links, single copy\n", rank, links.size());

  if (Status s = boot.Barrier(deadline); !s.ok()) return fail(s.WithContext("final barrier"));
  fmt::print("rank {}: ok\n", rank);
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
