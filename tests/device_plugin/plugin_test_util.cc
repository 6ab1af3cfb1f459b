#include "tests/device_plugin/plugin_test_util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <thread>

#include <gtest/gtest.h>

namespace kizuna::device {

std::string g_example_plugin;
std::map<std::string, std::string> g_testdata;

std::string TestData(const std::string& name) {
  auto it = g_testdata.find(name);
  if (it == g_testdata.end()) {
    ADD_FAILURE() << "test data " << name << " was not passed to the test";
    return "/nonexistent/" + name;
  }
  return it->second;
}

Config TestConfig() {
  Config c;
  c.timeout_s = 10;  // a broken wait fails the test in seconds, not minutes
  return c;
}

int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir))
    if (e->d_name[0] != '.') ++n;
  closedir(dir);
  return n;
}

// Polls `done` every few milliseconds (sleeping, not spinning) until it holds or `limit` passes.
bool Eventually(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Whether the shared library at `path` is mapped in this process (without loading it).
bool LibraryLoaded(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);  // NOLOAD took a reference too
  return true;
}

std::string Canonical(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

// A copy of the example plugin under another file name: the same backend name, another file.
std::string CopyOfExamplePlugin(const std::string& file_name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = tmp != nullptr ? tmp : std::filesystem::temp_directory_path().string();
  const std::filesystem::path copy = dir / file_name;
  std::error_code ec;
  std::filesystem::copy_file(g_example_plugin, copy, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) ADD_FAILURE() << "copying " << g_example_plugin << " to " << copy << ": " << ec.message();
  return copy.string();
}

}  // namespace kizuna::device

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    constexpr std::string_view kPlugin = "--example_plugin=";
    if (arg.starts_with(kPlugin)) {
      kizuna::device::g_example_plugin = std::string(arg.substr(kPlugin.size()));
    } else if (!arg.starts_with("-")) {
      const size_t slash = arg.rfind('/');
      const std::string name(slash == std::string_view::npos ? arg : arg.substr(slash + 1));
      kizuna::device::g_testdata[name] = std::string(arg);
    } else {
      std::fprintf(stderr, "plugin_backend_test: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (kizuna::device::g_example_plugin.empty()) {
    std::fprintf(stderr, "usage: plugin_backend_test --example_plugin=PATH [TESTDATA_FILE...]\n");
    return 2;
  }
  return RUN_ALL_TESTS();
}
