// Loads a fabric plugin (a shared library built against fabric/kizuna_fabric_plugin.h) and wraps it
// as a Fabric. Version, symbol and property problems are reported as errors naming the path, the
// versions and the offending field; plugin result codes become Status values once, here.
//
// Lifetime: the returned Fabric owns the plugin's context (finalize runs when it is destroyed,
// after its comms, which the caller must destroy first as for any fabric) and a dlopen reference
// to the library (dlclose after finalize). Loading one path twice (one fabric per rank in a
// threaded test) gives two independent contexts of one loaded library.
#pragma once

#include <memory>
#include <string>

#include "fabric/fabric.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::fabric {

// kUnavailable when the plugin's init reports no device here, or it has no devices;
// kInvalidArgument for a file that is not a usable plugin (missing, no entry point, api major
// mismatch, a table too short, a required function missing, an optional group half present,
// properties that break the ABI's rules); another code when the plugin's own calls fail.
// `config` must outlive the fabric.
Result<std::unique_ptr<Fabric>> LoadFabricPlugin(const std::string& path, const Config& config,
                                                 const FabricContext& context);

}  // namespace kizuna::fabric
