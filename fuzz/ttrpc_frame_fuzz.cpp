// ttrpc FrameReader under arbitrary splits: the frames do not depend on how the stream was cut,
// what it holds stays bounded (one message plus one feed), an oversized message is skipped whole
// and reported once, and every frame re-encodes to the bytes it came from.
#include <vector>

#include "fuzz_util.hpp"
#include "host/shim/ttrpc_frame.hpp"

using nes::ttrpc::Frame;
using nes::ttrpc::FrameReader;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nes::fuzz::Cursor c(data, size);
  std::vector<std::size_t> cuts;
  for (unsigned n = c.pick(16); n > 0; --n) cuts.push_back(c.pick(64));
  std::string_view stream = c.rest();

  FrameReader whole, split;
  std::vector<Frame> a, b;
  whole.feed(stream);
  while (auto f = whole.next()) a.push_back(*f);
  nes::fuzz::feed_in_cuts(stream, cuts, [&](std::string_view piece) {
    split.feed(piece);
    nes::fuzz::require(split.buffered() <= nes::ttrpc::kHeaderBytes + nes::ttrpc::kMaxMessageBytes + piece.size(),
                       "buffered() <= one message + one feed");
    while (auto f = split.next()) b.push_back(*f);
  });
  nes::fuzz::require(a == b, "frames do not depend on the split");
  // Whole frames re-encode to the prefix of the stream they came from.
  std::string again;
  for (const auto& f : a) {
    if (f.oversized) {
      nes::fuzz::require(f.payload.empty() && f.length > nes::ttrpc::kMaxMessageBytes, "oversized: skipped");
      break;  // what follows it in the input was its own bytes
    }
    nes::fuzz::require(f.payload.size() == f.length, "payload has the announced length");
    std::string e = nes::ttrpc::encode_frame(f.stream, static_cast<nes::ttrpc::MsgType>(f.type), f.payload);
    e[9] = static_cast<char>(f.flags);
    again += e;
  }
  if (a.empty() || !a.back().oversized)
    nes::fuzz::require(stream.substr(0, again.size()) == again, "frames re-encode to their bytes");
  return 0;
}
