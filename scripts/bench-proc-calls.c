/* The system calls the notification path chooses between, each in a loop of 200,000 against
 * a child process: kcmp(KCMP_FILE) of the child's directory fd against our pidfd_getfd copy
 * of it, against a statx of /proc/<pid>/fd/<n>; and a 128-byte read of the child's memory by
 * process_vm_readv, against pread of a kept /proc/<pid>/mem. Then what a fresh page of
 * anonymous memory costs: its first write (a page fault), and MADV_POPULATE_WRITE of as many.
 *
 *     cc -O2 scripts/bench-proc-calls.c -o /tmp/bench-proc-calls && /tmp/bench-proc-calls
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/kcmp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static char path[256] = "/usr/lib/python3/some/package/module.py";

int main(void) {
  enum { N = 200000, FD = 7 };
  int p[2];
  if (pipe(p) != 0) return 1;
  pid_t c = fork();
  if (c == 0) {
    dup2(open("/usr", O_RDONLY | O_DIRECTORY), FD);
    if (write(p[1], "x", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char b;
  if (read(p[0], &b, 1) != 1) return 1;
  int pidfd = syscall(SYS_pidfd_open, c, 0);
  int mine = syscall(SYS_pidfd_getfd, pidfd, FD, 0);
  char name[64];
  snprintf(name, sizeof name, "/proc/%d", c);
  int proc = open(name, O_PATH | O_DIRECTORY);
  snprintf(name, sizeof name, "/proc/%d/mem", c);
  int mem = open(name, O_RDONLY);
  if (pidfd < 0 || mine < 0 || proc < 0 || mem < 0) return 1;

  double t = now();
  long same = 0;
  for (int i = 0; i < N; i++) same += syscall(SYS_kcmp, c, getpid(), KCMP_FILE, FD, mine) == 0;
  printf("kcmp(KCMP_FILE)             %.3f us (%ld equal)\n", (now() - t) / 1e3 / N, same);
  struct statx st;
  t = now();
  for (int i = 0; i < N; i++) statx(proc, "fd/7", 0, STATX_TYPE | STATX_INO | STATX_MNT_ID, &st);
  printf("statx /proc/<pid>/fd/<n>    %.3f us\n", (now() - t) / 1e3 / N);
  char buf[256];
  struct iovec l = {buf, 128}, r = {path, 128};
  t = now();
  for (int i = 0; i < N; i++) process_vm_readv(c, &l, 1, &r, 1, 0);
  printf("process_vm_readv 128 bytes  %.3f us\n", (now() - t) / 1e3 / N);
  t = now();
  for (int i = 0; i < N; i++) pread(mem, buf, 128, (off_t)path);
  printf("pread /proc/<pid>/mem       %.3f us\n", (now() - t) / 1e3 / N);
  kill(c, SIGKILL);
  waitpid(c, NULL, 0);

  enum { PAGES = 2000 };
  long page = sysconf(_SC_PAGESIZE);
  char *a = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *z = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED || z == MAP_FAILED) return 1;
  t = now();
  for (int i = 0; i < PAGES; i++) a[i * page] = 1;
  printf("first write of a fresh page %.3f us\n", (now() - t) / 1e3 / PAGES);
  t = now();
  madvise(z, PAGES * page, MADV_POPULATE_WRITE);
  printf("MADV_POPULATE_WRITE, a page %.3f us\n", (now() - t) / 1e3 / PAGES);
  return 0;
}
