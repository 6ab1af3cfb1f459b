// What transport.cc and transport_staging.cc share. Not a public header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kizuna::collectives::transport_internal {

// "a, b, c", or "none".
std::string NameList(const std::vector<std::string>& names);
// "8 MiB", "3 KiB", "1000 bytes".
std::string SizeText(size_t n);

}  // namespace kizuna::collectives::transport_internal
