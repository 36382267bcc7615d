#include "codec.hpp"
// placeholder: being implemented (issue 2)
namespace nes::proto {
GuestDecoded decode_guest(std::string_view) { return DecodeError{"not implemented"}; }
HostDecoded decode_host(std::string_view) { return DecodeError{"not implemented"}; }
std::string encode(const GuestMessage&) { return {}; }
std::string encode(const HostMessage&) { return {}; }
}
