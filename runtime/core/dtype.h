// Element types and reduction operators, as NCCL names them (ncclFloat16, ncclSum, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kizuna {

// Values are part of the C API and the plugin ABI (kz_dtype_t): append only.
enum class DataType : uint8_t {
  kFloat16 = 0,
  kBfloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUint8 = 5,
  kInt32 = 6,
  kUint32 = 7,
  kInt64 = 8,
  kUint64 = 9,
};
inline constexpr int kNumDataTypes = 10;

// Values are part of the C API and the plugin ABI (kz_reduce_op_t): append only.
//
// kAvg is the sum divided by the number of inputs: for floating types computed in the
// accumulation type (float32 for float16/bfloat16) and rounded once; for integer types the
// (wrapping) sum divided with truncation toward zero, as NCCL's ncclAvg does.
// Integer kSum and kProd wrap modulo 2^bits (two's complement), never undefined behaviour.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,
};
inline constexpr int kNumReduceOps = 5;

// Every value, for loops in tests and tools.
std::span<const DataType> AllDataTypes();
std::span<const ReduceOp> AllReduceOps();

// Bytes per element; 0 for an out-of-range value.
size_t DataTypeSize(DataType type);
// "float16", "bfloat16", "float32", ... ; "invalid" for an out-of-range value.
std::string_view DataTypeName(DataType type);
// "sum", "prod", "min", "max", "avg"; "invalid" for an out-of-range value.
std::string_view ReduceOpName(ReduceOp op);

bool IsValid(DataType type);
bool IsValid(ReduceOp op);
bool IsFloatingPoint(DataType type);

// Accepts the names above and common aliases (half, fp16, bf16, float, double, int, ...).
std::optional<DataType> ParseDataType(std::string_view name);
std::optional<ReduceOp> ParseReduceOp(std::string_view name);

}  // namespace kizuna
