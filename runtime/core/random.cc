#include "runtime/core/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

namespace kizuna {

Status RandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return FromErrno(errno, "getrandom");
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace kizuna
