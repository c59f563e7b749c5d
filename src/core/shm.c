/* shm.c -- POSIX shared-memory segments that several processes map, freed
 * when the last of them lets go.
 *
 * A segment is a file in /dev/shm named "dlb-<creator pid>-<serial>-<salt>".
 * Its first DLB_SHM_HEADER_BYTES hold a header; the data follows, aligned to
 * DLB_DATA_ALIGNMENT because the mapping itself is page-aligned.
 *
 * Lifetime.  The header holds one 64-bit atomic word: the low half counts
 * live mappings (in every process), the high half counts handles "in
 * flight" -- described to another process (pickled) but not yet opened
 * there.  A handle in flight keeps the segment alive after its sender
 * unmapped it, which is what `queue.put(share(x)); del x` needs.  Opening
 * moves one in-flight count to the mapping count in the same atomic step.
 * Whoever brings the word to zero unlinks the name; an open that finds the
 * word at zero fails cleanly ("already released"), because the segment is
 * then being unlinked.  Keeping both counts in one word makes every decision
 * a single compare-and-swap, so no interleaving of processes can free a
 * segment that an open is about to adopt.
 *
 * Lock-free atomics are address-free (C11 7.17.5 note), so they work across
 * processes that map the same page at different addresses; the build stops
 * on a platform where 64-bit atomics are not lock-free.
 *
 * A process that ends without releasing (a crash, or the os._exit() with
 * which multiprocessing's fork and forkserver workers end) cannot decrement
 * anything, and the word never reaches zero.  So each mapping also keeps its
 * descriptor open with a shared flock(), which the kernel drops when the
 * process ends, however it ends: an exclusive lock that succeeds on a fresh
 * descriptor proves that no live process maps the segment.  A release that
 * leaves mappings counted but no handle in flight tries that lock and
 * unlinks when it succeeds (unlink_if_unheld); when a holder that never
 * releases is still alive then, its creator's dlb_shm_cleanup (dlbridge.share
 * runs it, and so does a normal exit) removes the segment once it is gone.
 * dlb_shm_cleanup also removes the segments of dead creators that nobody
 * maps, giving up their handles in flight; see docs/scale-out.md.  Cost:
 * one open descriptor per mapping.
 */
#if defined(__linux__) || defined(__unix__) || defined(__APPLE__)
#define _DEFAULT_SOURCE 1
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define DLB_HAVE_SHM 1
#endif

#include "internal.h"

#if DLB_HAVE_SHM

#if ATOMIC_LLONG_LOCK_FREE != 2
#error "shared-memory reference counts need lock-free 64-bit atomics"
#endif

static const char shm_magic[8] = {'D', 'L', 'B', 'S', 'H', 'M', '1', '\0'};
#define SHM_PREFIX "dlb-"
#define ONE_IN_FLIGHT ((uint64_t)1 << 32)
#define MAPPINGS(word) ((uint32_t)((word) & 0xffffffffu))
#define IN_FLIGHT(word) ((uint32_t)((word) >> 32))

/* The first bytes of every segment.  Padded to DLB_SHM_HEADER_BYTES. */
typedef struct shm_header {
  char magic[8];
  uint64_t data_bytes;      /* bytes after the header the creator asked for */
  int64_t creator_pid;
  _Atomic uint64_t counts;  /* mappings | in-flight handles << 32 */
} shm_header;

_Static_assert(sizeof(shm_header) <= DLB_SHM_HEADER_BYTES,
               "the header must fit before the data");
_Static_assert(DLB_SHM_HEADER_BYTES % DLB_DATA_ALIGNMENT == 0,
               "the data must keep dlbridge's alignment");

struct dlb_shm {
  shm_header *header;   /* start of the mapping */
  /* Kept open: holds a shared flock while this handle holds the segment;
   * -1 once the hold was given back (dlb_shm_close, or a normal exit). */
  int fd;
  long pid;             /* the process whose mapping was counted */
  size_t map_bytes;     /* header + data */
  /* The file mapped (device and inode), so that only it is ever unlinked
   * through this handle's name. */
  struct stat file;
  bool adopted;         /* the open took over a handle in flight */
  dlb_allocator allocator;  /* what allocated this struct */
  struct dlb_shm *prev, *next; /* the handles of this process still open */
  char name[DLB_SHM_NAME_MAX];
};

/* A name fits "dlb-<digits>-<digits>-<hex>" and nothing else: handles come
 * from pickles, which may be hostile, and shm_open must only ever see names
 * of our own segments (no '/', no "..", bounded). */
static bool name_is_ours(const char *name) {
  size_t n = strnlen(name, DLB_SHM_NAME_MAX);
  if (n == DLB_SHM_NAME_MAX || strncmp(name, SHM_PREFIX, 4) != 0) return false;
  int dashes = 0;
  for (size_t i = 4; i < n; i++) {
    char c = name[i];
    if (c == '-') {
      if (name[i - 1] == '-') return false;
      dashes++;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return dashes == 2 && name[n - 1] != '-';
}

/* shm_open wants a leading slash; our names are kept without it, as they
 * appear in /dev/shm. */
static int open_name(const char *name, int oflag, mode_t mode) {
  char path[DLB_SHM_NAME_MAX + 1];
  path[0] = '/';
  memcpy(path + 1, name, strlen(name) + 1);
  return shm_open(path, oflag, mode);
}

static void unlink_name(const char *name) {
  char path[DLB_SHM_NAME_MAX + 1];
  path[0] = '/';
  memcpy(path + 1, name, strlen(name) + 1);
  (void)shm_unlink(path);
}

/* Unlink name when nobody holds the segment any more: no process maps it
 * and no handle is in flight.  Every mapping keeps a shared flock on its
 * own descriptor, which the kernel drops when its process ends, however it
 * ends (_exit, a crash); so an exclusive lock taken on a fresh descriptor
 * proves that no live process maps the segment, whatever counts a process
 * that never released left in the header.  A lock says nothing of handles
 * in flight: the header says that, read only once the lock is held (no
 * mapping, so no hand-out, can exist then).  Only a finished segment (its
 * magic written) is removed, and when same is not NULL only the file it
 * describes.  True when removed. */
static bool unlink_if_unheld(const char *name, const struct stat *same) {
  unsigned char head[sizeof(shm_header)];
  struct stat st;
  bool removed = false;
  int fd = open_name(name, O_RDWR, 0);
  if (fd < 0) return false;
  if (fstat(fd, &st) == 0 &&
      (same == NULL || (st.st_dev == same->st_dev && st.st_ino == same->st_ino)) &&
      flock(fd, LOCK_EX | LOCK_NB) == 0 &&
      pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
      memcmp(head + offsetof(shm_header, magic), shm_magic, sizeof shm_magic) == 0) {
    uint64_t word;
    memcpy(&word, head + offsetof(shm_header, counts), sizeof word);
    if (IN_FLIGHT(word) == 0) {
      unlink_name(name);
      removed = true;
    }
  }
  close(fd); /* and with it the exclusive lock */
  return removed;
}

/* True when name still names the file st describes: it was not unlinked
 * (and perhaps made again) since st was read. */
static bool still_named(const char *name, const struct stat *st) {
  struct stat now;
  int fd = open_name(name, O_RDONLY, 0);
  if (fd < 0) return false;
  bool same = fstat(fd, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino;
  close(fd);
  return same;
}

/* A system call about segment `name` failed with errno e while `doing`:
 * DLB_ESYSTEM, or DLB_ENOMEM when the system is out of memory.  Out of
 * descriptors, the message says what holds them.  The caller returns with
 * errno == e (dlbridge.h: DLB_ESYSTEM leaves errno set), restoring it after
 * its own cleanup. */
static int os_error(dlb_error *err, int e, const char *doing, const char *name) {
  const char *why = e == EMFILE || e == ENFILE
                        ? " (every open mapping of a segment keeps a file "
                          "descriptor: each live shared tensor holds one; "
                          "raise the limit, ulimit -n, or keep fewer)"
                        : "";
  return dlb_error_set(err, e == ENOMEM ? DLB_ENOMEM : DLB_ESYSTEM,
                       "cannot %s shared memory /dev/shm/%s: %s%s", doing,
                       name, strerror(e), why);
}

/* Bytes of a mapping holding data_bytes of data; false on overflow. */
static bool map_size(uint64_t data_bytes, size_t *out) {
  /* Offsets into the mapping are int64 (off_t), so the whole mapping must
   * fit there as well as in size_t. */
  int64_t total;
  if (data_bytes > (uint64_t)INT64_MAX ||
      dlb__add_overflow((int64_t)data_bytes, DLB_SHM_HEADER_BYTES, &total))
    return false;
  return !dlb__size_overflow(total, 0, out);
}

static dlb_shm *handle_new(void) {
  const dlb_allocator *a = dlb_get_allocator();
  dlb_shm *s = (dlb_shm *)a->alloc(sizeof *s, a->ctx);
  if (s == NULL) return NULL;
  memset(s, 0, sizeof *s);
  s->allocator = *a;
  return s;
}

static void handle_free(dlb_shm *s) {
  dlb_allocator a = s->allocator;
  a.release(s, a.ctx);
}

/* ---- holds, given back on close or at a normal exit ------------------------ */

/* The handles of this process that are still open, so that a normal exit
 * can give back their holds. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static dlb_shm *open_handles;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

/* Give back s's hold on its segment: its count (when this process counted
 * the mapping) and its shared lock, unmapping its pages first when unmap
 * is set; unlink the name when nobody holds the segment any more.
 * open_lock held. */
static void give_back_hold(dlb_shm *s, bool unmap) {
  if (s->fd < 0) return; /* given back already */
  /* A child made by fork() inherits the mapping but was never counted: only
   * the process that counted a mapping may uncount it. */
  bool counted = s->pid == (long)getpid();
  uint64_t left = counted ? atomic_fetch_sub(&s->header->counts, (uint64_t)1) - 1u
                          : atomic_load(&s->header->counts);
  /* A mapping keeps its descriptor's open file, and with it the lock,
   * alive: unmapped first, and unlocked explicitly for when it is not (at
   * exit).  Only the process that counted the mapping unlocks.  A child
   * made by fork() shares the lock of every descriptor it inherited; its
   * inherited mappings do not hold the segment (they were never counted),
   * so the parent's unlock is theirs too, while a child's unlock would take
   * the parent's lock away. */
  if (unmap) {
    munmap((void *)s->header, s->map_bytes);
    s->header = NULL;
  }
  if (counted) (void)flock(s->fd, LOCK_UN);
  close(s->fd);
  s->fd = -1;
  if (counted && left == 0) {
    unlink_name(s->name); /* the last hold by the counts: no lock needed */
  } else if (left != 0 && IN_FLIGHT(left) == 0) {
    /* Mappings are still counted, but a process that ended without
     * releasing (a pool worker's os._exit, a crash) leaves its count
     * behind: the locks tell whether anyone is really left. */
    (void)unlink_if_unheld(s->name, &s->file);
  }
}

/* At a normal exit (exit() or the end of main -- not _exit, not a crash)
 * every handle still open gives back its hold.  Releasing a segment needs
 * nothing but this library, so it must not wait for whoever owns the
 * handle: a Python program that ends with another framework's view of a
 * shared tensor alive frees that view's deleter late or never (torch's
 * runs at interpreter teardown, where the Tensor it holds can no longer be
 * dropped), and its segment would stay in /dev/shm.  The pages stay mapped
 * for code that still runs (later exit handlers, destructors); a later
 * dlb_shm_close only unmaps.  Never blocks: when another thread holds the
 * list (exit() called in the middle of an open or a close), it is left. */
static void release_at_exit(void) {
  if (pthread_mutex_trylock(&open_lock) == 0) {
    for (dlb_shm *s = open_handles; s != NULL; s = s->next) give_back_hold(s, false);
    pthread_mutex_unlock(&open_lock);
  }
  /* And what this process made and released while others still held it,
   * if they have gone since (dlb_shm_cleanup). */
  (void)dlb_shm_cleanup(NULL, NULL);
}

/* fork() while another thread holds open_lock would leave the child's copy
 * locked for good: fork waits for the list instead. */
static void lock_for_fork(void) { pthread_mutex_lock(&open_lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&open_lock); }

static void register_exit(void) {
  (void)pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
  (void)atexit(release_at_exit);
}

/* s is open: list it. */
static void track(dlb_shm *s) {
  (void)pthread_once(&exit_once, register_exit);
  pthread_mutex_lock(&open_lock);
  s->prev = NULL;
  s->next = open_handles;
  if (open_handles != NULL) open_handles->prev = s;
  open_handles = s;
  pthread_mutex_unlock(&open_lock);
}

int dlb_shm_create(size_t data_bytes, dlb_shm **out, dlb_error *err) {
  static _Atomic uint32_t serial;
  int rc = DLB_OK, fd = -1, sys_errno = 0;
  bool created = false;
  void *map = MAP_FAILED;
  size_t total = 0;
  dlb_shm *s = NULL;
  if (out == NULL) return dlb_error_set(err, DLB_EINVAL, "dlb_shm_create: out is NULL");
  if (!map_size(data_bytes, &total))
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "shared memory of %zu bytes is more than this system can map",
                         data_bytes);
  s = handle_new();
  if (s == NULL)
    return dlb_error_set(err, DLB_ENOMEM, "out of memory for a shared-memory handle");
  /* pid + serial is unique among live processes; the salt keeps a name of a
   * dead process (same pid reused) from colliding with a leftover. */
  uintptr_t salt = (uintptr_t)s ^ (uintptr_t)time(NULL) ^ (uintptr_t)clock();
  for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
    snprintf(s->name, sizeof s->name, SHM_PREFIX "%ld-%u-%x", (long)getpid(),
             (unsigned)atomic_fetch_add(&serial, 1u) & 0xffffffu,
             (unsigned)(salt + (uintptr_t)attempt * 0x9e3779b9u) & 0xffffffffu);
    fd = open_name(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    sys_errno = errno;
    rc = os_error(err, sys_errno, "create", s->name);
    goto cleanup;
  }
  created = true;
  /* posix_fallocate, not only ftruncate: a tmpfs that is too small (64 MiB
   * in a default container) must fail here with ENOSPC, not later with a
   * SIGBUS on the first write to a page it cannot back. */
  int falloc = posix_fallocate(fd, 0, (off_t)total);
  if (falloc != 0) {
    sys_errno = falloc;
    rc = dlb_error_set(err, falloc == ENOSPC || falloc == ENOMEM ? DLB_ENOMEM : DLB_ESYSTEM,
                       "cannot reserve %zu bytes of shared memory in /dev/shm: %s "
                       "(a container may need a larger --shm-size)",
                       total, strerror(falloc));
    goto cleanup;
  }
  if (flock(fd, LOCK_SH) != 0 || fstat(fd, &s->file) != 0) {
    sys_errno = errno;
    rc = os_error(err, sys_errno, "lock", s->name);
    goto cleanup;
  }
  map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    sys_errno = errno;
    rc = os_error(err, sys_errno, "map", s->name);
    goto cleanup;
  }
  shm_header *h = (shm_header *)map;
  h->data_bytes = data_bytes;
  h->creator_pid = (int64_t)getpid();
  atomic_store(&h->counts, (uint64_t)1);
  /* The magic last: an open that races with creation sees "not ours". */
  atomic_thread_fence(memory_order_release);
  memcpy(h->magic, shm_magic, sizeof shm_magic);
  s->header = h;
  s->map_bytes = total;
  s->fd = fd;
  s->pid = (long)getpid();
  track(s);
  *out = s;
  s = NULL;
  map = MAP_FAILED;
  fd = -1;
cleanup:
  if (map != MAP_FAILED) munmap(map, total);
  if (fd >= 0) close(fd);
  if (s != NULL) {
    if (created) unlink_name(s->name);
    handle_free(s);
  }
  if (rc == DLB_ESYSTEM) errno = sys_errno;
  return rc;
}

int dlb_shm_open(const char *name, dlb_shm **out, dlb_error *err) {
  int rc = DLB_OK, fd = -1, sys_errno = 0;
  void *map = MAP_FAILED;
  size_t total = 0;
  dlb_shm *s = NULL;
  struct stat st;
  if (out == NULL || name == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_shm_open: name or out is NULL");
  if (!name_is_ours(name))
    return dlb_error_set(err, DLB_EINVAL,
                         "'%.64s' is not the name of a dlbridge shared-memory segment",
                         name);
  /* Allocated first: an open that fails for want of memory has changed
   * nothing, and its handle can be loaded again. */
  s = handle_new();
  if (s == NULL)
    return dlb_error_set(err, DLB_ENOMEM, "out of memory for a shared-memory handle");
  fd = open_name(name, O_RDWR, 0);
  if (fd < 0 && errno == ENOENT) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "shared memory /dev/shm/%s is gone: every process that "
                       "held it released it (or its creator died and it was "
                       "cleaned up) before this handle was opened",
                       name);
    goto cleanup;
  }
  if (fd < 0) {
    sys_errno = errno;
    rc = os_error(err, sys_errno, "open", name);
    goto cleanup;
  }
  /* Held as long as the mapping: nobody unlinks a segment while a live
   * process holds this lock (unlink_if_unheld). */
  if (flock(fd, LOCK_SH) != 0) {
    sys_errno = errno;
    rc = os_error(err, sys_errno, "lock", name);
    goto cleanup;
  }
  /* Between our open and our lock, the last holder may have found nobody
   * left and unlinked the name (a counted mapping of a process that ended
   * without releasing does not stop that): such a file is on its way out,
   * as if the open had come a moment later. */
  if (fstat(fd, &st) != 0 || !still_named(name, &st)) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "shared memory /dev/shm/%s is gone: every process that "
                       "held it released it before this handle was opened",
                       name);
    goto cleanup;
  }
  /* The header is read, and the file's size checked against it, before
   * anything is mapped: any process of the same user can shrink the file,
   * and touching a mapped page past its end is a SIGBUS, not an error.  A
   * shrink after this check still kills readers; docs/decisions.md says
   * why segments stay named files all the same. */
  unsigned char head[sizeof(shm_header)];
  if (st.st_size < (off_t)DLB_SHM_HEADER_BYTES ||
      pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "shared memory /dev/shm/%s is not a dlbridge segment (too small)",
                       name);
    goto cleanup;
  }
  uint64_t data_bytes = 0;
  memcpy(&data_bytes, head + offsetof(shm_header, data_bytes), sizeof data_bytes);
  if (memcmp(head + offsetof(shm_header, magic), shm_magic, sizeof shm_magic) != 0 ||
      !map_size(data_bytes, &total)) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "shared memory /dev/shm/%s is not a dlbridge segment "
                       "(bad header or size)", name);
    goto cleanup;
  }
  if ((uint64_t)st.st_size < (uint64_t)total) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "shared memory /dev/shm/%s was truncated: it holds %lld "
                       "bytes, its header says %zu (some process of the same "
                       "user shrank it); refusing to map it",
                       name, (long long)st.st_size, total);
    goto cleanup;
  }
  if ((uint64_t)st.st_size != (uint64_t)total) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "shared memory /dev/shm/%s is not a dlbridge segment "
                       "(bad header or size)", name);
    goto cleanup;
  }
  map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    sys_errno = errno;
    rc = os_error(err, sys_errno, "map", name);
    goto cleanup;
  }
  shm_header *h = (shm_header *)map;
  atomic_thread_fence(memory_order_acquire);
  /* Adopt: one more mapping, one fewer handle in flight (when any). */
  uint64_t word = atomic_load(&h->counts);
  for (;;) {
    if (word == 0) {
      rc = dlb_error_set(err, DLB_EINVAL,
                         "shared memory /dev/shm/%s was already released by every "
                         "process that held it", name);
      goto cleanup;
    }
    if (MAPPINGS(word) == UINT32_MAX) {
      rc = dlb_error_set(err, DLB_EOVERFLOW,
                         "shared memory /dev/shm/%s has too many mappings", name);
      goto cleanup;
    }
    uint64_t next = word + 1u - (IN_FLIGHT(word) > 0 ? ONE_IN_FLIGHT : 0u);
    if (atomic_compare_exchange_weak(&h->counts, &word, next)) break;
  }
  s->adopted = IN_FLIGHT(word) > 0;
  memcpy(s->name, name, strlen(name) + 1);
  s->header = h;
  s->map_bytes = total;
  s->file = st;
  s->fd = fd;
  s->pid = (long)getpid();
  track(s);
  *out = s;
  s = NULL;
  map = MAP_FAILED;
  fd = -1;
cleanup:
  if (map != MAP_FAILED) munmap(map, total);
  if (fd >= 0) close(fd);
  if (s != NULL) handle_free(s);
  if (rc == DLB_ESYSTEM) errno = sys_errno;
  return rc;
}

int dlb_shm_hand_out(dlb_shm *shm, dlb_error *err) {
  if (shm == NULL) return dlb_error_set(err, DLB_EINVAL, "dlb_shm_hand_out: NULL");
  uint64_t word = atomic_load(&shm->header->counts);
  for (;;) {
    if (IN_FLIGHT(word) == UINT32_MAX)
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "shared memory /dev/shm/%s has too many handles in flight",
                           shm->name);
    if (atomic_compare_exchange_weak(&shm->header->counts, &word, word + ONE_IN_FLIGHT))
      return DLB_OK;
  }
}

void dlb_shm_close(dlb_shm *shm) {
  if (shm == NULL) return;
  pthread_mutex_lock(&open_lock);
  if (shm->prev != NULL) shm->prev->next = shm->next;
  else open_handles = shm->next;
  if (shm->next != NULL) shm->next->prev = shm->prev;
  if (shm->fd >= 0)
    give_back_hold(shm, true);
  else /* its hold was given back at exit */
    munmap((void *)shm->header, shm->map_bytes);
  pthread_mutex_unlock(&open_lock);
  handle_free(shm);
}

void dlb_shm_close_unused(dlb_shm *shm) {
  if (shm == NULL) return;
  /* The handle first, then the mapping: the segment stays held throughout
   * (by our mapping, then by the handle), so nothing can unlink it. */
  if (shm->adopted && shm->pid == (long)getpid())
    (void)atomic_fetch_add(&shm->header->counts, ONE_IN_FLIGHT);
  dlb_shm_close(shm);
}

void *dlb_shm_data(const dlb_shm *shm) {
  return (char *)shm->header + DLB_SHM_HEADER_BYTES;
}

size_t dlb_shm_size(const dlb_shm *shm) { return (size_t)shm->header->data_bytes; }

const char *dlb_shm_name(const dlb_shm *shm) { return shm->name; }

void dlb_shm_counts(const dlb_shm *shm, uint32_t *mappings, uint32_t *in_flight) {
  uint64_t word = atomic_load(&shm->header->counts);
  if (mappings != NULL) *mappings = MAPPINGS(word);
  if (in_flight != NULL) *in_flight = IN_FLIGHT(word);
}

/* The creator pid in a name of ours, or -1. */
static long name_pid(const char *name) {
  if (!name_is_ours(name)) return -1;
  char *end = NULL;
  long pid = strtol(name + 4, &end, 10);
  return (end != NULL && *end == '-' && pid > 0) ? pid : -1;
}

/* Remove name if it is a leftover, a segment nobody holds any more:
 *  - one this process made, that no process maps and no handle in flight
 *    holds (unlink_if_unheld).  Its last mapping went while a process
 *    that later ended without releasing (os._exit, a crash, a fork child
 *    sharing our descriptor's lock) still held it, so no release saw it
 *    free.  A live creator looks after its own, so other live processes'
 *    segments are left alone;
 *  - one whose creator is dead and that no live process maps: an exclusive
 *    lock on it succeeds, whatever the counts a crash left in its header
 *    say.  Handles still in flight from a dead creator are given up, and a
 *    half-made segment (no header) is removed too.
 * True when it was removed. */
static bool remove_if_left_over(const char *name) {
  long pid = name_pid(name);
  if (pid < 0) return false;
  if (pid == (long)getpid()) return unlink_if_unheld(name, NULL);
  if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) return false;
  int fd = open_name(name, O_RDWR, 0);
  if (fd < 0) return false;
  bool removed = false;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
    unlink_name(name);
    removed = true;
  }
  close(fd);
  return removed;
}

int dlb_shm_cleanup(int *removed, dlb_error *err) {
  static const char dir[] = "/dev/shm";
  int count = 0;
  DIR *d = opendir(dir);
  if (d == NULL) {
    if (removed != NULL) *removed = 0;
    /* No /dev/shm: nothing of ours can be there. */
    int e = errno;
    if (e == ENOENT) return DLB_OK;
    dlb_error_set(err, DLB_ESYSTEM, "cannot list %s: %s", dir, strerror(e));
    errno = e;
    return DLB_ESYSTEM;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, SHM_PREFIX, 4) != 0) continue;
    if (remove_if_left_over(e->d_name)) count++;
  }
  closedir(d);
  if (removed != NULL) *removed = count;
  return DLB_OK;
}

#else /* no POSIX shared memory */

int dlb_shm_create(size_t data_bytes, dlb_shm **out, dlb_error *err) {
  (void)data_bytes;
  (void)out;
  return dlb_error_set(err, DLB_EUNSUPPORTED, "shared memory needs a POSIX system");
}
int dlb_shm_open(const char *name, dlb_shm **out, dlb_error *err) {
  (void)name;
  (void)out;
  return dlb_error_set(err, DLB_EUNSUPPORTED, "shared memory needs a POSIX system");
}
int dlb_shm_hand_out(dlb_shm *shm, dlb_error *err) {
  (void)shm;
  return dlb_error_set(err, DLB_EUNSUPPORTED, "shared memory needs a POSIX system");
}
void dlb_shm_close(dlb_shm *shm) { (void)shm; }
void dlb_shm_close_unused(dlb_shm *shm) { (void)shm; }
void *dlb_shm_data(const dlb_shm *shm) { (void)shm; return NULL; }
size_t dlb_shm_size(const dlb_shm *shm) { (void)shm; return 0; }
const char *dlb_shm_name(const dlb_shm *shm) { (void)shm; return ""; }
void dlb_shm_counts(const dlb_shm *shm, uint32_t *mappings, uint32_t *in_flight) {
  (void)shm;
  if (mappings != NULL) *mappings = 0;
  if (in_flight != NULL) *in_flight = 0;
}
int dlb_shm_cleanup(int *removed, dlb_error *err) {
  (void)err;
  if (removed != NULL) *removed = 0;
  return DLB_OK;
}

#endif
