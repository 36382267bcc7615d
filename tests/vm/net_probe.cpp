// A static network probe for the guest side of the network tests (tests/vm/vm_test.py net_*) and
// bench P10, reaching the guest as a file volume: busybox's nc there has no UDP and a shell loop
// of nc would time fork+exec, not the network.
//   net_probe udp-echo PORT        binds UDP 0.0.0.0:PORT, prints "udp-echo PORT" on stdout, then
//                                  answers each datagram with the same bytes; "quit" is answered
//                                  "bye" and ends it (exit 0).
//   net_probe connects IP PORT N   N TCP connects to IP:PORT, each closed at once; prints
//                                  "connects N median_us MEDIAN mean_us MEAN" (connect(2)'s time,
//                                  CLOCK_MONOTONIC, µs) and exits 0; any failure: exit 1.
//   net_probe send IP PORT MIB     MIB MiB of zeros in 64 KiB writes over one TCP connection to
//                                  IP:PORT, then shutdown(SHUT_WR) and read to the peer's EOF (it
//                                  has everything); prints "send MIB ms MS" on stderr (connect to
//                                  EOF, CLOCK_MONOTONIC). busybox nc reads a pipe at ~4 MiB/s here,
//                                  so `dd | nc` would time nc.
//   net_probe recv IP PORT         reads one TCP connection from IP:PORT to its EOF; prints "recv
//                                  BYTES ms MS" on stderr (connect to EOF, CLOCK_MONOTONIC).
//   net_probe write MIB            the same 64 KiB writes to stdout (the data channel under
//                                  `neshost run`); prints "write MIB ms MS" on stderr (until the
//                                  last write returned).
// Exit 2: usage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

namespace {

int udp_echo(int port) {
  int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::perror("udp-echo: bind");
    return 1;
  }
  std::printf("udp-echo %d\n", port);
  std::fflush(stdout);
  char buf[65536];
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n = ::recvfrom(s, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0) continue;
    bool quit = n == 4 && std::memcmp(buf, "quit", 4) == 0;
    if (quit) std::memcpy(buf, "bye", n = 3);
    ::sendto(s, buf, static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), len);
    if (quit) return 0;
  }
}

double now_us() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

int connects(const char* ip, int port, int n) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &a.sin_addr) != 1 || n < 1) return 2;
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    double t0 = now_us();
    if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      std::perror("connects: connect");
      return 1;
    }
    us.push_back(now_us() - t0);
    ::close(s);
  }
  double mean = 0;
  for (double u : us) mean += u / n;
  std::sort(us.begin(), us.end());
  std::printf("connects %d median_us %.0f mean_us %.0f\n", n, us[us.size() / 2], mean);
  return 0;
}

int write_all(int fd, int mib) {
  static char buf[65536];
  for (long i = 0; i < static_cast<long>(mib) * 16; ++i) {
    for (size_t off = 0; off < sizeof buf;) {
      ssize_t n = ::write(fd, buf + off, sizeof buf - off);
      if (n <= 0) {
        std::perror("write");
        return 1;
      }
      off += static_cast<size_t>(n);
    }
  }
  return 0;
}

int send(const char* ip, int port, int mib) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &a.sin_addr) != 1 || mib < 1) return 2;
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  double t0 = now_us();
  if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::perror("send: connect");
    return 1;
  }
  if (write_all(s, mib) != 0) return 1;
  ::shutdown(s, SHUT_WR);
  char b[4096];
  while (::read(s, b, sizeof b) > 0) {
  }
  std::fprintf(stderr, "send %d ms %.0f\n", mib, (now_us() - t0) / 1e3);
  ::close(s);
  return 0;
}

int recv(const char* ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &a.sin_addr) != 1) return 2;
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  double t0 = now_us();
  if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::perror("recv: connect");
    return 1;
  }
  static char b[65536];
  long long total = 0;
  for (ssize_t n; (n = ::read(s, b, sizeof b)) != 0; total += n)
    if (n < 0) {
      std::perror("recv: read");
      return 1;
    }
  std::fprintf(stderr, "recv %lld ms %.0f\n", total, (now_us() - t0) / 1e3);
  ::close(s);
  return 0;
}

int write_stdout(int mib) {
  if (mib < 1) return 2;
  double t0 = now_us();
  if (write_all(1, mib) != 0) return 1;
  std::fprintf(stderr, "write %d ms %.0f\n", mib, (now_us() - t0) / 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "udp-echo") == 0) return udp_echo(std::atoi(argv[2]));
  if (argc == 5 && std::strcmp(argv[1], "connects") == 0)
    return connects(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc == 5 && std::strcmp(argv[1], "send") == 0) return send(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc == 3 && std::strcmp(argv[1], "write") == 0) return write_stdout(std::atoi(argv[2]));
  if (argc == 4 && std::strcmp(argv[1], "recv") == 0) return recv(argv[2], std::atoi(argv[3]));
  std::fputs("usage: net_probe udp-echo PORT | connects IP PORT N | send IP PORT MIB | recv IP PORT | write MIB\n",
             stderr);
  return 2;
}
