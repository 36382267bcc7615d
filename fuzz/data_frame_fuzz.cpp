// The data channel's frames and the init's side of data channel resume (docs/protocol.md "Data
// channel", "Data channel resume"). Part 1: FrameDecoder under arbitrary bytes, rules and cuts:
// the frames and the error do not depend on the cuts, every frame re-encodes to its bytes, what
// it holds stays within one frame. Part 2: a StdioCore with resume driven by fuzz-chosen events
// (workload output, host frames of every kind including arbitrary bytes, losses and redials,
// writes of any size): the replay ring never exceeds replay_bytes, sent never exceeds framed,
// a resume never replays a position the host already has, and every error is named.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "nesinit/stdio.hpp"
#include "protocol/frame.hpp"

using namespace nes;
using proto::FrameKind;
using proto::Stream;

namespace {

void frames_part(fuzz::Cursor& c) {
  proto::FrameRules r;
  const unsigned bits = c.byte();
  r.sender = bits & 1 ? proto::FrameSender::host : proto::FrameSender::guest;
  r.terminal = bits & 2;
  r.input = bits & 4;
  r.lossy = bits & 8;
  r.resume = bits & 16;
  std::vector<std::size_t> cuts;
  for (unsigned n = c.pick(8); n > 0; --n) cuts.push_back(1 + c.pick(80));
  std::string_view stream = c.bytes(2048);
  proto::FrameDecoder whole(r), split(r);
  std::vector<proto::Frame> a, b;
  std::string_view w = stream;
  while (auto f = whole.next(w)) a.push_back(std::move(*f));
  fuzz::feed_in_cuts(stream, cuts, [&](std::string_view piece) {
    while (auto f = split.next(piece)) b.push_back(std::move(*f));
  });
  fuzz::require(a == b, "frames do not depend on the cuts");
  fuzz::require(whole.error() == split.error(), "the error does not depend on the cuts");
  std::string again;
  for (const auto& f : a) proto::append_frame(again, f);
  fuzz::require(stream.substr(0, again.size()) == again || a.empty() ||
                    std::any_of(a.begin(), a.end(), [](const proto::Frame& f) { return f.proc != 0; }),
                "frames re-encode to their bytes");
}

void resume_part(fuzz::Cursor& c) {
  proto::Stdio s;
  s.buffer_bytes = 4096;
  s.replay_bytes = 4096 + c.pick(4) * 4096;
  s.mode = c.pick(2) ? proto::StdioMode::lossy : proto::StdioMode::lossless;
  s.attach_stdin = c.pick(2);
  if (c.pick(4) == 0) s.terminal = proto::Terminal{24, 80};
  init::StdioCore core(s);
  core.enable_resume(c.byte(), "vm");
  std::uint64_t host_pos[3] = {0, 0, 0};  // what a host that reads everything would have
  for (unsigned step = 0; step < 64 && !c.empty(); ++step) {
    switch (c.pick(8)) {
      case 0: {
        const Stream st = c.pick(2) && !s.terminal ? Stream::err : Stream::out;
        std::string_view b = c.bytes(6000);
        if (core.out_room(st) > 0 && !b.empty()) core.on_output(st, b.substr(0, core.out_room(st)));
        break;
      }
      case 1: {  // the host reads what is due (or part of it)
        std::string_view v = core.tx();
        const std::size_t n = std::min<std::size_t>(v.size(), c.pick(2) ? v.size() : c.pick(4096));
        core.sent(n);
        break;
      }
      case 2: {  // a well-formed host frame
        std::string w;
        const Stream st = c.pick(2) && !s.terminal ? Stream::err : Stream::out;
        const std::uint64_t pos = c.pick(2) ? core.framed_total(st) - c.pick(200) % (core.framed_total(st) + 1)
                                            : std::uint64_t{c.byte()} << c.pick(40);
        switch (c.pick(4)) {
          case 0: proto::append_position(w, st, pos); break;
          case 1: proto::append_ack(w, st, pos); break;
          case 2: proto::append_close(w); break;
          default: proto::append_data(w, Stream::in, c.bytes(100)); break;
        }
        host_pos[static_cast<int>(st)] = pos;
        if (core.rx_room() > 0) core.on_rx(w);
        break;
      }
      case 3:  // arbitrary bytes from the host
        if (core.rx_room() > 0) core.on_rx(c.bytes(64));
        break;
      case 4: core.channel_lost(); break;
      case 5: core.channel_resumed(); break;
      case 6: core.on_output_eof(c.pick(2) ? Stream::err : Stream::out); break;
      default: core.in_written(core.in_pending().size()); break;
    }
    for (Stream st : {Stream::out, Stream::err}) {
      fuzz::require(core.ring_size(st) <= s.replay_bytes, "the ring holds at most replay_bytes");
      fuzz::require(core.framed(st) <= core.framed_total(st), "sent <= framed");
      fuzz::require(core.ring_start(st) + core.ring_size(st) == core.framed_total(st) || !core.channel_open(),
                    "the ring ends at the stream's position");
    }
    if (!core.rx_error().empty()) {
      fuzz::require(core.rx_error().size() < 512, "errors are bounded");
      break;
    }
  }
  (void)host_pos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Cursor c(data, size);
  if (c.pick(2)) frames_part(c);
  else resume_part(c);
  return 0;
}
