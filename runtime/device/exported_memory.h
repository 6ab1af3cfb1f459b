// Moving exported device memory between processes on one host (README.md): the descriptor
// (backend, device, offset, size, opaque handle bytes) travels as a message on a Unix-domain
// stream socket, and an fd travels beside it with SCM_RIGHTS, so the receiver gets its own fd to
// the same memfd / DMA-BUF object.
#pragma once

#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::device {

// Sends one descriptor (and its fd) on a connected AF_UNIX SOCK_STREAM socket.
Status SendExportedMemory(int socket_fd, const ExportedMemory& exported, Deadline deadline);

// Receives one descriptor sent by SendExportedMemory; kTimeout at the deadline, kRemoteError when
// the peer closed the socket, kInvalidArgument for a malformed message.
Result<ExportedMemory> ReceiveExportedMemory(int socket_fd, Deadline deadline);

}  // namespace kizuna::device
