/* pool.c -- the shared-memory pool of pool.h.
 *
 * Every block moves between two states by compare-and-swap on its state
 * word: free (refs 0) and held (refs > 0, tagged with its owner and a new
 * gen). Nothing else is shared but the futex word and two hints, so there
 * is no lock to leave held and no step after which a dead process leaves a
 * block nobody can find.
 *
 * No lost wakeup (pool_wait): a producer counts itself in waiters, reads
 * free_seq, then scans the states; a free changes a state, bumps free_seq,
 * then reads waiters and, if any, wakes them all. All of it is seq_cst, so
 * in the one order either the producer's scan sees the freed state, or its
 * free_seq read came before the bump and FUTEX_WAIT returns at once (the
 * word changed), or it is asleep by the time of the wake. Every waiter is
 * woken, not one: one block may free several waiters' wait (each retries
 * its alloc), and with few producers the herd is small. */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"

#define PAGE  4096u

static uint64_t state_make(uint32_t gen, uint32_t owner, uint32_t refs) {
    return (uint64_t) gen << 32 | (uint64_t) owner << 16 | refs;
}

/* Block 0's offset: the header and slots, rounded up to a page. */
static size_t data_offset(uint32_t n_blocks) {
    size_t end = sizeof(PoolHeader) + (size_t) n_blocks * sizeof(PoolSlot);

    return (end + PAGE - 1) / PAGE * PAGE;
}

static size_t pool_size(uint32_t n_blocks, uint32_t block_size) {
    return data_offset(n_blocks) + (size_t) n_blocks * block_size;
}

static int check_sizes(uint32_t n_blocks, uint32_t block_size, Err *err) {
    if (n_blocks == 0 || n_blocks > POOL_MAX_BLOCKS) {
        return err_set(err, "%" PRIu32 " blocks (1 to %u)", n_blocks,
                       POOL_MAX_BLOCKS);
    }
    if (block_size == 0 || block_size > POOL_MAX_BLOCK
        || block_size % POOL_ALIGN != 0)
    {
        return err_set(err, "blocks of %" PRIu32 " bytes (a multiple of %d "
                       "up to %u)", block_size, POOL_ALIGN, POOL_MAX_BLOCK);
    }
    return 0;
}

/* Maps fd's size bytes and sets p's views and sizes (trusted: checked by
 * the caller). Returns 0, or -1 with errno set. */
static int map_pool(Pool *p, int fd, uint32_t n_blocks, uint32_t block_size)
{
    size_t   size = pool_size(n_blocks, block_size);
    uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    if (m == MAP_FAILED) return -1;
    p->hdr = (PoolHeader *) m;
    p->slots = (PoolSlot *) (m + sizeof(PoolHeader));
    p->data = m + data_offset(n_blocks);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->size = size;
    return 0;
}

/* fallocate, not ftruncate: the pages are reserved now, so a short
 * machine fails here at startup and not with SIGBUS on a block's first
 * write mid-request. */
int pool_create(Pool *p, uint32_t n_blocks, uint32_t block_size, Err *err) {
    PoolHeader *h;

    memset(p, 0, sizeof(*p));
    p->fd = -1;
    if (check_sizes(n_blocks, block_size, err) != 0) {
        return err_prefix(err, "shared-memory pool");
    }
    p->fd = memfd_create("omni-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->fd < 0
        || fallocate(p->fd, 0, 0, (off_t) pool_size(n_blocks, block_size))
           != 0
        || fcntl(p->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW
                                     | F_SEAL_SEAL) != 0
        || map_pool(p, p->fd, n_blocks, block_size) != 0)
    {
        err_set(err, "shared-memory pool (%" PRIu32 " blocks of %" PRIu32
                " bytes): %s", n_blocks, block_size, strerror(errno));
        if (p->fd >= 0) close(p->fd);
        p->fd = -1;
        return -1;
    }
    /* the memfd came zeroed: every state is free, gen 0 */
    h = p->hdr;
    h->magic = POOL_MAGIC;
    h->version = POOL_VERSION;
    h->n_blocks = n_blocks;
    h->block_size = block_size;
    h->data_offset = data_offset(n_blocks);
    h->total_size = p->size;
    return 0;
}

/* The header is read with pread and checked before anything is mapped;
 * the seals are checked last, so a wrong file gets the more telling
 * complaint about its contents. */
int pool_attach(Pool *p, int fd, Err *err) {
    struct stat st;
    PoolHeader  h;
    int         seals;

    memset(p, 0, sizeof(*p));
    p->fd = -1;
    if (fstat(fd, &st) != 0) {
        return err_set(err, "pool fd %d: %s", fd, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        return err_set(err, "pool fd %d: not a memfd", fd);
    }
    if ((size_t) st.st_size < sizeof(h)
        || pread(fd, &h, sizeof(h), 0) != (ssize_t) sizeof(h))
    {
        return err_set(err, "pool fd %d: %lld bytes, too small for a pool "
                       "header", fd, (long long) st.st_size);
    }
    if (h.magic != POOL_MAGIC) {
        return err_set(err, "pool fd %d: bad magic %#" PRIx64, fd, h.magic);
    }
    if (h.version != POOL_VERSION) {
        return err_set(err, "pool fd %d: version %" PRIu32 ", this engine "
                       "reads %d", fd, h.version, POOL_VERSION);
    }
    if (check_sizes(h.n_blocks, h.block_size, err) != 0) {
        return err_prefix(err, "pool fd %d", fd);
    }
    if (h.data_offset != data_offset(h.n_blocks)
        || h.total_size != pool_size(h.n_blocks, h.block_size)
        || (uint64_t) st.st_size != h.total_size)
    {
        return err_set(err, "pool fd %d: %lld bytes, but its %" PRIu32
                       " blocks of %" PRIu32 " bytes need %zu", fd,
                       (long long) st.st_size, h.n_blocks, h.block_size,
                       pool_size(h.n_blocks, h.block_size));
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
        return err_set(err, "pool fd %d: not sealed against shrinking", fd);
    }
    if (map_pool(p, fd, h.n_blocks, h.block_size) != 0) {
        return err_set(err, "pool fd %d: mmap: %s", fd, strerror(errno));
    }
    p->fd = fd;
    return 0;
}

void pool_detach(Pool *p) {
    if (p->hdr != NULL) munmap(p->hdr, p->size);
    p->hdr = NULL;
    p->slots = NULL;
    p->data = NULL;
    p->fd = -1;
}

void pool_destroy(Pool *p) {
    int fd = p->fd;

    pool_detach(p);
    if (fd >= 0) close(fd);
}

/* Wakes every producer in pool_wait, in any process: shared futex, so no
 * FUTEX_PRIVATE_FLAG. */
static void wake_waiters(Pool *p) {
    atomic_fetch_add(&p->hdr->free_seq, 1);
    if (atomic_load(&p->hdr->waiters) > 0) {
        syscall(SYS_futex, (uint32_t *) &p->hdr->free_seq, FUTEX_WAKE,
                INT_MAX, NULL, NULL, 0);
    }
}

int pool_alloc(Pool *p, uint16_t owner, uint64_t request_id) {
    uint32_t n = p->n_blocks;
    uint32_t start = atomic_load_explicit(&p->hdr->next,
                                          memory_order_relaxed) % n;

    for (uint32_t i = 0; i < n; i++) {
        uint32_t  b = (start + i) % n;
        PoolSlot *sl = &p->slots[b];
        uint64_t  s = atomic_load(&sl->state);

        while (POOL_REFS(s) == 0) {
            uint64_t t = state_make(POOL_GEN(s) + 1, owner, 1);

            if (!atomic_compare_exchange_weak(&sl->state, &s, t)) continue;
            atomic_store_explicit(&sl->request_id, request_id,
                                  memory_order_relaxed);
            atomic_store_explicit(&sl->id_gen, POOL_GEN(t),
                                  memory_order_release);
            atomic_store_explicit(&p->hdr->next, (b + 1) % n,
                                  memory_order_relaxed);
            return (int) b;
        }
    }
    return -1;
}

int pool_ref(Pool *p, uint32_t b) {
    uint64_t s;

    if (b >= p->n_blocks) return -1;
    s = atomic_load(&p->slots[b].state);
    do {
        if (POOL_REFS(s) == 0 || POOL_REFS(s) == POOL_MAX_REFS) return -1;
    } while (!atomic_compare_exchange_weak(&p->slots[b].state, &s, s + 1));
    return 0;
}

int pool_unref(Pool *p, uint32_t b) {
    uint64_t s, t;

    if (b >= p->n_blocks) return -1;
    s = atomic_load(&p->slots[b].state);
    do {
        if (POOL_REFS(s) == 0) return -1;
        t = POOL_REFS(s) > 1 ? s - 1 : state_make(POOL_GEN(s), 0, 0);
    } while (!atomic_compare_exchange_weak(&p->slots[b].state, &s, t));
    if (POOL_REFS(t) > 0) return 0;
    wake_waiters(p);
    return 1;
}

void *pool_block(const Pool *p, uint32_t b) {
    if (b >= p->n_blocks) return NULL;
    return p->data + (size_t) b * p->block_size;
}

static bool any_free(const Pool *p) {
    for (uint32_t b = 0; b < p->n_blocks; b++) {
        if (POOL_REFS(atomic_load(&p->slots[b].state)) == 0) return true;
    }
    return false;
}

/* The remaining time until deadline (seconds on the monotonic clock) into
 * ts; false when none is left. */
static bool time_left(double deadline, struct timespec *ts) {
    double left = deadline - clock_now_s();

    if (left <= 0) return false;
    ts->tv_sec = (time_t) left;
    ts->tv_nsec = (long) ((left - (double) ts->tv_sec) * 1e9);
    return true;
}

/* A wake, a changed word (EAGAIN) or a signal all lead back to the scan:
 * 0 is returned only with a block seen free, so a producer that lost the
 * freed block to another sleeps again, within the same deadline. */
int pool_wait(Pool *p, int timeout_ms) {
    PoolHeader      *h = p->hdr;
    double           deadline = clock_now_s() + timeout_ms / 1e3;
    struct timespec  ts, *tsp = timeout_ms < 0 ? NULL : &ts;
    int              rc = 0;

    atomic_fetch_add(&h->waiters, 1);
    for (;;) {
        uint32_t seq = atomic_load(&h->free_seq);

        if (any_free(p)) break;
        if (tsp != NULL && !time_left(deadline, tsp)) {
            rc = -1;
            break;
        }
        syscall(SYS_futex, (uint32_t *) &h->free_seq, FUTEX_WAIT, seq, tsp,
                NULL, 0);
    }
    atomic_fetch_sub(&h->waiters, 1);
    return rc;
}

typedef bool PoolMatch(const PoolSlot *sl, uint64_t s, uint64_t key);

static bool owner_is(const PoolSlot *sl, uint64_t s, uint64_t owner) {
    return POOL_OWNER(s) == owner;
}

/* request_id is this allocation's only when id_gen names its gen (the
 * allocator publishes the id after its CAS). Should the block be freed
 * and taken again after these loads, the gen in the caller's CAS no
 * longer matches and nothing is freed. */
static bool request_is(const PoolSlot *sl, uint64_t s, uint64_t id) {
    return atomic_load_explicit(&sl->id_gen, memory_order_acquire)
               == POOL_GEN(s)
           && atomic_load_explicit(&sl->request_id, memory_order_relaxed)
               == id;
}

/* Frees every held block that match accepts, whatever its count. */
static int reclaim(Pool *p, PoolMatch *match, uint64_t key) {
    int n = 0;

    for (uint32_t b = 0; b < p->n_blocks; b++) {
        PoolSlot *sl = &p->slots[b];
        uint64_t  s = atomic_load(&sl->state);

        while (POOL_REFS(s) > 0 && match(sl, s, key)) {
            if (atomic_compare_exchange_weak(&sl->state, &s,
                                             state_make(POOL_GEN(s), 0, 0)))
            {
                n++;
                break;
            }
        }
    }
    if (n > 0) wake_waiters(p);
    return n;
}

int pool_reclaim_owner(Pool *p, uint16_t owner) {
    return reclaim(p, owner_is, owner);
}

int pool_reclaim_request(Pool *p, uint64_t request_id) {
    if (request_id == 0) return 0;
    return reclaim(p, request_is, request_id);
}

void pool_stats(const Pool *p, PoolStats *st) {
    st->n_blocks = p->n_blocks;
    st->free = 0;
    for (uint32_t b = 0; b < p->n_blocks; b++) {
        st->free += POOL_REFS(atomic_load(&p->slots[b].state)) == 0;
    }
    st->used = p->n_blocks - st->free;
    st->waiters = atomic_load(&p->hdr->waiters);
}

int pool_check(const Pool *p, PoolRef r, Err *err) {
    if (r.block >= p->n_blocks) {
        return err_set(err, "pool block %" PRIu32 " out of range (%" PRIu32
                       " blocks)", r.block, p->n_blocks);
    }
    if (r.offset > p->block_size || r.length > p->block_size - r.offset) {
        return err_set(err, "pool block %" PRIu32 ": %" PRIu32 " bytes at "
                       "%" PRIu32 " run past its %" PRIu32, r.block,
                       r.length, r.offset, p->block_size);
    }
    if (POOL_REFS(atomic_load(&p->slots[r.block].state)) == 0) {
        return err_set(err, "pool block %" PRIu32 " is free", r.block);
    }
    return 0;
}
