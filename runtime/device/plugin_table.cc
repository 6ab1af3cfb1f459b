#include "runtime/device/plugin_table.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

namespace kizuna::device::plugin_table {
namespace {

Status CheckName(const char* name, const std::string& path) {
  if (name == nullptr) return InvalidArgument(fmt::format("device plugin {}: the api table has no name", path));
  const std::string n = BoundedString(name, kMaxNameLength + 1);
  auto allowed = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; };
  if (n.empty() || n.size() > kMaxNameLength || !std::all_of(n.begin(), n.end(), allowed))
    return InvalidArgument(fmt::format("device plugin {}: name '{}' is not 1 to {} characters of [a-z0-9_]", path, n,
                                       kMaxNameLength));
  return Status::Ok();
}

// The functions api 1.0 requires, by field name, so the error names the one that is missing.
struct RequiredFunction {
  std::string_view field;
  bool present;
};

Status CheckFunctions(const kz_device_plugin_api_t& api, const std::string& path) {
  const RequiredFunction required[] = {
      {"last_error", api.last_error != nullptr},
      {"init", api.init != nullptr},
      {"finalize", api.finalize != nullptr},
      {"device_count", api.device_count != nullptr},
      {"device_properties", api.device_properties != nullptr},
      {"mem_alloc", api.mem_alloc != nullptr},
      {"mem_free", api.mem_free != nullptr},
      {"stream_create", api.stream_create != nullptr},
      {"stream_destroy", api.stream_destroy != nullptr},
      {"stream_copy", api.stream_copy != nullptr},
      {"stream_reduce", api.stream_reduce != nullptr},
      {"stream_host_callback", api.stream_host_callback != nullptr},
      {"stream_synchronize", api.stream_synchronize != nullptr},
      {"stream_query", api.stream_query != nullptr},
      {"event_create", api.event_create != nullptr},
      {"event_destroy", api.event_destroy != nullptr},
      {"event_record", api.event_record != nullptr},
      {"stream_wait_event", api.stream_wait_event != nullptr},
      {"event_query", api.event_query != nullptr},
      {"event_synchronize", api.event_synchronize != nullptr},
  };
  for (const RequiredFunction& f : required)
    if (!f.present)
      return InvalidArgument(fmt::format("device plugin {}: required function '{}' is NULL in the api table", path,
                                         f.field));
  // Export is optional, but an export nobody can import (or an import nobody can undo) is a bug.
  if (api.mem_export_fd != nullptr && api.mem_import_fd == nullptr)
    return InvalidArgument(fmt::format("device plugin {}: 'mem_export_fd' is set but 'mem_import_fd' is NULL", path));
  if (api.mem_import_fd != nullptr && api.mem_unimport == nullptr)
    return InvalidArgument(fmt::format("device plugin {}: 'mem_import_fd' is set but 'mem_unimport' is NULL", path));
  return Status::Ok();
}

}  // namespace

Status CheckTable(const kz_device_plugin_api_t* api, const std::string& path) {
  if (api == nullptr)
    return InvalidArgument(fmt::format("device plugin {}: {} returned no api table for kizuna's device plugin api "
                                       "{}.{} (the plugin does not serve this version)",
                                       path, KZ_DEVICE_PLUGIN_ENTRY_POINT, KZ_DEVICE_PLUGIN_API_MAJOR,
                                       KZ_DEVICE_PLUGIN_API_MINOR));
  if (api->struct_size < kVersionFieldsSize)
    return InvalidArgument(fmt::format("device plugin {}: api table struct_size {} is too small to hold its version",
                                       path, api->struct_size));
  if (api->api_major != KZ_DEVICE_PLUGIN_API_MAJOR)
    return InvalidArgument(fmt::format("device plugin {}: plugin api version {}.{} is incompatible with kizuna's "
                                       "device plugin api {}.{} (the major versions must match; rebuild the plugin "
                                       "against kizuna_device_plugin.h {}.x)",
                                       path, api->api_major, api->api_minor, KZ_DEVICE_PLUGIN_API_MAJOR,
                                       KZ_DEVICE_PLUGIN_API_MINOR, KZ_DEVICE_PLUGIN_API_MAJOR));
  if (api->struct_size < kApi10TableSize)
    return InvalidArgument(fmt::format("device plugin {}: api table struct_size {} is smaller than the {} bytes of "
                                       "api {}.0",
                                       path, api->struct_size, kApi10TableSize, KZ_DEVICE_PLUGIN_API_MAJOR));
  KZ_RETURN_IF_ERROR(CheckName(api->name, path));
  return CheckFunctions(*api, path);
}

}  // namespace kizuna::device::plugin_table
