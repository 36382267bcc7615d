// ttrpc framing (host/shim/ttrpc_frame.hpp).
#include "host/shim/ttrpc_frame.hpp"

#include <algorithm>

namespace nes::ttrpc {

namespace {

void put_u32(std::string& s, std::uint32_t v) {
  s.push_back(static_cast<char>(v >> 24));
  s.push_back(static_cast<char>(v >> 16));
  s.push_back(static_cast<char>(v >> 8));
  s.push_back(static_cast<char>(v));
}

std::uint32_t get_u32(const char* p) {
  auto b = reinterpret_cast<const unsigned char*>(p);
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

}  // namespace

std::string encode_frame(std::uint32_t stream, MsgType type, std::string_view payload) {
  std::string s;
  s.reserve(kHeaderBytes + payload.size());
  put_u32(s, static_cast<std::uint32_t>(payload.size()));
  put_u32(s, stream);
  s.push_back(static_cast<char>(type));
  s.push_back(0);
  s.append(payload);
  return s;
}

void FrameReader::feed(std::string_view bytes) {
  if (skip_left_ > 0) {
    auto n = std::min<std::uint64_t>(skip_left_, bytes.size());
    skip_left_ -= n;
    bytes.remove_prefix(n);
  }
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (64u << 10) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

std::optional<Frame> FrameReader::next() {
  if (skipping_) {
    if (skip_left_ > 0) return std::nullopt;
    // Bytes fed after the skipped message were appended behind it.
    Frame f = std::move(*skipping_);
    skipping_.reset();
    return f;
  }
  if (buffered() < kHeaderBytes) return std::nullopt;
  const char* h = buf_.data() + pos_;
  Frame f;
  f.length = get_u32(h);
  f.stream = get_u32(h + 4);
  f.type = static_cast<std::uint8_t>(h[8]);
  f.flags = static_cast<std::uint8_t>(h[9]);
  if (f.length > kMaxMessageBytes) {
    pos_ += kHeaderBytes;
    f.oversized = true;
    std::uint64_t have = buffered();
    std::uint64_t drop = std::min<std::uint64_t>(have, f.length);
    pos_ += drop;
    skip_left_ = f.length - drop;
    if (skip_left_ == 0) return f;
    // Whatever is still buffered belongs to the oversized message; feed() drops the rest.
    skipping_ = std::move(f);
    return std::nullopt;
  }
  if (buffered() < kHeaderBytes + f.length) return std::nullopt;
  f.payload.assign(h + kHeaderBytes, f.length);
  pos_ += kHeaderBytes + f.length;
  return f;
}

}  // namespace nes::ttrpc
