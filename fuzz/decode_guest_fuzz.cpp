// Host-side decoder (guest -> host lines) under arbitrary bytes: never crashes, and whatever
// decodes re-encodes to a line that decodes to the same value (decode ∘ encode = id on its image),
// its envelope (the fencing generation) included; the decoder with and without the envelope
// agree on the message.
#include "fuzz_util.hpp"
#include "protocol/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  auto d = nes::proto::decode_guest(line);
  if (auto* m = std::get_if<nes::proto::GuestMessage>(&d)) {
    std::string again = nes::proto::encode(*m);
    auto d2 = nes::proto::decode_guest(again);
    auto* m2 = std::get_if<nes::proto::GuestMessage>(&d2);
    nes::fuzz::require(m2 != nullptr, "a decoded guest message re-encodes to a valid line");
    nes::fuzz::require(*m2 == *m, "guest round trip is the identity");
    nes::fuzz::require(again.find('\n') == std::string::npos, "an encoded line has no newline");
  } else if (auto* e = std::get_if<nes::proto::DecodeError>(&d)) {
    nes::fuzz::require(!e->reason.empty() && e->reason.size() < 4096, "a decode error is named and bounded");
  }
  nes::proto::GuestEnvelope env;
  auto de = nes::proto::decode_guest(line, env);
  if (auto* m = std::get_if<nes::proto::GuestMessage>(&de)) {
    // A message the plain decoder also took (the envelope only adds a check of its own field).
    auto* plain = std::get_if<nes::proto::GuestMessage>(&d);
    nes::fuzz::require(plain && *plain == *m, "the envelope does not change the message");
    nes::fuzz::require(!env.generation || (*env.generation >= 1 && *env.generation <= nes::proto::kGenerationMax),
                       "an envelope generation is 1..2^53-1");
    std::string again = nes::proto::encode_line(*m, env);
    nes::proto::GuestEnvelope env2;
    auto d2 = nes::proto::decode_guest(std::string_view(again).substr(0, again.size() - 1), env2);
    auto* m2 = std::get_if<nes::proto::GuestMessage>(&d2);
    nes::fuzz::require(m2 && *m2 == *m && env2 == env, "envelope round trip is the identity");
  } else {
    nes::fuzz::require(!env.generation, "no envelope without a message");
    if (auto* e = std::get_if<nes::proto::DecodeError>(&de))
      nes::fuzz::require(!e->reason.empty() && e->reason.size() < 4096, "a decode error is named and bounded");
  }
  return 0;
}
