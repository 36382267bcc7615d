// Guest-side decoder (host -> guest lines, what the init parses) under arbitrary bytes: never
// crashes, whatever decodes round-trips, and the error reason is bounded (it is sent back in
// `protocol_error` unchanged).
#include "fuzz_util.hpp"
#include "protocol/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  auto d = nes::proto::decode_host(line);
  if (auto* m = std::get_if<nes::proto::HostMessage>(&d)) {
    std::string again = nes::proto::encode(*m);
    auto d2 = nes::proto::decode_host(again);
    auto* m2 = std::get_if<nes::proto::HostMessage>(&d2);
    nes::fuzz::require(m2 != nullptr, "a decoded host message re-encodes to a valid line");
    nes::fuzz::require(*m2 == *m, "host round trip is the identity");
  } else if (auto* e = std::get_if<nes::proto::DecodeError>(&d)) {
    nes::fuzz::require(!e->reason.empty() && e->reason.size() < 4096, "a decode error is named and bounded");
    // The reason must itself be sendable: a protocol_error carrying it decodes.
    std::string reply = nes::proto::encode(nes::proto::GuestMessage{nes::proto::ProtocolError{e->reason}});
    nes::fuzz::require(std::holds_alternative<nes::proto::GuestMessage>(nes::proto::decode_guest(reply)),
                       "protocol_error{reason} is a valid line");
  }
  return 0;
}
