// LineReader: any split of the same bytes yields the same lines; over-long lines are refused
// without being held in memory and the reader resynchronises at the next '\n'; '\r\n' tolerated.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

#include <random>

using namespace nes::proto;
using namespace nes::proto::test;

namespace {

Line text(std::string s) {
  const std::size_t n = s.size();
  return Line{Line::Kind::text, std::move(s), n};
}
Line too_long(std::size_t n) { return Line{Line::Kind::too_long, {}, n}; }

std::vector<Line> drain(LineReader& r) {
  std::vector<Line> out;
  while (auto l = r.next()) out.push_back(std::move(*l));
  return out;
}

/// Feeds `bytes` in pieces chosen by `next_size`, draining as it goes; checks the memory bound.
template <class NextSize>
std::vector<Line> feed_split(std::string_view bytes, std::size_t cap, NextSize next_size) {
  LineReader r(cap);
  std::vector<Line> out;
  while (!bytes.empty()) {
    const std::size_t n = std::min(bytes.size(), std::max<std::size_t>(1, next_size()));
    r.feed(bytes.substr(0, n));
    bytes.remove_prefix(n);
    REQUIRE(r.buffered() <= cap + 1);
    for (Line& l : drain(r)) out.push_back(std::move(l));
  }
  CHECK(!r.partial());
  return out;
}

}  // namespace

TEST_CASE("byte by byte, whole, and random chunks: the same lines") {
  constexpr std::size_t cap = 64;
  std::string stream;
  std::vector<Line> want;
  auto add = [&](std::string line, std::string ending, Line expect) {
    stream += line + ending;
    want.push_back(std::move(expect));
  };
  add(R"({"type":"stop"})", "\n", text(R"({"type":"stop"})"));
  add(R"({"type":"shutdown"})", "\r\n", text(R"({"type":"shutdown"})"));
  add("", "\n", text(""));
  add("", "\r\n", text(""));
  add(std::string(cap, 'a'), "\n", text(std::string(cap, 'a')));           // exactly the cap
  add(std::string(cap, 'b'), "\r\n", text(std::string(cap, 'b')));         // cap + tolerated \r
  add(std::string(cap + 1, 'c'), "\n", too_long(cap + 1));                 // one over
  add(std::string(cap + 1, 'd'), "\r\n", too_long(cap + 2));               // length counts the \r
  add(std::string(10 * cap, 'e'), "\n", too_long(10 * cap));
  add("x\ry", "\n", text("x\ry"));                                         // inner \r is data
  add("z\r", "\r\n", text("z\r"));                                         // only one \r is dropped
  add(encode(HostMessage{Kill{9}}), "\n", text(encode(HostMessage{Kill{9}})));

  // Whole.
  LineReader whole(cap);
  whole.feed(stream);
  CHECK(drain(whole) == want);
  CHECK(!whole.partial());
  // Byte by byte.
  CHECK(feed_split(stream, cap, [] { return 1; }) == want);
  // Random chunk sizes, many seeds (fixed).
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::size_t> size(1, seed % 2 ? 7 : 300);
    CAPTURE(seed);
    CHECK(feed_split(stream, cap, [&] { return size(rng); }) == want);
  }
}

TEST_CASE("several lines per read, a line split across reads, partial() at EOF") {
  LineReader r;
  r.feed("{\"type\":\"stop\"}\n{\"type\":\"shut");
  CHECK(r.partial());
  auto l = r.next();
  REQUIRE(l);
  CHECK(l->text == "{\"type\":\"stop\"}");
  CHECK(!r.next());
  r.feed("down\"}\n{\"type\":\"kill\",\"signal\":9}\n");
  CHECK(!r.partial());
  CHECK(drain(r) == std::vector<Line>{text("{\"type\":\"shutdown\"}"), text("{\"type\":\"kill\",\"signal\":9}")});
  r.feed("{\"type\"");
  CHECK(r.partial());  // EOF now would cut a line in half: the caller reports it
  CHECK(r.buffered() == 7);
  CHECK(r.pending() == 7);
  CHECK(!r.dropping());
  CHECK(!r.next());
}

TEST_CASE("over-long line: bounded memory while it streams in, then resync at the next newline") {
  for (std::size_t cap : {std::size_t{0}, std::size_t{1}, std::size_t{100}, kDefaultLineCap}) {
    CAPTURE(cap);
    LineReader r(cap);
    CHECK(r.cap() == cap);
    const std::size_t total = 2 * cap + 4096;
    std::mt19937_64 rng(cap);
    std::size_t fed = 0, peak = 0;
    while (fed < total) {
      const std::size_t n = std::min<std::size_t>(total - fed, 1 + rng() % 8192);
      r.feed(std::string(n, 'x'));
      fed += n;
      peak = std::max(peak, r.buffered());
      CHECK(r.dropping() == (fed > cap + 1));  // said as soon as the cap is passed, not at a '\n'
      CHECK(r.pending() == fed);               // dropped bytes counted
      CHECK(!r.next());  // nothing is produced before the line ends
    }
    CHECK(peak <= cap + 1);
    CHECK(r.buffered() == 0);  // the prefix was released once the cap was passed
    CHECK(r.partial());
    r.feed("\nok\n");
    CHECK(!r.dropping());
    CHECK(r.pending() == 0);
    auto a = r.next();
    REQUIRE(a);
    CHECK(*a == too_long(total));
    auto b = r.next();
    REQUIRE(b);
    if (cap >= 2) {
      CHECK(*b == text("ok"));
    } else {
      CHECK(*b == too_long(2));
    }
    CHECK(!r.next());
  }
}

TEST_CASE("the default cap is 1 MiB and a line of exactly 1 MiB is accepted") {
  CHECK(kDefaultLineCap == 1024 * 1024);
  LineReader r;
  CHECK(r.cap() == kDefaultLineCap);
  r.feed(std::string(kDefaultLineCap, 'a'));
  r.feed("\r\n");
  auto l = r.next();
  REQUIRE(l);
  CHECK(l->kind == Line::Kind::text);
  CHECK(l->length == kDefaultLineCap);
  r.feed(std::string(kDefaultLineCap + 1, 'a') + "\n");
  l = r.next();
  REQUIRE(l);
  CHECK(*l == too_long(kDefaultLineCap + 1));
}

TEST_CASE("lines from the reader decode: a valid stream with \\r\\n endings, any split") {
  std::string stream;
  std::vector<HostMessage> sent = host_samples();
  for (const auto& m : sent) stream += encode(m) + "\r\n";
  std::mt19937_64 rng(7);
  auto lines = feed_split(stream, kDefaultLineCap, [&] { return 1 + rng() % 97; });
  REQUIRE(lines.size() == sent.size());
  for (std::size_t i = 0; i < sent.size(); ++i) {
    HostDecoded d = decode_host(lines[i].text);
    REQUIRE(summary(d) == "ok");
    CHECK(std::get<HostMessage>(d) == sent[i]);
  }
}
