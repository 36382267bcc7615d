// storm: the P4 workload. Creates N orphans by double fork (each grandchild is reparented to PID 1
// or the nearest subreaper and exits at once), then polls /proc until no zombie is left, bounded.
// Prints one line: `storm orphans=N reaped_ms=T zombies_left=Z`. Usage: storm N [limit_ms]
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/// Number of zombie processes visible in /proc (state 'Z' in /proc/PID/stat).
int count_zombies() {
  DIR* d = opendir("/proc");
  if (!d) return -1;
  int z = 0;
  char path[300], buf[256];
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE* f = std::fopen(path, "re");
    if (!f) continue;
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* rp = std::strrchr(buf, ')');  // comm may hold spaces: state follows the last ')'
    if (rp && rp[1] == ' ' && rp[2] == 'Z') ++z;
  }
  closedir(d);
  return z;
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  long long limit_ms = argc > 2 ? std::atoll(argv[2]) : 60000;
  long long t0 = now_ns();
  for (int i = 0; i < n; ++i) {
    pid_t c = fork();
    if (c < 0) { std::perror("fork"); return 1; }
    if (c == 0) {
      if (fork() < 0) _exit(1);
      _exit(0);  // both the child and the grandchild end here; the grandchild is an orphan
    }
    while (waitpid(c, nullptr, 0) < 0) {}
  }
  int z = count_zombies();
  while (z > 0 && (now_ns() - t0) / 1000000 < limit_ms) z = count_zombies();
  std::printf("storm orphans=%d reaped_ms=%.3f zombies_left=%d\n", n, (now_ns() - t0) / 1e6, z);
  return z == 0 ? 0 : 3;
}
