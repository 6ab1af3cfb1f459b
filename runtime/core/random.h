// Random bytes from the kernel (getrandom): secrets, nonces and connection tokens.
#pragma once

#include <cstddef>

#include "runtime/core/status.h"

namespace kizuna {

// Fills [out, out + n) from getrandom(2), retrying short reads and EINTR; the error names the
// call when the kernel refuses.
Status RandomBytes(void* out, size_t n);

// One random value of a trivially copyable type (a nonce, a starting sequence number).
template <typename T>
Result<T> RandomValue() {
  T value{};
  KZ_RETURN_IF_ERROR(RandomBytes(&value, sizeof value));
  return value;
}

}  // namespace kizuna
