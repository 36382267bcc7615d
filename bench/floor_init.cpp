// floor_init: the least a PID 1 can do for P4's reaping storm, as its floor: start ARGV, then
// block in wait(2) until no child is left, and exit with ARGV's status. No signal handling, no
// protocol, nothing else: an init cannot reap faster than this on the same kernel.
// Usage (as PID 1 of a fresh pid namespace): floor_init ARGV...
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  pid_t child = fork();
  if (child < 0) return 125;
  if (child == 0) {
    execvp(argv[1], argv + 1);
    _exit(127);
  }
  int code = 125;
  for (;;) {
    int st = 0;
    pid_t p = wait(&st);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;  // ECHILD: every child reaped
    if (p == child) code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  return code;
}
