#include "runtime/bootstrap/unique_id.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <charconv>
#include <mutex>

#include <fmt/format.h>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/bootstrap/socket.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {
namespace {

constexpr std::string_view kPrefix = "kz1:";

std::string_view TrimSpace(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// inet_pton reads a C string: a host with a NUL byte would be judged by what precedes the NUL
// ("127.0.0.1\0junk" as 127.0.0.1) and then carried whole into the id.
bool IsIpv4Literal(std::string_view host) {
  in_addr a;
  return host.find('\0') == std::string_view::npos && inet_pton(AF_INET, std::string(host).c_str(), &a) == 1;
}

bool IsIpv6Literal(std::string_view host) {
  in6_addr a;
  return host.find('\0') == std::string_view::npos && inet_pton(AF_INET6, std::string(host).c_str(), &a) == 1;
}

Result<uint16_t> ParsePort(std::string_view text, std::string_view what) {
  uint32_t port = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || port == 0 || port > 65535) {
    // Quoted only when it is as short as a port: in a garbled unique id the secret may sit here.
    if (text.size() > 5)
      return InvalidArgument(fmt::format("{}: port of {} characters is not a number in 1..65535", what, text.size()));
    return InvalidArgument(fmt::format("{}: port '{}' is not a number in 1..65535", what, ShownText(text)));
  }
  return static_cast<uint16_t>(port);
}

// Splits "host:rest" or "[v6]:rest" into the host (brackets removed) and what follows the colon.
Status SplitHost(std::string_view text, std::string_view what, std::string& host, std::string_view& rest) {
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return InvalidArgument(fmt::format("{}: '[' without a closing ']'", what));
    host = std::string(text.substr(1, close - 1));
    if (!IsIpv6Literal(host)) {
      // Quoted only when it looks like an attempt at one: in a garbled unique id the secret (hex
      // digits, no ':') may sit here.
      if (host.find(':') == std::string::npos)
        return InvalidArgument(fmt::format("{}: what is in brackets ({} characters, no ':') is not an IPv6 address",
                                           what, host.size()));
      return InvalidArgument(fmt::format("{}: '{}' in brackets is not an IPv6 address", what, ShownText(host)));
    }
    if (close + 1 >= text.size() || text[close + 1] != ':')
      return InvalidArgument(fmt::format("{}: expected ':' and a port after ']'", what));
    rest = text.substr(close + 2);
    return Status::Ok();
  }
  size_t colon = text.find(':');
  if (colon == std::string_view::npos) return InvalidArgument(fmt::format("{}: expected host:port", what));
  host = std::string(text.substr(0, colon));
  rest = text.substr(colon + 1);
  return ValidateHost(host, what);
}

}  // namespace

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Status ValidateHost(std::string_view host, std::string_view what) {
  if (host.empty()) return InvalidArgument(fmt::format("{}: the host is empty", what));
  if (IsIpv4Literal(host) || IsIpv6Literal(host)) return Status::Ok();
  if (host.find(':') != std::string_view::npos)
    return InvalidArgument(
        fmt::format("{}: '{}' is not an IPv6 address (write IPv6 addresses in brackets, "
                    "e.g. [fd00::2]:29501)",
                    what, ShownText(host)));
  if (host.find_first_not_of("0123456789.") == std::string_view::npos)
    return InvalidArgument(fmt::format("{}: '{}' is not a valid IPv4 address", what, ShownText(host)));
  if (host.size() > 253) return InvalidArgument(fmt::format("{}: host name longer than 253 characters", what));
  size_t label = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    char c = host[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (c == '.') {
      if (label == 0) return InvalidArgument(fmt::format("{}: host name '{}' has an empty label", what, ShownText(host)));
      label = 0;
      continue;
    }
    if (!ok) {
      return InvalidArgument(fmt::format("{}: host name '{}' contains '{}' (allowed: letters, digits, '-', '_', '.')",
                                         what, ShownText(host),
                                         c == ' ' ? std::string("space") : ShownText(std::string_view(&c, 1))));
    }
    if (++label > 63)
      return InvalidArgument(fmt::format("{}: a label of host name '{}' exceeds 63 characters", what, ShownText(host)));
  }
  if (label == 0) return InvalidArgument(fmt::format("{}: host name '{}' ends with '.'", what, ShownText(host)));
  if (host.front() == '-') return InvalidArgument(fmt::format("{}: host name '{}' starts with '-'", what, ShownText(host)));
  return Status::Ok();
}

bool IsLoopbackHost(std::string_view host) {
  std::string h(host);
  std::string lower = h;
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lower == "localhost") return true;
  in_addr a4;
  if (inet_pton(AF_INET, h.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6;
  if (inet_pton(AF_INET6, h.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) return a6.s6_addr[12] == 127;
  }
  return false;
}

Result<HostPort> ParseHostPort(std::string_view text, std::string_view what) {
  text = TrimSpace(text);
  HostPort out;
  std::string_view rest;
  KZ_RETURN_IF_ERROR(SplitHost(text, what, out.host, rest));
  KZ_ASSIGN_OR_RETURN(out.port, ParsePort(rest, what));
  return out;
}

Result<Secret> RandomSecret() { return RandomValue<Secret>(); }

std::string UniqueId::ToString() const {
  std::string hex;
  hex.reserve(2 * secret.size());
  for (uint8_t b : secret) hex += fmt::format("{:02x}", b);
  return fmt::format("{}{}:{}", kPrefix, root.ToString(), hex);
}

std::string UniqueId::Redacted() const { return fmt::format("{}{}:****", kPrefix, root.ToString()); }

Result<UniqueId> UniqueId::Parse(std::string_view text) {
  constexpr std::string_view kWhat = "unique id";
  text = TrimSpace(text);
  if (text.substr(0, kPrefix.size()) != kPrefix) {
    if (text.size() >= 3 && text.substr(0, 2) == "kz" && text[2] >= '0' && text[2] <= '9') {
      // Quoted only when it is as short as a version: without its ':' the whole id, secret included,
      // would be the "version".
      const std::string_view version = text.substr(0, text.find(':'));
      if (version.size() > 8)
        return InvalidArgument(
            fmt::format("unique id: version of {} characters is not supported (this build reads "
                        "kz1)",
                        version.size()));
      return InvalidArgument(
          fmt::format("unique id: version '{}' is not supported (this build reads kz1)", ShownText(version)));
    }
    return InvalidArgument("unique id: not a kizuna unique id (expected kz1:HOST:PORT:SECRET)");
  }
  text.remove_prefix(kPrefix.size());
  UniqueId id;
  std::string_view rest;
  if (text.empty() || text.front() != '[') {
    // Catch an unbracketed IPv6 address before SplitHost cuts it at its first colon.
    size_t colons = 0;
    for (char c : text) colons += c == ':';
    if (colons > 2)
      return InvalidArgument("unique id: too many ':' (write an IPv6 address in brackets: kz1:[::1]:PORT:SECRET)");
  }
  KZ_RETURN_IF_ERROR(SplitHost(text, kWhat, id.root.host, rest));
  size_t colon = rest.find(':');
  if (colon == std::string_view::npos) return InvalidArgument("unique id: expected ':' and the secret after the port");
  KZ_ASSIGN_OR_RETURN(id.root.port, ParsePort(rest.substr(0, colon), kWhat));
  std::string_view hex = rest.substr(colon + 1);
  if (hex.size() != 2 * id.secret.size())
    return InvalidArgument(fmt::format("unique id: the secret must be {} hex digits, got {} characters",
                                       2 * id.secret.size(), hex.size()));
  for (size_t i = 0; i < id.secret.size(); ++i) {
    uint8_t byte = 0;
    for (size_t j = 0; j < 2; ++j) {
      char c = hex[2 * i + j];
      int v = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (v < 0)
        return InvalidArgument(
            fmt::format("unique id: the secret has a non-hex character at position {}", 2 * i + j + 1));
      byte = static_cast<uint8_t>(byte << 4 | v);
    }
    id.secret[i] = byte;
  }
  return id;
}

namespace {

std::mutex g_reserved_mu;
std::map<uint16_t, UniqueFd>& Reserved() {  // guarded by g_reserved_mu
  static auto* m = new std::map<uint16_t, UniqueFd>();  // process lifetime
  return *m;
}

// The address other hosts most likely reach this one at: the first up, non-loopback IPv4 address,
// then a global IPv6 one, then 127.0.0.1 (a machine without a network).
std::string DefaultHostAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
  std::string v4, v6;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
      v4 = buf;
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a) || IN6_IS_ADDR_LOOPBACK(&a)) continue;  // link-local needs a scope id
      inet_ntop(AF_INET6, &a, buf, sizeof(buf));
      v6 = buf;
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return "127.0.0.1";
}

}  // namespace

namespace internal {
UniqueFd TakeReservedListener(uint16_t port) {
  std::lock_guard<std::mutex> lock(g_reserved_mu);
  auto it = Reserved().find(port);
  if (it == Reserved().end()) return UniqueFd();
  UniqueFd fd = std::move(it->second);
  Reserved().erase(it);
  return fd;
}
}  // namespace internal

Result<UniqueId> CreateUniqueId(const HostPort& root) {
  KZ_RETURN_IF_ERROR(ValidateHost(root.host, "root address"));
  UniqueId id;
  KZ_ASSIGN_OR_RETURN(id.secret, RandomSecret());
  KZ_ASSIGN_OR_RETURN(UniqueFd listener, net::ListenForRoot(root));
  id.root = root;
  id.root.port = net::LocalAddress(listener.get()).Port();
  if (id.root.port == 0) return Internal("root listener: getsockname returned port 0");
  std::lock_guard<std::mutex> lock(g_reserved_mu);
  Reserved()[id.root.port] = std::move(listener);
  return id;
}

Result<UniqueId> GetUniqueId(const Config& config, const std::map<std::string, std::string>& env) {
  KZ_ASSIGN_OR_RETURN(std::optional<RootAddress> configured, ConfiguredRoot(config, env));
  HostPort root;
  std::string origin;
  if (configured) {
    root = configured->address;
    origin = configured->origin;
  } else {
    root = HostPort{DefaultHostAddress(), 0};
    origin = "this host's first address, an ephemeral port";
  }
  KZ_ASSIGN_OR_RETURN(UniqueId id, CreateUniqueId(root));
  KZ_INFO(kLogBootstrap, "bootstrap: new unique id {} (root address from {})", id.Redacted(), origin);
  return id;
}

Result<UniqueId> GetUniqueId() { return GetUniqueId(GlobalConfig(), ProcessEnvironment()); }

}  // namespace kizuna::bootstrap
