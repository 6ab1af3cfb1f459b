// WriteConformance (fabrics with write_immediate): one-sided writes into an exposed region, with
// and without immediates, their order, their bounds, keys of other connections, and the deadline
// of WaitImmediate. What the group checks: README.md.

#include <chrono>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/conformance/fabric/fabric_conformance.h"

namespace kizuna::fabric::conformance {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_P(WriteConformance, AWriteWithAnImmediateLandsBeforeTheImmediate) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  constexpr size_t kRegion = 1 << 20, kBytes = 65536 + 5, kOffset = 4099;
  std::vector<uint8_t> region(kRegion, 0), src(kBytes);
  FillPattern(src.data(), kBytes, 77);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(region.data(), kRegion)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(src.data(), kBytes)));
  KZ_ASSERT_OK_AND_ASSIGN(RemoteKey key, c.recv->Expose(rreg));
  EXPECT_GT(key.size, 0u);
  EXPECT_LE(key.size, kRemoteKeyMaxBytes);
  KZ_ASSERT_OK_AND_ASSIGN(std::optional<uint32_t> none, c.recv->PollImmediate());
  EXPECT_FALSE(none.has_value());
  KZ_ASSERT_OK_AND_ASSIGN(Request * w, c.send->Write(src.data(), kBytes, sreg, key, kOffset, 0xfeedbeefu));
  ASSERT_NE(w, nullptr);
  RunBoth([&] { KZ_EXPECT_OK(c.send->Wait(w, TestDeadline()).status()); },
          [&] {
            auto imm = c.recv->WaitImmediate(TestDeadline());
            ASSERT_TRUE(imm.ok()) << imm.status().ToString();
            EXPECT_EQ(*imm, 0xfeedbeefu);
            EXPECT_TRUE(HasPattern(region.data() + kOffset, kBytes, 77));
          });
  for (size_t i = 0; i < kOffset; ++i) ASSERT_EQ(region[i], 0) << "byte " << i << " before the write changed";
  for (size_t i = kOffset + kBytes; i < kRegion; ++i) ASSERT_EQ(region[i], 0) << "byte " << i << " after the write changed";
}

TEST_P(WriteConformance, WritesAndImmediatesKeepTheirOrder) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  constexpr int kWrites = 100;
  constexpr size_t kSlot = 4096;
  std::vector<uint8_t> region(kWrites * kSlot, 0), src(kWrites * kSlot);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(region.data(), region.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(src.data(), src.size())));
  KZ_ASSERT_OK_AND_ASSIGN(RemoteKey key, c.recv->Expose(rreg));
  RunBoth(
      [&] {
        std::vector<Request*> pending;
        for (int i = 0; i < kWrites; ++i) {
          FillPattern(src.data() + i * kSlot, kSlot, 500 + i);
          // Every other write carries no immediate: its bytes must still be in place when the next
          // immediate arrives.
          std::optional<uint32_t> imm;
          if (i % 2 == 1) imm = static_cast<uint32_t>(i);
          Result<Request*> w = c.send->Write(src.data() + i * kSlot, kSlot, sreg, key, i * kSlot, imm);
          ASSERT_TRUE(w.ok()) << w.status().ToString();
          if (*w == nullptr) {  // busy: finish what is in flight, then post again
            for (Request* p : pending) KZ_ASSERT_OK(c.send->Wait(p, TestDeadline()).status());
            pending.clear();
            --i;
            continue;
          }
          pending.push_back(*w);
        }
        for (Request* p : pending) KZ_EXPECT_OK(c.send->Wait(p, TestDeadline()).status());
      },
      [&] {
        for (int i = 1; i < kWrites; i += 2) {
          auto imm = c.recv->WaitImmediate(TestDeadline());
          ASSERT_TRUE(imm.ok()) << imm.status().ToString();
          ASSERT_EQ(*imm, static_cast<uint32_t>(i)) << "immediates out of order";
          for (int k = 0; k <= i; ++k)
            ASSERT_TRUE(HasPattern(region.data() + k * kSlot, kSlot, 500 + k))
                << "write " << k << " not in place when immediate " << i << " arrived";
        }
      });
}

TEST_P(WriteConformance, WritesAreBoundedByTheExposedRegionAndTheirConnection) {
  Connection c = MustConnect();
  Connection other = MustConnect();
  ASSERT_NE(c.send, nullptr);
  ASSERT_NE(other.send, nullptr);
  std::vector<uint8_t> region(4096), src(8192);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(region.data(), 4096)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(src.data(), 8192)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * oreg, other.send->Register(MemoryDescriptor::Host(src.data(), 8192)));
  KZ_ASSERT_OK_AND_ASSIGN(RemoteKey key, c.recv->Expose(rreg));
  KZ_EXPECT_CODE(c.send->Write(src.data(), 4097, sreg, key, 0, std::nullopt).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Write(src.data(), 16, sreg, key, 4090, std::nullopt).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Write(src.data(), 1, sreg, key, uint64_t{1} << 62, 1u).status(), StatusCode::kInvalidArgument);
  RemoteKey garbage;
  garbage.size = key.size;
  for (size_t i = 0; i < garbage.size; ++i) garbage.data[i] = static_cast<uint8_t>(i * 29 + 3);
  KZ_EXPECT_CODE(c.send->Write(src.data(), 16, sreg, garbage, 0, 1u).status(), StatusCode::kInvalidArgument);
  RemoteKey empty;
  KZ_EXPECT_CODE(c.send->Write(src.data(), 16, sreg, empty, 0, 1u).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(other.send->Write(src.data(), 16, oreg, key, 0, 1u).status(), StatusCode::kInvalidArgument)
      << "a key exposed on one connection used on another";
  EXPECT_EQ(c.send->requests_in_flight(), 0);
  // A write that fits exactly still works.
  KZ_ASSERT_OK_AND_ASSIGN(Request * w, c.send->Write(src.data(), 4096, sreg, key, 0, 5u));
  ASSERT_NE(w, nullptr);
  RunBoth([&] { KZ_EXPECT_OK(c.send->Wait(w, TestDeadline()).status()); },
          [&] { KZ_EXPECT_OK(c.recv->WaitImmediate(TestDeadline()).status()); });
}

TEST_P(WriteConformance, WaitImmediateDeadlineExpires) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  const auto start = Clock::now();
  KZ_EXPECT_CODE(c.recv->WaitImmediate(Deadline::After(50ms)).status(), StatusCode::kTimeout);
  EXPECT_GE(Clock::now() - start, 50ms);
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST_P(WriteConformance, ALargeWrite) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  const size_t size = max_bytes();
  HostBuffer region(size), src(size);
  ASSERT_TRUE(region.ok() && src.ok());
  FillPattern(src.data(), size, 12);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(region.data(), size)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(src.data(), size)));
  KZ_ASSERT_OK_AND_ASSIGN(RemoteKey key, c.recv->Expose(rreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * w, c.send->Write(src.data(), size, sreg, key, 0, 99u));
  ASSERT_NE(w, nullptr);
  RunBoth([&] { KZ_EXPECT_OK(c.send->Wait(w, TestDeadline()).status()); },
          [&] {
            auto imm = c.recv->WaitImmediate(TestDeadline());
            ASSERT_TRUE(imm.ok()) << imm.status().ToString();
            EXPECT_EQ(*imm, 99u);
          });
  EXPECT_TRUE(HasPattern(region.data(), size, 12));
}

}  // namespace
}  // namespace kizuna::fabric::conformance
