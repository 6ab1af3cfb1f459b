#include "runtime/core/dtype.h"

#include <array>
#include <string>

namespace kizuna {
namespace {

struct TypeInfo {
  DataType type;
  std::string_view name;
  size_t size;
  bool floating;
  std::array<std::string_view, 3> aliases;
};

constexpr std::array<TypeInfo, kNumDataTypes> kTypes = {{
    {DataType::kFloat16, "float16", 2, true, {"half", "fp16", "f16"}},
    {DataType::kBfloat16, "bfloat16", 2, true, {"bf16", "", ""}},
    {DataType::kFloat32, "float32", 4, true, {"float", "fp32", "f32"}},
    {DataType::kFloat64, "float64", 8, true, {"double", "fp64", "f64"}},
    {DataType::kInt8, "int8", 1, false, {"char", "i8", ""}},
    {DataType::kUint8, "uint8", 1, false, {"u8", "", ""}},
    {DataType::kInt32, "int32", 4, false, {"int", "i32", ""}},
    {DataType::kUint32, "uint32", 4, false, {"u32", "", ""}},
    {DataType::kInt64, "int64", 8, false, {"i64", "", ""}},
    {DataType::kUint64, "uint64", 8, false, {"u64", "", ""}},
}};

constexpr std::array<DataType, kNumDataTypes> kAllTypes = {
    DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64, DataType::kInt8,
    DataType::kUint8,   DataType::kInt32,    DataType::kUint32,  DataType::kInt64,   DataType::kUint64};
constexpr std::array<ReduceOp, kNumReduceOps> kAllOps = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                                         ReduceOp::kMax, ReduceOp::kAvg};
constexpr std::array<std::string_view, kNumReduceOps> kOpNames = {"sum", "prod", "min", "max", "avg"};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

}  // namespace

std::span<const DataType> AllDataTypes() { return kAllTypes; }
std::span<const ReduceOp> AllReduceOps() { return kAllOps; }

bool IsValid(DataType type) { return static_cast<unsigned>(type) < kNumDataTypes; }
bool IsValid(ReduceOp op) { return static_cast<unsigned>(op) < kNumReduceOps; }

size_t DataTypeSize(DataType type) { return IsValid(type) ? kTypes[static_cast<unsigned>(type)].size : 0; }

std::string_view DataTypeName(DataType type) {
  return IsValid(type) ? kTypes[static_cast<unsigned>(type)].name : "invalid";
}

bool IsFloatingPoint(DataType type) { return IsValid(type) && kTypes[static_cast<unsigned>(type)].floating; }

std::string_view ReduceOpName(ReduceOp op) { return IsValid(op) ? kOpNames[static_cast<unsigned>(op)] : "invalid"; }

std::optional<DataType> ParseDataType(std::string_view name) {
  std::string n = Lower(name);
  for (const TypeInfo& t : kTypes) {
    if (n == t.name) return t.type;
    for (std::string_view a : t.aliases)
      if (!a.empty() && n == a) return t.type;
  }
  return std::nullopt;
}

std::optional<ReduceOp> ParseReduceOp(std::string_view name) {
  std::string n = Lower(name);
  for (size_t i = 0; i < kOpNames.size(); ++i)
    if (n == kOpNames[i]) return kAllOps[i];
  if (n == "product") return ReduceOp::kProd;
  if (n == "average" || n == "mean") return ReduceOp::kAvg;
  return std::nullopt;
}

}  // namespace kizuna
