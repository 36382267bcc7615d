// The monitor's control socket (host/monitor/control.hpp) under arbitrary bytes, taken as a
// request line (what the monitor parses) and as a reply line (what neshost and the shim parse):
// never crashes; whatever parses re-encodes to one line within the bounds that parses to the
// same value (parse(encode(parse(x))) == parse(x)), also with a `generation G` target; an error is
// named, bounded, and can itself be sent back as an `error:` reply unchanged.
#include "fuzz_util.hpp"
#include "host/monitor/control.hpp"

namespace {

namespace ctl = nes::monitor::control;

void check_error(const nes::base::Error& e) {
  nes::fuzz::require(!e.message.empty() && e.message.size() < 8192, "a parse error is named and bounded");
  nes::fuzz::require(ctl::validate(ctl::Reply{ctl::Error{e.message}}).ok(), "a parse error is a valid `error:` reply");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  if (auto r = ctl::parse_request(line)) {
    const std::string again = ctl::encode(*r);
    nes::fuzz::require(again.find('\n') == std::string::npos && again.size() <= ctl::kRequestMax,
                       "an encoded request is one line within the bound");
    auto r2 = ctl::parse_request(again);
    nes::fuzz::require(r2.ok(), "a parsed request re-encodes to a valid line");
    nes::fuzz::require(*r2 == *r, "request round trip is the identity");
  } else {
    check_error(r.error());
  }
  // The same line as a request aimed at a generation (fencing: `generation G REQUEST`).
  if (auto r = ctl::parse_targeted(line)) {
    const std::string again = ctl::encode(*r);
    nes::fuzz::require(again.find('\n') == std::string::npos && again.size() <= ctl::kRequestMax,
                       "an encoded targeted request is one line within the bound");
    auto r2 = ctl::parse_targeted(again);
    nes::fuzz::require(r2.ok() && *r2 == *r, "targeted request round trip is the identity");
    nes::fuzz::require(!r->generation || (*r->generation >= 1 && *r->generation <= ctl::kGenerationMax),
                       "a target is a generation 1..2^53-1");
  } else {
    check_error(r.error());
  }
  if (auto r = ctl::parse_reply(line)) {
    const std::string again = ctl::encode(*r);
    nes::fuzz::require(again.find('\n') == std::string::npos && again.size() <= ctl::kReplyMax,
                       "an encoded reply is one line within the bound");
    auto r2 = ctl::parse_reply(again);
    nes::fuzz::require(r2.ok(), "a parsed reply re-encodes to a valid line");
    nes::fuzz::require(*r2 == *r, "reply round trip is the identity");
  } else {
    check_error(r.error());
  }
  return 0;
}
