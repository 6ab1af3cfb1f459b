// The shared half of the fabric conformance suite: the groups and their requirements, the world
// of fabrics, byte patterns, connection helpers, the fixture, and the instantiation of every
// group. Tests live in the *_test.cc files of this folder, by concept:
//  - FabricConformance (every fabric): devices and properties, listen / connect / accept, the
//    non-blocking contract, handles, argument checks of the wrappers, deadlines that expire,
//    one-sided calls answering kNotSupported where the fabric has none (connection_test.cc).
//  - TransferConformance (every fabric): messages of 0 B to the maximum, many in flight, the
//    in-flight limit, ordering by tag and posting order, over-long messages, a peer that closes
//    mid-transfer (transfer_test.cc).
//  - WriteConformance (write_immediate): one-sided writes with immediates (write_test.cc).
//  - FdMemoryConformance (fd memory): emulated device buffers registered by fd, single copy
//    (memory_test.cc).
//  - ProcessConformance (every fabric): rank 1 as a second process: echo of every size, with
//    host and with fd-registered device buffers, and a peer killed mid-transfer (process_test.cc).

#include "tests/conformance/fabric/fabric_conformance.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric::conformance {
namespace {

std::unique_ptr<ConformanceWorld>& WorldSlot() {
  static std::unique_ptr<ConformanceWorld> world;
  return world;
}

std::string Sanitize(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out += ok ? c : '_';
  }
  return out.empty() ? std::string("unnamed") : out;
}

uint64_t PatternWord(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + i * 0xd1b54a32d192ed03ull + 1;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return x;
}

Status WaitFd(int fd, short events, Deadline deadline, std::string_view what) {
  while (true) {
    if (deadline.Expired()) return Timeout(fmt::format("{}: deadline passed", what));
    pollfd p{fd, events, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms + 1, 1, 1 << 30)));
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return FromErrno(errno, "poll");
  }
}

}  // namespace

// ---- Groups ----

const std::vector<TestGroup>& TestGroups() {
  static const std::vector<TestGroup> groups = {
      {"FabricConformance", {}, ""},
      {"TransferConformance", {}, ""},
      {"WriteConformance", {Tag::kWriteImmediate}, "the fabric has no one-sided write with immediate data"},
      {"NoWriteConformance",
       {Tag::kNoWriteImmediate},
       "the fabric has one-sided writes (WriteConformance checks them)"},
      {"FdMemoryConformance",
       {Tag::kFdMemory},
       "needs registration by fd + offset (kPtrFd) and an emulated device that exports fds"},
      {"ProcessConformance", {}, ""},
      {"FdProcessConformance", {Tag::kFdMemory}, "needs registration by fd + offset (kPtrFd), across processes"},
      {"FdWriteConformance",
       {Tag::kFdMemory, Tag::kWriteImmediate},
       "needs both registration by fd + offset and one-sided writes"},
  };
  return groups;
}

std::string_view TagName(Tag tag) {
  switch (tag) {
    case Tag::kWriteImmediate: return "write_immediate";
    case Tag::kFdMemory: return "fd_memory";
    case Tag::kPointToPoint: return "point_to_point";
    case Tag::kNoWriteImmediate: return "no_write_immediate";
  }
  return "invalid";
}

bool FabricUnderTest::Has(Tag tag) const { return std::find(tags.begin(), tags.end(), tag) != tags.end(); }

std::string FabricUnderTest::TagList() const {
  std::string out;
  for (Tag t : tags) out += (out.empty() ? "" : ", ") + std::string(TagName(t));
  return out.empty() ? "(none)" : out;
}

bool TestGroup::AppliesTo(const FabricUnderTest& f) const {
  if (!f.available()) return requires_all.empty();
  for (Tag t : requires_all)
    if (!f.Has(t)) return false;
  return true;
}

void PrintTo(const FabricParam& param, std::ostream* os) {
  const auto& fabrics = World().fabrics();
  if (param.index < fabrics.size()) *os << fabrics[param.index].name;
  else *os << "fabric #" << param.index;
}

FabricContext RankContext(int rank) {
  FabricContext c;
  c.rank = rank;
  c.world_size = 2;
  c.local_rank = rank;
  c.host_id = "conformance";
  return c;
}

// ---- World ----

ConformanceWorld::ConformanceWorld(Config config, Options options)
    : config_(std::make_unique<Config>(std::move(config))), options_(std::move(options)) {
  devices_ = device::DeviceRegistry::Create(*config_);
  registry_ = FabricRegistry::Create(*config_, RankContext(0), /*every=*/true);
  const bool fd_device = emulated_device() != nullptr;
  for (const FabricSlot& slot : registry_->fabrics()) {
    FabricUnderTest f;
    f.name = slot.name;
    f.slot = &slot;
    f.max_bytes = options_.max_bytes;
    if (slot.status.ok() && slot.fabric->device_count() > 0) {
      auto p = slot.fabric->properties(0);
      if (p.ok()) {
        f.tags.push_back(p->write_immediate ? Tag::kWriteImmediate : Tag::kNoWriteImmediate);
        if ((p->ptr_support & kPtrFd) != 0 && fd_device) f.tags.push_back(Tag::kFdMemory);
        if (p->point_to_point) f.tags.push_back(Tag::kPointToPoint);
        f.max_bytes = std::min<uint64_t>(f.max_bytes, p->max_message_bytes);
      }
    }
    fabrics_.push_back(std::move(f));
  }
}

device::Device* ConformanceWorld::emulated_device() const {
  device::Backend* b = devices_->Find("host_emulated");
  if (b == nullptr || b->device_count() == 0) return nullptr;
  device::Device* d = b->device(0);
  return d != nullptr && d->properties().export_fd && d->properties().host_accessible ? d : nullptr;
}

std::vector<FabricParam> ConformanceWorld::ParamsFor(std::string_view suite) const {
  const TestGroup* group = nullptr;
  for (const TestGroup& g : TestGroups())
    if (g.suite == suite) group = &g;
  std::vector<FabricParam> out;
  if (group == nullptr) return out;
  for (size_t i = 0; i < fabrics_.size(); ++i)
    if (group->AppliesTo(fabrics_[i])) out.push_back(FabricParam{i});
  return out;
}

void InitConformance(Config config, Options options) {
  WorldSlot() = std::make_unique<ConformanceWorld>(std::move(config), std::move(options));
}
void ShutdownConformance() { WorldSlot().reset(); }

const ConformanceWorld& World() {
  if (WorldSlot() == nullptr) {
    std::fprintf(stderr, "fabric conformance: World() used before InitConformance()\n");
    std::abort();
  }
  return *WorldSlot();
}

std::string FabricTestName(const ::testing::TestParamInfo<FabricParam>& info) {
  return Sanitize(World().fabric(info.param).name);
}

void PrintCapabilities(std::FILE* out) {
  const ConformanceWorld& w = World();
  std::string text = fmt::format("[ kizuna ] fabric conformance: {} fabric(s); messages up to {} bytes; waits bounded "
                                 "by {} s; topology for point-to-point fabrics: {}\n",
                                 w.fabrics().size(), w.options().max_bytes, kTestTimeoutSeconds,
                                 w.options().topology_path.empty() ? "(none)" : w.options().topology_path);
  if (w.fabrics().empty()) text += "[ kizuna ]   (no fabric is linked into this binary)\n";
  for (const FabricUnderTest& f : w.fabrics()) {
    const FabricSlot& slot = *f.slot;
    if (!slot.status.ok()) {
      const bool unavailable = slot.status.code() == StatusCode::kUnavailable;
      text += fmt::format("[ kizuna ]   {} ({}): {} — {}\n", f.name, slot.origin, slot.status.ToString(),
                          unavailable ? "its tests skip" : "BROKEN: its tests fail");
      continue;
    }
    text += fmt::format("[ kizuna ]   {} ({}): {} device(s); tags: {}; largest message {} bytes\n", f.name,
                        slot.origin, slot.fabric->device_count(), f.TagList(), f.max_bytes);
    bool any = false;
    for (const TestGroup& g : TestGroups()) {
      if (g.AppliesTo(f)) continue;
      text += fmt::format("[ kizuna ]     unsupported: {}.* — {}\n", g.suite, g.reason);
      any = true;
    }
    if (!any) text += "[ kizuna ]     unsupported: (none)\n";
  }
  std::fputs(text.c_str(), out);
  std::fflush(out);
}

// ---- Patterns ----

void FillPattern(void* p, size_t bytes, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  const size_t words = bytes / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = PatternWord(seed, i);
    std::memcpy(b + 8 * i, &w, 8);
  }
  const uint64_t tail = PatternWord(seed, words);
  std::memcpy(b + 8 * words, &tail, bytes - 8 * words);
}

::testing::AssertionResult HasPattern(const void* p, size_t bytes, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  const size_t words = bytes / 8;
  for (size_t i = 0; i <= words; ++i) {
    const uint64_t w = PatternWord(seed, i);
    const size_t n = i < words ? 8 : bytes - 8 * words;
    if (n == 0 || std::memcmp(b + 8 * i, &w, n) == 0) continue;
    const auto* e = reinterpret_cast<const uint8_t*>(&w);
    size_t k = 0;
    while (k < n && b[8 * i + k] == e[k]) ++k;
    return ::testing::AssertionFailure() << "byte " << 8 * i + k << " of " << bytes << " is " << int{b[8 * i + k]}
                                         << ", pattern " << seed << " has " << int{e[k]};
  }
  return ::testing::AssertionSuccess();
}

// ---- Host memory ----

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

// ---- Connections ----

Result<DevicePair> PickDevices(const Fabric& listener, int listener_rank, const Fabric& connector,
                               int connector_rank) {
  if (listener.device_count() == 0 || connector.device_count() == 0)
    return Unavailable(fmt::format("{} has no devices", listener.name()));
  for (int l = 0; l < listener.device_count(); ++l) {
    KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, listener.properties(l));
    if (!p.point_to_point) return DevicePair{l, 0};
    if (p.link_peer.has_value() && p.link_peer->rank == connector_rank && p.link_peer->port >= 0 &&
        p.link_peer->port < connector.device_count())
      return DevicePair{l, p.link_peer->port};
  }
  return NotSupported(fmt::format("{}: no device of rank {} links to rank {}", listener.name(), listener_rank,
                                  connector_rank));
}

Result<Connection> Connect(Fabric& listener, int listener_rank, Fabric& connector, int connector_rank,
                           Deadline deadline) {
  KZ_ASSIGN_OR_RETURN(DevicePair devs, PickDevices(listener, listener_rank, connector, connector_rank));
  Connection c;
  KZ_ASSIGN_OR_RETURN(c.listen, listener.Listen(devs.listen_dev));
  // Both calls are non-blocking: drive them alternately on this thread, backing off while
  // neither advances (which also checks that neither blocks waiting for the other).
  auto backoff = std::chrono::microseconds(20);
  while (c.send == nullptr || c.recv == nullptr) {
    bool advanced = false;
    if (c.send == nullptr) {
      KZ_ASSIGN_OR_RETURN(c.send, connector.Connect(devs.connect_dev, c.listen->handle()));
      advanced = advanced || c.send != nullptr;
    }
    if (c.recv == nullptr) {
      KZ_ASSIGN_OR_RETURN(c.recv, c.listen->Accept());
      advanced = advanced || c.recv != nullptr;
    }
    if (c.send != nullptr && c.recv != nullptr) break;
    if (deadline.Expired()) return Timeout("connect / accept did not complete by the deadline");
    if (!advanced) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min<std::chrono::microseconds>(backoff * 2, std::chrono::milliseconds(5));
    }
  }
  return c;
}

void RunBoth(const std::function<void()>& a, const std::function<void()>& b) {
  std::thread t(b);
  a();
  t.join();
}

// ---- Fixture ----

void FabricTest::SetUp() {
  const FabricUnderTest& f = under_test();
  if (!f.slot->status.ok()) {
    if (f.slot->status.code() == StatusCode::kUnavailable)
      GTEST_SKIP() << "fabric " << f.name << " is unavailable here: " << f.slot->status.message();
    FAIL() << "fabric " << f.name << " (" << f.slot->origin << ") did not start: " << f.slot->status.ToString();
  }
  auto r0 = CreateFabric(f.name, World().config(), RankContext(0));
  ASSERT_TRUE(r0.ok()) << "rank 0's " << f.name << ": " << r0.status().ToString();
  auto r1 = CreateFabric(f.name, World().config(), RankContext(1));
  ASSERT_TRUE(r1.ok()) << "rank 1's " << f.name << ": " << r1.status().ToString();
  rank0_ = std::move(r0).value();
  rank1_ = std::move(r1).value();
  ASSERT_GT(rank0_->device_count(), 0) << f.name << " started with no devices (it must say unavailable instead)";
}

Connection FabricTest::MustConnect() {
  auto c = Connect(rank0(), 0, rank1(), 1, TestDeadline());
  EXPECT_TRUE(c.ok()) << "connecting rank 1 to rank 0: " << c.status().ToString();
  if (!c.ok()) return Connection{};
  return std::move(c).value();
}

// ---- Control lines ----

Status SendLine(int fd, std::string_view line, Deadline deadline) {
  std::string text(line);
  text += '\n';
  size_t sent = 0;
  while (sent < text.size()) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "sending a control line"));
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "send");
    }
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> ReceiveLine(int fd, Deadline deadline) {
  std::string out;
  while (out.size() < 4096) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "waiting for a control line"));
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (n == 0) return RemoteError(fmt::format("the other process closed the control socket (after \"{}\")", out));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "recv");
    }
    if (c == '\n') return out;
    out += c;
  }
  return InvalidArgument("control line too long");
}

std::vector<uint64_t> EchoSizes(uint64_t max) {
  std::vector<uint64_t> sizes;
  for (uint64_t s : {uint64_t{0}, uint64_t{1}, uint64_t{4097}, (uint64_t{1} << 20) + 3, max})
    if (s <= max && (sizes.empty() || sizes.back() != s)) sizes.push_back(s);
  return sizes;
}

// ---- Instantiation ----

#define KZ_INSTANTIATE_GROUP(group)                                                                     \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(group);                                                 \
  INSTANTIATE_TEST_SUITE_P(Fabrics, group, ::testing::ValuesIn(World().ParamsFor(#group)), FabricTestName)

KZ_INSTANTIATE_GROUP(FabricConformance);
KZ_INSTANTIATE_GROUP(TransferConformance);
KZ_INSTANTIATE_GROUP(WriteConformance);
KZ_INSTANTIATE_GROUP(NoWriteConformance);
KZ_INSTANTIATE_GROUP(FdMemoryConformance);
KZ_INSTANTIATE_GROUP(ProcessConformance);
KZ_INSTANTIATE_GROUP(FdProcessConformance);
KZ_INSTANTIATE_GROUP(FdWriteConformance);

}  // namespace kizuna::fabric::conformance
