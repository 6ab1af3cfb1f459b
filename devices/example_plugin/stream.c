/* Streams and events.
 *
 * Each stream is an in-order queue served by its own worker thread, as a device's queue is served
 * by the device: enqueue calls validate their arguments, append an operation and return at once;
 * the worker runs the operations one after another. A real device does the same with its command
 * queue (and runs copies and reduces on its engines, not on a CPU thread).
 *
 * The ABI's semantics, and where they live:
 *  - Sticky errors: when an operation fails on the worker, the stream keeps that error. Later
 *    copies, reduces and scales are skipped; stream_synchronize / stream_query return it; events
 *    recorded afterwards capture it; host callbacks receive it.
 *  - A stream waiting on an event whose captured work failed takes that error too: its later work
 *    depends on results that were never produced.
 *  - Events: a record is an operation in the stream's queue; when the worker reaches it, the event
 *    completes with the stream's status at that point. Records are numbered, so an event that is
 *    recorded again is pending until its latest record has run.
 *  - Host callbacks run on the worker thread, after all earlier work, exactly once, with the
 *    stream's status, even when the stream has failed (the host frees its state in them).
 *    stream_destroy returns only after every host callback of the stream has run and returned
 *    (the worker has exited), except when it gives up on a callback that does not return.
 *  - Timeouts: every wait is bounded: stream_synchronize and event_synchronize by the caller's
 *    timeout, a stream's wait for an event and both of stream_destroy's waits by the context's
 *    internal timeout (KIZUNA_TIMEOUT, default 600 s; see example_plugin.h). Waiting threads block
 *    on condition variables (CLOCK_MONOTONIC): nothing spins.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "example_plugin.h"

#define EXAMPLE_MESSAGE_BYTES 256

typedef enum example_op_kind {
  EXAMPLE_OP_COPY,
  EXAMPLE_OP_REDUCE,
  EXAMPLE_OP_SCALE,
  EXAMPLE_OP_RECORD,
  EXAMPLE_OP_WAIT_EVENT,
  EXAMPLE_OP_HOST_FN,
} example_op_kind_t;

typedef struct example_op {
  struct example_op* next;
  example_op_kind_t kind;
  int inject_fault; /* KZ_EXAMPLE_FAIL_STREAM_OP picked this operation */
  uint64_t number;  /* copies, reduces, scales: their 1-based number in the context (for messages) */
  union {
    struct {
      void* dst;
      const void* src;
      uint64_t bytes;
    } copy;
    struct {
      void* dst;
      const void** srcs; /* a copy: the caller's array may be gone by the time this runs */
      uint32_t num_srcs;
      uint64_t count;
      int32_t dtype;
      int32_t op;
    } reduce;
    struct {
      void* dst;
      const void* src;
      uint64_t count;
      int32_t dtype;
      uint32_t divisor;
    } scale;
    struct {
      struct kz_plugin_event* event; /* holds a reference */
      uint64_t generation;           /* RECORD: this record's number; WAIT: the record to wait for */
    } event;
    struct {
      kz_plugin_host_fn_t fn;
      void* user_data;
    } host_fn;
  } u;
} example_op_t;

struct kz_plugin_event {
  uint32_t magic;
  example_context_t* ctx;
  pthread_mutex_t mu; /* guards everything below */
  pthread_cond_t cv;  /* signalled when a record completes */
  uint64_t recorded;  /* records enqueued so far */
  uint64_t completed; /* the highest record that has run */
  kz_plugin_result_t status; /* of that record */
  char message[EXAMPLE_MESSAGE_BYTES];
  uint32_t refs; /* the user's handle plus queued operations that name the event */
};

struct kz_plugin_stream {
  uint32_t magic;
  example_context_t* ctx;
  int32_t device;
  pthread_t worker;
  pthread_mutex_t mu;      /* guards everything below */
  pthread_cond_t work_cv;  /* the worker waits here for operations */
  pthread_cond_t done_cv;  /* synchronize / destroy wait here for completions */
  example_op_t* head;
  example_op_t* tail;
  uint64_t enqueued;  /* operations appended so far */
  uint64_t completed; /* operations the worker has finished (run or skipped) */
  kz_plugin_result_t error; /* sticky: KZ_PLUGIN_OK until an operation fails */
  char error_message[EXAMPLE_MESSAGE_BYTES];
  int shutdown;                          /* destroy: exit once the queue is empty */
  atomic_int cancel;                     /* destroy timed out: end event waits now */
  struct kz_plugin_event* waiting_on;    /* the event the worker is blocked on, if any */
  int exited;   /* the worker has left its loop: every operation, host callbacks included, is done */
  int orphaned; /* destroy gave up waiting for the worker: the worker frees the stream on exit */
};

/* ---- time ---- */

/* An absolute CLOCK_MONOTONIC time `ns` from now (saturating far in the future). */
static struct timespec example_deadline(uint64_t ns) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  const uint64_t max_seconds = (uint64_t)1 << 40; /* ~35000 years: no time_t overflow */
  uint64_t sec = ns / 1000000000ull;
  if (sec > max_seconds) sec = max_seconds;
  t.tv_sec += (time_t)sec;
  t.tv_nsec += (long)(ns % 1000000000ull);
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec += 1;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

/* Condition variables that time out on CLOCK_MONOTONIC, so a wall-clock jump cannot stretch or
 * cut a wait. */
static void example_cond_init(pthread_cond_t* cv) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
}

/* ---- handles ---- */

static kz_plugin_result_t example_check_stream(void* context, kz_plugin_stream_t stream) {
  example_context_t* ctx = NULL;
  kz_plugin_result_t rc = example_check_context(context, &ctx);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (stream == NULL || stream->magic != EXAMPLE_STREAM_MAGIC || stream->ctx != ctx)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "%p is not a stream of this context", (void*)stream);
  return KZ_PLUGIN_OK;
}

static kz_plugin_result_t example_check_event(void* context, kz_plugin_event_t event) {
  example_context_t* ctx = NULL;
  kz_plugin_result_t rc = example_check_context(context, &ctx);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (event == NULL || event->magic != EXAMPLE_EVENT_MAGIC || event->ctx != ctx)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "%p is not an event of this context", (void*)event);
  return KZ_PLUGIN_OK;
}

static int example_on_worker(kz_plugin_stream_t stream) { return pthread_equal(pthread_self(), stream->worker); }

/* ---- events: references ---- */

static void example_event_ref(kz_plugin_event_t event) {
  pthread_mutex_lock(&event->mu);
  ++event->refs;
  pthread_mutex_unlock(&event->mu);
}

static void example_event_unref(kz_plugin_event_t event) {
  pthread_mutex_lock(&event->mu);
  const uint32_t left = --event->refs;
  pthread_mutex_unlock(&event->mu);
  if (left > 0) return;
  pthread_cond_destroy(&event->cv);
  pthread_mutex_destroy(&event->mu);
  free(event);
}

/* ---- the worker ---- */

/* Records the stream's first error (later ones are consequences of it), printf-style; a message
 * that does not fit is cut. Worker thread only. */
static void example_stream_fail(kz_plugin_stream_t stream, kz_plugin_result_t code, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
static void example_stream_fail(kz_plugin_stream_t stream, kz_plugin_result_t code, const char* format, ...) {
  pthread_mutex_lock(&stream->mu);
  if (stream->error == KZ_PLUGIN_OK) {
    stream->error = code;
    int n = snprintf(stream->error_message, sizeof stream->error_message, "stream on device %d: ", (int)stream->device);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof stream->error_message) {
      va_list args;
      va_start(args, format);
      vsnprintf(stream->error_message + n, sizeof stream->error_message - (size_t)n, format, args);
      va_end(args);
    }
  }
  pthread_mutex_unlock(&stream->mu);
}

/* The worker is the only thread that changes `error`, so it may read it without the lock. */
static int example_stream_failed(kz_plugin_stream_t stream) { return stream->error != KZ_PLUGIN_OK; }

static void example_run_wait(kz_plugin_stream_t stream, kz_plugin_event_t event, uint64_t generation) {
  /* Publish what we wait on, so that a timed-out destroy can wake us (see example_stream_destroy). */
  pthread_mutex_lock(&stream->mu);
  stream->waiting_on = event;
  pthread_mutex_unlock(&stream->mu);

  const uint64_t timeout_ns = stream->ctx->internal_timeout_ns;
  const struct timespec deadline = example_deadline(timeout_ns);
  int timed_out = 0;
  pthread_mutex_lock(&event->mu);
  while (event->completed < generation && !atomic_load(&stream->cancel) && !timed_out)
    timed_out = pthread_cond_timedwait(&event->cv, &event->mu, &deadline) == ETIMEDOUT;
  const int done = event->completed >= generation;
  const kz_plugin_result_t status = event->status;
  char message[EXAMPLE_MESSAGE_BYTES];
  memcpy(message, event->message, sizeof message);
  pthread_mutex_unlock(&event->mu);

  pthread_mutex_lock(&stream->mu);
  stream->waiting_on = NULL;
  pthread_mutex_unlock(&stream->mu);

  if (!done && atomic_load(&stream->cancel)) {
    example_stream_fail(stream, KZ_PLUGIN_ERR_ABORTED, "stream destroyed while waiting for an event");
  } else if (!done) {
    example_stream_fail(stream, KZ_PLUGIN_ERR_TIMEOUT,
                        "waited %.3f s (KIZUNA_TIMEOUT) for an event recorded on another stream; is there a cycle?",
                        (double)timeout_ns / 1e9);
  } else if (status != KZ_PLUGIN_OK) {
    example_stream_fail(stream, status, "waited on an event whose work failed (%s)", message);
  }
}

static void example_run(kz_plugin_stream_t stream, example_op_t* op) {
  /* A destroy that gave up waiting: what is left is skipped, and host callbacks learn why. */
  if (atomic_load(&stream->cancel) && !example_stream_failed(stream))
    example_stream_fail(stream, KZ_PLUGIN_ERR_ABORTED, "stream destroyed before this work ran");
  switch (op->kind) {
    case EXAMPLE_OP_COPY:
    case EXAMPLE_OP_REDUCE:
    case EXAMPLE_OP_SCALE:
      if (example_stream_failed(stream)) break; /* sticky: skipped */
      if (op->inject_fault) {
        example_stream_fail(stream, KZ_PLUGIN_ERR_INTERNAL,
                            "injected fault: stream operation #%llu failed (KZ_EXAMPLE_FAIL_STREAM_OP)",
                            (unsigned long long)op->number);
        break;
      }
      if (op->kind == EXAMPLE_OP_COPY)
        memcpy(op->u.copy.dst, op->u.copy.src, (size_t)op->u.copy.bytes);
      else if (op->kind == EXAMPLE_OP_REDUCE)
        example_reduce(op->u.reduce.dst, (const void* const*)op->u.reduce.srcs, op->u.reduce.num_srcs,
                       op->u.reduce.count, op->u.reduce.dtype, op->u.reduce.op);
      else
        example_scale(op->u.scale.dst, op->u.scale.src, op->u.scale.count, op->u.scale.dtype, op->u.scale.divisor);
      break;
    case EXAMPLE_OP_RECORD: {
      kz_plugin_event_t event = op->u.event.event;
      pthread_mutex_lock(&stream->mu); /* a consistent (error, message) pair */
      const kz_plugin_result_t status = stream->error;
      char message[EXAMPLE_MESSAGE_BYTES];
      memcpy(message, stream->error_message, sizeof message);
      pthread_mutex_unlock(&stream->mu);
      pthread_mutex_lock(&event->mu);
      /* Records of one event on two streams may finish out of order; the latest record wins. */
      if (op->u.event.generation > event->completed) {
        event->completed = op->u.event.generation;
        event->status = status;
        memcpy(event->message, message, sizeof message);
      }
      pthread_cond_broadcast(&event->cv);
      pthread_mutex_unlock(&event->mu);
      break;
    }
    case EXAMPLE_OP_WAIT_EVENT:
      if (!example_stream_failed(stream)) example_run_wait(stream, op->u.event.event, op->u.event.generation);
      break;
    case EXAMPLE_OP_HOST_FN:
      op->u.host_fn.fn(op->u.host_fn.user_data, stream->error);
      break;
  }
}

static void example_op_free(example_op_t* op) {
  if (op->kind == EXAMPLE_OP_REDUCE) free(op->u.reduce.srcs);
  if (op->kind == EXAMPLE_OP_RECORD || op->kind == EXAMPLE_OP_WAIT_EVENT) example_event_unref(op->u.event.event);
  free(op);
}

/* Releases what stream_create made. The worker must have exited (or be exiting: see orphaned). */
static void example_stream_free(kz_plugin_stream_t stream) {
  pthread_cond_destroy(&stream->done_cv);
  pthread_cond_destroy(&stream->work_cv);
  pthread_mutex_destroy(&stream->mu);
  free(stream);
}

static void* example_worker_main(void* arg) {
  kz_plugin_stream_t stream = (kz_plugin_stream_t)arg;
  pthread_mutex_lock(&stream->mu);
  for (;;) {
    /* Idle until there is work: blocked on the condition variable, not spinning. */
    while (stream->head == NULL && !stream->shutdown) pthread_cond_wait(&stream->work_cv, &stream->mu);
    if (stream->head == NULL) break; /* shut down and drained */
    example_op_t* op = stream->head;
    stream->head = op->next;
    if (stream->head == NULL) stream->tail = NULL;
    pthread_mutex_unlock(&stream->mu);

    example_run(stream, op);
    example_op_free(op);

    pthread_mutex_lock(&stream->mu);
    ++stream->completed;
    pthread_cond_broadcast(&stream->done_cv);
  }
  /* Tell stream_destroy that the last host callback has returned; or, if it stopped waiting for
   * that, free the stream ourselves (the worker is detached by then, so nobody joins it). Both
   * happen under the lock, so exactly one side frees the stream. */
  stream->exited = 1;
  const int orphaned = stream->orphaned;
  pthread_cond_broadcast(&stream->done_cv);
  pthread_mutex_unlock(&stream->mu);
  if (orphaned) example_stream_free(stream);
  return NULL;
}

/* Appends `op` (the stream takes it) and wakes the worker. */
static void example_enqueue(kz_plugin_stream_t stream, example_op_t* op) {
  op->next = NULL;
  pthread_mutex_lock(&stream->mu);
  if (stream->tail != NULL)
    stream->tail->next = op;
  else
    stream->head = op;
  stream->tail = op;
  ++stream->enqueued;
  pthread_cond_signal(&stream->work_cv);
  pthread_mutex_unlock(&stream->mu);
}

static example_op_t* example_op_new(example_op_kind_t kind) {
  example_op_t* op = (example_op_t*)calloc(1, sizeof *op);
  if (op != NULL) op->kind = kind;
  return op;
}

/* Copies, reduces and scales are counted for fault injection when they are enqueued, so the k-th
 * one is the same operation however the workers are scheduled. */
static void example_count_stream_op(kz_plugin_stream_t stream, example_op_t* op) {
  op->number = atomic_fetch_add(&stream->ctx->stream_ops, 1) + 1;
  op->inject_fault = stream->ctx->fail_stream_op != 0 && op->number == stream->ctx->fail_stream_op;
}

/* ---- streams ---- */

kz_plugin_result_t example_stream_create(void* context, int32_t device, kz_plugin_stream_t* stream) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (stream == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_create: stream is NULL");
  kz_plugin_stream_t s = (kz_plugin_stream_t)calloc(1, sizeof *s);
  if (s == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "stream_create: out of host memory");
  s->ctx = (example_context_t*)context;
  s->device = device;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL); /* the worker's idle wait has no deadline */
  example_cond_init(&s->done_cv);
  atomic_init(&s->cancel, 0);
  s->error = KZ_PLUGIN_OK;
  const int err = pthread_create(&s->worker, NULL, example_worker_main, s);
  if (err != 0) {
    example_stream_free(s);
    return example_error(err == EAGAIN ? KZ_PLUGIN_ERR_OUT_OF_MEMORY : KZ_PLUGIN_ERR_INTERNAL,
                         "stream_create: cannot start the stream's thread: %s", strerror(err));
  }
  s->magic = EXAMPLE_STREAM_MAGIC;
  *stream = s;
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_stream_destroy(void* context, kz_plugin_stream_t stream) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  /* The worker cannot join itself, and the ABI says a host never does this (kizuna hands such a
   * destroy to a thread of its own); refuse rather than deadlock. */
  if (example_on_worker(stream))
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT,
                         "stream_destroy called from the stream's own host callback (the ABI forbids it: the "
                         "stream's thread cannot wait for itself)");

  /* The ABI gives stream_destroy no timeout: both waits below are bounded by the plugin's own. */
  const uint64_t timeout_ns = stream->ctx->internal_timeout_ns;

  /* Let queued work finish, for a bounded time. */
  const struct timespec deadline = example_deadline(timeout_ns);
  int timed_out = 0;
  pthread_mutex_lock(&stream->mu);
  while (stream->completed < stream->enqueued && !timed_out)
    timed_out = pthread_cond_timedwait(&stream->done_cv, &stream->mu, &deadline) == ETIMEDOUT;
  const uint64_t pending = stream->enqueued - stream->completed;
  stream->shutdown = 1;
  pthread_cond_signal(&stream->work_cv);
  pthread_mutex_unlock(&stream->mu);

  if (timed_out) {
    /* Cut a wait for an event short (what can take this long), so the worker drains the rest as
     * skipped work and its host callbacks still run, with KZ_PLUGIN_ERR_ABORTED. The cancel flag
     * is set before the event's lock is taken, and the worker checks it under that lock, so the
     * wake-up cannot be lost. */
    atomic_store(&stream->cancel, 1);
    pthread_mutex_lock(&stream->mu);
    kz_plugin_event_t event = stream->waiting_on;
    if (event != NULL) {
      pthread_mutex_lock(&event->mu);
      pthread_cond_broadcast(&event->cv);
      pthread_mutex_unlock(&event->mu);
    }
    pthread_mutex_unlock(&stream->mu);
  }

  /* Wait for the worker to leave its loop: after a cancel it skips what is left and runs only the
   * host callbacks, so this second wait is long only while a callback does not return. It is
   * bounded too; if it runs out, the stream is left to its worker, which frees it when that
   * callback finally returns, and the caller learns (KZ_PLUGIN_ERR_TIMEOUT) that a thread of the
   * plugin is still running: it must then neither finalize the context nor unload the library. */
  const struct timespec exit_deadline = example_deadline(timeout_ns);
  int exit_timed_out = 0;
  pthread_mutex_lock(&stream->mu);
  while (!stream->exited && !exit_timed_out)
    exit_timed_out = pthread_cond_timedwait(&stream->done_cv, &stream->mu, &exit_deadline) == ETIMEDOUT;
  const int exited = stream->exited;
  const pthread_t worker = stream->worker;
  stream->magic = 0; /* a stale handle from here on, whoever frees the memory */
  if (!exited) stream->orphaned = 1;
  pthread_mutex_unlock(&stream->mu);

  if (!exited) {
    /* The worker may free the stream at any moment now: it is not touched again. */
    pthread_detach(worker);
    return example_error(KZ_PLUGIN_ERR_TIMEOUT,
                         "stream_destroy: a host callback of the stream has not returned %.3f s after the stream "
                         "was cancelled (KIZUNA_TIMEOUT); the stream's thread is left to finish it and free the "
                         "stream, so the plugin must stay loaded",
                         (double)timeout_ns / 1e9);
  }
  pthread_join(worker, NULL);
  example_stream_free(stream);
  if (timed_out)
    return example_error(KZ_PLUGIN_ERR_TIMEOUT,
                         "stream_destroy: %llu operations still pending after %.3f s (KIZUNA_TIMEOUT); cancelled",
                         (unsigned long long)pending, (double)timeout_ns / 1e9);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_stream_copy(void* context, kz_plugin_stream_t stream, void* dst, const void* src,
                                       uint64_t bytes) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (bytes == 0) return KZ_PLUGIN_OK;
  if (dst == NULL || src == NULL)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_copy: %s is NULL", dst == NULL ? "dst" : "src");
  const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (bytes > UINTPTR_MAX - d || bytes > UINTPTR_MAX - s)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_copy: %llu bytes run past the address space",
                         (unsigned long long)bytes);
  if (d < s + bytes && s < d + bytes)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_copy: source and destination overlap");
  example_op_t* op = example_op_new(EXAMPLE_OP_COPY);
  if (op == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "stream_copy: out of host memory");
  op->u.copy.dst = dst;
  op->u.copy.src = src;
  op->u.copy.bytes = bytes;
  example_count_stream_op(stream, op);
  example_enqueue(stream, op);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_stream_reduce(void* context, kz_plugin_stream_t stream, void* dst,
                                         const void* const* srcs, uint32_t num_srcs, uint64_t count, int32_t dtype,
                                         int32_t op_code) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  const uint64_t esize = example_dtype_size(dtype);
  if (esize == 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: unknown dtype %d", (int)dtype);
  if (op_code < KZ_PLUGIN_SUM || op_code > KZ_PLUGIN_AVG)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: unknown op %d", (int)op_code);
  if (num_srcs == 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: num_srcs is 0");
  if (srcs == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: srcs is NULL");
  if (count == 0) return KZ_PLUGIN_OK;
  if (dst == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: dst is NULL");
  if (count > UINT64_MAX / esize || count * esize > UINTPTR_MAX - (uintptr_t)dst)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: count %llu overflows the address space",
                         (unsigned long long)count);
  const uint64_t bytes = count * esize;
  const uintptr_t d = (uintptr_t)dst;
  for (uint32_t k = 0; k < num_srcs; ++k) {
    const uintptr_t s = (uintptr_t)srcs[k];
    if (srcs[k] == NULL)
      return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: input %u is NULL", (unsigned)k);
    if (bytes > UINTPTR_MAX - s)
      return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: input %u runs past the address space",
                           (unsigned)k);
    /* In place (dst == an input) is allowed; any other overlap would read half-written data. */
    if (s != d && d < s + bytes && s < d + bytes)
      return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_reduce: input %u partially overlaps dst",
                           (unsigned)k);
  }
  example_op_t* op = example_op_new(EXAMPLE_OP_REDUCE);
  const void** copy = (const void**)malloc((size_t)num_srcs * sizeof *copy);
  if (op == NULL || copy == NULL) {
    free(op);
    free(copy);
    return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "stream_reduce: out of host memory");
  }
  memcpy(copy, srcs, (size_t)num_srcs * sizeof *copy);
  op->u.reduce.dst = dst;
  op->u.reduce.srcs = copy;
  op->u.reduce.num_srcs = num_srcs;
  op->u.reduce.count = count;
  op->u.reduce.dtype = dtype;
  op->u.reduce.op = op_code;
  example_count_stream_op(stream, op);
  example_enqueue(stream, op);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_stream_scale(void* context, kz_plugin_stream_t stream, void* dst, const void* src,
                                        uint64_t count, int32_t dtype, uint32_t divisor) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  const uint64_t esize = example_dtype_size(dtype);
  if (esize == 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_scale: unknown dtype %d", (int)dtype);
  if (divisor == 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_scale: divisor is 0");
  if (count == 0) return KZ_PLUGIN_OK;
  if (dst == NULL || src == NULL)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_scale: %s is NULL", dst == NULL ? "dst" : "src");
  const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (count > UINT64_MAX / esize || count * esize > UINTPTR_MAX - d || count * esize > UINTPTR_MAX - s)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_scale: count %llu overflows the address space",
                         (unsigned long long)count);
  const uint64_t bytes = count * esize;
  /* In place (dst == src) is allowed; any other overlap would read what was already divided. */
  if (s != d && d < s + bytes && s < d + bytes)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_scale: src partially overlaps dst");
  example_op_t* op = example_op_new(EXAMPLE_OP_SCALE);
  if (op == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "stream_scale: out of host memory");
  op->u.scale.dst = dst;
  op->u.scale.src = src;
  op->u.scale.count = count;
  op->u.scale.dtype = dtype;
  op->u.scale.divisor = divisor;
  example_count_stream_op(stream, op);
  example_enqueue(stream, op);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_stream_host_callback(void* context, kz_plugin_stream_t stream, kz_plugin_host_fn_t fn,
                                                void* user_data) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (fn == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "stream_host_callback: fn is NULL");
  example_op_t* op = example_op_new(EXAMPLE_OP_HOST_FN);
  if (op == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "stream_host_callback: out of host memory");
  op->u.host_fn.fn = fn;
  op->u.host_fn.user_data = user_data;
  example_enqueue(stream, op);
  return KZ_PLUGIN_OK;
}

/* Copies the stream's error into this thread's last_error and returns it. */
static kz_plugin_result_t example_stream_report(kz_plugin_stream_t stream) {
  /* Called with stream->mu held. */
  if (stream->error == KZ_PLUGIN_OK) return KZ_PLUGIN_OK;
  return example_error(stream->error, "%s", stream->error_message);
}

kz_plugin_result_t example_stream_synchronize(void* context, kz_plugin_stream_t stream, uint64_t timeout_ns) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (example_on_worker(stream))
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT,
                         "stream_synchronize called from the stream's own host callback (it would wait for itself)");
  const struct timespec deadline = example_deadline(timeout_ns);
  int timed_out = 0;
  pthread_mutex_lock(&stream->mu);
  /* Work enqueued after this call started is not waited for. */
  const uint64_t target = stream->enqueued;
  while (stream->completed < target && !timed_out)
    timed_out = pthread_cond_timedwait(&stream->done_cv, &stream->mu, &deadline) == ETIMEDOUT;
  if (stream->completed < target) {
    const uint64_t pending = target - stream->completed;
    pthread_mutex_unlock(&stream->mu);
    return example_error(KZ_PLUGIN_ERR_TIMEOUT, "stream_synchronize: %llu operations still pending after %.3f s",
                         (unsigned long long)pending, (double)timeout_ns / 1e9);
  }
  rc = example_stream_report(stream);
  pthread_mutex_unlock(&stream->mu);
  return rc;
}

kz_plugin_result_t example_stream_query(void* context, kz_plugin_stream_t stream) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  pthread_mutex_lock(&stream->mu);
  /* A known error is reported at once; there is no point waiting for the skipped rest. */
  rc = stream->error != KZ_PLUGIN_OK          ? example_stream_report(stream)
       : stream->completed < stream->enqueued ? KZ_PLUGIN_NOT_READY
                                              : KZ_PLUGIN_OK;
  pthread_mutex_unlock(&stream->mu);
  return rc;
}

/* ---- events ---- */

kz_plugin_result_t example_event_create(void* context, int32_t device, kz_plugin_event_t* event) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (event == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "event_create: event is NULL");
  kz_plugin_event_t e = (kz_plugin_event_t)calloc(1, sizeof *e);
  if (e == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "event_create: out of host memory");
  e->ctx = (example_context_t*)context;
  pthread_mutex_init(&e->mu, NULL);
  example_cond_init(&e->cv);
  e->status = KZ_PLUGIN_OK;
  e->refs = 1;
  e->magic = EXAMPLE_EVENT_MAGIC;
  *event = e;
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_event_destroy(void* context, kz_plugin_event_t event) {
  kz_plugin_result_t rc = example_check_event(context, event);
  if (rc != KZ_PLUGIN_OK) return rc;
  /* Queued records and waits hold their own references: the memory lives until they have run,
   * as destroying a CUDA event with work outstanding is allowed. */
  event->magic = 0;
  example_event_unref(event);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_event_record(void* context, kz_plugin_event_t event, kz_plugin_stream_t stream) {
  kz_plugin_result_t rc = example_check_event(context, event);
  if (rc != KZ_PLUGIN_OK) return rc;
  rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  example_op_t* op = example_op_new(EXAMPLE_OP_RECORD);
  if (op == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "event_record: out of host memory");
  pthread_mutex_lock(&event->mu);
  op->u.event.generation = ++event->recorded;
  ++event->refs;
  pthread_mutex_unlock(&event->mu);
  op->u.event.event = event;
  example_enqueue(stream, op);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_stream_wait_event(void* context, kz_plugin_stream_t stream, kz_plugin_event_t event) {
  kz_plugin_result_t rc = example_check_stream(context, stream);
  if (rc != KZ_PLUGIN_OK) return rc;
  rc = example_check_event(context, event);
  if (rc != KZ_PLUGIN_OK) return rc;
  pthread_mutex_lock(&event->mu);
  const uint64_t generation = event->recorded; /* the latest record as of now; 0: never recorded */
  pthread_mutex_unlock(&event->mu);
  if (generation == 0) return KZ_PLUGIN_OK; /* an unrecorded event: no wait */
  example_op_t* op = example_op_new(EXAMPLE_OP_WAIT_EVENT);
  if (op == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "stream_wait_event: out of host memory");
  example_event_ref(event);
  op->u.event.event = event;
  op->u.event.generation = generation;
  example_enqueue(stream, op);
  return KZ_PLUGIN_OK;
}

/* Copies the event's error into this thread's last_error. Called with event->mu held. */
static kz_plugin_result_t example_event_report(kz_plugin_event_t event) {
  if (event->status == KZ_PLUGIN_OK) return KZ_PLUGIN_OK;
  return example_error(event->status, "%s", event->message);
}

kz_plugin_result_t example_event_query(void* context, kz_plugin_event_t event) {
  kz_plugin_result_t rc = example_check_event(context, event);
  if (rc != KZ_PLUGIN_OK) return rc;
  pthread_mutex_lock(&event->mu);
  rc = event->completed < event->recorded ? KZ_PLUGIN_NOT_READY : example_event_report(event);
  pthread_mutex_unlock(&event->mu);
  return rc;
}

kz_plugin_result_t example_event_synchronize(void* context, kz_plugin_event_t event, uint64_t timeout_ns) {
  kz_plugin_result_t rc = example_check_event(context, event);
  if (rc != KZ_PLUGIN_OK) return rc;
  const struct timespec deadline = example_deadline(timeout_ns);
  int timed_out = 0;
  pthread_mutex_lock(&event->mu);
  const uint64_t target = event->recorded;
  while (event->completed < target && !timed_out)
    timed_out = pthread_cond_timedwait(&event->cv, &event->mu, &deadline) == ETIMEDOUT;
  if (event->completed < target) {
    pthread_mutex_unlock(&event->mu);
    return example_error(KZ_PLUGIN_ERR_TIMEOUT, "event_synchronize: the recorded work is still pending after %.3f s",
                         (double)timeout_ns / 1e9);
  }
  rc = example_event_report(event);
  pthread_mutex_unlock(&event->mu);
  return rc;
}
