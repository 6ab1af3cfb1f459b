/* The reduction kernel, for every dtype x op the ABI lists, and the scale kernel (the division
 * that finishes an average), with the semantics of runtime/device/host_reduce.h. Results are
 * bit-identical to kizuna's host kernels, except that where two NaNs meet in arithmetic (sum, prod,
 * avg), which one's payload survives is left open (as IEEE 754 leaves it):
 *  - inputs combine in order: acc = src0; acc = acc op src1; ...
 *  - float16 / bfloat16 accumulate in float32 and round once, to nearest even, on the store;
 *    float32 accumulates in float32, float64 in float64;
 *  - integer sum / prod wrap modulo 2^bits (done in unsigned arithmetic, never undefined);
 *  - avg = sum / n: floats divide the accumulator, integers divide the wrapped sum truncating
 *    toward zero;
 *  - floating min / max are IEEE 754-2019's minimum / maximum, as the host kernels: -0 orders below
 *    +0, and any NaN input gives the canonical quiet NaN, so the order of the inputs does not
 *    change a bit of the result (example_min_max_f32 / _f64).
 *
 * Work goes block by block: a block of every input is combined into an accumulator that stays in
 * L1, then stored. Storing a block only after all inputs of that block were read is what makes
 * dst == srcs[k] (in place) safe. A real device runs this as its own kernel.
 */
#include <stdint.h>
#include <string.h>

#include "example_plugin.h"

#define EXAMPLE_BLOCK 1024 /* elements per block: 8 KiB accumulators, well inside L1 */

uint64_t example_dtype_size(int32_t dtype) {
  switch (dtype) {
    case KZ_PLUGIN_FLOAT16: return 2;
    case KZ_PLUGIN_BFLOAT16: return 2;
    case KZ_PLUGIN_FLOAT32: return 4;
    case KZ_PLUGIN_FLOAT64: return 8;
    case KZ_PLUGIN_INT8: return 1;
    case KZ_PLUGIN_UINT8: return 1;
    case KZ_PLUGIN_INT32: return 4;
    case KZ_PLUGIN_UINT32: return 4;
    case KZ_PLUGIN_INT64: return 8;
    case KZ_PLUGIN_UINT64: return 8;
    default: return 0;
  }
}

/* ---- float16 / bfloat16 <-> float32, round to nearest even (the same as runtime/core/half.h) ---- */

static uint32_t example_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float example_bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static float example_half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return example_bits_float(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
  if (exp != 0) return example_bits_float(sign | ((exp + 112) << 23) | (mant << 13)); /* 112 = 127 - 15 */
  if (mant == 0) return example_bits_float(sign);                                     /* signed zero */
  /* Subnormal half (mant * 2^-24): normalise into a float. */
  int e = -1;
  do {
    ++e;
    mant <<= 1;
  } while ((mant & 0x400u) == 0);
  return example_bits_float(sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13));
}

static uint16_t example_float_to_half(float f) {
  const uint32_t x = example_float_bits(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((absx >> 13) & 0x1ffu)); /* NaN, kept quiet */
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: infinity */
  if (absx < 0x38800000u) {
    /* Subnormal or zero result: value / 2^-24, rounded to nearest even. */
    if (absx < 0x33000000u) return sign; /* below half the smallest subnormal */
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  /* Normal: rebias the exponent, round the 13 dropped bits to nearest even (a carry into the
   * exponent is the correct result). */
  uint32_t r = absx - 0x38000000u;
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return (uint16_t)(sign | r);
}

static float example_bf16_to_float(uint16_t b) { return example_bits_float((uint32_t)b << 16); }

static uint16_t example_float_to_bf16(float f) {
  uint32_t x = example_float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u); /* nearest even; overflow carries into infinity */
  return (uint16_t)(x >> 16);
}

/* ---- loads: one block of an input, widened to the accumulator type ---- */

static void example_load_f32(int32_t dtype, const void* src, uint64_t begin, uint32_t len, float* out) {
  if (dtype == KZ_PLUGIN_FLOAT32) {
    memcpy(out, (const float*)src + begin, (size_t)len * sizeof(float));
  } else if (dtype == KZ_PLUGIN_FLOAT16) {
    const uint16_t* s = (const uint16_t*)src + begin;
    for (uint32_t i = 0; i < len; ++i) out[i] = example_half_to_float(s[i]);
  } else { /* bfloat16 */
    const uint16_t* s = (const uint16_t*)src + begin;
    for (uint32_t i = 0; i < len; ++i) out[i] = example_bf16_to_float(s[i]);
  }
}

/* Integers widen to 64 bits: sign-extended for signed types. Wrapping sums and products of the
 * widened values, truncated back to the type's width on the store, equal the wrapping result in
 * the narrow type (arithmetic modulo 2^64 agrees with it modulo 2^bits). */
static void example_load_u64(int32_t dtype, const void* src, uint64_t begin, uint32_t len, uint64_t* out) {
  switch (dtype) {
    case KZ_PLUGIN_INT8: {
      const int8_t* s = (const int8_t*)src + begin;
      for (uint32_t i = 0; i < len; ++i) out[i] = (uint64_t)(int64_t)s[i];
      break;
    }
    case KZ_PLUGIN_UINT8: {
      const uint8_t* s = (const uint8_t*)src + begin;
      for (uint32_t i = 0; i < len; ++i) out[i] = s[i];
      break;
    }
    case KZ_PLUGIN_INT32: {
      const int32_t* s = (const int32_t*)src + begin;
      for (uint32_t i = 0; i < len; ++i) out[i] = (uint64_t)(int64_t)s[i];
      break;
    }
    case KZ_PLUGIN_UINT32: {
      const uint32_t* s = (const uint32_t*)src + begin;
      for (uint32_t i = 0; i < len; ++i) out[i] = s[i];
      break;
    }
    default: /* int64, uint64: the bits as they are */
      memcpy(out, (const uint64_t*)src + begin, (size_t)len * sizeof(uint64_t));
      break;
  }
}

static int example_is_signed(int32_t dtype) {
  return dtype == KZ_PLUGIN_INT8 || dtype == KZ_PLUGIN_INT32 || dtype == KZ_PLUGIN_INT64;
}

/* The wrapped value of `v` in the dtype's width, as a signed or unsigned 64-bit number. */
static int64_t example_wrap_signed(int32_t dtype, uint64_t v) {
  switch (dtype) {
    case KZ_PLUGIN_INT8: return (v & 0x80u) ? (int64_t)(v & 0xffu) - 0x100 : (int64_t)(v & 0xffu);
    case KZ_PLUGIN_INT32:
      return (v & 0x80000000u) ? (int64_t)(v & 0xffffffffu) - 0x100000000ll : (int64_t)(v & 0xffffffffu);
    default: /* int64: two's complement reinterpretation, without implementation-defined casts */
      return (v >> 63) ? -(int64_t)(~v) - 1 : (int64_t)v;
  }
}

static uint64_t example_wrap_unsigned(int32_t dtype, uint64_t v) {
  switch (dtype) {
    case KZ_PLUGIN_UINT8: return v & 0xffu;
    case KZ_PLUGIN_UINT32: return v & 0xffffffffu;
    default: return v;
  }
}

/* ---- stores: one block of the accumulator, narrowed to the dtype ---- */

static void example_store_f32(int32_t dtype, void* dst, uint64_t begin, uint32_t len, const float* acc) {
  if (dtype == KZ_PLUGIN_FLOAT32) {
    memcpy((float*)dst + begin, acc, (size_t)len * sizeof(float));
  } else if (dtype == KZ_PLUGIN_FLOAT16) {
    uint16_t* d = (uint16_t*)dst + begin;
    for (uint32_t i = 0; i < len; ++i) d[i] = example_float_to_half(acc[i]);
  } else {
    uint16_t* d = (uint16_t*)dst + begin;
    for (uint32_t i = 0; i < len; ++i) d[i] = example_float_to_bf16(acc[i]);
  }
}

/* Writes the low bits of each value; signed types are stored through their unsigned twin, which
 * has the same representation and is allowed to alias them. */
static void example_store_u64(int32_t dtype, void* dst, uint64_t begin, uint32_t len, const uint64_t* acc) {
  switch (dtype) {
    case KZ_PLUGIN_INT8:
    case KZ_PLUGIN_UINT8: {
      uint8_t* d = (uint8_t*)dst + begin;
      for (uint32_t i = 0; i < len; ++i) d[i] = (uint8_t)acc[i];
      break;
    }
    case KZ_PLUGIN_INT32:
    case KZ_PLUGIN_UINT32: {
      uint32_t* d = (uint32_t*)dst + begin;
      for (uint32_t i = 0; i < len; ++i) d[i] = (uint32_t)acc[i];
      break;
    }
    default:
      memcpy((uint64_t*)dst + begin, acc, (size_t)len * sizeof(uint64_t));
      break;
  }
}

/* ---- min / max of floating values, the same bits in either order ---- */

/* Both selections differ only for operands that compare equal (the zeros: ANDing the bits gives
 * max's +0, ORing min's -0) or unordered (a NaN: the canonical quiet NaN). */
static float example_min_max_f32(float a, float b, int is_max) {
  const float x = is_max ? (a < b ? b : a) : (b < a ? b : a);
  const float y = is_max ? (b < a ? a : b) : (a < b ? a : b);
  const uint32_t bx = example_float_bits(x), by = example_float_bits(y);
  if (a != a || b != b) return example_bits_float(0x7fc00000u);
  return example_bits_float(is_max ? (bx & by) : (bx | by));
}

static double example_min_max_f64(double a, double b, int is_max) {
  const double x = is_max ? (a < b ? b : a) : (b < a ? b : a);
  const double y = is_max ? (b < a ? a : b) : (a < b ? a : b);
  uint64_t bx, by, r;
  double out;
  memcpy(&bx, &x, sizeof bx);
  memcpy(&by, &y, sizeof by);
  r = (a != a || b != b) ? 0x7ff8000000000000ull : (is_max ? (bx & by) : (bx | by));
  memcpy(&out, &r, sizeof out);
  return out;
}

/* ---- the three accumulator families ---- */

static void example_reduce_f32(void* dst, const void* const* srcs, uint32_t n, uint64_t count, int32_t dtype,
                               int32_t op) {
  float acc[EXAMPLE_BLOCK];
  float in[EXAMPLE_BLOCK];
  for (uint64_t b = 0; b < count; b += EXAMPLE_BLOCK) {
    const uint32_t len = (uint32_t)(count - b < EXAMPLE_BLOCK ? count - b : EXAMPLE_BLOCK);
    example_load_f32(dtype, srcs[0], b, len, acc);
    for (uint32_t k = 1; k < n; ++k) {
      example_load_f32(dtype, srcs[k], b, len, in);
      switch (op) {
        case KZ_PLUGIN_SUM:
        case KZ_PLUGIN_AVG:
          for (uint32_t i = 0; i < len; ++i) acc[i] += in[i];
          break;
        case KZ_PLUGIN_PROD:
          for (uint32_t i = 0; i < len; ++i) acc[i] *= in[i];
          break;
        case KZ_PLUGIN_MIN:
          for (uint32_t i = 0; i < len; ++i) acc[i] = example_min_max_f32(acc[i], in[i], 0);
          break;
        default: /* max */
          for (uint32_t i = 0; i < len; ++i) acc[i] = example_min_max_f32(acc[i], in[i], 1);
          break;
      }
    }
    if (op == KZ_PLUGIN_AVG) {
      const float scale = (float)n;
      for (uint32_t i = 0; i < len; ++i) acc[i] /= scale;
    }
    example_store_f32(dtype, dst, b, len, acc);
  }
}

static void example_reduce_f64(void* dst, const void* const* srcs, uint32_t n, uint64_t count, int32_t op) {
  double acc[EXAMPLE_BLOCK];
  for (uint64_t b = 0; b < count; b += EXAMPLE_BLOCK) {
    const uint32_t len = (uint32_t)(count - b < EXAMPLE_BLOCK ? count - b : EXAMPLE_BLOCK);
    memcpy(acc, (const double*)srcs[0] + b, (size_t)len * sizeof(double));
    for (uint32_t k = 1; k < n; ++k) {
      const double* in = (const double*)srcs[k] + b;
      switch (op) {
        case KZ_PLUGIN_SUM:
        case KZ_PLUGIN_AVG:
          for (uint32_t i = 0; i < len; ++i) acc[i] += in[i];
          break;
        case KZ_PLUGIN_PROD:
          for (uint32_t i = 0; i < len; ++i) acc[i] *= in[i];
          break;
        case KZ_PLUGIN_MIN:
          for (uint32_t i = 0; i < len; ++i) acc[i] = example_min_max_f64(acc[i], in[i], 0);
          break;
        default:
          for (uint32_t i = 0; i < len; ++i) acc[i] = example_min_max_f64(acc[i], in[i], 1);
          break;
      }
    }
    if (op == KZ_PLUGIN_AVG) {
      const double scale = (double)n;
      for (uint32_t i = 0; i < len; ++i) acc[i] /= scale;
    }
    memcpy((double*)dst + b, acc, (size_t)len * sizeof(double));
  }
}

static void example_reduce_int(void* dst, const void* const* srcs, uint32_t n, uint64_t count, int32_t dtype,
                               int32_t op) {
  uint64_t acc[EXAMPLE_BLOCK];
  uint64_t in[EXAMPLE_BLOCK];
  const int is_signed = example_is_signed(dtype);
  for (uint64_t b = 0; b < count; b += EXAMPLE_BLOCK) {
    const uint32_t len = (uint32_t)(count - b < EXAMPLE_BLOCK ? count - b : EXAMPLE_BLOCK);
    example_load_u64(dtype, srcs[0], b, len, acc);
    for (uint32_t k = 1; k < n; ++k) {
      example_load_u64(dtype, srcs[k], b, len, in);
      switch (op) {
        case KZ_PLUGIN_SUM:
        case KZ_PLUGIN_AVG:
          for (uint32_t i = 0; i < len; ++i) acc[i] += in[i];
          break;
        case KZ_PLUGIN_PROD:
          for (uint32_t i = 0; i < len; ++i) acc[i] *= in[i];
          break;
        case KZ_PLUGIN_MIN:
          /* Loads are exact (sign-extended), so comparing the widened values is comparing the
           * originals. */
          if (is_signed) {
            for (uint32_t i = 0; i < len; ++i)
              if (example_wrap_signed(KZ_PLUGIN_INT64, in[i]) < example_wrap_signed(KZ_PLUGIN_INT64, acc[i]))
                acc[i] = in[i];
          } else {
            for (uint32_t i = 0; i < len; ++i)
              if (in[i] < acc[i]) acc[i] = in[i];
          }
          break;
        default: /* max */
          if (is_signed) {
            for (uint32_t i = 0; i < len; ++i)
              if (example_wrap_signed(KZ_PLUGIN_INT64, acc[i]) < example_wrap_signed(KZ_PLUGIN_INT64, in[i]))
                acc[i] = in[i];
          } else {
            for (uint32_t i = 0; i < len; ++i)
              if (acc[i] < in[i]) acc[i] = in[i];
          }
          break;
      }
    }
    if (op == KZ_PLUGIN_AVG) {
      /* The sum wraps in the dtype's width first; then divide, truncating toward zero (C's /). */
      if (is_signed) {
        for (uint32_t i = 0; i < len; ++i) {
          const int64_t q = example_wrap_signed(dtype, acc[i]) / (int64_t)n;
          acc[i] = (uint64_t)q;
        }
      } else {
        for (uint32_t i = 0; i < len; ++i) acc[i] = example_wrap_unsigned(dtype, acc[i]) / n;
      }
    }
    example_store_u64(dtype, dst, b, len, acc);
  }
}

/* ---- scale: the last step of an average whose sum was formed elsewhere ---- */

/* dst[i] = src[i] / divisor, exactly KZ_PLUGIN_AVG's division applied to one already-summed
 * input: the same widening and rounding as the reduction above. Block by block through an
 * L1-resident buffer, so dst == src (in place) is safe. */
void example_scale(void* dst, const void* src, uint64_t count, int32_t dtype, uint32_t divisor) {
  if (dtype == KZ_PLUGIN_FLOAT64) {
    const double div = (double)divisor;
    const double* s = (const double*)src;
    double* d = (double*)dst;
    for (uint64_t i = 0; i < count; ++i) d[i] = s[i] / div;
    return;
  }
  if (dtype == KZ_PLUGIN_FLOAT16 || dtype == KZ_PLUGIN_BFLOAT16 || dtype == KZ_PLUGIN_FLOAT32) {
    /* Widened to float32, divided by (float)divisor, rounded once on the store. */
    const float div = (float)divisor;
    float buf[EXAMPLE_BLOCK];
    for (uint64_t b = 0; b < count; b += EXAMPLE_BLOCK) {
      const uint32_t len = (uint32_t)(count - b < EXAMPLE_BLOCK ? count - b : EXAMPLE_BLOCK);
      example_load_f32(dtype, src, b, len, buf);
      for (uint32_t i = 0; i < len; ++i) buf[i] /= div;
      example_store_f32(dtype, dst, b, len, buf);
    }
    return;
  }
  /* Integers: the loads sign-extend signed types, so the widened value is the element's value;
   * C's / truncates toward zero, and the quotient fits the type (|q| <= |x|). */
  const int is_signed = example_is_signed(dtype);
  uint64_t buf[EXAMPLE_BLOCK];
  for (uint64_t b = 0; b < count; b += EXAMPLE_BLOCK) {
    const uint32_t len = (uint32_t)(count - b < EXAMPLE_BLOCK ? count - b : EXAMPLE_BLOCK);
    example_load_u64(dtype, src, b, len, buf);
    if (is_signed) {
      for (uint32_t i = 0; i < len; ++i)
        buf[i] = (uint64_t)(example_wrap_signed(KZ_PLUGIN_INT64, buf[i]) / (int64_t)divisor);
    } else {
      for (uint32_t i = 0; i < len; ++i) buf[i] /= divisor;
    }
    example_store_u64(dtype, dst, b, len, buf);
  }
}

void example_reduce(void* dst, const void* const* srcs, uint32_t num_srcs, uint64_t count, int32_t dtype,
                    int32_t op) {
  switch (dtype) {
    case KZ_PLUGIN_FLOAT16:
    case KZ_PLUGIN_BFLOAT16:
    case KZ_PLUGIN_FLOAT32:
      example_reduce_f32(dst, srcs, num_srcs, count, dtype, op);
      break;
    case KZ_PLUGIN_FLOAT64:
      example_reduce_f64(dst, srcs, num_srcs, count, op);
      break;
    default:
      example_reduce_int(dst, srcs, num_srcs, count, dtype, op);
      break;
  }
}
