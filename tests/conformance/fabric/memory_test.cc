// FdMemoryConformance (kPtrFd fabrics, with the emulated device linked in): device buffers
// exported by the device layer and registered by fd + offset. A transfer between two such regions
// is a single copy: no byte goes through a staging buffer (TransferStats::staged_bytes stays 0).
// What the group checks: README.md.

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/conformance/fabric/fabric_conformance.h"

namespace kizuna::fabric::conformance {
namespace {

// An emulated device buffer, its export and a descriptor for [offset, offset + size) of it.
struct DeviceRegion {
  std::unique_ptr<device::Buffer> buffer;
  device::ExportedMemory exported;
  MemoryDescriptor memory;
  uint8_t* data() const { return static_cast<uint8_t*>(memory.data); }
};

Result<DeviceRegion> MakeDeviceRegion(size_t buffer_bytes, size_t offset, size_t size) {
  device::Device* d = World().emulated_device();
  if (d == nullptr) return Unavailable("no emulated device");
  DeviceRegion r;
  KZ_ASSIGN_OR_RETURN(r.buffer, d->Allocate(buffer_bytes));
  KZ_ASSIGN_OR_RETURN(r.exported, d->Export(*r.buffer, offset, size));
  r.memory = MemoryDescriptor::FromExport(static_cast<uint8_t*>(r.buffer->data()) + offset, r.exported,
                                          d->properties().host_accessible);
  return r;
}

TEST_P(FdMemoryConformance, DeviceBuffersByFdMoveInOneCopy) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  const size_t max = std::max<uint64_t>(max_bytes(), 1);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion src, MakeDeviceRegion(max, 0, max));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion dst, MakeDeviceRegion(max, 0, max));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(src.memory));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(dst.memory));
  std::vector<uint64_t> sizes;
  for (uint64_t s : {uint64_t{1}, uint64_t{4097}, (uint64_t{1} << 20) + 3, uint64_t{max}})
    if (s <= max && (sizes.empty() || sizes.back() < s)) sizes.push_back(s);
  for (uint64_t size : sizes) {
    FillPattern(src.data(), size, size + 1);
    KZ_ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(dst.data(), size, 1, rreg));
    KZ_ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(src.data(), size, 1, sreg));
    ASSERT_NE(r, nullptr);
    ASSERT_NE(s, nullptr);
    RunBoth([&] { KZ_EXPECT_OK(c.recv->Wait(r, TestDeadline()).status()); },
            [&] { KZ_EXPECT_OK(c.send->Wait(s, TestDeadline()).status()); });
    ASSERT_TRUE(HasPattern(dst.data(), size, size + 1)) << size << " bytes";
  }
  EXPECT_EQ(c.send->stats().staged_bytes, 0u) << "the sending side staged bytes between two fd regions";
  EXPECT_EQ(c.recv->stats().staged_bytes, 0u) << "the receiving side staged bytes between two fd regions";
}

TEST_P(FdMemoryConformance, AWindowAtAnOffsetOfADeviceBuffer) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  constexpr size_t kBuffer = 3 * 4096 + 100, kOffset = 4096 + 37, kSize = 4096 + 11;
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion src, MakeDeviceRegion(kBuffer, kOffset, kSize));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion dst, MakeDeviceRegion(kBuffer, kOffset, kSize));
  auto* whole = static_cast<uint8_t*>(dst.buffer->data());
  std::memset(whole, 0x3c, kBuffer);
  FillPattern(src.data(), kSize, 8);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(src.memory));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(dst.memory));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(dst.data(), kSize, 1, rreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(src.data(), kSize, 1, sreg));
  RunBoth([&] { KZ_EXPECT_OK(c.recv->Wait(r, TestDeadline()).status()); },
          [&] { KZ_EXPECT_OK(c.send->Wait(s, TestDeadline()).status()); });
  EXPECT_TRUE(HasPattern(dst.data(), kSize, 8));
  for (size_t i = 0; i < kOffset; ++i) ASSERT_EQ(whole[i], 0x3c) << "byte " << i << " before the window";
  for (size_t i = kOffset + kSize; i < kBuffer; ++i) ASSERT_EQ(whole[i], 0x3c) << "byte " << i << " after the window";
}

TEST_P(FdMemoryConformance, HostToDeviceAndDeviceToHost) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  const size_t size = std::min<uint64_t>(max_bytes(), uint64_t{4} << 20) + 1;
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion dev, MakeDeviceRegion(size, 0, size));
  HostBuffer host(size);
  ASSERT_TRUE(host.ok());
  // Host -> device.
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sh, c.send->Register(MemoryDescriptor::Host(host.data(), size)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rd, c.recv->Register(dev.memory));
  FillPattern(host.data(), size, 21);
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(dev.data(), size, 1, rd));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(host.data(), size, 1, sh));
  RunBoth([&] { KZ_EXPECT_OK(c.recv->Wait(r, TestDeadline()).status()); },
          [&] { KZ_EXPECT_OK(c.send->Wait(s, TestDeadline()).status()); });
  EXPECT_TRUE(HasPattern(dev.data(), size, 21));
  // Device -> host, over a connection the other way.
  auto back = Connect(rank1(), 1, rank0(), 0, TestDeadline());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sd, back->send->Register(dev.memory));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rh, back->recv->Register(MemoryDescriptor::Host(host.data(), size)));
  FillPattern(dev.data(), size, 22);
  KZ_ASSERT_OK_AND_ASSIGN(Request * r2, back->recv->Recv(host.data(), size, 1, rh));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s2, back->send->Send(dev.data(), size, 1, sd));
  RunBoth([&] { KZ_EXPECT_OK(back->recv->Wait(r2, TestDeadline()).status()); },
          [&] { KZ_EXPECT_OK(back->send->Wait(s2, TestDeadline()).status()); });
  EXPECT_TRUE(HasPattern(host.data(), size, 22));
}

TEST_P(FdWriteConformance, AWriteIntoAnExposedDeviceBuffer) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  const size_t size = std::min<uint64_t>(max_bytes(), uint64_t{8} << 20);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion src, MakeDeviceRegion(size, 0, size));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceRegion dst, MakeDeviceRegion(size, 0, size));
  FillPattern(src.data(), size, 31);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(src.memory));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(dst.memory));
  KZ_ASSERT_OK_AND_ASSIGN(RemoteKey key, c.recv->Expose(rreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * w, c.send->Write(src.data(), size, sreg, key, 0, 7u));
  ASSERT_NE(w, nullptr);
  RunBoth([&] { KZ_EXPECT_OK(c.send->Wait(w, TestDeadline()).status()); },
          [&] {
            auto imm = c.recv->WaitImmediate(TestDeadline());
            ASSERT_TRUE(imm.ok()) << imm.status().ToString();
            EXPECT_EQ(*imm, 7u);
          });
  EXPECT_TRUE(HasPattern(dst.data(), size, 31));
  EXPECT_EQ(c.send->stats().staged_bytes, 0u) << "a write between fd regions was staged";
}

}  // namespace
}  // namespace kizuna::fabric::conformance
