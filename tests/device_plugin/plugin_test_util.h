// The plugin loader test's shared pieces (internal to tests/device_plugin): the paths passed on
// the command line, the test configuration, and small process probes. The test binary is split by
// concept:
//
//   plugin_test_util.cc       these helpers and main (parses --example_plugin=PATH and testdata)
//   example_plugin_test.cc    the example plugin through the Backend / Device / Stream / Event wrapper
//   plugin_loader_test.cc     refused plugins, the plugin's own knobs, bounded teardown
//   plugin_registry_test.cc   how the registry adds plugins (each file once, each backend name once)
#pragma once

#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "runtime/core/config.h"

namespace kizuna::device {

extern std::string g_example_plugin;                  // --example_plugin
extern std::map<std::string, std::string> g_testdata;  // file name -> path

// The path of testdata file `name` (a test failure, and a path that does not exist, when the
// file was not passed to the test).
std::string TestData(const std::string& name);

// A configuration whose waits fail a broken test in seconds.
Config TestConfig();

// Sets an environment variable for one scope (the plugin reads its knobs in init).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};


// The threads of this process (the example plugin runs one per stream); -1 when unknown.
int ThreadCount();

// Polls `done` every few milliseconds (sleeping, not spinning) until it holds or `limit` passes.
bool Eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(10));

// Whether the shared library at `path` is mapped in this process (without loading it).
bool LibraryLoaded(const std::string& path);

// `path` with symbolic links resolved (unchanged when it cannot be resolved).
std::string Canonical(const std::string& path);

// A copy of the example plugin under another file name: the same backend name, another file.
std::string CopyOfExamplePlugin(const std::string& file_name);

// A gate a host callback blocks on, with its own deadline so a failing test cannot hang.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool WaitOpen(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace kizuna::device
