// Outcome records: JSON form, parsing errors, generations, the durable write protocol with
// injected failures (fresh temp each attempt), the per-VM lock.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/file.h>
#include <fcntl.h>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "host/lib/record.hpp"
#include "support.hpp"
#include "tests/support/host_record.hpp"

using namespace nes;
using namespace nes::host;
namespace fs = std::filesystem;

namespace {
Record sample(std::uint64_t gen = 1, int code = 3) {
  Record r = nes::test::exited_record("vm-a", gen, code);
  r.started_at = WallTime{std::chrono::nanoseconds(1'764'499'200'123'456'789LL)};
  r.finished_at = WallTime{std::chrono::nanoseconds(1'764'499'201'000'000'001LL)};
  return r;
}
std::vector<std::string> temps(const fs::path& dir) {
  std::vector<std::string> v;
  for (auto& e : fs::directory_iterator(dir)) {
    auto n = e.path().filename().string();
    if (n.ends_with(".tmp")) v.push_back(n);
  }
  return v;
}
}  // namespace

TEST_CASE("RFC 3339 UTC with nanoseconds, both ways") {
  WallTime t{std::chrono::nanoseconds(1'764'499'200'123'456'789LL)};
  CHECK(format_rfc3339(t) == "2025-11-30T10:40:00.123456789Z");
  CHECK(parse_rfc3339("2025-11-30T10:40:00.123456789Z") == t);
  CHECK(!parse_rfc3339("2025-11-30T10:40:00Z"));
  CHECK(!parse_rfc3339("2025-13-30T10:40:00.123456789Z"));
  CHECK(!parse_rfc3339("2025-11-30 10:40:00.123456789Z"));
}

TEST_CASE("record JSON has exactly the schema's fields and round-trips") {
  auto r = sample();
  auto j = encode_record(r);
  CHECK(j == R"({"schema_version":1,"vm":"vm-a","generation":1,"outcome":"exited","exit_code":3,)"
             R"("signal":null,"exit_status":3,"reason":"workload exited with code 3",)"
             R"("started_at":"2025-11-30T10:40:00.123456789Z","finished_at":"2025-11-30T10:40:01.000000001Z"})"
             "\n");
  auto back = parse_record(j);
  REQUIRE(back);
  CHECK(*back == r);
  Record s = r;
  s.outcome = proto::Outcome::signalled;
  s.exit_code.reset();
  s.signal = 9;
  s.exit_status = 137;
  s.reason = "quote \" backslash \\ newline \n tab \t bell \x07 invalid \xff end";
  auto back2 = parse_record(encode_record(s));
  REQUIRE(back2);
  CHECK(back2->signal == std::optional<std::uint8_t>(9));
  CHECK(back2->reason.find("quote \" backslash \\ newline \n tab \t bell \x07 invalid ") == 0);
  CHECK(back2->reason.find("\xff") == std::string::npos);  // became U+FFFD: valid UTF-8 on disk
}

TEST_CASE("record parse errors name the field") {
  CHECK(parse_record("nope").error().message.find("not valid JSON") != std::string::npos);
  CHECK(parse_record("[]").error().message.find("object") != std::string::npos);
  auto j = encode_record(sample());
  auto with = [&](std::string from, std::string to) {
    auto s = j;
    s.replace(s.find(from), from.size(), to);
    return parse_record(s);
  };
  CHECK(with("\"generation\":1", "\"generation\":-1").error().message.starts_with("generation"));
  CHECK(with("\"exit_code\":3", "\"exit_code\":256").error().message.starts_with("exit_code"));
  CHECK(with("\"signal\":null", "\"signal\":0").error().message.starts_with("signal"));
  CHECK(with("\"outcome\":\"exited\"", "\"outcome\":\"meh\"").error().message.starts_with("outcome"));
  CHECK(with("\"schema_version\":1", "\"schema_version\":2").error().message.starts_with("schema_version"));
  CHECK(with("\"started_at\":\"2025", "\"started_at\":\"x025").error().message.starts_with("started_at"));
  CHECK(with(",\"reason\":\"workload exited with code 3\"", "").error().message.starts_with("reason"));
  CHECK(with("{", "{\"later_field\":[1,2],"));  // unknown fields are ignored
}

TEST_CASE("write_record: creates dirs 0700, writes, reads back, no temp left") {
  test::TempDir t;
  auto state = t.path / "deep" / "state";
  auto w = write_record(state, sample());
  REQUIRE(w);
  CHECK(w->kind == WriteResult::Kind::written);
  CHECK(w->attempts == 1);
  CHECK((fs::status(state).permissions() & fs::perms::all) == fs::perms::owner_all);
  CHECK((fs::status(state / "vm-a").permissions() & fs::perms::all) == fs::perms::owner_all);
  auto r = read_record(state, "vm-a");
  REQUIRE(r);
  REQUIRE(*r);
  CHECK(**r == sample());
  CHECK(temps(state / "vm-a").empty());
  auto none = read_record(state, "other");
  REQUIRE(none);
  CHECK(!*none);
}

TEST_CASE("generations: newer replaces, same keeps the first, older is stale") {
  test::TempDir t;
  REQUIRE(write_record(t.path, sample(5, 1))->kind == WriteResult::Kind::written);
  auto same = write_record(t.path, sample(5, 2));
  REQUIRE(same);
  CHECK(same->kind == WriteResult::Kind::already_recorded);
  CHECK(same->on_disk.exit_code == std::optional<std::uint8_t>(1));
  auto old = write_record(t.path, sample(4, 9));
  REQUIRE(old);
  CHECK(old->kind == WriteResult::Kind::stale);
  CHECK(old->on_disk.generation == 5);
  auto newer = write_record(t.path, sample(6, 7));
  REQUIRE(newer);
  CHECK(newer->kind == WriteResult::Kind::written);
  CHECK((*read_record(t.path, "vm-a"))->exit_code == std::optional<std::uint8_t>(7));
}

TEST_CASE("output lost: additive fields, written only when set, round-trip; the status to report is 125") {
  auto r = sample(1, 7);
  CHECK(encode_record(r).find("lost") == std::string::npos);
  CHECK(reported_status(r) == 7);
  CHECK(describe_loss(r).empty());
  r.lost.out = 1234567;
  r.truncated.err = 12;
  r.lost_reason = "the VM was stopped while its output was still being read";
  auto j = encode_record(r);
  CHECK(j.find(R"(,"finished_at":"2025-11-30T10:40:01.000000001Z","lost":{"stdout":1234567},)"
               R"("truncated":{"stderr":12},"lost_reason":"the VM was stopped while its output was still being read"})") !=
        std::string::npos);
  auto back = parse_record(j);
  REQUIRE(back);
  CHECK(*back == r);
  CHECK(back->exit_status == 7);  // the workload's own status stays in the record
  CHECK(reported_status(*back) == 125);
  CHECK(describe_loss(*back) ==
        std::vector<std::string>{"1234567 bytes of stdout lost: the VM was stopped while its output was still being read",
                                 "stderr truncated: its eof never arrived (12 bytes received)"});
  // A host verdict already says the run was cut short: a timeout's 124 stays (the loss is said).
  Record t = *back;
  t.outcome = proto::Outcome::timeout;
  t.exit_code.reset();
  t.exit_status = 124;
  CHECK(reported_status(t) == 124);
  CHECK(describe_loss(t).size() == 2);
  auto bad = j;
  bad.replace(bad.find(":1234567}"), 9, ":-1}");
  auto bad_parsed = parse_record(bad);
  REQUIRE(!bad_parsed);
  CAPTURE(bad_parsed.error().message);
  CHECK(bad_parsed.error().message.starts_with("lost.stdout"));
}

TEST_CASE("amend_record: the first outcome stays, what was lost of its output is added durably") {
  test::TempDir t;
  REQUIRE(write_record(t.path, sample(5, 1))->kind == WriteResult::Kind::written);
  Record late = sample(5, 9);  // another outcome of the same generation: must not win
  late.lost.out = 100;
  late.lost_reason = "why";
  std::vector<WriteStep> steps;
  WriteOptions opt;
  opt.at_step = [&](WriteStep s) {
    steps.push_back(s);
    return 0;
  };
  auto a = amend_record(t.path, late, opt);
  REQUIRE(a);
  CHECK(a->kind == WriteResult::Kind::written);
  CHECK(steps == std::vector<WriteStep>{WriteStep::temp_written, WriteStep::temp_fsynced, WriteStep::renamed,
                                        WriteStep::dir_fsynced});
  auto on_disk = *read_record(t.path, "vm-a");
  REQUIRE(on_disk);
  CHECK(on_disk->exit_code == std::optional<std::uint8_t>(1));
  CHECK(on_disk->lost.out == 100u);
  CHECK(on_disk->lost_reason == "why");
  CHECK(*on_disk == a->on_disk);
  CHECK(temps(t.path / "vm-a").empty());
  // A second amendment adds to it (a stream counted later); the earlier field stays.
  Record more = sample(5, 1);
  more.truncated.err = 3;
  REQUIRE(amend_record(t.path, more)->kind == WriteResult::Kind::written);
  on_disk = *read_record(t.path, "vm-a");
  CHECK(on_disk->lost.out == 100u);
  CHECK(on_disk->truncated.err == 3u);
  // A write of the same generation still keeps what is there (first wins).
  CHECK(write_record(t.path, sample(5, 2))->kind == WriteResult::Kind::already_recorded);
  // Another generation: a newer one on disk makes it stale; none at all is an error.
  CHECK(amend_record(t.path, sample(4, 1))->kind == WriteResult::Kind::stale);
  auto none = amend_record(t.path, sample(6, 1));
  REQUIRE(!none);
  CHECK(none.error().message.find("no record of generation 6") != std::string::npos);
  CHECK(!amend_record(t.path / "nothing-here", sample(1, 1)));
}

TEST_CASE("a failing step restarts from a fresh temp file; bounded attempts surface the error") {
  test::TempDir t;
  for (auto failing : {WriteStep::temp_written, WriteStep::temp_fsynced, WriteStep::renamed,
                       WriteStep::dir_fsynced}) {
    CAPTURE(to_string(failing));
    int calls = 0;
    WriteOptions o;
    o.at_step = [&](WriteStep s) {
      if (s == failing && calls++ == 0) return EIO;  // first attempt fails at this step
      return 0;
    };
    auto r = sample(10 + static_cast<int>(failing), 4);
    auto w = write_record(t.path, r, o);
    REQUIRE(w);
    CHECK(w->kind == WriteResult::Kind::written);
    CHECK(w->attempts == 2);
    CHECK(temps(t.path / "vm-a").empty());
    CHECK((*read_record(t.path, "vm-a"))->generation == r.generation);
  }
  WriteOptions always;
  always.attempts = 3;
  int seen = 0;
  always.at_step = [&](WriteStep s) { return s == WriteStep::temp_fsynced ? (++seen, EIO) : 0; };
  auto w = write_record(t.path, sample(99), always);
  REQUIRE(!w);
  CHECK(seen == 3);
  CHECK(w.error().message.find("after 3 attempts") != std::string::npos);
  CHECK(temps(t.path / "vm-a").empty());
  CHECK((*read_record(t.path, "vm-a"))->generation == 13);  // the previous record is intact
}

TEST_CASE("per-VM lock: a held flock bounds the writer; leftover temps are removed") {
  test::TempDir t;
  REQUIRE(write_record(t.path, sample(1)));
  { std::ofstream(t.path / "vm-a" / ".outcome.json.1.2.tmp") << "{\"torn"; }
  Fd lock{::open((t.path / "vm-a" / ".lock").c_str(), O_RDWR | O_CLOEXEC)};
  REQUIRE(::flock(lock.get(), LOCK_EX) == 0);
  WriteOptions o;
  o.lock_tries = 3;
  auto w = write_record(t.path, sample(2), o);
  REQUIRE(!w);
  CHECK(w.error().message.find("held by another writer") != std::string::npos);
  lock.reset();
  auto w2 = write_record(t.path, sample(2), o);
  REQUIRE(w2);
  CHECK(temps(t.path / "vm-a").empty());
}

TEST_CASE("concurrent writers of one VM: the newest generation ends up on disk") {
  test::TempDir t;
  std::vector<std::thread> th;
  for (int g = 1; g <= 16; ++g)
    th.emplace_back([&, g] { CHECK(write_record(t.path, sample(g, g))); });
  for (auto& x : th) x.join();
  CHECK((*read_record(t.path, "vm-a"))->generation == 16);
}

TEST_CASE("readers never see a torn record while a writer replaces it") {
  test::TempDir t;
  REQUIRE(write_record(t.path, sample(1, 1)));
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad{0};
  std::thread reader([&] {
    while (!stop) {
      auto r = read_record(t.path, "vm-a");
      if (!r || !*r) ++bad;
      ++reads;
    }
  });
  for (int g = 2; g <= 200; ++g) REQUIRE(write_record(t.path, sample(g, g % 256)));
  stop = true;
  reader.join();
  CHECK(bad == 0);
  CHECK(reads > 0);
}

namespace {
/// N records of distinct VMs vm-0..vm-(N-1), generation 1.
std::vector<Record> many(int n) {
  std::vector<Record> rs;
  for (int i = 0; i < n; ++i) {
    auto r = sample(1, i);
    r.vm = "vm-" + std::to_string(i);
    rs.push_back(r);
  }
  return rs;
}

/// What an fsync hook saw: fsyncs of the state dir itself, of other directories, of files.
struct FsyncCount {
  fs::path state;
  std::mutex mu;
  int state_dir = 0, dirs = 0, files = 0;
  std::vector<std::string> paths;
  int operator()(int fd) {
    struct stat st{}, sd{};
    REQUIRE(::fstat(fd, &st) == 0);
    REQUIRE(::stat(state.c_str(), &sd) == 0);
    char link[4096] = {};
    ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1);
    std::lock_guard<std::mutex> l(mu);
    if (n > 0) paths.emplace_back(link, static_cast<std::size_t>(n));
    if (st.st_ino == sd.st_ino && st.st_dev == sd.st_dev) ++state_dir;
    else if (S_ISDIR(st.st_mode)) ++dirs;
    else ++files;
    return ::fsync(fd) == 0 ? 0 : errno;
  }
};
}  // namespace

TEST_CASE("group commit: records final together share the state dir's fsync, phase by phase") {
  test::TempDir t;
  const fs::path state = t.path / "state";
  REQUIRE(write_record(state, sample(1)));  // the state dir exists; only VM dirs are new below
  constexpr int n = 8;
  auto rs = many(n);
  auto count = std::make_shared<FsyncCount>();
  count->state = state;
  std::vector<WriteStep> steps;
  WriteOptions o;
  o.fsync = [count](int fd) { return (*count)(fd); };
  o.at_step = [&](WriteStep s) {
    steps.push_back(s);
    return 0;
  };
  auto res = write_records(state, rs, o);
  REQUIRE(res.size() == n);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    REQUIRE(res[i]);
    CHECK(res[i]->kind == WriteResult::Kind::written);
    CHECK(*read_record(state, rs[i].vm) == std::optional<Record>(rs[i]));
    CHECK(temps(state / rs[i].vm).empty());
  }
  // Every record still gets its own temp and VM-dir fsync; the state dir, into which all eight
  // VM dirs were made, is fsynced once for the batch instead of once per record.
  CHECK(count->files == n);
  CHECK(count->dirs == n);
  CHECK(count->state_dir == 1);
  // Phase by phase: no rename before every temp is durable, no dir fsync before every rename.
  REQUIRE(steps.size() == 4 * n);
  for (int i = 0; i < 4 * n; ++i) CHECK(steps[i] == static_cast<WriteStep>(i / n));

  // The same records one by one: one state-dir fsync each.
  auto one = std::make_shared<FsyncCount>();
  one->state = t.path / "state2";
  WriteOptions o1;
  o1.fsync = [one](int fd) { return (*one)(fd); };
  REQUIRE(write_record(one->state, sample(1)));
  for (auto& r : rs) REQUIRE(write_record(one->state, r, o1));
  CHECK(one->state_dir == n);
}

TEST_CASE("group commit: a round's fsyncs are in flight together") {
  // Each temp's fsync waits (bounded) until all of them have been issued: sequential fsyncs would
  // never get there.
  test::TempDir t;
  constexpr int n = 6;
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, max_seen = 0;
  WriteOptions o;
  o.fsync = [&](int fd) {
    struct stat st{};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
      std::unique_lock<std::mutex> l(mu);
      max_seen = std::max(max_seen, ++in_flight);
      cv.notify_all();
      cv.wait_for(l, std::chrono::seconds(20), [&] { return max_seen == n; });
    }
    return ::fsync(fd) == 0 ? 0 : errno;
  };
  auto res = write_records(t.path, many(n), o);
  for (auto& r : res) CHECK(r);
  CHECK(max_seen == n);
}

TEST_CASE("group commit: a failed fsync in a round fails every record of it; nothing is written") {
  test::TempDir t;
  constexpr int n = 5;
  auto rs = many(n);
  std::atomic<int> failed{0};
  WriteOptions o;
  o.attempts = 2;
  o.fsync = [&](int fd) {
    char link[4096] = {};
    ssize_t len = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1);
    if (len > 0 && std::string_view(link).find("/vm-3/.outcome.json.") != std::string_view::npos) {
      ++failed;
      return EIO;  // vm-3's temp, on every attempt
    }
    return ::fsync(fd) == 0 ? 0 : errno;
  };
  auto res = write_records(t.path, rs, o);
  REQUIRE(res.size() == n);
  CHECK(failed == 2);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    REQUIRE(!res[i]);
    CHECK(res[i].error().message.find("recording outcome of vm-" + std::to_string(i)) == 0);
    CHECK(res[i].error().message.find("Input/output error (after 2 attempts; one group commit of 5 records)") !=
          std::string::npos);
    CHECK(!*read_record(t.path, rs[i].vm));  // no record renamed into place
    CHECK(temps(t.path / rs[i].vm).empty());
  }
  // The next batch, with the disk healthy again, writes them.
  o.fsync = nullptr;
  for (auto& r : write_records(t.path, rs, o)) CHECK(r);
}

TEST_CASE("group commit: rounds are bounded in records and bytes; a VM's records stay in order") {
  test::TempDir t;
  auto count = std::make_shared<FsyncCount>();
  count->state = t.path;
  WriteOptions o;
  o.fsync = [count](int fd) { return (*count)(fd); };
  o.batch_records = 3;
  auto res = write_records(t.path, many(8), o);
  for (auto& r : res) CHECK(r);
  CHECK(count->state_dir == 3);  // rounds of 3, 3, 2

  // batch_bytes below two records: every round holds one (a lone record always fits).
  test::TempDir t2;
  count = std::make_shared<FsyncCount>();
  count->state = t2.path;
  o.fsync = [count](int fd) { return (*count)(fd); };
  o.batch_records = 64;
  o.batch_bytes = encode_record(many(1)[0]).size() + 1;
  res = write_records(t2.path, many(4), o);
  for (auto& r : res) CHECK(r);
  CHECK(count->state_dir == 4);

  // Generations 1, 3, 2 of one VM in one batch: three rounds, in order, and 2 is stale.
  test::TempDir t3;
  std::vector<Record> same = {sample(1, 1), sample(3, 3), sample(2, 2)};
  res = write_records(t3.path, same, {});
  REQUIRE(res.size() == 3);
  CHECK(res[0]->kind == WriteResult::Kind::written);
  CHECK(res[1]->kind == WriteResult::Kind::written);
  CHECK(res[2]->kind == WriteResult::Kind::stale);
  CHECK((*read_record(t3.path, "vm-a"))->generation == 3);
}
