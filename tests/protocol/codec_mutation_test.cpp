// Fixed-seed random mutation of valid lines (run under ASan+UBSan in build-asan/): the decoders
// never crash and always answer (message, unknown or error); whatever decodes re-encodes to a line
// that decodes to the same value; every error reason is non-empty, bounded and sendable as protocol_error.reason (valid UTF-8, no NUL).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

#include <random>

using namespace nes::proto;
using namespace nes::proto::test;

namespace {

constexpr std::uint64_t kSeed = 0x6e6573696e6974ULL;  // "nesinit"
constexpr std::size_t kInputs = 120000;

/// Tokens worth splicing into JSON: structure, escapes, edge numbers, NUL, invalid UTF-8.
const std::vector<std::string> kTokens = {
    "{", "}", "[", "]", "\"", ",", ":", "\\", "\\u0000", "\\ud800", "\\n", "null", "true", "false",
    "-1", "0", "255", "256", "64", "65", "4294967295", "4294967296", "1e400", "1.5", "-0",
    "\"type\"", "\"boot\"", "\"stop\"", "\"exit_code\"", "\"signal\"", "\"argv\"", "[]", "{}",
    "\xFF", "\xC3", "\xE2\x82", "\xF0\x9F\x98\x80", "\r", "\t", " ", std::string(1, '\0'),
};

std::string mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& corpus) {
  auto pick = [&](std::size_t n) { return n ? std::uniform_int_distribution<std::size_t>(0, n - 1)(rng) : 0; };
  const int rounds = pick(3) == 0 ? 2 + static_cast<int>(pick(3)) : 1;  // mostly one edit
  for (int r = 0; r < rounds; ++r) {
    const std::size_t pos = pick(s.size() + 1);
    switch (pick(9)) {
      case 0:  // flip one bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:  // random byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(pick(256));
        break;
      case 2:  // insert a random byte
        s.insert(pos, 1, static_cast<char>(pick(256)));
        break;
      case 3:  // delete a span
        if (!s.empty()) s.erase(pick(s.size()), 1 + pick(8));
        break;
      case 4:  // insert a token
        s.insert(pos, kTokens[pick(kTokens.size())]);
        break;
      case 5:  // replace a span by a token
        if (!s.empty()) s.replace(pick(s.size()), 1 + pick(6), kTokens[pick(kTokens.size())]);
        break;
      case 6:  // duplicate a span (duplicate keys, repeated objects)
        if (!s.empty()) {
          const std::size_t a = pick(s.size()), n = 1 + pick(40);
          s.insert(pos, s.substr(a, n));
        }
        break;
      case 7:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 8: {  // splice with another valid line
        const std::string& o = corpus[pick(corpus.size())];
        s = s.substr(0, pos) + o.substr(pick(o.size() + 1));
        break;
      }
    }
  }
  return s;
}

/// True if `s` can be sent as protocol_error.reason unchanged: valid UTF-8, no NUL.
bool sendable(std::string_view s) {
  return validate(GuestMessage{ProtocolError{std::string(s)}}).ok();
}

struct Tally {
  std::size_t ok = 0, unknown = 0, error = 0;
};

template <class Decoded, class Msg>
void check_result(const Decoded& d, Decoded (*decode)(std::string_view), Tally& t) {
  if (auto* e = std::get_if<DecodeError>(&d)) {
    ++t.error;
    REQUIRE(!e->reason.empty());
    REQUIRE(e->reason.size() < 4096);  // bounded: never echoes the whole line
    REQUIRE(sendable(e->reason));  // the guest echoes it in protocol_error
    return;
  }
  if (std::holds_alternative<UnknownMessage>(d)) {
    ++t.unknown;
    return;
  }
  ++t.ok;
  const Msg& m = std::get<Msg>(d);
  const std::string again = encode(m);
  const Decoded d2 = decode(again);
  REQUIRE(std::holds_alternative<Msg>(d2));
  REQUIRE(std::get<Msg>(d2) == m);
}

}  // namespace

TEST_CASE("random mutations of valid lines never crash; decoded values re-encode to themselves") {
  std::vector<std::string> corpus;
  for (const auto& m : host_samples()) corpus.push_back(encode(m));
  for (const auto& m : guest_samples()) corpus.push_back(encode(m));
  corpus.push_back(boot_tree().dump());
  corpus.push_back(std::string(kReferenceBootLine));
  corpus.push_back(R"({"type":"stop","video":{"a":[1,{"b":null}],"c":"\u00e9"}})");

  std::mt19937_64 rng(kSeed);
  Tally host, guest;
  for (std::size_t i = 0; i < kInputs; ++i) {
    const std::string& base = corpus[i % corpus.size()];
    const std::string line = mutate(base, rng, corpus);
    CAPTURE(i);
    CAPTURE(line);
    check_result<HostDecoded, HostMessage>(decode_host(line), &decode_host, host);
    check_result<GuestDecoded, GuestMessage>(decode_guest(line), &decode_guest, guest);
  }
  MESSAGE("inputs " << kInputs << ": host ok/unknown/error " << host.ok << "/" << host.unknown << "/"
                    << host.error << ", guest " << guest.ok << "/" << guest.unknown << "/" << guest.error);
  // The mutations must reach every outcome, or the loop is not testing much.
  CHECK(host.ok > 1000);
  CHECK(host.error > kInputs / 2);
  CHECK(host.unknown > 1000);
  CHECK(guest.ok > 1000);
}
