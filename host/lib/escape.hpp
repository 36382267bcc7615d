// Text from a guest, made safe to print: one line, no terminal control sequences.
#pragma once

#include <string>
#include <string_view>

namespace nes::host {

/// `s` with every byte a terminal or a line-oriented log could act on written as an escape:
/// `\\` for a backslash, `\n` `\r` `\t`, `\xHH` for any other C0 control or DEL, `\u0080`..`\u009f`
/// for the C1 controls (a terminal takes U+009B as CSI), and `\xHH` for each byte that is not part
/// of well-formed UTF-8. Valid printable UTF-8 is kept as is. The result never contains a byte
/// below 0x20 or 0x7f, so one event stays one line (the forged-line attack) and ESC/BEL never
/// reach a terminal.
std::string escape_text(std::string_view s);

}  // namespace nes::host
