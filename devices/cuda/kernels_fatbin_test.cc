// The embedded kernel image (kernels_fatbin.h) without a GPU: it is a well-formed fatbin, holds
// exactly the configured architectures (SASS and PTX), and every kernel kernel_abi.h names is in
// every entry; cuobjdump, where the toolkit has it, must agree.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "devices/cuda/kernel_abi.h"
#include "devices/cuda/kernels_fatbin.h"

namespace kizuna::cuda {
namespace {

// The fatbin container as nvcc 13 writes it (the layout is not published; these offsets are the
// ones cuobjdump and the driver read, checked against nvcc's output): a 16-byte header, then
// entries, each a header of at least 64 bytes followed by its payload.
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr size_t kFatbinHeaderBytes = 16;   // magic u32, version u16, header size u16, payload u64
constexpr size_t kEntryMinHeaderBytes = 64;
constexpr size_t kEntryKindOffset = 0;      // u16: 1 = PTX, 2 = ELF (SASS)
constexpr size_t kEntryHeaderSizeOffset = 4;   // u32
constexpr size_t kEntryPayloadSizeOffset = 8;  // u64
constexpr size_t kEntryArchOffset = 28;        // u32: 80 for sm_80 / compute_80
constexpr uint16_t kKindPtx = 1;
constexpr uint16_t kKindElf = 2;

// Where the test finds the genrule's output among its runfiles.
constexpr const char* kFatbinFile = "devices/cuda/kernels.fatbin";

template <typename T>
T Read(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct Entry {
  uint16_t kind;
  uint32_t arch;
  std::string_view payload;
};

std::string Name(const Entry& e) { return std::string(e.kind == kKindPtx ? "ptx:" : "elf:") + std::to_string(e.arch); }

// Walks the entries; fails the test (and returns what it got so far) on anything out of bounds.
std::vector<Entry> ParseEntries(const unsigned char* image, size_t size) {
  std::vector<Entry> entries;
  EXPECT_GE(size, kFatbinHeaderBytes);
  if (size < kFatbinHeaderBytes) return entries;
  const uint16_t header_bytes = Read<uint16_t>(image + 6);
  const uint64_t payload_bytes = Read<uint64_t>(image + 8);
  EXPECT_EQ(header_bytes, kFatbinHeaderBytes);
  EXPECT_EQ(header_bytes + payload_bytes, size) << "the fatbin header's size disagrees with the image's";
  size_t off = header_bytes;
  while (off < size) {
    if (size - off < kEntryMinHeaderBytes) {
      ADD_FAILURE() << "truncated entry header at offset " << off;
      break;
    }
    const unsigned char* e = image + off;
    const uint32_t entry_header = Read<uint32_t>(e + kEntryHeaderSizeOffset);
    const uint64_t entry_payload = Read<uint64_t>(e + kEntryPayloadSizeOffset);
    if (entry_header < kEntryMinHeaderBytes || entry_header > size - off || entry_payload > size - off - entry_header) {
      ADD_FAILURE() << "entry at offset " << off << " runs past the image";
      break;
    }
    entries.push_back({Read<uint16_t>(e + kEntryKindOffset), Read<uint32_t>(e + kEntryArchOffset),
                       std::string_view(reinterpret_cast<const char*>(e + entry_header), entry_payload)});
    off += entry_header + entry_payload;
  }
  return entries;
}

std::set<std::string> Split(const std::string& list) {
  std::set<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.insert(item);
  return out;
}

// kernel_abi.h's names: kz_reduce_<type>_<op> and kz_scale_<type>.
std::vector<std::string> KernelNames() {
  static constexpr std::array<const char*, 10> kTypes = {"f16", "bf16", "f32", "f64", "i8",
                                                         "u8",  "i32",  "u32", "i64", "u64"};
  static constexpr std::array<const char*, 5> kOps = {"sum", "prod", "min", "max", "avg"};
  std::vector<std::string> names;
  for (const char* t : kTypes) {
    for (const char* op : kOps) names.push_back(std::string("kz_reduce_") + t + "_" + op);
    names.push_back(std::string("kz_scale_") + t);
  }
  return names;
}

TEST(KernelsFatbin, EmbeddedImageIsAnAlignedFatbin) {
  ASSERT_GT(kKizunaCudaFatbinSize, kFatbinHeaderBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(kKizunaCudaFatbin) % 8, 0u);
  EXPECT_EQ(Read<uint32_t>(kKizunaCudaFatbin), kFatbinMagic);
  EXPECT_EQ(Read<uint16_t>(kKizunaCudaFatbin + 4), 1) << "fatbin version";
}

TEST(KernelsFatbin, EmbeddedImageEqualsNvccOutput) {
  std::ifstream in(kFatbinFile, std::ios::binary);
  ASSERT_TRUE(in) << "cannot open " << kFatbinFile;
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(file.size(), kKizunaCudaFatbinSize);
  EXPECT_EQ(std::memcmp(file.data(), kKizunaCudaFatbin, file.size()), 0);
}

TEST(KernelsFatbin, HoldsExactlyTheConfiguredArchitectures) {
  std::set<std::string> got;
  for (const Entry& e : ParseEntries(kKizunaCudaFatbin, kKizunaCudaFatbinSize)) {
    EXPECT_TRUE(got.insert(Name(e)).second) << "duplicate entry " << Name(e);
  }
  EXPECT_EQ(got, Split(KZ_EXPECTED_ENTRIES));
}

TEST(KernelsFatbin, EveryEntryHoldsEveryKernel) {
  const std::vector<Entry> entries = ParseEntries(kKizunaCudaFatbin, kKizunaCudaFatbinSize);
  ASSERT_FALSE(entries.empty());
  const std::vector<std::string> names = KernelNames();
  ASSERT_EQ(names.size(), 60u);
  for (const Entry& e : entries) {
    if (e.kind == kKindElf) {
      // Uncompressed (nvcc -no-compress): a plain ELF whose symbol names are NUL-terminated strings.
      ASSERT_EQ(e.payload.substr(0, 4), std::string_view("\x7f" "ELF")) << Name(e) << " is not a plain ELF";
      for (const std::string& n : names) {
        EXPECT_NE(e.payload.find(std::string(1, '\0') + n + std::string(1, '\0')), std::string_view::npos)
            << n << " missing from " << Name(e);
      }
    } else {
      ASSERT_EQ(e.kind, kKindPtx) << "unknown entry kind";
      ASSERT_NE(e.payload.find(".version"), std::string_view::npos) << Name(e) << " is not plain PTX text";
      for (const std::string& n : names) {
        EXPECT_NE(e.payload.find(".entry " + n + "("), std::string_view::npos) << n << " missing from " << Name(e);
      }
    }
  }
}

// Runs a command, returning its standard output; empty on failure.
std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  if (pclose(p) != 0) out.clear();
  return out;
}

TEST(KernelsFatbin, CuobjdumpAgrees) {
  if (std::ifstream(KZ_CUOBJDUMP).fail()) GTEST_SKIP() << KZ_CUOBJDUMP << " is not installed in this toolkit";
  const std::string elf = RunCommand(std::string(KZ_CUOBJDUMP) + " --list-elf " + kFatbinFile);
  const std::string ptx = RunCommand(std::string(KZ_CUOBJDUMP) + " --list-ptx " + kFatbinFile);
  const std::string symbols = RunCommand(std::string(KZ_CUOBJDUMP) + " -symbols " + kFatbinFile);
  ASSERT_FALSE(elf.empty());
  ASSERT_FALSE(ptx.empty());
  for (const std::string& e : Split(KZ_EXPECTED_ENTRIES)) {
    const std::string arch = e.substr(4);
    if (e.rfind("elf:", 0) == 0) EXPECT_NE(elf.find("sm_" + arch), std::string::npos) << elf;
    else EXPECT_NE(ptx.find("sm_" + arch), std::string::npos) << ptx;
  }
  for (const std::string& n : KernelNames()) EXPECT_NE(symbols.find(n), std::string::npos) << n;
}

}  // namespace
}  // namespace kizuna::cuda
