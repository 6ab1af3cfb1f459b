/* Memory registration for the example fabric. Sockets read and write any host memory, so a
 * registration only records the range (for checks) and ties it to its comm, which releases it when
 * it closes.
 */
#include <stdlib.h>

#include "example_fabric.h"

kz_fabric_result_t xf_check_comm(kz_fabric_comm_t comm, int32_t is_send, xf_comm_t** out) {
  xf_comm_t* c = comm;
  if (c == NULL || c->magic != XF_COMM_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "%p is not an example_tcp comm", comm);
  if (c->is_send != (is_send != 0))
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "comm %p is a %s comm, passed as a %s comm", comm,
                    c->is_send ? "send" : "receive", is_send ? "send" : "receive");
  *out = c;
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_reg_mr(kz_fabric_comm_t comm, int32_t is_send, void* data, uint64_t size, int32_t mem_type,
                             kz_fabric_mr_t* mr) {
  xf_comm_t* c;
  kz_fabric_result_t rc = xf_check_comm(comm, is_send, &c);
  if (rc != KZ_FABRIC_OK) return rc;
  if (mem_type != KZ_FABRIC_MEM_HOST)
    return xf_error(KZ_FABRIC_ERR_NOT_SUPPORTED, "reg_mr: example_tcp moves host memory only (memory type %d)",
                    mem_type);
  if (data == NULL || size == 0 || mr == NULL)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "reg_mr: empty or null region (%p, %llu bytes)", data,
                    (unsigned long long)size);
  xf_mr_t* m = calloc(1, sizeof *m);
  if (m == NULL) return xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "reg_mr: out of memory");
  m->magic = XF_MR_MAGIC;
  m->comm = c;
  m->data = data;
  m->size = size;
  m->next = c->mrs;
  c->mrs = m;
  *mr = m;
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_dereg_mr(kz_fabric_comm_t comm, int32_t is_send, kz_fabric_mr_t mr) {
  xf_comm_t* c;
  kz_fabric_result_t rc = xf_check_comm(comm, is_send, &c);
  if (rc != KZ_FABRIC_OK) return rc;
  for (xf_mr_t** p = &c->mrs; *p != NULL; p = &(*p)->next) {
    if (*p != mr) continue;
    *p = mr->next;
    mr->magic = 0;
    free(mr);
    return KZ_FABRIC_OK;
  }
  return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "dereg_mr: %p is not a registration of comm %p", (void*)mr, comm);
}
