/* The example fabric plugin's internal declarations: TCP sockets over the loopback interface.
 *
 * The simplest real fabric: one device (127.0.0.1), host memory only, tagged send/receive, no
 * one-sided writes. Every socket is non-blocking; bytes move inside isend/irecv/test/wait, on the
 * calling thread (the ABI's comms are used by one thread at a time, so a comm needs no lock).
 *
 * Wire protocol (all integers little-endian), per connection:
 *   hello   connector -> listener: "KZTH", version u32, token[16]       (24 bytes)
 *   ack     listener -> connector: "KZTA"                                (4 bytes)
 *   frames  24 bytes each: type u32, tag i32, id u64, size u64
 *     POSTED  receiver -> sender: receive `id` for `tag` is posted and holds `size` bytes
 *     DATA    sender -> receiver: `size` payload bytes for receive `id` follow the frame
 *     TRUNC   sender -> receiver: the message matched with receive `id` has `size` bytes, too many
 * Receives announce themselves as they are posted; the sender pairs its sends with them per tag, in
 * posting order on both sides, and writes each payload straight into the socket. So a send
 * completes on the sender's progress alone once its receive is announced (no reply to wait for), a
 * message waiting on one tag never holds up another, and a message longer than its receive fails
 * both sides, naming both sizes, without moving a byte while the connection stays usable.
 */
#ifndef KIZUNA_FABRIC_EXAMPLE_PLUGIN_EXAMPLE_FABRIC_H_
#define KIZUNA_FABRIC_EXAMPLE_PLUGIN_EXAMPLE_FABRIC_H_

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "fabric/kizuna_fabric_plugin.h"

#define XF_CONTEXT_MAGIC 0x6b7a6678u /* "xfzk" */
#define XF_LISTEN_MAGIC 0x6b7a666cu
#define XF_COMM_MAGIC 0x6b7a6663u
#define XF_REQUEST_MAGIC 0x6b7a6672u
#define XF_MR_MAGIC 0x6b7a666du
#define XF_CONNECT_MAGIC 0x6b7a666bu

#define XF_TOKEN_BYTES 16
#define XF_HANDLE_BYTES 28 /* "KZTF", version u8, family u8, port u16 (network), ipv4 (network), token */
#define XF_HELLO_BYTES 24
#define XF_ACK_BYTES 4
#define XF_FRAME_BYTES 24
#define XF_MAX_PENDING 16 /* unfinished hellos a listener holds; the oldest is dropped beyond it */

#define XF_MAX_REQUESTS 32
/* Sizes are 64-bit on the wire; the bound only keeps a corrupt header from announcing exabytes. */
#define XF_MAX_MESSAGE_BYTES (UINT64_C(1) << 32)

typedef struct xf_context {
  uint32_t magic;
  uint64_t timeout_ns; /* KIZUNA_TIMEOUT, bounds the connection handshake */
} xf_context_t;

/* A connection attempt the listener has accepted but whose hello has not fully arrived. */
typedef struct xf_pending {
  int fd;
  size_t got;
  uint8_t hello[XF_HELLO_BYTES];
} xf_pending_t;

typedef struct kz_fabric_listen_comm {
  uint32_t magic;
  xf_context_t* ctx;
  int fd;
  uint8_t token[XF_TOKEN_BYTES];
  xf_pending_t pending[XF_MAX_PENDING];
  int npending;
} xf_listen_t;

typedef struct kz_fabric_connect_state {
  uint32_t magic;
  int fd;
  int phase; /* XF_CONNECTING, XF_SENDING_HELLO, XF_WAITING_ACK */
  uint8_t hello[XF_HELLO_BYTES];
  size_t sent;
  uint8_t ack[XF_ACK_BYTES];
  size_t got;
  struct timespec started;
} xf_connect_t;

enum { XF_CONNECTING = 0, XF_SENDING_HELLO = 1, XF_WAITING_ACK = 2 };

enum { XF_FRAME_POSTED = 1, XF_FRAME_DATA = 2, XF_FRAME_TRUNC = 3 };

/* Request states. Sends: UNMATCHED -> SENDING -> DONE; receives: POSTED -> MATCHED (payload
 * arriving) -> DONE; either may end in FAILED. */
enum { XF_POSTED = 0, XF_UNMATCHED = 1, XF_MATCHED = 2, XF_SENDING = 3, XF_DONE = 4, XF_FAILED = 5 };

typedef struct xf_comm xf_comm_t;

typedef struct kz_fabric_request {
  uint32_t magic;
  xf_comm_t* comm;
  struct kz_fabric_request* next; /* the comm's requests, in posting order */
  struct kz_fabric_request* prev;
  int state;
  uint64_t id;    /* receives: the id announced to the sender */
  int32_t tag;
  uint8_t* data;
  uint64_t size;  /* sends: the message's size; receives: the capacity */
  uint64_t done_bytes;
  kz_fabric_result_t error;
  char message[256];
} xf_request_t;

typedef struct kz_fabric_mr {
  uint32_t magic;
  xf_comm_t* comm;
  struct kz_fabric_mr* next;
  uint8_t* data;
  uint64_t size;
} xf_mr_t;

/* A queued piece of outbound stream: a frame (copied into `frame`) or a payload (the user's
 * buffer, sent without a copy in this process). */
typedef struct xf_segment {
  struct xf_segment* next;
  const uint8_t* ptr;
  uint64_t len;
  uint64_t off;
  xf_request_t* completes; /* a send that is done once this segment is fully written */
  uint8_t frame[XF_FRAME_BYTES];
} xf_segment_t;

/* Send side: a receive the peer announced that no send has matched yet. */
typedef struct xf_arrival {
  struct xf_arrival* next;
  uint64_t id;
  int32_t tag;
  uint64_t size;
} xf_arrival_t;

/* Send and receive comms share this layout (the ABI's two handle types both point to one). */
struct xf_comm {
  uint32_t magic;
  int is_send;
  int fd;
  xf_context_t* ctx;
  int broken;
  kz_fabric_result_t broken_error;
  char broken_message[200];
  uint64_t next_id;
  xf_request_t* head;
  xf_request_t* tail;
  int nrequests;
  xf_mr_t* mrs;
  xf_segment_t* out_head;
  xf_segment_t* out_tail;
  xf_arrival_t* arrivals_head;
  xf_arrival_t* arrivals_tail;
  uint8_t in_frame[XF_FRAME_BYTES];
  size_t in_frame_got;
  xf_request_t* in_data; /* receive side: the request the payload now arriving belongs to */
  uint64_t in_data_left;
};

/* fabric.c */
kz_fabric_result_t xf_error(kz_fabric_result_t code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
const char* xf_last_error(void);
int xf_expired(const struct timespec* started, uint64_t timeout_ns);

/* endpoint.c */
kz_fabric_result_t xf_listen(void* context, int32_t dev, void* handle, uint32_t* handle_size,
                             kz_fabric_listen_comm_t* listen_comm);
kz_fabric_result_t xf_connect(void* context, int32_t dev, const void* handle, uint32_t handle_size,
                              kz_fabric_connect_state_t* state, kz_fabric_send_comm_t* send_comm);
void xf_connect_abort(void* context, kz_fabric_connect_state_t state);
kz_fabric_result_t xf_accept(kz_fabric_listen_comm_t listen_comm, kz_fabric_recv_comm_t* recv_comm);
kz_fabric_result_t xf_wait_acceptable(kz_fabric_listen_comm_t listen_comm, uint64_t timeout_ns);
kz_fabric_result_t xf_close_listen(kz_fabric_listen_comm_t listen_comm);
int xf_poll_fd(int fd, short events, uint64_t timeout_ns);

/* memory.c */
kz_fabric_result_t xf_reg_mr(kz_fabric_comm_t comm, int32_t is_send, void* data, uint64_t size, int32_t mem_type,
                             kz_fabric_mr_t* mr);
kz_fabric_result_t xf_dereg_mr(kz_fabric_comm_t comm, int32_t is_send, kz_fabric_mr_t mr);
kz_fabric_result_t xf_check_comm(kz_fabric_comm_t comm, int32_t is_send, xf_comm_t** out);

/* transfer.c */
xf_comm_t* xf_comm_new(xf_context_t* ctx, int fd, int is_send);
kz_fabric_result_t xf_isend(kz_fabric_send_comm_t send_comm, const void* data, uint64_t size, int32_t tag,
                            kz_fabric_mr_t mr, kz_fabric_request_t* request);
kz_fabric_result_t xf_irecv(kz_fabric_recv_comm_t recv_comm, void* data, uint64_t capacity, int32_t tag,
                            kz_fabric_mr_t mr, kz_fabric_request_t* request);
kz_fabric_result_t xf_test(kz_fabric_request_t request, int32_t* done, uint64_t* size);
kz_fabric_result_t xf_wait(kz_fabric_comm_t comm, int32_t is_send, uint64_t timeout_ns);
kz_fabric_result_t xf_close_send(kz_fabric_send_comm_t send_comm);
kz_fabric_result_t xf_close_recv(kz_fabric_recv_comm_t recv_comm);

#endif /* KIZUNA_FABRIC_EXAMPLE_PLUGIN_EXAMPLE_FABRIC_H_ */
