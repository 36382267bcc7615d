// Encoding (fmt) and decoding (simdjson On Demand) of one line of the lifecycle channel.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "base/result.hpp"
#include "messages.hpp"

namespace nes::proto {

/// A line whose `type` this direction does not know: callers log it and skip it.
struct UnknownMessage {
  std::string type;
  bool operator==(const UnknownMessage&) const = default;
};

/// A line that cannot be acted on. `reason` names the field path and what was expected, e.g.
/// `boot.exec.uid: expected unsigned 32-bit integer, got -1`.
struct DecodeError {
  std::string reason;
  bool operator==(const DecodeError&) const = default;
};

/// Deepest nesting of JSON objects/arrays accepted on a line, the top-level object counting as 1.
/// Deeper lines are a DecodeError (bounded recursion; the contract itself needs 3).
inline constexpr int kMaxJsonDepth = 64;

/// What a guest line carries beside its message's own fields to fence it to one session
/// (additive, docs/protocol.md "Fencing"): `generation` (1..2^53-1), which this project's init
/// echoes from `boot.generation` in every line it sends after that `boot` (a resumed `ready`
/// included). Unset: a line without it (an init that predates the field, or a `ready` before any
/// `boot`), which a host accepts as before.
struct GuestEnvelope {
  std::optional<std::uint64_t> generation;
  bool operator==(const GuestEnvelope&) const = default;
};

/// Result of decoding one line from the guest (used by the host).
using GuestDecoded = std::variant<GuestMessage, UnknownMessage, DecodeError>;
/// Result of decoding one line from the host (used by the guest).
using HostDecoded = std::variant<HostMessage, UnknownMessage, DecodeError>;

/// Decode one line (without its '\n'; a trailing '\r' is tolerated). Never throws.
/// Strict JSON, exactly one object; duplicate keys in any object, nesting deeper than
/// kMaxJsonDepth, NUL in a contract string, and out-of-range values are DecodeErrors; unknown
/// fields are ignored; an unknown `type` is UnknownMessage. No length cap here: the LineReader
/// caps lines. Policies and their reasons: docs/protocol.md.
GuestDecoded decode_guest(std::string_view line);
/// decode_guest(line), also reading the line's envelope into `envelope` (set only when the result
/// is a GuestMessage): a top-level `generation` outside 1..2^53-1 is a DecodeError naming it
/// (`workload_exited.generation: expected integer 1..9007199254740991, got 0`).
GuestDecoded decode_guest(std::string_view line, GuestEnvelope& envelope);
/// Decode one line (without its '\n'; a trailing '\r' is tolerated). Never throws.
HostDecoded decode_host(std::string_view line);

/// Compact JSON, `type` first, unset optionals omitted, no trailing newline. Exceptions that keep
/// the reference's shape: `exec.cwd` unset is written as null; additive fields at their default
/// (`groups` empty, `fs` virtiofs) are omitted.
/// Strings: `"` `\` and every control character escaped; invalid UTF-8 bytes each become U+FFFD
/// (the output is always valid JSON/UTF-8). Values are written as given: a NUL byte becomes
/// \u0000 and a WorkloadExited with both/neither field is written so; the peer refuses such lines
/// (check with validate()). Precondition for WorkloadExited: exactly one field set.
std::string encode(const GuestMessage& m);
std::string encode(const HostMessage& m);

/// encode(m) followed by '\n': one line ready to write to the stream.
std::string encode_line(const GuestMessage& m);
std::string encode_line(const HostMessage& m);
/// encode_line(m) with `envelope`'s fields written after the message's own (`generation` when
/// set: `{"type":"workload_exited","exit_code":7,"generation":3}`): what the init sends after `boot`.
std::string encode_line(const GuestMessage& m, const GuestEnvelope& envelope);

/// Would the peer accept `m`? Ok if decode(encode(m)) == m; otherwise the DecodeError the
/// peer would report (e.g. `boot.exec.argv: expected non-empty array of strings, got []`), or a
/// DecodeError naming the type when a string is not valid UTF-8 (encode would alter it).
/// Senders call it before writing a line they built from outside input.
base::StatusOf<DecodeError> validate(const GuestMessage& m);
base::StatusOf<DecodeError> validate(const HostMessage& m);

/// `s` as a JSON string literal (quotes included), escaped exactly as encode() escapes strings:
/// valid UTF-8 kept, invalid bytes each U+FFFD. For other JSON the project writes (records).
std::string json_quote(std::string_view s);

/// The wire text of boot.network's values, as encode() writes them: inet_ntop(3)'s text of an
/// address ("10.0.2.15", "fd00::2"), "ADDR/LEN", and a MAC in lower-case hex ("52:54:00:12:34:56").
std::string ip_text(const IpAddr& a);
std::string prefix_text(const IpPrefix& p);
std::string mac_text(const MacAddr& m);
/// `text` as an address, read as decode() reads one (inet_pton(3): dotted quad or IPv6 text);
/// nullopt if it is neither. For hosts that take addresses from users (`neshost run --dns`).
std::optional<IpAddr> ip_from_text(std::string_view text);
/// boot.network's text rules, as decode() checks them. A hostname or search domain: 1..253 bytes
/// of letters, digits, '-', '.', '_' (what resolv.conf(5) and hosts(5) hold unquoted). A
/// resolv.conf(5) option: 1..64 printable ASCII bytes, no spaces.
bool valid_dns_name(std::string_view s);
bool valid_dns_option(std::string_view s);

/// The wire tag of a message ("ready", "boot", ...).
std::string_view type_name(const GuestMessage& m);
std::string_view type_name(const HostMessage& m);

}  // namespace nes::proto
