/* test_shm.c -- shared-memory segments: create/open/close, the mapping and
 * in-flight counts that decide when a name is unlinked, hostile names and
 * headers, allocation failure, and cleanup of a dead creator's leftovers. */
#define _DEFAULT_SOURCE 1
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* What an out-parameter holds before a call that must fail: it is written
 * only on success. */
#define NOT_WRITTEN ((dlb_shm *)(uintptr_t)1)

static bool exists(const char *name) {
  char path[16 + 2 * DLB_SHM_NAME_MAX];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  struct stat st;
  return stat(path, &st) == 0;
}

static void test_create_open_close(void) {
  dlb_error err;
  dlb_shm *a = NULL, *b = NULL;
  CHECK_EQ(dlb_shm_create(1000, &a, &err), DLB_OK);
  CHECK(a != NULL);
  if (a == NULL) return;
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  CHECK(strncmp(name, "dlb-", 4) == 0);
  CHECK(exists(name));
  CHECK_EQ(dlb_shm_size(a), 1000);
  CHECK_EQ((uintptr_t)dlb_shm_data(a) % DLB_DATA_ALIGNMENT, 0);
  memset(dlb_shm_data(a), 0x5a, 1000);

  CHECK_EQ(dlb_shm_open(name, &b, &err), DLB_OK);
  CHECK(b != NULL);
  if (b == NULL) return;
  /* Two mappings of the same pages: a write through one shows in the other. */
  CHECK(dlb_shm_data(a) != dlb_shm_data(b));
  ((unsigned char *)dlb_shm_data(b))[999] = 7;
  CHECK_EQ(((unsigned char *)dlb_shm_data(a))[999], 7);
  CHECK_EQ(((unsigned char *)dlb_shm_data(b))[0], 0x5a);
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(a, &maps, &flight);
  CHECK_EQ(maps, 2);
  CHECK_EQ(flight, 0);

  dlb_shm_close(a);
  CHECK(exists(name));  /* b still maps it */
  dlb_shm_close(b);
  CHECK(!exists(name)); /* last one out unlinks */
  b = NOT_WRITTEN;
  CHECK_EQ(dlb_shm_open(name, &b, &err), DLB_EINVAL);
  CHECK(b == NOT_WRITTEN); /* out-parameters are written only on success */
  CHECK_MSG(err, "gone");
  dlb_shm_close(NULL);
}

/* A handle in flight keeps the segment after its sender unmapped it; the
 * open adopts the handle, so closing that mapping frees it. */
static void test_in_flight(void) {
  dlb_error err;
  dlb_shm *a = NULL, *b = NULL, *c = NULL;
  CHECK_EQ(dlb_shm_create(0, &a, &err), DLB_OK);
  if (a == NULL) return;
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  CHECK_EQ(dlb_shm_size(a), 0);
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(a, &maps, &flight);
  CHECK_EQ(maps, 1);
  CHECK_EQ(flight, 1);
  dlb_shm_close(a);
  CHECK(exists(name));

  CHECK_EQ(dlb_shm_open(name, &b, &err), DLB_OK);
  if (b == NULL) return;
  dlb_shm_counts(b, &maps, &flight);
  CHECK_EQ(maps, 1);
  CHECK_EQ(flight, 0);
  /* A second open of the same handle (a pickle loaded twice) maps it while
   * it lives, and does not drive the in-flight count below zero. */
  CHECK_EQ(dlb_shm_open(name, &c, &err), DLB_OK);
  if (c == NULL) return;
  dlb_shm_counts(c, &maps, &flight);
  CHECK_EQ(maps, 2);
  CHECK_EQ(flight, 0);
  dlb_shm_close(b);
  dlb_shm_close(c);
  CHECK(!exists(name));
}

static void test_hostile_names_and_headers(void) {
  dlb_error err;
  dlb_shm *s = NOT_WRITTEN;
  const char *bad[] = {"", "dlb-", "dlb-1-2", "dlb-1-2-", "dlb--1-2", "x-1-2-3",
                       "dlb-1-2-3/../x", "dlb-1-2-zz", "../dlb-1-2-3",
                       "dlb-1-2-3-4",
                       "dlb-11111111111111111111111111111111111111111111111111111111-1-1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ(dlb_shm_open(bad[i], &s, &err), DLB_EINVAL);
    CHECK(s == NOT_WRITTEN);
    CHECK_MSG(err, "not the name");
  }
  CHECK_EQ(dlb_shm_open(NULL, &s, &err), DLB_EINVAL);
  CHECK_EQ(dlb_shm_open("dlb-1-2-3", NULL, &err), DLB_EINVAL);
  CHECK_EQ(dlb_shm_create(10, NULL, &err), DLB_EINVAL);
  CHECK_EQ(dlb_shm_hand_out(NULL, &err), DLB_EINVAL);
  CHECK_EQ(dlb_shm_create(SIZE_MAX - 8, &s, &err), DLB_EOVERFLOW);
  CHECK(s == NOT_WRITTEN);

  /* Segments with names of our form but not made by us. */
  char name[64];
  snprintf(name, sizeof name, "dlb-%ld-999999-abc", (long)getpid());
  char path[80];
  snprintf(path, sizeof path, "/%s", name);
  int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ(dlb_shm_open(name, &s, &err), DLB_EINVAL);  /* empty: too small */
  CHECK_MSG(err, "too small");
  CHECK_EQ(ftruncate(fd, 4096), 0);
  CHECK_EQ(dlb_shm_open(name, &s, &err), DLB_EINVAL);  /* zeros: no magic */
  CHECK_MSG(err, "not a dlbridge segment");
  CHECK(s == NOT_WRITTEN);

  /* A real header whose size field disagrees with the file. */
  dlb_shm *real = NULL;
  CHECK_EQ(dlb_shm_create(64, &real, &err), DLB_OK);
  if (real != NULL) {
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    if (m != MAP_FAILED) {
      memcpy(m, (char *)dlb_shm_data(real) - DLB_SHM_HEADER_BYTES, DLB_SHM_HEADER_BYTES);
      CHECK_EQ(dlb_shm_open(name, &s, &err), DLB_EINVAL);  /* 64 + header != 4096 */
      CHECK_MSG(err, "bad header or size");
      munmap(m, 4096);
    }
    dlb_shm_close(real);
  }
  close(fd);
  shm_unlink(path);
}

/* A segment some process shrank: an open refuses it before mapping
 * anything (a mapped page past the file's end is a SIGBUS), and the handle
 * in flight stays counted. */
static void test_truncated_segment_refused(void) {
  dlb_error err;
  dlb_shm *a = NULL, *s = NOT_WRITTEN;
  CHECK_EQ(dlb_shm_create(1 << 16, &a, &err), DLB_OK);
  if (a == NULL) return;
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  char path[16 + DLB_SHM_NAME_MAX];
  snprintf(path, sizeof path, "/%s", dlb_shm_name(a));
  int fd = shm_open(path, O_RDWR, 0);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ(ftruncate(fd, DLB_SHM_HEADER_BYTES + 100), 0); /* header kept */
  CHECK_EQ(dlb_shm_open(dlb_shm_name(a), &s, &err), DLB_EINVAL);
  CHECK_MSG(err, "was truncated");
  CHECK(s == NOT_WRITTEN);
  CHECK_EQ(ftruncate(fd, 100), 0); /* not even the header */
  CHECK_EQ(dlb_shm_open(dlb_shm_name(a), &s, &err), DLB_EINVAL);
  CHECK_MSG(err, "too small");
  close(fd);
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(a, &maps, &flight);
  CHECK_EQ(maps, 1);
  CHECK_EQ(flight, 1);
  dlb_shm_close(a); /* our mapping was shrunk too: we never touch it again */
  shm_unlink(path);
}

static void test_allocation_failure(void) {
  dlb_error err;
  dlb_shm *s = NULL;
  failing_allocator_install(0);
  CHECK_EQ(dlb_shm_create(100, &s, &err), DLB_ENOMEM);
  CHECK(s == NULL);
  CHECK_EQ(failing_allocator_live(), 0);
  failing_allocator_remove();

  dlb_shm *a = NULL;
  CHECK_EQ(dlb_shm_create(100, &a, &err), DLB_OK);
  if (a == NULL) return;
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  failing_allocator_install(0);
  CHECK_EQ(dlb_shm_open(dlb_shm_name(a), &s, &err), DLB_ENOMEM);
  CHECK(s == NULL);
  failing_allocator_remove();
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(a, &maps, &flight);
  CHECK_EQ(maps, 1);    /* the failed open left no mapping counted ... */
  CHECK_EQ(flight, 1);  /* ... and the handle in flight, to load again */

  /* Freed through the allocator that made it, even after a change. */
  failing_allocator_install(-1);
  dlb_shm *b = NULL;
  CHECK_EQ(dlb_shm_open(dlb_shm_name(a), &b, &err), DLB_OK);
  CHECK_EQ(failing_allocator_live(), 1);
  failing_allocator_remove();
  dlb_shm_counts(a, &maps, &flight);
  CHECK_EQ(maps, 2);
  CHECK_EQ(flight, 0);
  dlb_shm_close(b);
  CHECK_EQ(failing_allocator_live(), 0);
  dlb_shm_close(a);
}

/* A load that opened the segment and then failed (its layout does not fit,
 * say) gives the handle back: in flight again, loadable again, and the
 * segment held by it even when nobody else maps it. */
static void test_close_unused_gives_the_handle_back(void) {
  dlb_error err;
  dlb_shm *a = NULL, *b = NULL, *c = NULL;
  CHECK_EQ(dlb_shm_create(64, &a, &err), DLB_OK);
  if (a == NULL) return;
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  dlb_shm_close(a);
  CHECK_EQ(dlb_shm_open(name, &b, &err), DLB_OK);
  if (b == NULL) return;
  dlb_shm_close_unused(b);
  CHECK(exists(name));
  CHECK_EQ(dlb_shm_open(name, &c, &err), DLB_OK); /* loadable again */
  if (c == NULL) return;
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(c, &maps, &flight);
  CHECK_EQ(maps, 1);
  CHECK_EQ(flight, 0);
  /* A second load of a pickle already loaded adopted nothing: undoing it
   * gives nothing back. */
  dlb_shm *again = NULL;
  CHECK_EQ(dlb_shm_open(name, &again, &err), DLB_OK);
  dlb_shm_close_unused(again);
  dlb_shm_counts(c, &maps, &flight);
  CHECK_EQ(maps, 1);
  CHECK_EQ(flight, 0);
  dlb_shm_close(c);
  CHECK(!exists(name));
  dlb_shm_close_unused(NULL);
}

/* Out of file descriptors: DLB_ESYSTEM with errno EMFILE, saying what holds
 * them.  In a child, whose descriptor limit can be lowered freely. */
static void test_out_of_descriptors(void) {
  pid_t pid = fork();
  if (pid == 0) {
    dlb_error err;
    dlb_shm *s = NULL, *first = NULL;
    struct rlimit lim;
    if (dlb_shm_create(16, &first, &err) != DLB_OK) _exit(1);
    if (dlb_shm_hand_out(first, &err) != DLB_OK) _exit(1);
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(1);
    lim.rlim_cur = 16;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(1);
    int rc = DLB_OK;
    for (int i = 0; i < 64 && rc == DLB_OK; i++) rc = dlb_shm_create(16, &s, &err);
    if (rc != DLB_ESYSTEM || errno != EMFILE) _exit(2);
    if (strstr(err.message, "each live shared tensor holds one") == NULL) _exit(3);
    errno = 0;
    if (dlb_shm_open(dlb_shm_name(first), &s, &err) != DLB_ESYSTEM || errno != EMFILE)
      _exit(4);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  CHECK_EQ(strcmp(dlb_status_name(DLB_ESYSTEM), "DLB_ESYSTEM"), 0);
}

/* A child creates segments and dies without closing them: cleanup in the
 * parent removes the unmapped one and keeps the one the parent still maps. */
static void test_cleanup_after_crash(void) {
  int pipefd[2];
  CHECK_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dlb_error err;
    dlb_shm *x = NULL, *y = NULL;
    if (dlb_shm_create(4096, &x, &err) != DLB_OK) _exit(1);
    if (dlb_shm_create(4096, &y, &err) != DLB_OK) _exit(1);
    char names[2 * DLB_SHM_NAME_MAX] = {0};
    strcpy(names, dlb_shm_name(x));
    strcpy(names + DLB_SHM_NAME_MAX, dlb_shm_name(y));
    if (write(pipefd[1], names, sizeof names) != (ssize_t)sizeof names) _exit(1);
    _exit(0);  /* "crash": nothing closed */
  }
  close(pipefd[1]);
  char names[2 * DLB_SHM_NAME_MAX] = {0};
  CHECK_EQ(read(pipefd[0], names, sizeof names), (ssize_t)sizeof names);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const char *dead = names, *kept = names + DLB_SHM_NAME_MAX;
  CHECK(exists(dead));
  CHECK(exists(kept));
  dlb_error err;
  dlb_shm *held = NULL;
  /* The header still counts the crashed child's mappings; only the locks
   * tell that nobody holds `dead`, while we hold `kept`. */
  CHECK_EQ(dlb_shm_open(kept, &held, &err), DLB_OK);
  int removed = -1;
  CHECK_EQ(dlb_shm_cleanup(&removed, &err), DLB_OK);
  CHECK(removed >= 1);
  CHECK(!exists(dead));
  CHECK(exists(kept));
  dlb_shm *late = NULL;
  CHECK_EQ(dlb_shm_open(dead, &late, &err), DLB_EINVAL);  /* a late handle */
  CHECK_MSG(err, "gone");
  uint32_t maps = 0;
  dlb_shm_counts(held, &maps, NULL);
  CHECK_EQ(maps, 2);  /* the crashed creator's count never went down ... */
  dlb_shm_close(held);
  CHECK(!exists(kept)); /* ... but its lock did: closing ours unlinks it */
}

/* Open `name` in a child that then leaves with _exit, never closing: what a
 * multiprocessing pool worker does with a handle it loaded (issue 15).
 * Returns when the child is gone. */
static void open_in_child_and_vanish(const char *name) {
  pid_t pid = fork();
  if (pid == 0) {
    dlb_error err;
    dlb_shm *s = NULL;
    _exit(dlb_shm_open(name, &s, &err) == DLB_OK ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A process that loaded a handle and ended with _exit left its mapping
 * counted: the creator's release still unlinks the segment, since the
 * locks show nobody is left. */
static void test_release_after_loader_exits_without_closing(void) {
  dlb_error err;
  dlb_shm *a = NULL;
  CHECK_EQ(dlb_shm_create(64, &a, &err), DLB_OK);
  if (a == NULL) return;
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  for (int i = 0; i < 3; i++) {
    CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
    open_in_child_and_vanish(name);
  }
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(a, &maps, &flight);
  CHECK_EQ(maps, 4); /* three of them from processes that are gone */
  CHECK_EQ(flight, 0);
  dlb_shm_close(a);
  CHECK(!exists(name));
}

/* A handle in flight keeps the segment even when the counts are stale and
 * nobody maps it; loading it and dropping it then unlinks. */
static void test_stale_counts_keep_handles_in_flight(void) {
  dlb_error err;
  dlb_shm *a = NULL, *b = NULL;
  CHECK_EQ(dlb_shm_create(64, &a, &err), DLB_OK);
  if (a == NULL) return;
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  open_in_child_and_vanish(name);   /* adopts that handle: a stale count */
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);  /* one still in flight */
  dlb_shm_close(a);
  CHECK(exists(name));
  int removed = 0;
  CHECK_EQ(dlb_shm_cleanup(&removed, &err), DLB_OK);
  CHECK(exists(name)); /* ours, unmapped, but a handle is in flight */
  CHECK_EQ(dlb_shm_open(name, &b, &err), DLB_OK);
  dlb_shm_close(b);
  CHECK(!exists(name));
}

/* A fork child shares its parent's descriptor, and so its lock.  Its
 * inherited mapping is not counted and does not hold the segment: the
 * parent's release unlocks for both, and still unlinks (the child's pages
 * stay mapped).  A handle the child loaded itself does hold it; once that
 * child has ended without closing, the creator's cleanup removes it. */
static void test_fork_children_and_locks(void) {
  dlb_error err;
  dlb_shm *a = NULL;
  int go[2], ready[2];
  CHECK_EQ(dlb_shm_create(64, &a, &err), DLB_OK);
  if (a == NULL) return;
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  ((unsigned char *)dlb_shm_data(a))[0] = 42;
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  open_in_child_and_vanish(name); /* a stale count, so the lock decides */
  CHECK_EQ(pipe(go), 0);
  pid_t child = fork();
  if (child == 0) { /* holds its inherited mapping until told to check it */
    close(go[1]);
    char c;
    if (read(go[0], &c, 1) != 1) _exit(2);
    _exit(((unsigned char *)dlb_shm_data(a))[0] == 42 ? 0 : 1);
  }
  close(go[0]);
  dlb_shm_close(a);
  CHECK(!exists(name));
  CHECK_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* A child that loaded its own handle holds the segment while it lives. */
  CHECK_EQ(dlb_shm_create(64, &a, &err), DLB_OK);
  if (a == NULL) return;
  strcpy(name, dlb_shm_name(a));
  CHECK_EQ(dlb_shm_hand_out(a, &err), DLB_OK);
  CHECK_EQ(pipe(go), 0);
  CHECK_EQ(pipe(ready), 0);
  child = fork();
  if (child == 0) {
    dlb_shm *mine = NULL;
    char c;
    close(go[1]);
    close(ready[0]);
    int ok = dlb_shm_open(name, &mine, &err) == DLB_OK;
    if (write(ready[1], ok ? "y" : "n", 1) != 1) _exit(2);
    if (read(go[0], &c, 1) != 1) _exit(2);
    _exit(0); /* never closed */
  }
  close(go[0]);
  close(ready[1]);
  char c = 0;
  CHECK_EQ(read(ready[0], &c, 1), 1);
  CHECK_EQ(c, 'y');
  close(ready[0]);
  dlb_shm_close(a);
  CHECK(exists(name)); /* the child maps it */
  int removed = 0;
  CHECK_EQ(dlb_shm_cleanup(&removed, &err), DLB_OK);
  CHECK(exists(name)); /* still */
  CHECK_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  waitpid(child, &status, 0);
  CHECK_EQ(dlb_shm_cleanup(&removed, &err), DLB_OK);
  CHECK(!exists(name)); /* ours, and nobody holds it any more */
}

/* The creator ends with _exit while a fork child still has its inherited
 * mapping (and so the creator's lock): when that child lets go, nobody is
 * left, and the child's close unlinks the segment. */
static void test_inherited_close_after_creator_vanished(void) {
  int names_pipe[2], go[2], done[2];
  CHECK_EQ(pipe(names_pipe), 0);
  CHECK_EQ(pipe(go), 0);
  CHECK_EQ(pipe(done), 0); /* its write end closes when the heir is gone */
  pid_t creator = fork();
  if (creator == 0) {
    dlb_error err;
    dlb_shm *a = NULL;
    close(names_pipe[0]);
    close(done[0]);
    if (dlb_shm_create(64, &a, &err) != DLB_OK) _exit(1);
    if (fork() == 0) { /* the heir: waits for its creator to be gone */
      char c;
      close(go[1]);
      close(names_pipe[1]);
      if (read(go[0], &c, 1) != 1) _exit(2);
      dlb_shm_close(a);
      _exit(0);
    }
    close(done[1]);
    char name[DLB_SHM_NAME_MAX] = {0};
    strcpy(name, dlb_shm_name(a));
    if (write(names_pipe[1], name, sizeof name) != (ssize_t)sizeof name) _exit(1);
    _exit(0); /* never closed */
  }
  close(names_pipe[1]);
  close(go[0]);
  close(done[1]);
  char name[DLB_SHM_NAME_MAX] = {0};
  CHECK_EQ(read(names_pipe[0], name, sizeof name), (ssize_t)sizeof name);
  close(names_pipe[0]);
  int status = 0;
  waitpid(creator, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(exists(name)); /* the heir maps it */
  CHECK_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  char c;
  CHECK_EQ(read(done[0], &c, 1), 0); /* end of file: the heir is gone */
  close(done[0]);
  CHECK(!exists(name));
}

/* A process that ends with exit() gives back the holds of the handles it
 * never closed, and removes what it made that others held when it let go
 * but nobody holds now.  A handle in flight still keeps its segment. */
static void test_normal_exit_gives_back(void) {
  int names_pipe[2];
  CHECK_EQ(pipe(names_pipe), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dlb_error err;
    dlb_shm *open_at_exit = NULL, *released = NULL, *in_flight = NULL;
    char names[3 * DLB_SHM_NAME_MAX] = {0};
    if (dlb_shm_create(64, &open_at_exit, &err) != DLB_OK ||
        dlb_shm_create(64, &released, &err) != DLB_OK ||
        dlb_shm_create(64, &in_flight, &err) != DLB_OK)
      _exit(1);
    strcpy(names, dlb_shm_name(open_at_exit));
    strcpy(names + DLB_SHM_NAME_MAX, dlb_shm_name(released));
    strcpy(names + 2 * DLB_SHM_NAME_MAX, dlb_shm_name(in_flight));
    /* `released`: a grandchild loads it and lingers while we let go. */
    int go[2], ready[2];
    if (pipe(go) != 0 || pipe(ready) != 0 ||
        dlb_shm_hand_out(released, &err) != DLB_OK)
      _exit(1);
    pid_t grandchild = fork();
    if (grandchild == 0) {
      dlb_shm *g = NULL;
      char c;
      close(go[1]);
      close(ready[0]);
      if (dlb_shm_open(names + DLB_SHM_NAME_MAX, &g, &err) != DLB_OK) _exit(1);
      if (write(ready[1], "y", 1) != 1 || read(go[0], &c, 1) != 1) _exit(2);
      _exit(0);
    }
    close(go[0]);
    close(ready[1]);
    char c;
    if (read(ready[0], &c, 1) != 1) _exit(1);
    if (dlb_shm_hand_out(in_flight, &err) != DLB_OK) _exit(1);
    dlb_shm_close(in_flight);
    dlb_shm_close(released);
    if (!exists(names + DLB_SHM_NAME_MAX)) _exit(3); /* the grandchild holds it */
    if (write(go[1], "x", 1) != 1) _exit(1);
    close(go[1]);
    waitpid(grandchild, NULL, 0);
    if (write(names_pipe[1], names, sizeof names) != (ssize_t)sizeof names) _exit(1);
    exit(0); /* open_at_exit never closed */
  }
  close(names_pipe[1]);
  char names[3 * DLB_SHM_NAME_MAX] = {0};
  CHECK_EQ(read(names_pipe[0], names, sizeof names), (ssize_t)sizeof names);
  close(names_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(!exists(names));                        /* open at exit */
  CHECK(!exists(names + DLB_SHM_NAME_MAX));     /* released, held by a gone process */
  CHECK(exists(names + 2 * DLB_SHM_NAME_MAX));  /* a handle in flight */
  dlb_error err;
  dlb_shm *late = NULL;
  CHECK_EQ(dlb_shm_open(names + 2 * DLB_SHM_NAME_MAX, &late, &err), DLB_OK);
  dlb_shm_close(late);
  CHECK(!exists(names + 2 * DLB_SHM_NAME_MAX));
}

/* A creator that died half-way (name made, header never written) leaves a
 * segment with no magic: cleanup removes it once the creator is dead. */
static void test_cleanup_half_made(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  char name[64], path[80];
  snprintf(name, sizeof name, "dlb-%ld-1-beef", (long)pid);
  snprintf(path, sizeof path, "/%s", name);
  int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  /* And a finished segment of the same dead pid, with a handle in flight
   * that will never be opened. */
  dlb_shm *s = NULL;
  dlb_error err;
  CHECK_EQ(dlb_shm_create(16, &s, &err), DLB_OK);
  char done_name[64], done_path[80];
  snprintf(done_name, sizeof done_name, "dlb-%ld-2-beef", (long)pid);
  snprintf(done_path, sizeof done_path, "/%s", done_name);
  fd = shm_open(done_path, O_RDWR | O_CREAT | O_EXCL, 0600);
  CHECK(fd >= 0);
  if (fd >= 0 && s != NULL) {
    CHECK_EQ(ftruncate(fd, DLB_SHM_HEADER_BYTES + 16), 0);
    void *m = mmap(NULL, DLB_SHM_HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    if (m != MAP_FAILED) {
      memcpy(m, (char *)dlb_shm_data(s) - DLB_SHM_HEADER_BYTES, DLB_SHM_HEADER_BYTES);
      /* counts word: zero mappings, one handle in flight (never opened) */
      uint64_t word = (uint64_t)1 << 32;
      memcpy((char *)m + 24, &word, sizeof word);
      munmap(m, DLB_SHM_HEADER_BYTES);
    }
    close(fd);
  }
  dlb_shm_close(s);
  int removed = -1;
  CHECK_EQ(dlb_shm_cleanup(&removed, &err), DLB_OK);
  CHECK(removed >= 2);
  CHECK(!exists(name));
  CHECK(!exists(done_name));
}

/* A forked child inherits the parent's mapping uncounted: closing it there
 * must not uncount the parent's. */
static void test_fork_inherits_uncounted(void) {
  dlb_error err;
  dlb_shm *a = NULL;
  CHECK_EQ(dlb_shm_create(32, &a, &err), DLB_OK);
  if (a == NULL) return;
  pid_t pid = fork();
  if (pid == 0) {
    dlb_shm_close(a);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  uint32_t maps = 0;
  dlb_shm_counts(a, &maps, NULL);
  CHECK_EQ(maps, 1);
  CHECK(exists(dlb_shm_name(a)));
  char name[DLB_SHM_NAME_MAX];
  strcpy(name, dlb_shm_name(a));
  dlb_shm_close(a);
  CHECK(!exists(name));
}

int main(void) {
  test_fork_inherits_uncounted();
  test_create_open_close();
  test_in_flight();
  test_hostile_names_and_headers();
  test_truncated_segment_refused();
  test_allocation_failure();
  test_close_unused_gives_the_handle_back();
  test_out_of_descriptors();
  test_cleanup_after_crash();
  test_cleanup_half_made();
  test_release_after_loader_exits_without_closing();
  test_stale_counts_keep_handles_in_flight();
  test_fork_children_and_locks();
  test_inherited_close_after_creator_vanished();
  test_normal_exit_gives_back();
  return check_summary("shm");
}
