// A device plugin's api table (kizuna_device_plugin.h) as the loader judges it before any call:
// the sizes each api minor guarantees, the strings a plugin owns, and the checks that name what
// is wrong. Internal to runtime/device (plugin_backend.cc, plugin_table.cc).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "runtime/device/kizuna_device_plugin.h"
#include "runtime/core/status.h"

namespace kizuna::device::plugin_table {

// The api 1.0 table ends with event_synchronize. Later minors append after it, so this stays the
// least a major-1 plugin must provide however far the header grows.
constexpr size_t kApi10TableSize =
    offsetof(kz_device_plugin_api_t, event_synchronize) + sizeof(kz_device_plugin_api_t::event_synchronize);
// api 1.1 appends stream_scale: a table at least this large has the field (which may be NULL).
constexpr size_t kApi11TableSize =
    offsetof(kz_device_plugin_api_t, stream_scale) + sizeof(kz_device_plugin_api_t::stream_scale);
// struct_size, api_major and api_minor must be present before anything else can be judged.
constexpr size_t kVersionFieldsSize = offsetof(kz_device_plugin_api_t, api_minor) + sizeof(uint32_t);
// Likewise the api 1.0 device properties end with flags.
constexpr size_t kProps10Size =
    offsetof(kz_plugin_device_properties_t, flags) + sizeof(kz_plugin_device_properties_t::flags);

constexpr size_t kMaxNameLength = 64;

// A string the plugin owns, copied with a length bound so an unterminated one cannot run away.
inline std::string BoundedString(const char* s, size_t max) {
  if (s == nullptr) return {};
  return std::string(s, strnlen(s, max));
}

// The table a plugin's entry point returned, for kizuna's api: not NULL, the same major version,
// at least api 1.0's size, a name of [a-z0-9_], every required function, export and import in
// pairs. The errors name the plugin (`path`) and what is wrong.
Status CheckTable(const kz_device_plugin_api_t* api, const std::string& path);

}  // namespace kizuna::device::plugin_table
