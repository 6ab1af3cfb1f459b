// Fuzz target: unique ids (runtime/bootstrap/unique_id.h), the text ranks get from KIZUNA_UNIQUE_ID,
// from the file KIZUNA_UNIQUE_ID_FILE names, or from the application (MPI_Bcast of ToString());
// the same bytes as a host:port (KIZUNA_ROOT) and as a host.
//
// Asserted: a refusal is kInvalidArgument, one short line of printable text that never repeats a
// well-formed secret; an accepted id has a printable host and a port, prints back to text that
// parses to the same id, and its redacted form holds no secret.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/bootstrap/unique_id.h"
#include "tests/fuzz/fuzz_check.h"

namespace kizuna::bootstrap {
namespace {

bool IsHex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  return true;
}

// A host as the id carries it: printable, no space, nothing a C string would cut.
void CheckHost(const std::string& host, std::string_view what) {
  KZ_FUZZ_CHECK(!host.empty(), std::string(what) + ": an empty host was accepted");
  for (char c : host)
    KZ_FUZZ_CHECK(c > ' ' && c < 0x7f, std::string(what) + ": a host with byte " +
                                           std::to_string(static_cast<unsigned char>(c)) + " was accepted");
}

// An error message goes to logs: one line of printable text whatever the input held, and short.
void CheckPrintable(const std::string& message) {
  KZ_FUZZ_CHECK(message.size() <= 512, std::to_string(message.size()) + " bytes of message: " + message.substr(0, 200));
  for (char c : message)
    KZ_FUZZ_CHECK(c >= ' ' && c < 0x7f, "byte " + std::to_string(static_cast<unsigned char>(c)) + " in: " + message);
}

}  // namespace
}  // namespace kizuna::bootstrap

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kizuna::bootstrap;
  const std::string_view text = kizuna::fuzz::AsText(data, size);

  kizuna::Result<UniqueId> id = UniqueId::Parse(text);
  if (id.ok()) {
    CheckHost(id->root.host, "UniqueId::Parse");
    KZ_FUZZ_CHECK(id->root.port != 0, "an id with port 0 was accepted");
    const std::string printed = id->ToString();
    kizuna::Result<UniqueId> again = UniqueId::Parse(printed);
    KZ_FUZZ_CHECK(again.ok(), "ToString's output does not parse: " + again.status().ToString());
    KZ_FUZZ_CHECK(*again == *id, "the round trip changed the id");
    const std::string redacted = id->Redacted();
    KZ_FUZZ_CHECK(redacted == printed.substr(0, printed.rfind(':')) + ":****", "Redacted() shows the secret");
  } else {
    KZ_FUZZ_CHECK_REFUSAL(id.status(), size);
    CheckPrintable(id.status().message());
    // The text's last field, when it has a secret's form: the message must not repeat it.
    const size_t colon = text.rfind(':');
    if (colon != std::string_view::npos) {
      std::string_view last = text.substr(colon + 1);
      while (!last.empty() && (last.back() == ' ' || last.back() == '\n' || last.back() == '\r' || last.back() == '\t'))
        last.remove_suffix(1);
      // (Unless much of the same text is also elsewhere, where the message may name it: a host, say.)
      const bool secret = last.size() == 32 && IsHex(last);
      bool elsewhere = false;
      for (size_t i = 0; secret && i + 16 <= last.size() && !elsewhere; ++i)
        elsewhere = text.substr(0, colon).find(last.substr(i, 16)) != std::string_view::npos;
      if (secret && !elsewhere)
        KZ_FUZZ_CHECK(id.status().message().find(last) == std::string::npos,
                      "the error repeats the secret: " + id.status().message());
    }
  }

  kizuna::Result<HostPort> hp = ParseHostPort(text, "KIZUNA_ROOT");
  if (hp.ok()) {
    CheckHost(hp->host, "ParseHostPort");
    KZ_FUZZ_CHECK(hp->port != 0, "a host:port with port 0 was accepted");
    kizuna::Result<HostPort> again = ParseHostPort(hp->ToString(), "KIZUNA_ROOT");
    KZ_FUZZ_CHECK(again.ok() && *again == *hp, "HostPort's round trip failed: " + hp->ToString());
  } else {
    KZ_FUZZ_CHECK_REFUSAL(hp.status(), size);
    CheckPrintable(hp.status().message());
  }

  const kizuna::Status host = ValidateHost(text, "host");
  if (host.ok()) {
    CheckHost(std::string(text), "ValidateHost");
  } else {
    KZ_FUZZ_CHECK_REFUSAL(host, size);
    CheckPrintable(host.message());
  }
  (void)IsLoopbackHost(text);
  return 0;
}
