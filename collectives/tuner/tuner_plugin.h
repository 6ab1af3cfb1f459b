// Loads a tuner plugin (a shared library built against kizuna_tuner_plugin.h, named by
// KIZUNA_TUNER_PLUGIN) and asks it, for each collective the engine plans, which of the cost
// model's candidates to run (README.md). Version and symbol problems are errors naming the path and
// the versions; the plugin's answers are checked, and a bad one is refused (logged, counted) in
// favour of the model's choice. Plugin result codes become Status values once, here.
//
// Lifetime: one TunerPlugin per communicator (per Engine), holding a dlopen reference to the
// library and the context its init created; finalize, then dlclose, when it is destroyed. Loading
// one path for several communicators of a process gives independent contexts of one library.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "collectives/cost/selector.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "collectives/tuner/kizuna_tuner_plugin.h"
#include "runtime/core/status.h"

namespace kizuna::collectives::tuner {

// What kizuna refuses in a plugin's answer (one warning per kind and plugin context; the rest at
// TRACE). Any of them refuses the whole answer: the model's choice runs, with the engine's chunk
// and channels.
enum class Refusal : uint8_t {
  kError = 0,    // get_coll_info returned an error code
  kBadIndex,     // the candidate index is outside [0, candidates)
  kUnknownName,  // the algorithm name is no candidate's
  kUnsupported,  // the candidate cannot serve the call
  kBadChunk,     // 0, less than one element, or above KZ_TUNER_MAX_CHUNK_BYTES
  kBadChannels,  // outside [1, KZ_TUNER_MAX_CHANNELS]
};
inline constexpr int kNumRefusals = 6;
std::string_view RefusalName(Refusal r);  // "error code", "candidate index out of range", ...

// Whether the engine asks the plugin about a call: not for point-to-point (one algorithm), and not
// when the call (`per_call`) or KIZUNA_ALGO (`overrides`, its entry or its single name, "hier"
// included) names an algorithm for the collective: those win over the plugin.
bool PluginDecides(Collective collective, bool per_call, const AlgoOverrides& overrides);

// The ranks' agreement at creation: `mine` and `theirs` are two ranks' Identity() ("" for none).
// kInvalidArgument naming both when they differ: every rank must choose alike.
Status CheckSameTuner(std::string_view mine, int rank, std::string_view theirs, int other);

class TunerPlugin {
 public:
  // dlopen, the entry point, and the table's checks (not NULL, struct_size, the major version, a
  // name of [a-z0-9_], every function). kInvalidArgument naming `path` and what is wrong. No call
  // into the plugin but its entry point: Init creates the context.
  static Result<std::unique_ptr<TunerPlugin>> Load(const std::string& path);
  ~TunerPlugin();
  TunerPlugin(const TunerPlugin&) = delete;
  TunerPlugin& operator=(const TunerPlugin&) = delete;

  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  // "example_ring 1.0.0": what the ranks of a communicator compare (CheckSameTuner).
  const std::string& identity() const { return identity_; }

  // Creates the plugin's context for `rank` of the communicator `shape` describes (ranks, hosts,
  // ranks per host). Once. The plugin's error names its code and last_error.
  Status Init(int rank, const CommTopology& shape);

  // Shows the plugin the model's selection `sel` (nothing forced: PluginDecides) with the engine's
  // plan `options`, and applies a valid answer that changes something: sel.chosen, sel.tuned,
  // sel.chunk_count, sel.channels, and sel.reason naming the plugin. A refused answer keeps the
  // model's choice and says why in sel.reason. Never fails; calls are serialized per plugin.
  void Choose(Selection& sel, const PlanOptions& options);

  // Answers refused so far, of one kind.
  uint64_t refused(Refusal kind) const { return refused_[static_cast<size_t>(kind)].load(); }

 private:
  struct DlCloser {
    void operator()(void* handle) const;
  };
  using DlHandle = std::unique_ptr<void, DlCloser>;
  // An answer, checked: what the plan uses, or the refusal and its detail.
  struct Answer {
    std::optional<Refusal> refusal;
    std::string detail;
    Algorithm algorithm = Algorithm::kRing;
    uint64_t chunk_count = 0;
    int channels = 1;
  };

  TunerPlugin(DlHandle handle, const kz_tuner_plugin_api_t& api, std::string path);
  Answer Ask(const Selection& sel, const PlanOptions& options);
  void Refuse(Selection& sel, const Answer& answer);
  // The log callback of kz_tuner_init_args_t; `context` is the TunerPlugin.
  static void LogFromPlugin(void* context, int32_t level, const char* message);

  DlHandle handle_;
  kz_tuner_plugin_api_t api_;  // the plugin's table, copied: fields beyond its struct_size are NULL
  std::string path_;
  std::string name_;
  std::string version_;
  std::string identity_;
  void* context_ = nullptr;
  bool initialized_ = false;
  int32_t nranks_ = 0;
  int32_t nhosts_ = 0;
  int32_t ranks_per_host_ = 0;
  std::mutex mu_;  // one get_coll_info at a time (the ABI's promise)
  std::array<std::atomic<uint64_t>, kNumRefusals> refused_{};
};

}  // namespace kizuna::collectives::tuner
