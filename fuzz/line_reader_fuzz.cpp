// LineReader under arbitrary splits: the lines (and too_long notices) do not depend on how the
// stream was cut, and the unfinished line held never exceeds cap + 1 bytes.
#include <vector>

#include "fuzz_util.hpp"
#include "protocol/line_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nes::fuzz::Cursor c(data, size);
  const std::size_t cap = 1 + c.pick(64);  // small caps reach the over-long paths
  std::vector<std::size_t> cuts;
  for (unsigned n = c.pick(16); n > 0; --n) cuts.push_back(c.pick(32));
  std::string_view stream = c.rest();

  nes::proto::LineReader whole(cap), split(cap);
  std::vector<nes::proto::Line> a, b;
  whole.feed(stream);
  while (auto l = whole.next()) a.push_back(*l);
  nes::fuzz::feed_in_cuts(stream, cuts, [&](std::string_view piece) {
    split.feed(piece);
    nes::fuzz::require(split.buffered() <= cap + 1, "buffered() <= cap + 1");
    while (auto l = split.next()) b.push_back(*l);
  });
  nes::fuzz::require(a == b, "lines do not depend on the split");
  nes::fuzz::require(whole.partial() == split.partial(), "partial() does not depend on the split");
  for (auto& l : a) {
    if (l.kind == nes::proto::Line::Kind::text) {
      nes::fuzz::require(l.text.size() <= cap, "a text line fits the cap");
      nes::fuzz::require(l.text.find('\n') == std::string::npos, "no newline inside a line");
    } else {
      nes::fuzz::require(l.text.empty() && l.length > cap, "too_long carries only its length");
    }
  }
  return 0;
}
