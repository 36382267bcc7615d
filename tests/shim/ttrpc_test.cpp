// ttrpc: exact frame bytes, the reader under every split, and the Asio server over a real
// socketpair and a real Unix socket — unknown service/method, malformed requests, even stream ids,
// oversized frames, out-of-order answers — each answered with ttrpc's status while the
// connection keeps serving.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <boost/asio/io_context.hpp>

#include "host/shim/ttrpc.hpp"
#include "tests/support/temp_dir.hpp"
#include "containerd_pb.h"
#include "ttrpc.pb.h"

using namespace nes;
namespace asio = boost::asio;

namespace {

std::string bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

// A client end over a socketpair: writes frames, reads answers, both blocking and bounded by the
// io_context run in between.
struct Pair {
  asio::io_context io;
  ttrpc::Server server{io};
  int client = -1;
  Pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    client = sv[0];
    server.add("svc", "Echo", [](ttrpc::Call&& c, ttrpc::Respond r) { r({{}, "echo:" + c.payload}); });
    server.add("svc", "Later", [this](ttrpc::Call&& c, ttrpc::Respond r) {
      later.push_back({std::move(c.payload), std::move(r)});
    });
    server.serve_connection(host::Fd(sv[1]));
  }
  ~Pair() { ::close(client); }
  std::vector<std::pair<std::string, ttrpc::Respond>> later;

  void send_raw(const std::string& b) { REQUIRE(::write(client, b.data(), b.size()) == static_cast<ssize_t>(b.size())); }
  void send(std::uint32_t stream, const std::string& service, const std::string& method, const std::string& payload) {
    send_raw(ttrpc::encode_frame(stream, ttrpc::MsgType::request,
                                 ttrpc::encode_request({service, method, payload, 0, {}})));
  }
  // Run the server until one whole response frame has arrived; returns it.
  std::pair<ttrpc::Frame, ttrpc::Reply> recv() {
    for (int i = 0; i < 10000; ++i) {
      if (auto f = reader.next()) {
        auto r = ttrpc::decode_response(f->payload);
        REQUIRE(r);
        return {*f, *r};
      }
      io.run_for(std::chrono::milliseconds(1));
      io.restart();
      char buf[65536];
      ssize_t n = ::recv(client, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) reader.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    }
    FAIL("no response");
    return {};
  }
  ttrpc::FrameReader reader;
};

}  // namespace

TEST_CASE("a frame's bytes are ttrpc's header then the payload") {
  CHECK(ttrpc::encode_frame(1, ttrpc::MsgType::request, "ab") == bytes({0, 0, 0, 2, 0, 0, 0, 1, 1, 0}) + "ab");
  CHECK(ttrpc::encode_frame(0x01020304, ttrpc::MsgType::response, "") ==
        bytes({0, 0, 0, 0, 1, 2, 3, 4, 2, 0}));
}

TEST_CASE("a Request encodes as ttrpc's protobuf: service 1, method 2, payload 3") {
  // service "s", method "m", payload "p": tags 0x0a, 0x12, 0x1a (wire type 2), each length 1.
  CHECK(ttrpc::encode_request({"s", "m", "p", 0, {}}) == bytes({0x0a, 1, 's', 0x12, 1, 'm', 0x1a, 1, 'p'}));
  nes::ttrpc::wire::Request r;
  REQUIRE(r.ParseFromString(ttrpc::encode_request({"svc", "M", "x", 5, {{"k", "v"}}})));
  CHECK(r.timeout_nano() == 5);
  CHECK(r.metadata(0).key() == "k");
}

TEST_CASE("the reader gives the same frames however the stream is cut") {
  std::string stream = ttrpc::encode_frame(1, ttrpc::MsgType::request, "hello") +
                       ttrpc::encode_frame(3, ttrpc::MsgType::request, std::string(70000, 'x')) +
                       ttrpc::encode_frame(5, ttrpc::MsgType::response, "");
  for (std::size_t cut : {1u, 2u, 9u, 10u, 11u, 4096u, 100000u}) {
    ttrpc::FrameReader r;
    std::vector<ttrpc::Frame> got;
    for (std::size_t i = 0; i < stream.size(); i += cut) {
      r.feed(std::string_view(stream).substr(i, cut));
      while (auto f = r.next()) got.push_back(*f);
    }
    REQUIRE(got.size() == 3);
    CHECK(got[0].payload == "hello");
    CHECK(got[1].payload.size() == 70000);
    CHECK(got[1].stream == 3);
    CHECK(got[2].type == 2);
    CHECK(r.buffered() == 0);
  }
}

TEST_CASE("an oversized frame is skipped whole and reported once; the next one is read") {
  std::string hdr = bytes({0, 0x40, 0, 1, 0, 0, 0, 7, 1, 0});  // 4 MiB + 1
  std::string body((4u << 20) + 1, 'z');
  std::string next = ttrpc::encode_frame(9, ttrpc::MsgType::request, "ok");
  ttrpc::FrameReader r;
  std::vector<ttrpc::Frame> got;
  std::string all = hdr + body + next;
  for (std::size_t i = 0; i < all.size(); i += 65536) {
    r.feed(std::string_view(all).substr(i, 65536));
    CHECK(r.buffered() <= 65536 + 10);
    while (auto f = r.next()) got.push_back(*f);
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0].oversized);
  CHECK(got[0].stream == 7);
  CHECK(got[0].payload.empty());
  CHECK(got[1].payload == "ok");
}

TEST_CASE("server: unknown service and method are UNIMPLEMENTED, as ttrpc's own server says") {
  Pair p;
  p.send(1, "nope", "X", "");
  auto [f1, r1] = p.recv();
  CHECK(f1.stream == 1);
  CHECK(f1.type == 2);
  CHECK(r1.status.code == ttrpc::Code::unimplemented);
  CHECK(r1.status.message == "service nope");
  p.send(3, "svc", "Nope", "");
  auto [f2, r2] = p.recv();
  CHECK(r2.status.code == ttrpc::Code::unimplemented);
  CHECK(r2.status.message == "method Nope");
  p.send(5, "svc", "Echo", "hi");  // still serving
  auto [f3, r3] = p.recv();
  CHECK(f3.stream == 5);
  CHECK(r3.status.ok());
  CHECK(r3.payload == "echo:hi");
}

TEST_CASE("server: a malformed Request, an even stream id, an oversized frame: a status each, then service") {
  Pair p;
  p.send_raw(ttrpc::encode_frame(1, ttrpc::MsgType::request, bytes({0x0a, 0x7f})));  // truncated string
  auto [f1, r1] = p.recv();
  CHECK(r1.status.code == ttrpc::Code::invalid_argument);
  p.send(2, "svc", "Echo", "");
  auto [f2, r2] = p.recv();
  CHECK(f2.stream == 2);
  CHECK(r2.status.code == ttrpc::Code::invalid_argument);
  CHECK(r2.status.message == "StreamID must be odd for client initiated streams");
  // 4 MiB + 1: its bytes are read and dropped (never held), then the status, as ttrpc does.
  p.send_raw(bytes({0, 0x40, 0, 1, 0, 0, 0, 3, 1, 0}));
  std::thread writer([&] {
    std::string chunk(65536, 'z');
    std::size_t left = (4u << 20) + 1;
    while (left) {
      std::size_t n = std::min(left, chunk.size());
      if (::write(p.client, chunk.data(), n) != static_cast<ssize_t>(n)) return;
      left -= n;
    }
  });
  auto [f3, r3] = p.recv();
  writer.join();
  CHECK(f3.stream == 3);
  CHECK(r3.status.code == ttrpc::Code::resource_exhausted);
  CHECK(r3.status.message == "message length 4194305 exceed maximum message size of 4194304");
  p.send(5, "svc", "Echo", "after");
  auto [f4, r4] = p.recv();
  CHECK(f4.stream == 5);
  CHECK(r4.payload == "echo:after");
}

TEST_CASE("server: frames of other types are ignored; calls in flight are answered in any order") {
  Pair p;
  p.send_raw(ttrpc::encode_frame(1, ttrpc::MsgType::response, "junk"));
  p.send_raw(ttrpc::encode_frame(1, static_cast<ttrpc::MsgType>(9), "junk"));
  p.send(3, "svc", "Later", "a");
  p.send(5, "svc", "Later", "b");
  p.send(7, "svc", "Echo", "now");
  auto [f, r] = p.recv();
  CHECK(f.stream == 7);
  REQUIRE(p.later.size() == 2);
  p.later[1].second({{}, "B"});
  p.later[0].second({{ttrpc::Code::not_found, "gone"}, {}});
  p.later[0].second({{}, "twice"});  // a second answer is ignored
  auto [fb, rb] = p.recv();
  CHECK(fb.stream == 5);
  CHECK(rb.payload == "B");
  auto [fa, ra] = p.recv();
  CHECK(fa.stream == 3);
  CHECK(ra.status.code == ttrpc::Code::not_found);
  CHECK(ra.status.message == "gone");
}

TEST_CASE("call() against the server on a real Unix socket; a dead path is an error, not a hang") {
  nes::test::TempDir tmp;
  const std::filesystem::path& dir = tmp.path;
  {
    asio::io_context io;
    ttrpc::Server server(io);
    server.add("svc", "Echo", [](ttrpc::Call&& c, ttrpc::Respond r) { r({{}, "echo:" + c.payload}); });
    auto l = ttrpc::listen_unix(dir / "s.sock");
    REQUIRE(l);
    server.serve(std::move(*l));
    std::thread t([&] { io.run_for(std::chrono::seconds(10)); });
    auto r = ttrpc::call(dir / "s.sock", {"svc", "Echo", "x", 0, {}}, std::chrono::seconds(5));
    auto u = ttrpc::call(dir / "s.sock", {"svc", "Gone", "", 0, {}}, std::chrono::seconds(5));
    io.stop();
    t.join();
    REQUIRE(r);
    CHECK(r->payload == "echo:x");
    REQUIRE(u);
    CHECK(u->status.code == ttrpc::Code::unimplemented);
  }
  auto none = ttrpc::call(dir / "s.sock", {"svc", "Echo", "", 0, {}}, std::chrono::milliseconds(200));
  CHECK(!none);
}

TEST_CASE("server: a call beyond the in-flight limit is refused on its stream; the connection serves on") {
  Pair p;
  std::string batch;
  for (std::uint32_t i = 0; i < ttrpc::Server::kMaxInFlight; ++i)
    batch += ttrpc::encode_frame(2 * i + 1, ttrpc::MsgType::request, ttrpc::encode_request({"svc", "Later", "", 0, {}}));
  p.send_raw(batch);
  const std::uint32_t over = 2 * ttrpc::Server::kMaxInFlight + 1;
  p.send(over, "svc", "Later", "");
  auto [f, r] = p.recv();
  CHECK(f.stream == over);
  CHECK(r.status.code == ttrpc::Code::resource_exhausted);
  CHECK(p.later.size() == ttrpc::Server::kMaxInFlight);
  CHECK(p.server.connections() == 1);
  p.later.front().second({{}, "first"});  // one answered: room for one more
  auto [f1, r1] = p.recv();
  CHECK(f1.stream == 1);
  p.send(over + 2, "svc", "Echo", "still");
  auto [f2, r2] = p.recv();
  CHECK(f2.stream == over + 2);
  CHECK(r2.payload == "echo:still");
}

TEST_CASE("frames containerd 1.6.20 really sent: split, decoded, and re-encoded byte for byte") {
  const char* src = std::getenv("NES_SOURCE_ROOT");
  REQUIRE(src);
  std::ifstream in(std::filesystem::path(src) / "tests/shim/frames/containerd-1.6.20-ctr-run.to_shim", std::ios::binary);
  REQUIRE(in);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == 608);
  ttrpc::FrameReader r;
  r.feed(bytes);
  std::vector<std::string> methods, timeouts;
  std::string again;
  std::uint32_t want_stream = 1;
  while (auto f = r.next()) {
    CHECK(f->stream == want_stream);
    want_stream += 2;
    CHECK(f->type == 1);
    CHECK(f->flags == 0);
    nes::ttrpc::wire::Request q;
    REQUIRE(q.ParseFromString(f->payload));
    CHECK(q.service() == "containerd.task.v2.Task");
    methods.push_back(q.method());
    ttrpc::Call c{q.service(), q.method(), q.payload(), q.timeout_nano(), {}};
    for (const auto& kv : q.metadata()) c.metadata.emplace_back(kv.key(), kv.value());
    CHECK(ttrpc::encode_request(c) == f->payload);  // our encoder writes what Go's did
    again += ttrpc::encode_frame(f->stream, ttrpc::MsgType::request, ttrpc::encode_request(c));
    if (q.method() == "Create") {
      containerd::task::v2::CreateTaskRequest ct;
      REQUIRE(ct.ParseFromString(q.payload()));
      CHECK(ct.id() == "t1f");
      CHECK(ct.bundle().ends_with("/io.containerd.runtime.v2.task/default/t1f"));
      CHECK(ct.stdout().starts_with("file://"));  // ctr run --log-uri file://...
    }
    if (q.timeout_nano() != 0) timeouts.push_back(q.method());
  }
  CHECK(r.buffered() == 0);
  CHECK(again == bytes);
  CHECK(timeouts == std::vector<std::string>{"State", "Shutdown"});
  CHECK(methods == std::vector<std::string>{"Create", "Connect", "Connect", "Start", "Wait", "State", "State",
                                            "Delete", "Shutdown"});
}
