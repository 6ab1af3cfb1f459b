// The libfabric fabric (README.md): RDM endpoints with tagged messages, registered as "ofi".
//
// Each fabric device is one libfabric provider on one domain (an interface for tcp, a NIC for
// verbs or efa, the host for shm) with its own fid_fabric and fid_domain. Which ones become
// devices (SelectDevices below):
//   - FI_PROVIDER set (libfabric's own filter): every RDM provider libfabric then offers;
//   - else KIZUNA_FABRIC entries of the form "ofi:<provider>" ("ofi:shm", "ofi:tcp",
//     "ofi:verbs"), in that order;
//   - else "tcp;ofi_rxm" and "shm" (kDefaultProviders).
// A provider is listed once per domain (IPv4 preferred, then the first address family offered);
// loopback domains are left out when the provider also runs on another interface, so a single
// host without network still gets a device and a multi-host job never picks "lo".
//
// Connections (endpoint.h) and transfers (transfer.h) use one RDM endpoint per comm with its own
// completion queue; registration is in memory.h. libfabric 1.17 has no DMA-BUF registration and
// no CUDA / Level Zero memory: devices report kPtrHost | kPtrFd, where an fd region is mapped into
// this process and registered as host memory; device memory the CPU cannot address needs staging
// through host memory by the caller (logged once per fabric).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/ofi/loader.h"
#include "fabric/pending_connects.h"
#include "runtime/core/config.h"
#include "runtime/core/resources.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::ofi {

inline constexpr std::string_view kFabricName = "ofi";
inline const std::vector<std::string> kDefaultProviders = {"tcp;ofi_rxm", "shm"};
// Requests in flight per comm, at most (and at most a quarter of the provider's queue depth, since
// each receive also posts a control message and control buffers share the queues).
inline constexpr int kMaxRequests = 256;
// The largest single message: libfabric's own limit, capped far from offset overflow.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

// ---- Device selection (pure, so it is testable without libfabric) ----

// One fi_info as fi_getinfo offered it.
struct ProviderEntry {
  std::string provider;   // fabric_attr->prov_name, e.g. "tcp;ofi_rxm"
  std::string fabric;     // fabric_attr->name, e.g. "192.0.2.0/24"
  std::string domain;     // domain_attr->name, e.g. "eth0"
  uint32_t addr_format = 0;
  bool loopback = false;  // the domain is a loopback interface
  bool rma = false;       // offered with FI_RMA (one-sided writes possible)
};

struct SelectionRequest {
  bool fi_provider_set = false;        // FI_PROVIDER is set: take every provider offered
  std::vector<std::string> providers;  // from KIZUNA_FABRIC "ofi:<provider>" entries
};

// The providers KIZUNA_FABRIC names for this fabric ("ofi:shm" -> "shm"), in order.
std::vector<std::string> ProvidersFromConfig(const std::vector<std::string>& kizuna_fabric);
// True when `provider` is what `wanted` names: the same name, or a core provider under a utility
// provider ("tcp" names "tcp;ofi_rxm").
bool ProviderMatches(std::string_view provider, std::string_view wanted);
// Indices into `entries`, in device order, following the rules in this file's header comment.
std::vector<size_t> SelectDevices(const std::vector<ProviderEntry>& entries, const SelectionRequest& request);

// libfabric's tcp provider takes every interface when FI_TCP_IFACE names none of this host's (a
// typo, or a setting written for other hosts): traffic on a NIC nobody chose. kInvalidArgument
// naming the setting and `host_interfaces` when `fi_tcp_iface` (a name, or a comma list) names an
// interface not among them; ok when it is empty.
Status CheckTcpIface(std::string_view fi_tcp_iface, const std::vector<std::string>& host_interfaces);

// libfabric's shm provider leaves itself out of fi_getinfo, saying so only in libfabric's own log,
// when /dev/shm has less room than its regions need (28 MiB on a 2-core machine): a container's
// default 64 MiB /dev/shm, or a full one. Where shm is `wanted` but not `offered` and /dev/shm
// (`dev_shm`: its size and free space, or why they are unknown) has less than 32 MiB a core free,
// the reason and what to do, starting "; "; else "".
std::string ShmProviderHint(bool wanted, bool offered, const Result<FileSystemSpace>& dev_shm, unsigned cores);

// ---- Tags ----

// How a 64-bit libfabric tag is split (from the top of the provider's usable tag bits down):
// kind (4 bits) | connection id (the rest) | sequence (32 bits). The connection id is the low bits
// of the connection's random nonce, so two connections between the same pair of endpoints never
// match each other's messages, and the sequence names one receive (receiver-driven protocol,
// transfer.h).
enum class TagKind : uint64_t { kHello = 1, kWelcome = 2, kControl = 3, kData = 4 };

struct TagLayout {
  int bits = 64;  // usable tag bits (from ep_attr->mem_tag_format), >= kMinTagBits
  static constexpr int kMinTagBits = 48;
  uint64_t Make(TagKind kind, uint64_t connection, uint32_t sequence) const;
  int connection_bits() const { return bits - 4 - 32; }
};

// ---- Devices ----

// One provider on one domain: the fid_fabric and fid_domain every comm on it shares, and what
// the provider can do. Comms keep it alive (shared_ptr), so it outlives them whatever the order
// of destruction. Thread-safe (the domain is opened FI_THREAD_SAFE).
class OfiDevice {
 public:
  static Result<std::shared_ptr<OfiDevice>> Open(std::shared_ptr<const LibFabric> lib, const fi_info& info,
                                                 int index);
  ~OfiDevice();
  OfiDevice(const OfiDevice&) = delete;
  OfiDevice& operator=(const OfiDevice&) = delete;

  const LibFabric& lib() const { return *lib_; }
  const fi_info& info() const { return *info_; }
  fid_fabric* fabric() const { return fabric_; }
  fid_domain* domain() const { return domain_; }
  const std::string& provider() const { return provider_; }
  const std::string& domain_name() const { return domain_name_; }
  uint32_t provider_hash() const { return provider_hash_; }
  const TagLayout& tags() const { return tags_; }
  const FabricDeviceProperties& properties() const { return properties_; }

  // FI_RMA with >= 4 bytes of remote CQ data and 64-bit keys: SendComm::Write works.
  bool write_immediate() const { return write_immediate_; }
  // The provider places one write's data before the next one's (FI_ORDER_WAW).
  bool ordered_writes() const { return ordered_writes_; }
  uint64_t mr_mode() const { return mr_mode_; }
  // Memory-registration access flags the provider accepts on this device.
  uint64_t mr_access() const { return mr_access_; }
  // A key for fi_mr_reg, unique within the domain (used unless the provider picks keys).
  uint64_t NextKey() { return next_key_.fetch_add(1, std::memory_order_relaxed); }

 private:
  OfiDevice() = default;
  std::shared_ptr<const LibFabric> lib_;
  fi_info* info_ = nullptr;  // a dup, freed on destruction
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  std::string provider_;
  std::string domain_name_;
  uint32_t provider_hash_ = 0;
  TagLayout tags_;
  FabricDeviceProperties properties_;
  bool write_immediate_ = false;
  bool ordered_writes_ = false;
  uint64_t mr_mode_ = 0;
  uint64_t mr_access_ = 0;
  std::atomic<uint64_t> next_key_{1};
};

class PendingConnect;

class OfiFabric : public Fabric {
 public:
  // The factory registered as "ofi": the process's libfabric (LibFabric::Default()).
  static Result<std::unique_ptr<Fabric>> Create(const Config& config, const FabricContext& context);
  // With a given library (or the failure to load one): tests force a bad library path here.
  static Result<std::unique_ptr<Fabric>> CreateWith(const Config& config, const FabricContext& context,
                                                    Result<std::shared_ptr<const LibFabric>> lib);
  ~OfiFabric() override;

  const LibFabric& lib() const { return *lib_; }
  std::shared_ptr<OfiDevice> device(int dev) const { return ofi_devices_[static_cast<size_t>(dev)]; }
  // Bounds the short internal waits (a close message on teardown): KIZUNA_TIMEOUT.
  double io_timeout_s() const { return config().timeout_s; }

 protected:
  Result<std::unique_ptr<ListenComm>> DoListen(int dev) override;
  Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) override;
  Status DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt) override;

 private:
  OfiFabric(const Config* config, FabricContext context, std::shared_ptr<const LibFabric> lib,
            std::vector<std::shared_ptr<OfiDevice>> devices);

  std::shared_ptr<const LibFabric> lib_;
  std::vector<std::shared_ptr<OfiDevice>> ofi_devices_;
  // Connections in progress, by device and handle bytes (Fabric::Connect is called again with the
  // same pair until it yields a comm).
  PendingConnects<PendingConnect> pending_;
};

}  // namespace kizuna::fabric::ofi
