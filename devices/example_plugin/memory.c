/* The example's device memory: every allocation is its own memfd, mapped shared into this
 * process. That makes the memory host-accessible and lets mem_export_fd hand out a real fd that
 * another process maps onto the same pages (what a DMA-BUF export does for a real device). The
 * memfds are sealed against resizing, and imports accept only fds sealed against shrinking, so no
 * process holding the fd can pull pages out from under another's mapping.
 *
 * Each device keeps its allocations and imports in lists guarded by the device's mutex; a lookup
 * is linear, which is plenty for an example (a vendor would use their driver's own tables).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "example_plugin.h"

void example_device_init(example_device_t* device, int32_t index, uint64_t capacity_bytes) {
  device->index = index;
  device->capacity_bytes = capacity_bytes;
  pthread_mutex_init(&device->mu, NULL);
  device->allocated_bytes = 0;
  device->allocations = NULL;
  device->imports = NULL;
}

static void example_region_release(example_region_t* region) {
  if (region->map != NULL && region->map_bytes > 0) munmap(region->map, region->map_bytes);
  if (region->fd >= 0) close(region->fd);
  free(region);
}

void example_device_release(example_device_t* device) {
  /* kizuna frees everything before finalize; this only matters for a host that leaks. */
  for (example_region_t* r = device->allocations; r != NULL;) {
    example_region_t* next = r->next;
    example_region_release(r);
    r = next;
  }
  for (example_region_t* r = device->imports; r != NULL;) {
    example_region_t* next = r->next;
    example_region_release(r);
    r = next;
  }
  device->allocations = NULL;
  device->imports = NULL;
  pthread_mutex_destroy(&device->mu);
}

/* errno from a failed system call, as a plugin result with a message naming the call. */
static kz_plugin_result_t example_errno_error(int err, const char* what, int32_t device, uint64_t bytes) {
  if (err == EMFILE || err == ENFILE)
    /* Each allocation holds one memfd, so the open-file limit caps the number of live
     * allocations: out of a device resource, reported with what to raise. */
    return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY,
                         "device %d: %s (%llu bytes) failed: %s; each allocation holds one file descriptor, so "
                         "raise the open-file limit (ulimit -n) for more live allocations",
                         (int)device, what, (unsigned long long)bytes, strerror(err));
  kz_plugin_result_t code = (err == ENOMEM || err == ENOSPC || err == EFBIG) ? KZ_PLUGIN_ERR_OUT_OF_MEMORY
                            : (err == EINVAL || err == EBADF)               ? KZ_PLUGIN_ERR_INVALID_ARGUMENT
                                                                            : KZ_PLUGIN_ERR_INTERNAL;
  return example_error(code, "device %d: %s (%llu bytes) failed: %s", (int)device, what, (unsigned long long)bytes,
                       strerror(err));
}

kz_plugin_result_t example_mem_alloc(void* context, int32_t device, uint64_t bytes, void** ptr) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (ptr == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_alloc: ptr is NULL");
  *ptr = NULL;
  if (bytes == 0) return KZ_PLUGIN_OK; /* the ABI: an empty allocation is NULL */
  if (bytes > (uint64_t)SIZE_MAX / 2 || bytes > (uint64_t)INT64_MAX)
    return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "device %d: %llu bytes exceed the address space", (int)device,
                         (unsigned long long)bytes);

  /* Reserve the bytes first so that two threads cannot both take the last of the capacity. */
  pthread_mutex_lock(&dev->mu);
  if (bytes > dev->capacity_bytes - dev->allocated_bytes) {
    const uint64_t free_bytes = dev->capacity_bytes - dev->allocated_bytes;
    pthread_mutex_unlock(&dev->mu);
    return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "device %d: %llu bytes requested, %llu of %llu free",
                         (int)device, (unsigned long long)bytes, (unsigned long long)free_bytes,
                         (unsigned long long)dev->capacity_bytes);
  }
  dev->allocated_bytes += bytes;
  pthread_mutex_unlock(&dev->mu);

  char name[32];
  snprintf(name, sizeof name, "kz_example_dev%d", (int)device);
  example_region_t* region = (example_region_t*)calloc(1, sizeof *region);
  int fd = -1;
  void* map = MAP_FAILED;
  if (region == NULL) {
    rc = example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "device %d: cannot allocate bookkeeping", (int)device);
    goto fail;
  }
  fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    rc = example_errno_error(errno, "memfd_create", device, bytes);
    goto fail;
  }
  if (ftruncate(fd, (off_t)bytes) != 0) {
    rc = example_errno_error(errno, "ftruncate", device, bytes);
    goto fail;
  }
  /* An export hands this fd to other processes. Sealed, none of them can shrink the object under
   * our mapping (a touch of a page past the new end would kill us with SIGBUS) or grow it; and
   * F_SEAL_SEAL stops anyone from adding seals later (a write seal would break later imports). */
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    rc = example_errno_error(errno, "fcntl(F_ADD_SEALS)", device, bytes);
    goto fail;
  }
  map = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    rc = example_errno_error(errno, "mmap", device, bytes);
    goto fail;
  }
  region->ptr = map;
  region->bytes = bytes;
  region->map = map;
  region->map_bytes = bytes;
  region->fd = fd;
  pthread_mutex_lock(&dev->mu);
  region->next = dev->allocations;
  dev->allocations = region;
  pthread_mutex_unlock(&dev->mu);
  *ptr = map;
  return KZ_PLUGIN_OK;

fail: /* C has no destructors: one exit path undoes whatever was done */
  if (fd >= 0) close(fd);
  free(region);
  pthread_mutex_lock(&dev->mu);
  dev->allocated_bytes -= bytes;
  pthread_mutex_unlock(&dev->mu);
  return rc;
}

kz_plugin_result_t example_mem_free(void* context, int32_t device, void* ptr) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (ptr == NULL) return KZ_PLUGIN_OK; /* the empty allocation */
  pthread_mutex_lock(&dev->mu);
  example_region_t** link = &dev->allocations;
  while (*link != NULL && (*link)->ptr != ptr) link = &(*link)->next;
  example_region_t* region = *link;
  if (region != NULL) {
    *link = region->next;
    dev->allocated_bytes -= region->bytes;
  }
  pthread_mutex_unlock(&dev->mu);
  if (region == NULL)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_free: %p is not an allocation of device %d", ptr,
                         (int)device);
  example_region_release(region);
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_mem_export_fd(void* context, int32_t device, void* ptr, uint64_t bytes, int32_t* fd,
                                         uint64_t* offset) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (ptr == NULL || fd == NULL || offset == NULL)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_export_fd: ptr, fd and offset must not be NULL");
  if (bytes == 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_export_fd: bytes is 0");

  /* ptr may point inside an allocation: find the one that holds [ptr, ptr + bytes). */
  const uintptr_t p = (uintptr_t)ptr;
  pthread_mutex_lock(&dev->mu);
  example_region_t* region = dev->allocations;
  while (region != NULL) {
    const uintptr_t base = (uintptr_t)region->ptr;
    if (p >= base && p - base < region->bytes) break;
    region = region->next;
  }
  int dup_fd = -1;
  uint64_t region_offset = 0;
  int err = 0;
  if (region != NULL && bytes <= region->bytes - (p - (uintptr_t)region->ptr)) {
    region_offset = p - (uintptr_t)region->ptr;
    /* The caller owns the returned fd; our memfd stays open for the allocation itself. */
    dup_fd = fcntl(region->fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) err = errno;
  }
  const int found = region != NULL;
  const uint64_t region_bytes = found ? region->bytes : 0;
  pthread_mutex_unlock(&dev->mu);

  if (!found)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_export_fd: %p is not inside an allocation of device %d",
                         ptr, (int)device);
  if (dup_fd < 0 && err == 0)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT,
                         "mem_export_fd: %llu bytes at offset %llu exceed the %llu-byte allocation",
                         (unsigned long long)bytes, (unsigned long long)region_offset,
                         (unsigned long long)region_bytes);
  if (dup_fd < 0) return example_errno_error(err, "dup of the allocation's memfd", device, bytes);
  *fd = dup_fd;
  *offset = region_offset;
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_mem_import_fd(void* context, int32_t device, int32_t fd, uint64_t offset, uint64_t bytes,
                                         void** ptr) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (ptr == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_import_fd: ptr is NULL");
  if (fd < 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_import_fd: fd %d is not valid", (int)fd);
  if (bytes == 0) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_import_fd: bytes is 0");

  /* The size check below means something only if the object cannot shrink afterwards: another
   * process that shrank it would turn our mapping into SIGBUS on first touch. So only objects
   * sealed against shrinking are imported, as this plugin's own exports are. (A port importing
   * DMA-BUF fds drops this check: a DMA-BUF cannot be resized at all.) */
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 && errno != EINVAL) /* EINVAL: a file that cannot carry seals (refused below) */
    return example_errno_error(errno, "fcntl(F_GET_SEALS) of the imported fd", device, bytes);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT,
                         "mem_import_fd: fd %d is not sealed against shrinking (%s); the exporter must seal it "
                         "(memfd_create with MFD_ALLOW_SEALING, then fcntl F_ADD_SEALS F_SEAL_SHRINK | F_SEAL_GROW) "
                         "so that no process can shrink the memory under this mapping",
                         (int)fd, seals < 0 ? "the file does not support seals" : "F_SEAL_SHRINK is missing");

  /* Mapping past the end of the object would "work" and then SIGBUS on first touch: check first. */
  struct stat st;
  if (fstat(fd, &st) != 0) return example_errno_error(errno, "fstat of the imported fd", device, bytes);
  const uint64_t object_bytes = (uint64_t)st.st_size;
  if (offset > object_bytes || bytes > object_bytes - offset)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT,
                         "mem_import_fd: [%llu, +%llu) lies outside the fd's %llu-byte object",
                         (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)object_bytes);

  /* mmap wants a page-aligned file offset: map from the page that holds `offset`. */
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uint64_t map_offset = offset - offset % page;
  const uint64_t map_bytes = bytes + (offset - map_offset);
  example_region_t* region = (example_region_t*)calloc(1, sizeof *region);
  if (region == NULL)
    return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "device %d: cannot allocate bookkeeping", (int)device);
  void* map = mmap(NULL, (size_t)map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)map_offset);
  if (map == MAP_FAILED) {
    const int err = errno;
    free(region);
    return example_errno_error(err, "mmap of the imported fd", device, bytes);
  }
  /* The mapping keeps the memory alive by itself; the fd stays the caller's (the ABI). */
  region->ptr = (char*)map + (offset - map_offset);
  region->bytes = bytes;
  region->map = map;
  region->map_bytes = map_bytes;
  region->fd = -1;
  pthread_mutex_lock(&dev->mu);
  region->next = dev->imports;
  dev->imports = region;
  pthread_mutex_unlock(&dev->mu);
  *ptr = region->ptr;
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_mem_unimport(void* context, int32_t device, void* ptr, uint64_t bytes) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  pthread_mutex_lock(&dev->mu);
  example_region_t** link = &dev->imports;
  while (*link != NULL && ((*link)->ptr != ptr || (*link)->bytes != bytes)) link = &(*link)->next;
  example_region_t* region = *link;
  if (region != NULL) *link = region->next;
  pthread_mutex_unlock(&dev->mu);
  if (region == NULL)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "mem_unimport: %p (+%llu bytes) is not an import of device %d",
                         ptr, (unsigned long long)bytes, (int)device);
  example_region_release(region);
  return KZ_PLUGIN_OK;
}
