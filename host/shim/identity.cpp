// Length-framed SHA-256 names (host/shim/identity.hpp), with OpenSSL's libcrypto.
#include "host/shim/identity.hpp"

#include <openssl/evp.h>

#include <array>
#include <memory>

#include <fmt/format.h>

namespace nes::shim {

std::string framed_sha256(std::initializer_list<std::string_view> fields) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  for (auto f : fields) {
    std::array<unsigned char, 8> len{};
    std::uint64_t n = f.size();
    for (int i = 7; i >= 0; --i, n >>= 8) len[static_cast<std::size_t>(i)] = static_cast<unsigned char>(n & 0xff);
    EVP_DigestUpdate(ctx.get(), len.data(), len.size());
    EVP_DigestUpdate(ctx.get(), f.data(), f.size());
  }
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int mdlen = 0;
  EVP_DigestFinal_ex(ctx.get(), md.data(), &mdlen);
  std::string hex;
  for (unsigned int i = 0; i < mdlen; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string vm_id(std::string_view ns, std::string_view id) { return "ctr-" + framed_sha256({ns, id}).substr(0, 24); }

std::filesystem::path socket_path(std::string_view containerd_address, std::string_view ns, std::string_view id) {
  std::string_view a = containerd_address;
  if (a.starts_with("unix://")) a.remove_prefix(7);
  std::filesystem::path dir = std::filesystem::path(a).parent_path();
  if (dir.empty()) dir = "/run/containerd";
  return dir / "s" / framed_sha256({containerd_address, ns, id});
}

}  // namespace nes::shim
