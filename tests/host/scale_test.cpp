// 1 000 concurrent fake guests, each on its own Unix endpoint, each exiting with a code derived
// from its id: 1 000 correct records, 0 lost, 0 swapped. Guests run on their own thread and
// io_context; the Host on the test's.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <thread>

#include "support.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;
using namespace std::chrono_literals;

namespace {
int code_of(int i) { return (i * 7 + 3) % 256; }
}  // namespace

TEST_CASE("1000 concurrent guests: 1000 correct records, 0 lost, 0 swapped") {
  constexpr int N = 1000;
  auto nofile = raise_nofile();
  REQUIRE(nofile >= 4 * N);  // listener + host stream + guest socket + a record fd each
  Harness h;
  std::vector<std::string> paths;
  for (int i = 0; i < N; ++i) {
    auto c = h.config(fmt::format("vm{:04}", i));
    c.descriptor.exec.argv = {"/bin/sh", "-c", fmt::format("exit {}", code_of(i))};
    paths.push_back(h.add(c));
  }
  asio::io_context gio;
  std::atomic<int> done{0}, errors{0};
  std::vector<std::shared_ptr<GuestLog>> logs(N);
  for (int i = 0; i < N; ++i) {
    logs[i] = std::make_shared<GuestLog>();
    auto id = fmt::format("vm{:04}", i);
    asio::co_spawn(gio,
                   guest_at(paths[i], {step::Send{ready_line()}, step::Expect{"boot"},
                                       step::Send{started_line(i + 2) + exited_line(code_of(i))},
                                       step::Expect{"shutdown"}, step::Close{}},
                            logs[i]),
                   [&, i, id](std::exception_ptr) {
                     if (!logs[i]->error.empty()) ++errors;
                     ++done;
                     // The VMM exits after its guest powered off: tell the host, on its thread.
                     asio::post(h.io, [&, id] { (void)h.host->vm_exited(id); });
                   });
  }
  std::thread guests([&] { gio.run(); });
  bool ok = h.run_until([&] { return h.host->live_sessions() == 0; }, 300s);
  guests.join();
  REQUIRE(ok);
  CHECK(done == N);
  CHECK(errors == 0);
  int correct = 0, lost = 0, swapped = 0;
  for (int i = 0; i < N; ++i) {
    auto id = fmt::format("vm{:04}", i);
    auto rec = h.record(id);
    if (!rec) { ++lost; continue; }
    if (rec->vm != id || rec->exit_code != std::optional<std::uint8_t>(code_of(i)) ||
        rec->outcome != proto::Outcome::exited || rec->exit_status != code_of(i))
      ++swapped;
    else
      ++correct;
  }
  CHECK(correct == N);
  CHECK(lost == 0);
  CHECK(swapped == 0);
  // Every boot carried its own descriptor (identity from the endpoint).
  int boots_ok = 0;
  for (int i = 0; i < N; ++i) {
    auto d = proto::decode_host(logs[i]->lines.at(0));
    auto& b = std::get<proto::Boot>(std::get<proto::HostMessage>(d));
    if (b.exec.argv.at(2) == fmt::format("exit {}", code_of(i))) ++boots_ok;
  }
  CHECK(boots_ok == N);
}
