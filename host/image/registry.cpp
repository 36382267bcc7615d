// The registry v2 client (registry.hpp) on libcurl's easy and multi interfaces.
#include "host/image/registry.hpp"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <mutex>
#include <simdjson.h>
#include <fmt/format.h>

namespace nes::image {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxSmallBody = 1u << 20;  // token answers, error bodies
constexpr std::size_t kMaxErrorBody = 64u << 10;
constexpr std::size_t kMaxHeader = 8192;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

std::string base64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
  return out;
}

std::string status_text(long code) {
  switch (code) {
    case 400: return "400 Bad Request";
    case 401: return "401 Unauthorized";
    case 403: return "403 Forbidden";
    case 404: return "404 Not Found";
    case 429: return "429 Too Many Requests";
    case 500: return "500 Internal Server Error";
    case 502: return "502 Bad Gateway";
    case 503: return "503 Service Unavailable";
    case 504: return "504 Gateway Timeout";
    default: return fmt::format("HTTP {}", code);
  }
}

/// The registry's own words from an error body ({"errors":[{"code","message"}]}), or "".
std::string registry_says(std::string_view body) {
  if (body.empty()) return {};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(body);
  simdjson::dom::element doc;
  if (parser.parse(padded).get(doc)) return {};
  simdjson::dom::array errs;
  if (doc["errors"].get(errs)) {
    std::string_view d;
    if (!doc["details"].get(d)) return std::string(d);
    return {};
  }
  std::string out;
  for (auto e : errs) {
    std::string_view code, msg;
    if (e["code"].get(code)) code = {};
    if (e["message"].get(msg)) msg = {};
    if (!out.empty()) out += "; ";
    out += code.empty() ? std::string(msg) : fmt::format("{}: {}", code, msg);
    if (out.size() > 400) break;
  }
  return out;
}

/// Response headers we use, from the last response (a redirect's are dropped).
struct Headers {
  std::string www_authenticate, content_type, docker_digest;
  void reset() { *this = Headers{}; }
};

std::size_t on_header(char* p, std::size_t sz, std::size_t n, void* ud) {
  auto* h = static_cast<Headers*>(ud);
  std::string_view line(p, sz * n);
  if (line.starts_with("HTTP/")) {
    h->reset();
    return sz * n;
  }
  auto colon = line.find(':');
  if (colon == std::string_view::npos || line.size() > kMaxHeader) return sz * n;
  std::string name = lower(trim(line.substr(0, colon)));
  std::string_view value = trim(line.substr(colon + 1));
  if (name == "www-authenticate" && h->www_authenticate.empty())
    h->www_authenticate = value;
  else if (name == "content-type")
    h->content_type = value.substr(0, value.find(';'));
  else if (name == "docker-content-digest")
    h->docker_digest = value;
  return sz * n;
}

struct Body {
  std::string data;
  std::size_t max = 0;
  bool overflow = false;
};

std::size_t on_body(char* p, std::size_t sz, std::size_t n, void* ud) {
  auto* b = static_cast<Body*>(ud);
  if (b->data.size() + sz * n > b->max) {
    b->overflow = true;
    return 0;  // CURLE_WRITE_ERROR: the body is larger than we accept
  }
  b->data.append(p, sz * n);
  return sz * n;
}


}  // namespace

std::optional<Challenge> parse_challenge(std::string_view h) {
  h = trim(h);
  auto sp = h.find(' ');
  Challenge c;
  c.scheme = std::string(h.substr(0, sp));
  if (c.scheme.empty()) return std::nullopt;
  if (sp == std::string_view::npos) return c;
  std::string_view rest = h.substr(sp + 1);
  while (!rest.empty()) {
    rest = trim(rest);
    if (!rest.empty() && rest.front() == ',') {
      rest.remove_prefix(1);
      continue;
    }
    auto eq = rest.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    std::string key = lower(trim(rest.substr(0, eq)));
    if (key.empty() || key.find_first_of(" ,\"") != std::string::npos) return std::nullopt;
    rest.remove_prefix(eq + 1);
    rest = trim(rest);
    std::string value;
    if (!rest.empty() && rest.front() == '"') {
      std::size_t i = 1;
      for (; i < rest.size() && rest[i] != '"'; ++i) {
        if (rest[i] == '\\' && i + 1 < rest.size()) ++i;
        value += rest[i];
      }
      if (i >= rest.size()) return std::nullopt;  // unterminated quote
      rest.remove_prefix(i + 1);
    } else {
      auto end = rest.find(',');
      value = std::string(trim(rest.substr(0, end)));
      rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
    }
    c.params[key] = value;
    if (c.params.size() > 32) return std::nullopt;
  }
  return c;
}

CertFiles cert_files_for(const std::string& host, const TlsConfig& tls) {
  CertFiles out;
  fs::path dir;
  std::error_code ec;
  if (!tls.cert_dir.empty()) {
    dir = tls.cert_dir;
  } else {
    for (const auto& root : tls.certs_d) {
      if (fs::is_directory(root / host, ec)) {
        dir = root / host;
        break;
      }
    }
  }
  if (dir.empty()) return out;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  for (const auto& p : entries) {
    if (p.extension() == ".crt") {
      out.cas.push_back(p);
    } else if (p.extension() == ".cert" && out.client_cert.empty()) {
      fs::path key = p;
      key.replace_extension(".key");
      if (fs::exists(key, ec)) {
        out.client_cert = p;
        out.client_key = key;
      }
    }
  }
  return out;
}

/// One transfer's state: its easy handle, headers, and where its body goes.
struct Transfer {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  Headers got_headers;
  Body body;
  char errbuf[CURL_ERROR_SIZE] = {};
  // Blob transfers only:
  BlobJob* job = nullptr;
  std::uint64_t got = 0;
  std::optional<Error> sink_error;
  bool retried = false;
  std::string host;

  Transfer() : easy(curl_easy_init()) {}
  ~Transfer() {
    if (easy) curl_easy_cleanup(easy);
    if (headers) curl_slist_free_all(headers);
  }
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
};

std::size_t on_blob(char* p, std::size_t sz, std::size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const std::size_t len = sz * n;
  long code = 0;
  curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
  if (code != 200) {  // an error body: kept (bounded) for the message, never the sink's
    if (t->body.data.size() + len <= kMaxErrorBody) t->body.data.append(p, len);
    return len;
  }
  if (t->got + len > t->job->size) {
    t->sink_error = Error{fmt::format("registry {}: blob {}: the registry sent more than the {} bytes "
                                      "the manifest says (size mismatch)",
                                      t->host, t->job->digest, t->job->size)};
    return 0;
  }
  auto st = t->job->write(std::span<const std::byte>(reinterpret_cast<const std::byte*>(p), len));
  if (!st) {
    t->sink_error = Error{fmt::format("registry {}: blob {}: {}", t->host, t->job->digest, st.error().message)};
    return 0;
  }
  t->got += len;
  if (t->job->progress) t->job->progress(t->got, t->job->size);
  return len;
}

struct Registry::Impl {
  std::string host;
  TlsConfig tls;
  std::optional<Credential> cred;
  /// The CAs every TLS connection of this client verifies against: the system bundle and the
  /// registry's own (certs.d, --cert-dir), parsed once and shared by reference (ssl_ctx()).
  /// curl would parse the ~140-certificate bundle again for each connection (the registry, the
  /// token realm, a second blob connection): ~20 ms each on an idle machine, 90-180 ms each at
  /// load 20 here, what P15 measured as most of the gap to skopeo, which loads its pool once.
  /// The system's CAs come from the hashed directory when there is one (the constructor).
  X509_STORE* cas = nullptr;
  std::string ca_error;  // why `cas` could not be made (the first connection's error says it)
  CertFiles certs;
  std::map<std::string, std::string> auth;  // scope ("" for /v2/) -> "Authorization: ..." line
  /// Connections, TLS sessions and DNS shared by every request of this client: the manifest,
  /// the token and the blobs reuse one TLS connection instead of a handshake each.
  CURLSH* share = nullptr;

  Impl() {
    share = curl_share_init();
    if (share) {
      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    }
  }
  ~Impl() {
    if (share) curl_share_cleanup(share);
    if (cas) X509_STORE_free(cas);
  }

  /// CURLOPT_SSL_CTX_FUNCTION: the shared CA store in place of the one curl made (empty: no
  /// CAINFO/CAPATH set), with the partial-chain flag curl sets on its own store.
  static CURLcode ssl_ctx(CURL*, void* sslctx, void* ud) {
    auto* self = static_cast<Impl*>(ud);
    if (!self->cas) return CURLE_SSL_CACERT_BADFILE;
    SSL_CTX_set1_cert_store(static_cast<SSL_CTX*>(sslctx), self->cas);
    return CURLE_OK;
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  /// Sets the options every request shares.
  void setup(Transfer& t, const std::string& url, std::string_view accept, const std::string& auth_line,
             bool plain_http_ok) {
    CURL* e = t.easy;
    t.host = host;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, plain_http_ok ? "https,http" : "https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, plain_http_ok ? "https,http" : "https");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "neshost");
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t.errbuf);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &t.got_headers);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
    // HTTP/1.1: one connection per blob in flight. curl 7.88's HTTP/2 window handling halved a
    // 67 MB layer's throughput here (P15), and registries gain nothing from multiplexing a few
    // large downloads. 256 KiB reads: fewer write() calls into the store.
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024);
    // TLS 1.3: AES-128-GCM first, as Go's client (skopeo, docker) asks; OpenSSL's default order
    // puts AES-256 first, which costs both ends more per byte for no practical gain here.
    curl_easy_setopt(e, CURLOPT_TLS13_CIPHERS,
                     "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
    if (share) curl_easy_setopt(e, CURLOPT_SHARE, share);
    if (!tls.verify) {
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    } else {
      curl_easy_setopt(e, CURLOPT_CAINFO, nullptr);
      curl_easy_setopt(e, CURLOPT_CAPATH, nullptr);
      curl_easy_setopt(e, CURLOPT_SSL_CTX_FUNCTION, &Impl::ssl_ctx);
      curl_easy_setopt(e, CURLOPT_SSL_CTX_DATA, this);
    }
    if (!certs.client_cert.empty()) {
      curl_easy_setopt(e, CURLOPT_SSLCERT, certs.client_cert.c_str());
      curl_easy_setopt(e, CURLOPT_SSLKEY, certs.client_key.c_str());
    }
    if (!accept.empty()) t.headers = curl_slist_append(t.headers, fmt::format("Accept: {}", accept).c_str());
    if (!auth_line.empty()) t.headers = curl_slist_append(t.headers, auth_line.c_str());
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
  }

  struct Answer {
    long status = 0;
    Headers headers;
    std::string body;
  };

  /// One blocking GET. `what` names the request in errors.
  Result<Answer> get(const std::string& url, std::string_view accept, const std::string& auth_line,
                     std::size_t max_body, std::string_view what, bool plain_http_ok) {
    Transfer t;
    if (!t.easy) return Error{fmt::format("registry {}: {}: curl_easy_init failed", host, what)};
    if (tls.verify && !cas) return Error{fmt::format("registry {}: {}: {}", host, what, ca_error)};
    setup(t, url, accept, auth_line, plain_http_ok);
    t.body.max = max_body;
    curl_easy_setopt(t.easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(t.easy, CURLOPT_WRITEDATA, &t.body);
    CURLcode rc = curl_easy_perform(t.easy);
    if (t.body.overflow)
      return Error{fmt::format("registry {}: {}: the answer is larger than {} bytes", host, what, max_body)};
    if (rc != CURLE_OK)
      return Error{fmt::format("registry {}: {}: {}", host, what, t.errbuf[0] ? t.errbuf : curl_easy_strerror(rc)),
                   static_cast<int>(rc)};
    Answer a;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &a.status);
    a.headers = std::move(t.got_headers);
    a.body = std::move(t.body.data);
    return a;
  }

  /// The Authorization line a 401's challenge asks for (fetching a token from the realm).
  Result<std::string> authenticate(const std::string& www_auth, const std::string& scope, std::string_view what) {
    auto ch = parse_challenge(www_auth);
    if (!ch)
      return Error{fmt::format("registry {}: {}: 401 Unauthorized without a WWW-Authenticate challenge we can read",
                               host, what)};
    std::string scheme = lower(ch->scheme);
    if (scheme == "basic") {
      if (!cred)
        return Error{fmt::format("registry {}: {}: 401 Unauthorized: the registry wants credentials "
                                 "(neshost login {})",
                                 host, what, host)};
      return "Authorization: Basic " + base64(cred->username + ":" + cred->password);
    }
    if (scheme != "bearer")
      return Error{fmt::format("registry {}: {}: 401 Unauthorized with an auth scheme we do not speak: {}", host,
                               what, ch->scheme)};
    auto realm = ch->params.find("realm");
    if (realm == ch->params.end() || realm->second.empty())
      return Error{fmt::format("registry {}: {}: the bearer challenge names no realm", host, what)};
    std::string url = realm->second;
    char sep = url.find('?') == std::string::npos ? '?' : '&';
    auto add = [&](std::string_view k, const std::string& v) {
      CURL* e = curl_easy_init();
      char* esc = curl_easy_escape(e, v.c_str(), static_cast<int>(v.size()));
      url += fmt::format("{}{}={}", sep, k, esc ? esc : "");
      curl_free(esc);
      curl_easy_cleanup(e);
      sep = '&';
    };
    if (auto s = ch->params.find("service"); s != ch->params.end()) add("service", s->second);
    std::string want = scope;
    if (auto s = ch->params.find("scope"); s != ch->params.end() && !s->second.empty()) want = s->second;
    if (!want.empty()) add("scope", want);
    if (cred) add("account", cred->username);
    std::string basic = cred ? "Authorization: Basic " + base64(cred->username + ":" + cred->password) : "";
    auto a = get(url, "application/json", basic, kMaxSmallBody,
                 fmt::format("token from {}", realm->second), !tls.verify);
    if (!a) return std::move(a).error();
    if (a->status != 200) {
      std::string says = registry_says(a->body);
      return Error{fmt::format("registry {}: token from {}: {}{}{}", host, realm->second, status_text(a->status),
                               a->status == 401 && cred ? " (credentials rejected)" : "",
                               says.empty() ? "" : " (" + says + ")")};
    }
    simdjson::dom::parser parser;
    simdjson::padded_string padded(a->body);
    simdjson::dom::element doc;
    std::string_view tok;
    if (parser.parse(padded).get(doc) || (doc["token"].get(tok) && doc["access_token"].get(tok)) || tok.empty())
      return Error{fmt::format("registry {}: token from {}: the answer holds no token", host, realm->second)};
    return "Authorization: Bearer " + std::string(tok);
  }

  /// GET through the auth flow for `scope`: a 401 is answered once (a token, or basic).
  Result<Answer> get_authed(Registry& r, const std::string& path, std::string_view accept, std::size_t max_body,
                            const std::string& scope, std::string_view what) {
    auto attempt = [&]() { return get(r.base_ + path, accept, auth[scope], max_body, what, !tls.verify); };
    auto a = attempt();
    if (!a && !tls.verify && r.base_.starts_with("https://") &&
        (a.error().err == CURLE_SSL_CONNECT_ERROR || a.error().err == CURLE_RECV_ERROR)) {
      // --tls-verify=false and no TLS there: plain HTTP, as docker does for an insecure registry.
      r.base_ = "http://" + host;
      a = attempt();
    }
    if (!a) return a;
    if (a->status != 401) return a;
    auto line = authenticate(a->headers.www_authenticate, scope, what);
    if (!line) return std::move(line).error();
    auth[scope] = *line;
    a = attempt();
    if (!a) return a;
    if (a->status == 401) {
      std::string says = registry_says(a->body);
      return Error{fmt::format("registry {}: {}: 401 Unauthorized after authenticating {}{}", host, what,
                               cred ? "as " + cred->username : std::string("anonymously"),
                               says.empty() ? "" : " (" + says + ")")};
    }
    return a;
  }
};

Registry::Registry(std::string host, TlsConfig tls, std::optional<Credential> cred)
    : host_(std::move(host)), base_("https://" + host_), impl_((global_init(), std::make_unique<Impl>())) {
  impl_->host = host_;
  impl_->tls = std::move(tls);
  impl_->cred = std::move(cred);
  impl_->certs = cert_files_for(host_, impl_->tls);
  if (impl_->tls.verify) {
    // The system's CAs, then the registry's own. The system's as curl's build names them: its
    // hashed directory (c_rehash's HASH.0 links, which update-ca-certificates keeps in step with
    // the bundle) when there is one, looked up by OpenSSL per issuer as a chain needs it, so a
    // pull reads one or two certificates instead of parsing ~140 (170 ms of a pull at load 20);
    // else the bundle file, parsed once.
    auto* info = curl_version_info(CURLVERSION_NOW);
    fs::path system = info && info->cainfo ? info->cainfo : "/etc/ssl/certs/ca-certificates.crt";
    fs::path system_dir = info && info->capath ? info->capath : "";
    impl_->cas = X509_STORE_new();
    if (!impl_->cas) {
      impl_->ca_error = "X509_STORE_new failed";
    } else {
      X509_STORE_set_flags(impl_->cas, X509_V_FLAG_PARTIAL_CHAIN);
      std::error_code ec;
      if (!system_dir.empty() && fs::is_directory(system_dir, ec))
        X509_STORE_load_path(impl_->cas, system_dir.c_str());
      else if (fs::exists(system, ec))
        X509_STORE_load_file(impl_->cas, system.c_str());
      for (const auto& ca : impl_->certs.cas)
        if (X509_STORE_load_file(impl_->cas, ca.c_str()) != 1) {
          impl_->ca_error = fmt::format("CA file {} could not be read", ca.string());
          X509_STORE_free(impl_->cas);
          impl_->cas = nullptr;
          break;
        }
    }
  }
}

Registry::~Registry() = default;

Status Registry::ping() {
  auto a = impl_->get_authed(*this, "/v2/", "", kMaxSmallBody, "", "GET /v2/");
  if (!a) return std::move(a).error();
  if (a->status != 200)
    return Error{fmt::format("registry {}: GET /v2/: {}", host_, status_text(a->status))};
  return host::Ok{};
}

Result<FetchedManifest> Registry::get_manifest(std::string_view repo, std::string_view ref) {
  std::string scope = fmt::format("repository:{}:pull", repo);
  std::string what = fmt::format("manifest {}{}{}", repo, ref.starts_with("sha256:") ? "@" : ":", ref);
  auto a = impl_->get_authed(*this, fmt::format("/v2/{}/manifests/{}", repo, ref), kManifestAccept, kMaxManifest,
                             scope, what);
  if (!a) return std::move(a).error();
  if (a->status != 200) {
    std::string says = registry_says(a->body);
    return Error{fmt::format("registry {}: {}: {}{}", host_, what, status_text(a->status),
                             says.empty() ? "" : " (" + says + ")")};
  }
  return FetchedManifest{a->headers.content_type, std::move(a->body), a->headers.docker_digest};
}

Status Registry::fetch_blobs(std::string_view repo, std::vector<BlobJob>& jobs, unsigned parallel,
                             const std::atomic<bool>* cancel) {
  const std::string scope = fmt::format("repository:{}:pull", repo);
  if (impl_->tls.verify && !impl_->cas) return Error{fmt::format("registry {}: blobs: {}", host_, impl_->ca_error)};
  CURLM* multi = curl_multi_init();
  if (!multi) return Error{fmt::format("registry {}: curl_multi_init failed", host_)};
  std::vector<std::unique_ptr<Transfer>> live;
  std::optional<Error> failed;
  std::size_t next = 0;
  parallel = std::max(1u, parallel);

  auto start = [&](BlobJob& job, bool retried) {
    auto t = std::make_unique<Transfer>();
    impl_->setup(*t, fmt::format("{}/v2/{}/blobs/{}", base_, repo, job.digest), "", impl_->auth[scope],
                 !impl_->tls.verify);
    t->job = &job;
    t->retried = retried;
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_blob);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t.get());
    curl_multi_add_handle(multi, t->easy);
    live.push_back(std::move(t));
  };

  while (!failed) {
    while (live.size() < parallel && next < jobs.size()) start(jobs[next++], false);
    if (live.empty()) break;
    int running = 0;
    curl_multi_perform(multi, &running);
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &t);
      CURLcode rc = msg->data.result;
      curl_multi_remove_handle(multi, msg->easy_handle);
      auto it = std::find_if(live.begin(), live.end(), [&](auto& p) { return p.get() == t; });
      std::unique_ptr<Transfer> done = std::move(*it);
      live.erase(it);
      long code = 0;
      curl_easy_getinfo(done->easy, CURLINFO_RESPONSE_CODE, &code);
      BlobJob& job = *done->job;
      std::string what = fmt::format("blob {}", job.digest);
      if (done->sink_error) {
        failed = *done->sink_error;
      } else if (rc != CURLE_OK) {
        failed = Error{fmt::format("registry {}: {}: {}", host_, what,
                                   done->errbuf[0] ? done->errbuf : curl_easy_strerror(rc))};
      } else if (code == 401 && !done->retried) {
        // A token that expired mid-pull: answer the challenge once and start this blob again.
        auto line = impl_->authenticate(done->got_headers.www_authenticate, scope, what);
        if (!line) {
          failed = std::move(line).error();
        } else {
          impl_->auth[scope] = *line;
          start(job, true);
        }
      } else if (code != 200) {
        std::string says = registry_says(done->body.data);
        failed = Error{fmt::format("registry {}: {}: {}{}", host_, what, status_text(code),
                                   says.empty() ? "" : " (" + says + ")")};
      } else if (done->got != job.size) {
        failed = Error{fmt::format("registry {}: {}: the registry sent {} bytes, the manifest says {} "
                                   "(size mismatch)",
                                   host_, what, done->got, job.size)};
      } else if (auto st = job.finish(); !st) {
        failed = Error{fmt::format("registry {}: {}: {}", host_, what, st.error().message)};
      }
    }
    if (failed) break;
    if (cancel && cancel->load()) {
      failed = Error{fmt::format("registry {}: interrupted", host_), EINTR};
      break;
    }
    if (live.empty() && next >= jobs.size()) break;  // all done: no 200 ms poll for nothing
    if (live.empty()) continue;                      // a 401 retry or the next jobs start now
    curl_multi_poll(multi, nullptr, 0, 200, nullptr);
  }
  for (auto& t : live) curl_multi_remove_handle(multi, t->easy);
  live.clear();
  curl_multi_cleanup(multi);
  if (failed) return std::move(*failed);
  return host::Ok{};
}

}  // namespace nes::image
