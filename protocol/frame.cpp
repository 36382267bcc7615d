// Data-channel frames: encoder and incremental decoder (docs/protocol.md "Data channel").
#include "frame.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace nes::proto {
namespace {

void put_header(std::string& out, Stream s, FrameKind k, std::uint32_t len, std::uint16_t proc) {
  const char h[kFrameHeader] = {static_cast<char>(s), static_cast<char>(k),
                                static_cast<char>(proc >> 8), static_cast<char>(proc),
                                static_cast<char>(len >> 24), static_cast<char>(len >> 16),
                                static_cast<char>(len >> 8), static_cast<char>(len)};
  out.append(h, kFrameHeader);
}

std::uint64_t be(const unsigned char* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

bool known_stream(unsigned v) { return v <= 2; }
bool known_kind(unsigned v) { return v <= 7; }

void put_u64(std::string& out, std::uint64_t v) {
  char p[8];
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (56 - 8 * i));
  out.append(p, 8);
}

}  // namespace

std::string_view to_string(Stream s) {
  switch (s) {
    case Stream::in: return "stdin";
    case Stream::out: return "stdout";
    case Stream::err: return "stderr";
  }
  return "stream";
}

std::string_view to_string(FrameKind k) {
  switch (k) {
    case FrameKind::data: return "data";
    case FrameKind::eof: return "eof";
    case FrameKind::resize: return "resize";
    case FrameKind::dropped: return "dropped";
    case FrameKind::ack: return "ack";
    case FrameKind::position: return "position";
    case FrameKind::hello: return "hello";
    case FrameKind::close: return "close";
  }
  return "frame";
}

void append_data(std::string& out, Stream s, std::string_view bytes, std::uint16_t proc) {
  while (!bytes.empty()) {
    const std::size_t n = std::min(bytes.size(), kFrameDataMax);
    put_header(out, s, FrameKind::data, static_cast<std::uint32_t>(n), proc);
    out.append(bytes.data(), n);
    bytes.remove_prefix(n);
  }
}

void append_data_header(std::string& out, Stream s, std::size_t len, std::uint16_t proc) {
  put_header(out, s, FrameKind::data, static_cast<std::uint32_t>(len), proc);
}

void append_eof(std::string& out, Stream s, std::uint16_t proc) { put_header(out, s, FrameKind::eof, 0, proc); }

void append_resize(std::string& out, std::uint16_t rows, std::uint16_t cols, std::uint16_t proc) {
  put_header(out, Stream::in, FrameKind::resize, 4, proc);
  const char p[4] = {static_cast<char>(rows >> 8), static_cast<char>(rows),
                     static_cast<char>(cols >> 8), static_cast<char>(cols)};
  out.append(p, 4);
}

void append_dropped(std::string& out, Stream s, std::uint64_t count, std::uint16_t proc) {
  put_header(out, s, FrameKind::dropped, 8, proc);
  put_u64(out, count);
}

void append_ack(std::string& out, Stream s, std::uint64_t position, std::uint16_t proc) {
  put_header(out, s, FrameKind::ack, 8, proc);
  put_u64(out, position);
}

void append_position(std::string& out, Stream s, std::uint64_t position, std::uint16_t proc) {
  put_header(out, s, FrameKind::position, 8, proc);
  put_u64(out, position);
}

void append_hello(std::string& out, std::uint64_t generation, std::string_view vm) {
  put_header(out, Stream::in, FrameKind::hello, static_cast<std::uint32_t>(8 + vm.size()), 0);
  put_u64(out, generation);
  out.append(vm);
}

void append_close(std::string& out) { put_header(out, Stream::in, FrameKind::close, 0, 0); }

void append_frame(std::string& out, const Frame& f) {
  switch (f.kind) {
    case FrameKind::data: append_data(out, f.stream, f.data, f.proc); return;
    case FrameKind::eof: append_eof(out, f.stream, f.proc); return;
    case FrameKind::resize:
      put_header(out, f.stream, FrameKind::resize, 4, f.proc);
      out.push_back(static_cast<char>(f.rows >> 8));
      out.push_back(static_cast<char>(f.rows));
      out.push_back(static_cast<char>(f.cols >> 8));
      out.push_back(static_cast<char>(f.cols));
      return;
    case FrameKind::dropped: append_dropped(out, f.stream, f.dropped, f.proc); return;
    case FrameKind::ack: append_ack(out, f.stream, f.position, f.proc); return;
    case FrameKind::position: append_position(out, f.stream, f.position, f.proc); return;
    case FrameKind::hello:
      put_header(out, f.stream, FrameKind::hello, static_cast<std::uint32_t>(8 + f.data.size()), f.proc);
      put_u64(out, f.generation);
      out.append(f.data);
      return;
    case FrameKind::close: put_header(out, f.stream, FrameKind::close, 0, f.proc); return;
  }
}

std::string encode_frame(const Frame& f) {
  std::string out;
  append_frame(out, f);
  return out;
}

FrameDecoder::FrameDecoder(FrameRules rules) : rules_(rules) {}

bool FrameDecoder::open_process(std::uint16_t proc, FrameRules rules) {
  if (proc == 0) return false;
  close_process(proc);
  if (procs_.size() >= kExecMax) return false;
  procs_.push_back(Proc{proc, rules, {false, false, false}});
  highest_ = std::max(highest_, proc);
  return true;
}

void FrameDecoder::close_process(std::uint16_t proc) {
  std::erase_if(procs_, [&](const Proc& p) { return p.proc == proc; });
}

bool FrameDecoder::fail(std::string reason) {
  error_ = fmt::format("{} (frame at byte {})", reason, start_);
  return false;
}

/// Judges a complete header against the grammar and the session's rules, before any payload is
/// buffered (so an oversized length is refused without reading it).
bool FrameDecoder::check_header() {
  const unsigned s = hdr_[0], k = hdr_[1];
  len_ = static_cast<std::uint32_t>(be(hdr_ + 4, 4));
  proc_ = static_cast<std::uint16_t>(be(hdr_ + 2, 2));
  skip_ = false;
  if (!known_kind(k)) return fail(fmt::format("frame: kind {} unknown", k));
  const auto kind = static_cast<FrameKind>(k);
  const std::string_view kn = to_string(kind);
  if (!known_stream(s)) return fail(fmt::format("{} frame: stream {} unknown", kn, s));
  const auto stream = static_cast<Stream>(s);
  std::string where = fmt::format("{} frame on {}", kn, to_string(stream));
  FrameRules rules = rules_;
  bool* eof = eof_;
  if (proc_ != 0) {
    where += fmt::format(" of process {}", proc_);
    auto it = std::find_if(procs_.begin(), procs_.end(), [&](const Proc& p) { return p.proc == proc_; });
    if (it == procs_.end()) {
      if (proc_ > highest_) return fail(where + ": no such process");
      // A process that ended: what it (or the peer) still had in flight is skipped, its
      // length still bounded.
      if (len_ > kFrameDataMax)
        return fail(fmt::format("{}: length {} over the cap of {} bytes", where, len_, kFrameDataMax));
      skip_ = true;
      return true;
    }
    rules = it->rules;
    eof = it->eof;
  }
  const bool from_host = rules.sender == FrameSender::host;
  const bool resume_kind = kind == FrameKind::ack || kind == FrameKind::position || kind == FrameKind::hello ||
                           kind == FrameKind::close;
  if (resume_kind) {
    if (!rules.resume) return fail(where + ": data channel resume is off (boot.stdio.replay_bytes)");
    bool ok = false;
    if (kind == FrameKind::hello) ok = !from_host && stream == Stream::in && proc_ == 0;
    else if (kind == FrameKind::close) ok = from_host && stream == Stream::in && proc_ == 0;
    else if (from_host) ok = stream != Stream::in && !(rules.terminal && stream == Stream::err);
    else if (kind == FrameKind::position)  // the guest's: stdin's (attached), or an output stream's
      ok = stream == Stream::in ? rules.input : !(rules.terminal && stream == Stream::err);
    else ok = stream == Stream::in && rules.input;  // ack: of stdin
    if (!ok) return fail(fmt::format("{}: not a {} frame", where, from_host ? "host-to-guest" : "guest-to-host"));
    if (kind == FrameKind::close) return len_ == 0 || fail(fmt::format("{}: length {} (expected 0)", where, len_));
    if (kind == FrameKind::hello)
      return (len_ >= 8 && len_ <= 8 + kHelloVmMax) ||
             fail(fmt::format("{}: length {} (expected 8..{})", where, len_, 8 + kHelloVmMax));
    return len_ == 8 || fail(fmt::format("{}: length {} (expected 8)", where, len_));
  }
  bool legal = false;
  if (from_host) {
    legal = stream == Stream::in && (kind == FrameKind::data || kind == FrameKind::eof ||
                                     kind == FrameKind::resize);
  } else {
    legal = stream != Stream::in && kind != FrameKind::resize;
  }
  if (!legal)
    return fail(fmt::format("{}: not a {} frame", where, from_host ? "host-to-guest" : "guest-to-host"));
  if (kind == FrameKind::resize && !rules.terminal) return fail(where + ": no terminal");
  if (from_host && kind == FrameKind::data && !rules.input) return fail(where + ": stdin not attached");
  if (!from_host && rules.terminal && stream == Stream::err)
    return fail(where + ": with a terminal all output is stdout");
  if (kind == FrameKind::dropped && !rules.lossy) return fail(where + ": not in lossy mode");
  if (kind != FrameKind::resize && eof[s]) return fail(where + ": stream already at eof");
  switch (kind) {
    case FrameKind::data:
      if (len_ == 0) return fail(fmt::format("{}: length 0 (expected 1..{})", where, kFrameDataMax));
      if (len_ > kFrameDataMax)
        return fail(fmt::format("{}: length {} over the cap of {} bytes", where, len_, kFrameDataMax));
      return true;
    case FrameKind::eof:
      return len_ == 0 || fail(fmt::format("{}: length {} (expected 0)", where, len_));
    case FrameKind::resize:
      return len_ == 4 || fail(fmt::format("{}: length {} (expected 4)", where, len_));
    case FrameKind::dropped:
      return len_ == 8 || fail(fmt::format("{}: length {} (expected 8)", where, len_));
    default: break;
  }
  return true;
}

/// The current frame is complete: judge its payload and hand it out.
bool FrameDecoder::finish(Frame& out) {
  out = Frame{};
  out.proc = proc_;
  out.stream = static_cast<Stream>(hdr_[0]);
  out.kind = static_cast<FrameKind>(hdr_[1]);
  const auto* p = reinterpret_cast<const unsigned char*>(payload_.data());
  switch (out.kind) {
    case FrameKind::data: out.data = std::move(payload_); break;
    case FrameKind::eof:
      if (proc_ == 0) {
        eof_[hdr_[0]] = true;
      } else {
        for (Proc& pr : procs_)
          if (pr.proc == proc_) pr.eof[hdr_[0]] = true;
      }
      break;
    case FrameKind::resize:
      out.rows = static_cast<std::uint16_t>(be(p, 2));
      out.cols = static_cast<std::uint16_t>(be(p + 2, 2));
      if (out.rows == 0 || out.cols == 0)
        return fail(fmt::format("resize frame on stdin{}: {} {} (expected 1..65535)",
                                proc_ ? fmt::format(" of process {}", proc_) : std::string(),
                                out.rows == 0 ? "rows" : "cols", 0));
      break;
    case FrameKind::dropped: out.dropped = be(p, 8); break;
    case FrameKind::ack:
    case FrameKind::position: out.position = be(p, 8); break;
    case FrameKind::hello:
      out.generation = be(p, 8);
      out.data.assign(payload_, 8);
      break;
    case FrameKind::close: break;
  }
  payload_.clear();
  have_ = 0;
  return true;
}

std::optional<Frame> FrameDecoder::next(std::string_view& in) {
  while (!failed() && !in.empty()) {
    if (have_ == 0) start_ = offset_;
    if (have_ < kFrameHeader) {
      const std::size_t n = std::min(kFrameHeader - have_, in.size());
      std::copy_n(reinterpret_cast<const unsigned char*>(in.data()), n, hdr_ + have_);
      have_ += n;
      offset_ += n;
      in.remove_prefix(n);
      if (have_ < kFrameHeader) return std::nullopt;
      if (!check_header()) return std::nullopt;
      payload_.clear();
      if (len_ == 0) {
        Frame f;
        if (skip_) {
          have_ = 0;
          continue;
        }
        if (finish(f)) return f;
        return std::nullopt;
      }
      continue;
    }
    const std::size_t want = kFrameHeader + len_ - have_;
    const std::size_t n = std::min(want, in.size());
    if (!skip_) payload_.append(in.data(), n);
    have_ += n;
    offset_ += n;
    in.remove_prefix(n);
    if (n == want && skip_) {
      have_ = 0;
      continue;
    }
    if (n == want) {
      Frame f;
      if (finish(f)) return f;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace nes::proto
