// The CRI workload log: every line checked by a parser of this test's own (a regex, not
// host::parse_log_line), concatenated content equals what was written (all 256 byte values,
// arbitrary splits, both streams), rotation bounds (file count, file size), the async writer.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <regex>

#include "host/lib/log_writer.hpp"
#include <fmt/format.h>

#include "support.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;
namespace fs = std::filesystem;

namespace {

/// workload.log in `tmp`, rotated at the smallest size the writer takes, into `files` files.
LogOptions rotating(const TempDir& tmp, unsigned files) {
  LogOptions o;
  o.path = tmp.path / "workload.log";
  o.max_size = kMinLogSize;
  o.max_files = files;
  return o;
}

struct Parsed {
  std::string out, err;  // reconstructed stream bytes
  std::size_t records = 0;
};

// The CRI format as kubelet's parser reads it: RFC3339Nano, stream, tags (split at ':', the first
// P or F decides; the rest are extensions, here the generation `g<N>`), content.
const std::regex kLine(
    R"(^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)) (stdout|stderr) (P|F)(?::[^ :]+)* ([\s\S]*)$)");

/// Parses one file, appending to `p`; fails the test on any malformed line.
void parse_file(const fs::path& f, Parsed& p) {
  std::ifstream in(f, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  REQUIRE((all.empty() || all.back() == '\n'));
  std::size_t pos = 0;
  while (pos < all.size()) {
    auto nl = all.find('\n', pos);
    std::string line = all.substr(pos, nl - pos);
    pos = nl + 1;
    std::smatch m;
    INFO("line: " << line.substr(0, 80));
    REQUIRE(std::regex_match(line, m, kLine));
    std::string& dst = m[4] == "stdout" ? p.out : p.err;
    dst += m[6].str();
    if (m[5] == "F") dst += '\n';
    ++p.records;
  }
}

/// All files, oldest first (path.N .. path.1, path).
Parsed parse_all(const fs::path& path) {
  Parsed p;
  auto rot = rotated_logs(path);
  for (auto it = rot.rbegin(); it != rot.rend(); ++it) parse_file(*it, p);
  parse_file(path, p);
  return p;
}

std::string all_bytes(std::size_t n, std::mt19937& rng) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

WallTime t0() { return WallTime{std::chrono::nanoseconds(1'764'499'200'000'000'123LL)}; }

}  // namespace

TEST_CASE("every byte value, random splits, both streams: content is exact") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  o.max_size = 64u << 20;
  o.max_line = 1000;  // small, so long lines are split into P records too
  auto w = LogWriter::open(o);
  REQUIRE(w);
  std::mt19937 rng(42);
  std::string out, err;
  for (int b = 0; b < 256; ++b) out += static_cast<char>(b);  // all 256 values, '\n' among them
  std::string more = all_bytes(300000, rng);
  // Lines of many lengths: long runs without '\n' as well.
  more += std::string(5000, 'x') + "\n" + std::string(1000, 'y') + "\n" + std::string(999, 'z');
  out += more;
  err = all_bytes(100000, rng) + "no newline at the end";
  std::size_t io = 0, ie = 0;
  while (io < out.size() || ie < err.size()) {
    std::size_t n = 1 + rng() % 4000;
    if (io < out.size()) {
      auto k = std::min(n, out.size() - io);
      (*w)->write(OutputStream::out, std::string_view(out).substr(io, k), t0());
      io += k;
    }
    if (ie < err.size()) {
      auto k = std::min(n / 2 + 1, err.size() - ie);
      (*w)->write(OutputStream::err, std::string_view(err).substr(ie, k), t0());
      ie += k;
    }
  }
  (*w)->eof(OutputStream::out, t0());
  (*w)->eof(OutputStream::err, t0());
  CHECK(!(*w)->error());
  auto p = parse_all(o.path);
  CHECK(p.out == out);
  CHECK(p.err == err);
  CHECK(rotated_logs(o.path).empty());
}

TEST_CASE("a last line without newline is one P record; a complete one is F") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  auto w = LogWriter::open(o);
  REQUIRE(w);
  (*w)->write(OutputStream::out, "hello\nwor", t0());
  (*w)->write(OutputStream::err, "oops\n", t0());
  (*w)->write(OutputStream::out, "ld", t0());
  (*w)->eof(OutputStream::out, t0());
  std::ifstream in(o.path);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  CHECK(all ==
        "2025-11-30T10:40:00.000000123Z stdout F hello\n"
        "2025-11-30T10:40:00.000000123Z stderr F oops\n"
        "2025-11-30T10:40:00.000000123Z stdout P world\n");
  auto r = parse_log_line("2025-11-30T10:40:00.000000123Z stdout P world");
  REQUIRE(r);
  CHECK(r->partial);
  CHECK(r->content == "world");
  CHECK(r->time == t0());
}

TEST_CASE("rotation keeps at most max_files files of at most max_size bytes; the newest bytes survive") {
  TempDir tmp;
  const LogOptions o = rotating(tmp, 3);
  auto w = LogWriter::open(o);
  REQUIRE(w);
  std::mt19937 rng(7);
  std::string out;
  for (int i = 0; i < 20000; ++i) out += fmt::format("line {} {}\n", i, std::string(rng() % 80, 'a'));
  for (std::size_t i = 0; i < out.size(); i += 3000)
    (*w)->write(OutputStream::out, std::string_view(out).substr(i, 3000), t0());
  (*w)->flush();
  CHECK(!(*w)->error());
  auto rot = rotated_logs(o.path);
  CHECK(rot.size() == 2);  // workload.log.1, .2: three files with the live one
  CHECK(!fs::exists(o.path.string() + ".3"));
  for (auto& f : rot) CHECK(fs::file_size(f) <= o.max_size);
  CHECK(fs::file_size(o.path) <= o.max_size);
  auto p = parse_all(o.path);
  // What is kept is a suffix of what was written, starting at a record boundary.
  REQUIRE(p.out.size() > 2 * kMinLogSize / 2);
  CHECK(out.ends_with(p.out));
  CHECK(p.out.starts_with("line "));
}

TEST_CASE("max_files 1 truncates the one file") {
  TempDir tmp;
  const LogOptions o = rotating(tmp, 1);
  auto w = LogWriter::open(o);
  REQUIRE(w);
  std::string line(100, 'q');
  line += '\n';
  for (int i = 0; i < 3000; ++i) (*w)->write(OutputStream::err, line, t0());
  (*w)->flush();
  CHECK(rotated_logs(o.path).empty());
  CHECK(fs::file_size(o.path) <= o.max_size);
  auto p = parse_all(o.path);
  CHECK(p.err.size() % line.size() == 0);
  CHECK(p.err.size() > 0);
}

TEST_CASE("a drop count is a record of its own on that stream, after the held partial line") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  auto w = LogWriter::open(o);
  REQUIRE(w);
  (*w)->write(OutputStream::out, "abc", t0());
  (*w)->dropped(OutputStream::out, 4096, t0());
  auto p = parse_all(o.path);
  CHECK(p.out == "abc[neshost: 4096 bytes of stdout dropped]\n");
}

TEST_CASE("bad options name the field") {
  LogOptions o;
  CHECK(check_log_options(o).error().message.starts_with("log path"));
  o.path = "/tmp/x";
  o.max_size = 100;
  CHECK(check_log_options(o).error().message.starts_with("max_size"));
  o.max_size = 1 << 20;
  o.max_files = 0;
  CHECK(check_log_options(o).error().message.starts_with("max_files"));
  CHECK(!LogWriter::open(LogOptions{"/nonexistent-dir/x/workload.log"}));
}

TEST_CASE("parse_log_line: Go's RFC3339Nano shapes, and errors naming the field") {
  auto a = parse_log_line("2016-10-06T00:17:09.669794202Z stdout F log content 1");
  REQUIRE(a);
  CHECK(a->content == "log content 1");
  CHECK(!a->partial);
  auto b = parse_log_line("2016-10-06T02:17:09.6697942+02:00 stderr P x");
  REQUIRE(b);
  CHECK(b->stream == OutputStream::err);
  CHECK(b->time == a->time - std::chrono::nanoseconds(2));
  auto c = parse_log_line("2016-10-06T00:17:09Z stdout F ");
  REQUIRE(c);
  CHECK(c->content.empty());
  CHECK(parse_log_line("yesterday stdout F x").error().message.starts_with("timestamp"));
  CHECK(parse_log_line("2016-10-06T00:17:09Z stdin F x").error().message.starts_with("stream"));
  CHECK(parse_log_line("2016-10-06T00:17:09Z stdout X x").error().message.starts_with("tag"));
}

TEST_CASE("fencing: every record names its generation as a second CRI tag; content and kubelet's view unchanged") {
  TempDir tmp;
  LogOptions o = rotating(tmp, 10);    // room for all of it: nothing rotated away
  o.generation = 9007199254740991ull;  // the longest: the header still fits
  std::string out;
  {
    auto w = LogWriter::open(o);
    REQUIRE(w);
    std::mt19937 rng(7);
    for (int i = 0; i < 150; ++i) {  // several rotations (at most ~300 KiB in 64 KiB files)
      std::string chunk = all_bytes(1 + rng() % 2000, rng);
      (*w)->write(OutputStream::out, chunk, t0());
      out += chunk;
    }
    (*w)->gap(OutputStream::err, "12 bytes of stderr lost", t0());
    (*w)->eof(OutputStream::out, t0());
    REQUIRE_FALSE((*w)->error());
  }
  Parsed p = parse_all(o.path);  // kubelet's reading
  CHECK(p.out == out);
  CHECK(p.err == "[neshost: 12 bytes of stderr lost]\n");
  // Every record of every file carries it, and parse_log_line reads it back.
  auto files = rotated_logs(o.path);
  files.push_back(o.path);
  std::size_t seen = 0;
  for (auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    for (std::size_t pos = 0; pos < all.size();) {
      auto nl = all.find('\n', pos);
      std::string line = all.substr(pos, nl - pos);
      pos = nl + 1;
      const bool tagged = line.find(" stdout F:g9007199254740991 ") != std::string::npos ||
                          line.find(" stdout P:g9007199254740991 ") != std::string::npos ||
                          line.find(" stderr F:g9007199254740991 ") != std::string::npos;
      CHECK(tagged);
      auto r = parse_log_line(line);
      REQUIRE(r);
      CHECK(r->generation == std::optional<std::uint64_t>(9007199254740991ull));
      ++seen;
    }
  }
  CHECK(seen == p.records);
  CHECK(files.size() > 2);
}

TEST_CASE("parse_log_line: tags after the first are read as kubelet does; g<N> is the generation") {
  auto a = parse_log_line("2016-10-06T00:17:09Z stdout F:g3 x y");
  REQUIRE(a);
  CHECK(!a->partial);
  CHECK(a->generation == std::optional<std::uint64_t>(3));
  CHECK(a->content == "x y");
  auto b = parse_log_line("2016-10-06T00:17:09Z stderr P:future:g12 z");
  REQUIRE(b);
  CHECK(b->partial);
  CHECK(b->generation == std::optional<std::uint64_t>(12));
  for (auto l : {"2016-10-06T00:17:09Z stdout F x", "2016-10-06T00:17:09Z stdout F:g x",
                 "2016-10-06T00:17:09Z stdout F:g0 x", "2016-10-06T00:17:09Z stdout F:g3x x",
                 "2016-10-06T00:17:09Z stdout F: x"}) {
    CAPTURE(l);
    auto r = parse_log_line(l);
    REQUIRE(r);
    CHECK_FALSE(r->generation);
  }
  CHECK(parse_log_line("2016-10-06T00:17:09Z stdout X:g3 x").error().message.starts_with("tag"));
}

TEST_CASE("AsyncLog: everything pushed is written by close; on_drained after the cap was reached") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  std::mutex mu;
  std::condition_variable cv;
  int drained = 0;
  auto a = AsyncLog::start(o, 64 * 1024, [&] {
    std::lock_guard lk(mu);
    ++drained;
    cv.notify_all();
  });
  REQUIRE(a);
  std::mt19937 rng(3);
  std::string out = all_bytes(1 << 20, rng), err = "e1\ne2";
  // One push over the cap: the queue is full at once, so a drain must be reported.
  (*a)->push(OutputStream::out, out, wall_now());
  CHECK((*a)->queued_bytes() <= out.size());
  (*a)->push(OutputStream::err, err, wall_now());
  (*a)->push_eof(OutputStream::out, wall_now());
  {
    std::unique_lock lk(mu);
    CHECK(cv.wait_for(lk, std::chrono::seconds(30), [&] { return drained >= 1; }));
  }
  CHECK((*a)->close(std::chrono::seconds(30)));
  CHECK(!(*a)->error());
  auto p = parse_all(o.path);
  CHECK(p.out == out);
  CHECK(p.err == err);  // the held "e2" is written as P at close
}

// ---- positions (data channel resume: docs/protocol.md "Data channel resume") ---------------------

TEST_CASE("positions count the streams' bytes in records written: not a held line, not a gap's text") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  o.positions = tmp.path / "workload.log.pos";
  auto w = LogWriter::open(o);
  REQUIRE(w);
  auto t = wall_now();
  // More than 300 records in one append: the writer flushes in the middle of it.
  std::string many;
  for (int i = 0; i < 1000; ++i) many += fmt::format("line {}\n", i);
  (*w)->append(OutputStream::out, many, t);
  (*w)->append(OutputStream::out, "held", t);  // no newline yet: not written, not counted
  (*w)->flush();
  CHECK((*w)->positions().out == many.size());
  auto back = read_log_positions(o.positions);
  REQUIRE(back);
  CHECK(back->out == many.size());
  CHECK(back->file == fs::file_size(o.path));
  (*w)->gap(OutputStream::out, "5 bytes of stdout dropped", t);  // writes "held" as P, then the gap
  CHECK((*w)->positions().out == many.size() + 4);
  (*w)->write(OutputStream::err, "\n\nx\n", t);  // empty lines count their newline
  CHECK((*w)->positions().err == 4);
  CHECK(read_log_positions(o.positions)->err == 4);
}

TEST_CASE("a writer taking over continues the positions and cuts a torn tail back") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  o.positions = tmp.path / "workload.log.pos";
  {
    auto w = LogWriter::open(o);
    REQUIRE(w);
    (*w)->write(OutputStream::out, "abc\n", wall_now());
  }
  const auto size = fs::file_size(o.path);
  {
    std::ofstream f(o.path, std::ios::app | std::ios::binary);
    f << "2026-12-04T00:00:00.000000000Z stdout F tor";  // a write the killed host never finished
  }
  auto w = LogWriter::open(o);
  REQUIRE(w);
  CHECK(fs::file_size(o.path) == size);
  CHECK((*w)->positions().out == 4);
  (*w)->write(OutputStream::out, "de\n", wall_now());
  CHECK((*w)->positions().out == 7);
  Parsed p;
  parse_file(o.path, p);
  CHECK(p.out == "abc\nde\n");
  CHECK(!read_log_positions(tmp.path / "absent"));
}

TEST_CASE("a resume gap moves its stream's position past the bytes it names, once; its text is not counted") {
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  o.positions = tmp.path / "workload.log.pos";
  auto w = LogWriter::open(o);
  REQUIRE(w);
  auto t = wall_now();
  (*w)->write(OutputStream::out, "abc\n", t);
  (*w)->skipped(OutputStream::out, 1000, t);  // the guest's ring no longer held bytes 4..1003
  CHECK((*w)->positions().out == 1004);
  CHECK((*w)->positions().err == 0);
  CHECK(read_log_positions(o.positions)->out == 1004);  // a host taking over asks from 1004 on
  (*w)->write(OutputStream::out, "z\n", t);
  CHECK((*w)->positions().out == 1006);
  Parsed p;
  parse_file(o.path, p);
  CHECK(p.out == "abc\n[neshost: 1000 bytes of stdout dropped]\nz\n");
}

TEST_CASE("across a rotation the positions go on and the sidecar names the live file's size") {
  TempDir tmp;
  LogOptions o = rotating(tmp, 3);
  o.positions = tmp.path / "workload.log.pos";
  auto w = LogWriter::open(o);
  REQUIRE(w);
  auto t = wall_now();
  const std::string line(1000, 'x');
  for (int i = 0; i < 70; ++i) (*w)->write(OutputStream::out, line + "\n", t);  // past 64 KiB: one rotation
  REQUIRE(fs::exists(tmp.path / "workload.log.1"));
  auto back = read_log_positions(o.positions);
  REQUIRE(back);
  CHECK(back->file == fs::file_size(o.path));
  CHECK(back->file < fs::file_size(tmp.path / "workload.log.1"));
  CHECK(back->out == 70u * 1001u);
}
