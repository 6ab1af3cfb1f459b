/* kizuna tuner plugin ABI — the one header an operator's algorithm tuner is built against.
 *
 * A plugin is a shared library exporting one C function, kzTunerPluginGetApi, that returns a table
 * of function pointers. kizuna loads it with dlopen from the path in KIZUNA_TUNER_PLUGIN when a
 * communicator is created and, for each collective it plans, shows it the cost model's candidates
 * and lets it choose one (collectives/tuner/README.md). Start from collectives/tuner/example_plugin/.
 *
 * The calls follow NCCL's tuner plugin (ncclTuner_t in ext-tuner/ of NCCL's repository):
 *
 *   ncclTuner_t    kz_tuner_plugin_api_t
 *   init           init (rank, ranks, hosts, a log callback) -> context
 *   getCollInfo    get_coll_info (the call, the model's candidates) -> decision
 *   destroy        finalize
 *
 * Differences from ncclTuner_t, on purpose: the plugin picks one of kizuna's candidates (by index
 * or by name) instead of editing a cost table; kizuna fills the decision with its own choice before
 * the call, so a plugin without an opinion returns it untouched; every error carries a message
 * (last_error).
 *
 * Where the plugin stands (collectives/cost/selector.h): the call's own algorithm option wins,
 * then KIZUNA_ALGO; kizuna does not ask the plugin about a collective either of them names an
 * algorithm for. Otherwise the plugin's valid answer wins over the model's cheapest candidate.
 *
 * Versioning (as the device and fabric plugin ABIs, PJRT and NCCL's plugins do it):
 *  - Every struct starts with struct_size, set by whoever fills the struct to sizeof() of its
 *    version of the struct. Fields are only ever appended; the reader uses a field only when
 *    struct_size shows it is present.
 *  - api_major changes on any incompatible change; kizuna refuses a plugin whose major differs
 *    (communicator creation fails with an error naming both versions). api_minor grows when fields
 *    are appended; a plugin with a newer minor works with an older kizuna (the extra fields are
 *    ignored), and an older one works with a newer kizuna (missing fields count as "not given").
 *
 * Rules:
 *  - Deterministic. Every rank must choose the same algorithm, chunk and channels for the same
 *    call, or the ranks run different plans (the operation fails, at best). get_coll_info must be
 *    a pure function of its arguments and of what init was given, the rank excepted: no clocks,
 *    no randomness, no files or environment read per call, no measurements of this rank alone.
 *    Every rank must load the same plugin: ranks compare its name and version when the
 *    communicator forms, and a rank with another plugin, or none, fails creation naming both.
 *  - kizuna asks when it plans a call, not on every call: a plan is kept per distinct call
 *    (collective, count, type, operator, root, in place, grouped) and reused, so an answer that
 *    changes later is not seen for calls already planned.
 *  - kizuna checks every answer: a candidate index out of range, a name that is no candidate's, a
 *    candidate that cannot serve the call, a chunk or channel count out of range, or an error code
 *    from get_coll_info is refused with a warning (one per kind of fault) and the model's choice
 *    is used. A call never fails because of its plugin's answer.
 *  - Every function but finalize returns KZ_TUNER_OK or an error code; after an error,
 *    last_error() called on the same thread returns a message naming what went wrong (valid until
 *    the next call). An error from init fails communicator creation with that message.
 *  - Threading: kizuna calls get_coll_info on one context one call at a time; different contexts
 *    (one per communicator: several per process when a process drives several ranks or splits a
 *    communicator) may be called at once from different threads, so contexts must not share
 *    mutable state. get_coll_info runs on the application's thread while it plans a call: return
 *    quickly, and do not call into kizuna other than through the log callback.
 *  - No C++ exceptions, no longjmp across this boundary.
 */
#ifndef KIZUNA_TUNER_PLUGIN_H_
#define KIZUNA_TUNER_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KZ_TUNER_PLUGIN_API_MAJOR 1
#define KZ_TUNER_PLUGIN_API_MINOR 0
#define KZ_TUNER_PLUGIN_ENTRY_POINT "kzTunerPluginGetApi"

/* Result codes (the values of the device and fabric plugin ABIs for the same meanings). */
typedef int32_t kz_tuner_result_t;
#define KZ_TUNER_OK 0
#define KZ_TUNER_ERR_INVALID_ARGUMENT 1
#define KZ_TUNER_ERR_NOT_SUPPORTED 3
#define KZ_TUNER_ERR_OUT_OF_MEMORY 4
#define KZ_TUNER_ERR_INTERNAL 8

/* Collectives (values match kizuna::collectives::Collective). kizuna does not ask about send and
 * recv, which have one algorithm. */
#define KZ_TUNER_ALLREDUCE 0
#define KZ_TUNER_REDUCESCATTER 1
#define KZ_TUNER_ALLGATHER 2
#define KZ_TUNER_BROADCAST 3
#define KZ_TUNER_REDUCE 4
#define KZ_TUNER_ALLTOALL 5
#define KZ_TUNER_BARRIER 8

/* Element types (values match kizuna::DataType). */
#define KZ_TUNER_FLOAT16 0
#define KZ_TUNER_BFLOAT16 1
#define KZ_TUNER_FLOAT32 2
#define KZ_TUNER_FLOAT64 3
#define KZ_TUNER_INT8 4
#define KZ_TUNER_UINT8 5
#define KZ_TUNER_INT32 6
#define KZ_TUNER_UINT32 7
#define KZ_TUNER_INT64 8
#define KZ_TUNER_UINT64 9

/* What kizuna accepts in a decision (see kz_tuner_decision_t). */
#define KZ_TUNER_MAX_CHUNK_BYTES (UINT64_C(1) << 30)
#define KZ_TUNER_MAX_CHANNELS 16

/* Log levels for the log callback (values match kizuna::LogLevel). */
#define KZ_TUNER_LOG_WARN 1
#define KZ_TUNER_LOG_INFO 2
#define KZ_TUNER_LOG_TRACE 3

/* Writes one line to kizuna's log (subsystem TUNE, KIZUNA_DEBUG / KIZUNA_DEBUG_SUBSYS filter it),
 * prefixed with the plugin's name. `log_context` is init's args->log_context. Valid from init
 * until finalize returns, from any thread; the message is copied during the call. */
typedef void (*kz_tuner_log_fn_t)(void* log_context, int32_t level, const char* message);

/* What kizuna tells init about the communicator. Valid during init only (copy what you keep). */
typedef struct kz_tuner_init_args {
  size_t struct_size;     /* set by kizuna */
  int32_t rank;           /* this rank (for logs: answers must not depend on it) */
  int32_t nranks;         /* ranks of the communicator */
  int32_t nhosts;         /* hosts they run on */
  int32_t ranks_per_host; /* the most ranks on one host */
  kz_tuner_log_fn_t log;  /* never NULL */
  void* log_context;      /* passed back to log */
} kz_tuner_init_args_t;

/* One collective as kizuna is about to plan it, and the cost model's candidates: every algorithm
 * kizuna has, in kizuna's order, which only grows at the end (match names, not positions, to stay
 * independent of it). Valid during get_coll_info only. */
typedef struct kz_tuner_call {
  size_t struct_size; /* set by kizuna */
  int32_t collective; /* KZ_TUNER_ALLREDUCE, ... */
  int32_t dtype;      /* KZ_TUNER_FLOAT32, ... */
  uint64_t bytes;     /* the larger of one rank's input and output buffers, in bytes */
  int32_t nranks;
  int32_t nhosts;
  int32_t ranks_per_host;
  uint32_t num_candidates;
  /* num_candidates entries each: the algorithm's name as KIZUNA_ALGO spells it ("ring",
   * "hier:pairwise/ring"); 1 when it can serve this call, 0 when it cannot (choosing it is
   * refused); the model's predicted time in microseconds (+infinity when it cannot serve the
   * call or the model cannot predict it). */
  const char* const* candidate_names;
  const int32_t* candidate_supported;
  const double* candidate_predicted_us;
} kz_tuner_call_t;

/* kizuna's choice, filled in before get_coll_info; the plugin changes what it wants to. The plugin
 * writes only fields inside struct_size and leaves struct_size as it is. */
typedef struct kz_tuner_decision {
  size_t struct_size; /* set by kizuna */
  /* In: the model's choice. Out: the index of the candidate to run, in [0, num_candidates). */
  int32_t candidate;
  /* In: NULL. Out: optionally a candidate's name ("ring"), which then wins over `candidate`. The
   * string must stay valid until get_coll_info returns. */
  const char* algorithm;
  /* In: the largest step kizuna can stage for this call, in bytes. Out: the largest step to use:
   * at least one element, at most KZ_TUNER_MAX_CHUNK_BYTES; a value above kizuna's is cut to it
   * (its staging slots hold no more). Smaller chunks pipeline more finely and cost more steps. */
  uint64_t chunk_bytes;
  /* In: the channels kizuna would use. Out: channels to spread the call over, 1 to
   * KZ_TUNER_MAX_CHANNELS. An algorithm may use fewer (never more channels than elements; fused
   * is one pass); kizuna sizes its staging slots for the channels the plans use. */
  int32_t channels;
} kz_tuner_decision_t;

typedef struct kz_tuner_plugin_api {
  size_t struct_size;  /* sizeof(kz_tuner_plugin_api_t) as the plugin was built */
  uint32_t api_major;  /* KZ_TUNER_PLUGIN_API_MAJOR the plugin was built with */
  uint32_t api_minor;  /* KZ_TUNER_PLUGIN_API_MINOR the plugin was built with */
  const char* name;    /* [a-z0-9_]+; with version, what ranks compare at creation */
  const char* version; /* the plugin's own version, free text */

  /* ---- api 1.0: all required ---- */
  const char* (*last_error)(void);
  /* Creates the plugin's context for one rank of a communicator (*context may be set to NULL for
   * a plugin without state). Called once per communicator, when it is created. */
  kz_tuner_result_t (*init)(const kz_tuner_init_args_t* args, void** context);
  /* Called once per context that init created, when its communicator is destroyed. */
  void (*finalize)(void* context);
  /* Chooses for one call (see the rules above). KZ_TUNER_OK with `decision` as kizuna filled it
   * keeps kizuna's choice. */
  kz_tuner_result_t (*get_coll_info)(void* context, const kz_tuner_call_t* call, kz_tuner_decision_t* decision);
  /* ---- append api 1.1 fields below this line ---- */
} kz_tuner_plugin_api_t;

/* The entry point. kizuna passes its own api version; a plugin may return NULL when it cannot
 * serve that version (kizuna then reports the mismatch). */
typedef const kz_tuner_plugin_api_t* (*kz_tuner_plugin_get_api_fn)(uint32_t host_api_major, uint32_t host_api_minor);
const kz_tuner_plugin_api_t* kzTunerPluginGetApi(uint32_t host_api_major, uint32_t host_api_minor);

#ifdef __cplusplus
}
#endif

#endif /* KIZUNA_TUNER_PLUGIN_H_ */
