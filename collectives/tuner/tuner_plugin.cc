#include "collectives/tuner/tuner_plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/dtype.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives::tuner {
namespace {

// The api 1.0 table ends with get_coll_info. Later minors append after it, so this stays the least
// a major-1 plugin must provide however far the header grows.
constexpr size_t kApi10TableSize =
    offsetof(kz_tuner_plugin_api_t, get_coll_info) + sizeof(kz_tuner_plugin_api_t::get_coll_info);
// struct_size, api_major and api_minor must be present before anything else can be judged.
constexpr size_t kVersionFieldsSize = offsetof(kz_tuner_plugin_api_t, api_minor) + sizeof(uint32_t);

constexpr size_t kMaxNameLength = 64;
constexpr size_t kMaxVersionLength = 256;
constexpr size_t kMaxLastErrorLength = 4096;
constexpr size_t kMaxLogLineLength = 4096;
// name, a space, version.
constexpr size_t kMaxIdentity = kMaxNameLength + 1 + kMaxVersionLength;

// The enums the header spells as numbers must keep the values it promises.
static_assert(KZ_TUNER_ALLREDUCE == static_cast<int>(Collective::kAllReduce));
static_assert(KZ_TUNER_REDUCESCATTER == static_cast<int>(Collective::kReduceScatter));
static_assert(KZ_TUNER_ALLGATHER == static_cast<int>(Collective::kAllGather));
static_assert(KZ_TUNER_BROADCAST == static_cast<int>(Collective::kBroadcast));
static_assert(KZ_TUNER_REDUCE == static_cast<int>(Collective::kReduce));
static_assert(KZ_TUNER_ALLTOALL == static_cast<int>(Collective::kAllToAll));
static_assert(KZ_TUNER_BARRIER == static_cast<int>(Collective::kBarrier));
static_assert(KZ_TUNER_FLOAT16 == static_cast<int>(DataType::kFloat16));
static_assert(KZ_TUNER_BFLOAT16 == static_cast<int>(DataType::kBfloat16));
static_assert(KZ_TUNER_FLOAT32 == static_cast<int>(DataType::kFloat32));
static_assert(KZ_TUNER_FLOAT64 == static_cast<int>(DataType::kFloat64));
static_assert(KZ_TUNER_INT8 == static_cast<int>(DataType::kInt8));
static_assert(KZ_TUNER_UINT8 == static_cast<int>(DataType::kUint8));
static_assert(KZ_TUNER_INT32 == static_cast<int>(DataType::kInt32));
static_assert(KZ_TUNER_UINT32 == static_cast<int>(DataType::kUint32));
static_assert(KZ_TUNER_INT64 == static_cast<int>(DataType::kInt64));
static_assert(KZ_TUNER_UINT64 == static_cast<int>(DataType::kUint64));
static_assert(KZ_TUNER_LOG_WARN == static_cast<int>(LogLevel::kWarn));
static_assert(KZ_TUNER_LOG_INFO == static_cast<int>(LogLevel::kInfo));
static_assert(KZ_TUNER_LOG_TRACE == static_cast<int>(LogLevel::kTrace));

std::string_view ResultCodeName(kz_tuner_result_t rc) {
  switch (rc) {
    case KZ_TUNER_OK: return "KZ_TUNER_OK";
    case KZ_TUNER_ERR_INVALID_ARGUMENT: return "KZ_TUNER_ERR_INVALID_ARGUMENT";
    case KZ_TUNER_ERR_NOT_SUPPORTED: return "KZ_TUNER_ERR_NOT_SUPPORTED";
    case KZ_TUNER_ERR_OUT_OF_MEMORY: return "KZ_TUNER_ERR_OUT_OF_MEMORY";
    case KZ_TUNER_ERR_INTERNAL: return "KZ_TUNER_ERR_INTERNAL";
    default: return "unknown result code";
  }
}

StatusCode ResultStatusCode(kz_tuner_result_t rc) {
  switch (rc) {
    case KZ_TUNER_OK: return StatusCode::kOk;
    case KZ_TUNER_ERR_INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case KZ_TUNER_ERR_NOT_SUPPORTED: return StatusCode::kNotSupported;
    case KZ_TUNER_ERR_OUT_OF_MEMORY: return StatusCode::kOutOfMemory;
    default: return StatusCode::kInternal;  // an unknown code is a plugin bug
  }
}

// A string the plugin owns, copied with a length bound so an unterminated one cannot run away.
std::string BoundedString(const char* s, size_t max) {
  if (s == nullptr) return {};
  return std::string(s, strnlen(s, max));
}

// Text from the plugin as a log line or message shows it: at most `max` bytes, each byte outside
// printable ASCII (a newline that would forge a log line, say) escaped. ShownText cuts at 64 bytes,
// too short for a plugin's own sentences.
std::string Printable(std::string_view text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (text.size() > max) out += fmt::format("...({} bytes)", text.size());
  return out;
}

// NUL-terminated algorithm names for the candidate list, made once (AlgorithmName's views are not
// promised to be terminated).
const std::vector<std::string>& CandidateNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (int i = 0; i < kNumAlgorithms; ++i) n.emplace_back(AlgorithmName(static_cast<Algorithm>(i)));
    return n;
  }();
  return names;
}

std::string FormatChunk(uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

Status CheckName(const char* name, const std::string& path) {
  if (name == nullptr) return InvalidArgument(fmt::format("tuner plugin {}: the api table has no name", path));
  const std::string n = BoundedString(name, kMaxNameLength + 1);
  auto allowed = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; };
  if (n.empty() || n.size() > kMaxNameLength || !std::all_of(n.begin(), n.end(), allowed))
    return InvalidArgument(fmt::format("tuner plugin {}: name '{}' is not 1 to {} characters of [a-z0-9_]", path,
                                       Printable(n, kMaxNameLength), kMaxNameLength));
  return Status::Ok();
}

// The table an entry point returned, for kizuna's api. The errors name the plugin and what is wrong.
Status CheckTable(const kz_tuner_plugin_api_t* api, const std::string& path) {
  if (api == nullptr)
    return InvalidArgument(
        fmt::format("tuner plugin {}: {} returned no api table for kizuna's tuner plugin api "
                    "{}.{} (the plugin does not serve this version)",
                    path, KZ_TUNER_PLUGIN_ENTRY_POINT, KZ_TUNER_PLUGIN_API_MAJOR, KZ_TUNER_PLUGIN_API_MINOR));
  if (api->struct_size < kVersionFieldsSize)
    return InvalidArgument(fmt::format("tuner plugin {}: api table struct_size {} is too small to hold its version",
                                       path, api->struct_size));
  if (api->api_major != KZ_TUNER_PLUGIN_API_MAJOR)
    return InvalidArgument(
        fmt::format("tuner plugin {}: plugin api version {}.{} is incompatible with kizuna's "
                    "tuner plugin api {}.{} (the major versions must match; rebuild the plugin "
                    "against kizuna_tuner_plugin.h {}.x)",
                    path, api->api_major, api->api_minor, KZ_TUNER_PLUGIN_API_MAJOR, KZ_TUNER_PLUGIN_API_MINOR,
                    KZ_TUNER_PLUGIN_API_MAJOR));
  if (api->struct_size < kApi10TableSize)
    return InvalidArgument(
        fmt::format("tuner plugin {}: api table struct_size {} is smaller than the {} bytes of "
                    "api {}.0",
                    path, api->struct_size, kApi10TableSize, KZ_TUNER_PLUGIN_API_MAJOR));
  KZ_RETURN_IF_ERROR(CheckName(api->name, path));
  const std::pair<std::string_view, bool> required[] = {
      {"last_error", api->last_error != nullptr},
      {"init", api->init != nullptr},
      {"finalize", api->finalize != nullptr},
      {"get_coll_info", api->get_coll_info != nullptr},
  };
  for (const auto& [field, present] : required)
    if (!present)
      return InvalidArgument(
          fmt::format("tuner plugin {}: required function '{}' is NULL in the api table", path, field));
  return Status::Ok();
}

// The plugin's table as kizuna's version of the struct: only the struct_size bytes the plugin
// declared are read (a table built against an older header ends there); the fields it lacks stay
// NULL. Called after CheckTable.
kz_tuner_plugin_api_t CopyTable(const kz_tuner_plugin_api_t& table) {
  kz_tuner_plugin_api_t copy;
  std::memset(&copy, 0, sizeof copy);
  std::memcpy(&copy, &table, std::min(table.struct_size, sizeof copy));
  return copy;
}

}  // namespace

std::string_view RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kError: return "error code";
    case Refusal::kBadIndex: return "candidate index out of range";
    case Refusal::kUnknownName: return "unknown algorithm name";
    case Refusal::kUnsupported: return "unsupported candidate";
    case Refusal::kBadChunk: return "chunk size out of range";
    case Refusal::kBadChannels: return "channel count out of range";
  }
  return "?";
}

bool PluginDecides(Collective collective, bool per_call, const AlgoOverrides& overrides) {
  return !IsPointToPoint(collective) && !per_call && !overrides.For(collective) && !overrides.HierFor(collective);
}

Status CheckSameTuner(std::string_view mine, int rank, std::string_view theirs, int other) {
  if (mine == theirs) return Status::Ok();
  auto describe = [](std::string_view id) {
    return id.empty() ? std::string("no tuner plugin") : fmt::format("tuner plugin {}", Printable(id, kMaxIdentity));
  };
  return InvalidArgument(
      fmt::format("rank {} has {} and this rank (rank {}) {}: every rank must load the same "
                  "tuner plugin (KIZUNA_TUNER_PLUGIN), so that all choose the same algorithms",
                  other, describe(theirs), rank, describe(mine)));
}

void TunerPlugin::DlCloser::operator()(void* handle) const {
  if (handle != nullptr && dlclose(handle) != 0)
    KZ_WARN(kLogPlugin, "dlclose failed: {}", BoundedString(dlerror(), kMaxLastErrorLength));
}

TunerPlugin::TunerPlugin(DlHandle handle, const kz_tuner_plugin_api_t& api, std::string path)
    : handle_(std::move(handle)),
      api_(CopyTable(api)),
      path_(std::move(path)),
      name_(BoundedString(api.name, kMaxNameLength)),
      version_(api.version != nullptr ? Printable(BoundedString(api.version, kMaxVersionLength), kMaxVersionLength)
                                      : "unknown"),
      identity_(fmt::format("{} {}", name_, version_)) {}

TunerPlugin::~TunerPlugin() {
  if (initialized_) api_.finalize(context_);
  // handle_ is closed after this body: the table and the plugin's code stay mapped until here.
}

Result<std::unique_ptr<TunerPlugin>> TunerPlugin::Load(const std::string& path) {
  if (path.empty()) return InvalidArgument("tuner plugin path is empty");
  dlerror();  // clear any stale message
  DlHandle handle(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (handle == nullptr)
    return InvalidArgument(
        fmt::format("tuner plugin {}: dlopen failed: {}", path, BoundedString(dlerror(), kMaxLastErrorLength)));
  dlerror();
  auto get_api = reinterpret_cast<kz_tuner_plugin_get_api_fn>(dlsym(handle.get(), KZ_TUNER_PLUGIN_ENTRY_POINT));
  if (get_api == nullptr) {
    const std::string why = BoundedString(dlerror(), kMaxLastErrorLength);
    return InvalidArgument(fmt::format("tuner plugin {}: not a kizuna tuner plugin: it does not export {}{}{}", path,
                                       KZ_TUNER_PLUGIN_ENTRY_POINT, why.empty() ? "" : ": ", why));
  }
  const kz_tuner_plugin_api_t* api = get_api(KZ_TUNER_PLUGIN_API_MAJOR, KZ_TUNER_PLUGIN_API_MINOR);
  KZ_RETURN_IF_ERROR(CheckTable(api, path));
  std::unique_ptr<TunerPlugin> plugin(new TunerPlugin(std::move(handle), *api, path));
  KZ_INFO(kLogPlugin, "loaded tuner plugin {}: name {}, version {}, plugin api {}.{}, kizuna api {}.{}", path,
          plugin->name_, plugin->version_, api->api_major, api->api_minor, KZ_TUNER_PLUGIN_API_MAJOR,
          KZ_TUNER_PLUGIN_API_MINOR);
  return plugin;
}

Status TunerPlugin::Init(int rank, const CommTopology& shape) {
  if (initialized_) return InvalidArgument(fmt::format("tuner plugin '{}' ({}): initialized twice", name_, path_));
  std::map<std::string, int32_t> per_host;
  for (const RankDesc& d : shape.ranks) ++per_host[d.host_id];
  nranks_ = shape.nranks;
  nhosts_ = static_cast<int32_t>(per_host.size());
  ranks_per_host_ = 0;
  for (const auto& [host, n] : per_host) ranks_per_host_ = std::max(ranks_per_host_, n);

  kz_tuner_init_args_t args;
  std::memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.rank = rank;
  args.nranks = nranks_;
  args.nhosts = nhosts_;
  args.ranks_per_host = ranks_per_host_;
  args.log = &TunerPlugin::LogFromPlugin;
  args.log_context = this;
  void* context = nullptr;
  const kz_tuner_result_t rc = api_.init(&args, &context);
  if (rc != KZ_TUNER_OK) {
    std::string detail(ResultCodeName(rc));
    const std::string last = BoundedString(api_.last_error(), kMaxLastErrorLength);
    if (!last.empty()) detail += ": " + Printable(last, kMaxLastErrorLength);
    return FromForeign(ResultStatusCode(rc), fmt::format("tuner plugin '{}' ({})", name_, path_), "init", rc, detail);
  }
  context_ = context;
  initialized_ = true;
  if (rank == 0)
    KZ_INFO(kLogTune,
            "tuner plugin {} ({}) chooses where the call and KIZUNA_ALGO do not: {} ranks, {} host(s), "
            "up to {} per host",
            identity_, path_, nranks_, nhosts_, ranks_per_host_);
  return Status::Ok();
}

void TunerPlugin::LogFromPlugin(void* context, int32_t level, const char* message) {
  const auto* self = static_cast<const TunerPlugin*>(context);
  if (self == nullptr || message == nullptr) return;
  const LogLevel l = level <= KZ_TUNER_LOG_WARN   ? LogLevel::kWarn
                     : level == KZ_TUNER_LOG_INFO ? LogLevel::kInfo
                                                  : LogLevel::kTrace;
  if (!LogEnabled(l, kLogTune)) return;
  Log(l, kLogTune, "tuner plugin '{}': {}", self->name_,
      Printable(BoundedString(message, kMaxLogLineLength + 1), kMaxLogLineLength));
}

TunerPlugin::Answer TunerPlugin::Ask(const Selection& sel, const PlanOptions& options) {
  const CollectiveRequest& request = sel.request;
  const uint64_t elem = std::max<uint64_t>(1, DataTypeSize(request.dtype));
  const size_t n = sel.candidates.size();
  const std::vector<std::string>& all_names = CandidateNames();
  std::vector<const char*> names(n);
  std::vector<int32_t> supported(n);
  std::vector<double> predicted_us(n);
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = sel.candidates[i];
    names[i] = all_names[static_cast<size_t>(c.algorithm)].c_str();
    supported[i] = c.supported() ? 1 : 0;
    predicted_us[i] =
        c.supported() && c.prediction.finite() ? c.seconds() * 1e6 : std::numeric_limits<double>::infinity();
  }
  kz_tuner_call_t call;
  std::memset(&call, 0, sizeof call);
  call.struct_size = sizeof call;
  call.collective = static_cast<int32_t>(request.collective);
  call.dtype = static_cast<int32_t>(request.dtype);
  call.bytes = std::max(request.input_count(), request.output_count()) * elem;
  call.nranks = nranks_;
  call.nhosts = nhosts_;
  call.ranks_per_host = ranks_per_host_;
  call.num_candidates = static_cast<uint32_t>(n);
  call.candidate_names = names.data();
  call.candidate_supported = supported.data();
  call.candidate_predicted_us = predicted_us.data();

  const int32_t model =
      static_cast<int32_t>(std::find_if(sel.candidates.begin(), sel.candidates.end(),
                                        [&](const Candidate& c) { return c.algorithm == sel.chosen; }) -
                           sel.candidates.begin());
  kz_tuner_decision_t d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.candidate = model;
  d.algorithm = nullptr;
  d.chunk_bytes = options.chunk_count * elem;
  d.channels = options.channels;

  Answer a;
  const kz_tuner_result_t rc = api_.get_coll_info(context_, &call, &d);
  if (rc != KZ_TUNER_OK) {
    const std::string last = BoundedString(api_.last_error(), kMaxLastErrorLength);
    a.refusal = Refusal::kError;
    a.detail = fmt::format("get_coll_info returned {} ({}){}{}", ResultCodeName(rc), rc, last.empty() ? "" : ": ",
                           Printable(last, kMaxLastErrorLength));
    return a;
  }
  size_t index = 0;
  if (d.algorithm != nullptr) {
    const std::string wanted = BoundedString(d.algorithm, kMaxNameLength + 1);
    const std::optional<Algorithm> parsed = ParseAlgorithm(wanted);
    auto it = std::find_if(sel.candidates.begin(), sel.candidates.end(),
                           [&](const Candidate& c) { return parsed && c.algorithm == *parsed; });
    if (it == sel.candidates.end()) {
      a.refusal = Refusal::kUnknownName;
      a.detail = fmt::format("algorithm '{}' is not a candidate's name", Printable(wanted, kMaxNameLength));
      return a;
    }
    index = static_cast<size_t>(it - sel.candidates.begin());
  } else if (d.candidate < 0 || static_cast<size_t>(d.candidate) >= n) {
    a.refusal = Refusal::kBadIndex;
    a.detail = fmt::format("candidate {} is out of range (there are {}: 0 to {})", d.candidate, n, n - 1);
    return a;
  } else {
    index = static_cast<size_t>(d.candidate);
  }
  const Candidate& chosen = sel.candidates[index];
  if (!chosen.supported()) {
    a.refusal = Refusal::kUnsupported;
    a.detail = fmt::format("{} cannot serve the call: {}", AlgorithmName(chosen.algorithm), chosen.support.message());
    return a;
  }
  if (d.chunk_bytes < elem || d.chunk_bytes > KZ_TUNER_MAX_CHUNK_BYTES) {
    a.refusal = Refusal::kBadChunk;
    a.detail =
        fmt::format("chunk_bytes {} is outside [{} (one element), {}]", d.chunk_bytes, elem, KZ_TUNER_MAX_CHUNK_BYTES);
    return a;
  }
  if (d.channels < 1 || d.channels > KZ_TUNER_MAX_CHANNELS) {
    a.refusal = Refusal::kBadChannels;
    a.detail = fmt::format("channels {} is outside [1, {}]", d.channels, KZ_TUNER_MAX_CHANNELS);
    return a;
  }
  a.algorithm = chosen.algorithm;
  // The staging slots hold the engine's chunk: a larger one is cut to it.
  a.chunk_count = std::min(options.chunk_count, d.chunk_bytes / elem);
  a.channels = d.channels;
  return a;
}

void TunerPlugin::Refuse(Selection& sel, const Answer& answer) {
  const Refusal kind = *answer.refusal;
  const uint64_t before = refused_[static_cast<size_t>(kind)].fetch_add(1);
  const std::string text =
      fmt::format("tuner plugin {} ({}): answer for {} refused: {}; using the model's choice ({})", identity_, path_,
                  sel.request.ToString(), answer.detail, AlgorithmName(sel.chosen));
  // One warning per kind: a plugin wrong for one call is usually wrong for many.
  if (before == 0)
    KZ_WARN(kLogTune, "{} (later answers refused for the same reason, {}, are logged at TRACE)", text,
            RefusalName(kind));
  else
    KZ_TRACE(kLogTune, "{}", text);
  sel.reason += fmt::format(" (tuner plugin {} refused: {})", identity_, answer.detail);
}

void TunerPlugin::Choose(Selection& sel, const PlanOptions& options) {
  if (IsPointToPoint(sel.request.collective) || sel.candidates.empty()) return;
  std::lock_guard lock(mu_);
  if (!initialized_) return;
  const Answer answer = Ask(sel, options);
  if (answer.refusal) {
    Refuse(sel, answer);
    return;
  }
  const bool other_algorithm = answer.algorithm != sel.chosen;
  const bool other_chunk = answer.chunk_count != options.chunk_count;
  const bool other_channels = answer.channels != options.channels;
  if (!other_algorithm && !other_chunk && !other_channels) {
    sel.reason += fmt::format(" (tuner plugin {} kept it)", identity_);
    return;
  }
  const uint64_t elem = std::max<uint64_t>(1, DataTypeSize(sel.request.dtype));
  std::string what =
      other_algorithm ? fmt::format("over the model's {}", AlgorithmName(sel.chosen)) : std::string("as the model did");
  if (other_chunk) {
    what += fmt::format(", chunk {}", FormatChunk(answer.chunk_count * elem));
    sel.chunk_count = answer.chunk_count;
  }
  if (other_channels) {
    what += fmt::format(", {} channel{}", answer.channels, answer.channels == 1 ? "" : "s");
    sel.channels = answer.channels;
  }
  sel.chosen = answer.algorithm;
  sel.tuned = true;
  sel.reason = fmt::format("chosen by tuner plugin {} ({})", identity_, what);
}

}  // namespace kizuna::collectives::tuner
