// ttrpc's framing (github.com/containerd/ttrpc channel.go): a 10-byte header — payload length u32
// big-endian, stream id u32 big-endian, type u8, flags u8 — then the payload, at most 4 MiB.
// Sans-I/O, no protobuf: bytes in, frames out (fuzzed: fuzz/ttrpc_frame_fuzz.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace nes::ttrpc {

/// Header bytes before every message.
inline constexpr std::size_t kHeaderBytes = 10;
/// Largest message either side accepts (ttrpc's messageLengthMax), bytes.
inline constexpr std::uint32_t kMaxMessageBytes = 4u << 20;

/// Frame types (header byte 8). Others are ignored on receipt, as ttrpc does, for compatibility.
enum class MsgType : std::uint8_t { request = 1, response = 2 };

/// One frame as read. `oversized`: its header announced more than kMaxMessageBytes; its bytes were
/// skipped and `payload` is empty (ttrpc answers such a request RESOURCE_EXHAUSTED on its stream).
struct Frame {
  std::uint32_t stream = 0;
  std::uint8_t type = 0;
  std::uint8_t flags = 0;
  std::uint32_t length = 0;  // as announced by the header, bytes
  bool oversized = false;
  std::string payload;
  bool operator==(const Frame&) const = default;
};

/// Header plus payload. `payload` must be at most kMaxMessageBytes.
std::string encode_frame(std::uint32_t stream, MsgType type, std::string_view payload);

/// Splits a byte stream into frames. Holds at most one message (kMaxMessageBytes) plus the bytes
/// of one feed() call; an oversized message's bytes are dropped as they arrive.
class FrameReader {
 public:
  /// Append bytes read from the stream.
  void feed(std::string_view bytes);
  /// The next complete frame, or nullopt until more bytes are fed.
  std::optional<Frame> next();
  /// Bytes held (buffered, not yet returned as a frame).
  std::size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  std::size_t pos_ = 0;
  std::optional<Frame> skipping_;  // header of an oversized frame whose bytes are being dropped
  std::uint64_t skip_left_ = 0;
};

}  // namespace nes::ttrpc
