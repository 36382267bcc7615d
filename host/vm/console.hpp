// The VM console as neshost shows it: the serial line's CRLF turned back into LF (docs/vm.md).
#pragma once

#include <string>
#include <string_view>

namespace nes::vm {

/// Undoes the guest tty's ONLCR: "\r\n" becomes "\n"; every other byte, a lone '\r' included,
/// passes unchanged. Stateful across chunks (a '\r' ending one chunk is held until the next byte
/// is known); finish() returns a held '\r' at the end of the stream.
class CrlfToLf {
 public:
  /// Converts one chunk; the result may be one byte shorter or longer than the input.
  std::string feed(std::string_view chunk);
  /// At end of stream: "\r" if one was held, else "".
  std::string finish();

 private:
  bool cr_ = false;
};

}  // namespace nes::vm
