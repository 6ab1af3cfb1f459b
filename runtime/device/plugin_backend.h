// Loads a device plugin (a shared library built against kizuna_device_plugin.h) and wraps it as a
// Backend. Version or symbol problems are reported as errors naming the path and the versions.
#pragma once

#include <memory>
#include <string>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::device {

// kUnavailable when the plugin's init reports no hardware; kInvalidArgument for a file that is
// not a usable plugin (missing, wrong entry point, api major mismatch, missing functions).
Result<std::unique_ptr<Backend>> LoadDevicePlugin(const std::string& path, const Config& config);

}  // namespace kizuna::device
