/* pool.h -- the shared-memory pool that carries bulk data between the
 * engine's processes (unit chunks, PCM), so that the control channels carry
 * only descriptors (request id, block, offset, length).
 *
 * One pool is one memfd, created by its owner, the frontend
 * (pool_create), and inherited by each stage, which maps it
 * (pool_attach). Its size is fixed at creation and sealed (F_SEAL_SHRINK,
 * F_SEAL_GROW, F_SEAL_SEAL): nothing grows, and no process can truncate
 * it under another's mapping (which would turn a read into SIGBUS). A
 * producer that finds every block taken waits for one (pool_wait): that
 * is the backpressure, never more memory.
 *
 * Layout of the memfd (native byte order and alignment: every process
 * that maps it runs on this machine, from this binary):
 *
 *   offset 0            PoolHeader, 64 bytes
 *          64           PoolSlot[n_blocks], 32 bytes each
 *          data_offset  n_blocks blocks of block_size bytes; data_offset
 *                       is the end of the slots rounded up to 4096, and
 *                       block_size a multiple of POOL_ALIGN, so every block
 *                       starts on a cache line
 *          total_size   end (the memfd's size)
 *
 * A slot's state is one 64-bit word, changed only by compare-and-swap:
 *
 *   bits  0-15  refs    references held; 0: the block is free
 *        16-31  owner   the stage process slot that allocated it (the
 *                       frontend's numbering); meaningless when free
 *        32-63  gen     allocation count of this block, wrapping: tells
 *                       one allocation of the block from the next (ABA)
 *
 * Why one word per block scanned by CAS, and not a free bitmap or a
 * Treiber stack of free blocks: taking a block must tag it with its owner
 * in the same atomic step. With a bitmap or a stack, a process killed
 * between taking a block and tagging it leaks the block for good: it is
 * neither free nor anyone's, and no reclaim can find it. Here a block is
 * either free or tagged, at every instant, so pool_reclaim_owner after a
 * stage died finds all of its blocks. The cost is a scan, O(n_blocks)
 * loads when the pool is nearly full (from a rotating start, so O(1) while
 * it is not); pools hold hundreds of blocks, not millions. Nothing here
 * takes a lock, so a process that dies anywhere leaves nothing held.
 *
 * Memory order: every state change is seq_cst, and so are free_seq and
 * waiters: pool_wait's argument against a lost wakeup (pool.c) needs one
 * order over a free's state change, the free_seq bump and the waiters
 * load. request_id and id_gen are a pair published after the state CAS
 * (release on id_gen) and read by pool_reclaim_request (acquire).
 *
 * Trust: a stage is a separate process and may be buggy; what it writes
 * in the mapping must never crash another. Sizes and addresses come only
 * from the Pool struct each process filled when it checked the header,
 * never from the shared header afterwards; a descriptor received over a
 * channel is checked (pool_check) before it is used. A corrupt state word
 * gives wrong accounting, not a wild access. */

#ifndef OMNI_POOL_H
#define OMNI_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "omni_proto.h"

#define POOL_MAGIC       0x6f6d6e69706f6f6cull  // "omnipool"
#define POOL_VERSION     1
#define POOL_ALIGN       64             // block_size is a multiple of this
#define POOL_MAX_BLOCKS  (1u << 20)
#define POOL_MAX_BLOCK   (1u << 30)     // bytes; offsets fit a u32
#define POOL_MAX_REFS    0xFFFFu

/* The state word's fields (layout above). */
#define POOL_REFS(s)     ((uint32_t) ((s) & 0xFFFF))
#define POOL_OWNER(s)    ((uint32_t) (((s) >> 16) & 0xFFFF))
#define POOL_GEN(s)      ((uint32_t) ((s) >> 32))

/* Cross-process atomics must be lock-free: a lock-based atomic would keep
 * its lock in this process's memory, not in the mapping. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be "
               "lock-free to be shared between processes");

/* Written once by pool_create, before any other process maps the memfd;
 * then only the last three fields change. */
typedef struct {
    uint64_t          magic;        // POOL_MAGIC
    uint32_t          version;      // POOL_VERSION
    uint32_t          n_blocks;
    uint32_t          block_size;   // bytes, multiple of POOL_ALIGN
    uint32_t          pad0;
    uint64_t          data_offset;  // bytes from the start to block 0
    uint64_t          total_size;   // the memfd's size
    _Atomic uint32_t  free_seq;     // futex word: bumped by every free
                                    //   (any process), seq_cst
    _Atomic uint32_t  waiters;      // producers in pool_wait now, seq_cst;
                                    //   one killed while waiting leaves it
                                    //   high (frees then pay a wake call)
    _Atomic uint32_t  next;         // where the next scan starts: a hint,
                                    //   any allocator writes it, relaxed
    uint32_t          pad1[3];
} PoolHeader;

typedef struct {
    _Atomic uint64_t  state;        // refs | owner | gen (above)
    _Atomic uint64_t  request_id;   // the allocation's request; written by
                                    //   the allocator after its CAS, relaxed
    _Atomic uint32_t  id_gen;       // gen whose request_id that is (release
                                    //   after request_id)
    uint32_t          pad[3];
} PoolSlot;

_Static_assert(sizeof(PoolHeader) == 64, "PoolHeader is 64 bytes");
_Static_assert(sizeof(PoolSlot) == 32, "PoolSlot is 32 bytes");

/* One process's view of a pool. The sizes are this process's copies,
 * checked once; the shared header's are never read again. */
typedef struct {
    int          fd;            // the memfd: owned when created here,
                                //   borrowed when attached
    PoolHeader  *hdr;           // the whole mapping, total_size bytes, owned
    PoolSlot    *slots;         // (n_blocks,) view into the mapping
    uint8_t     *data;          // (n_blocks, block_size) view
    uint32_t     n_blocks;
    uint32_t     block_size;
    size_t       size;          // bytes mapped
} Pool;

/* A block's bytes as named on a channel: a descriptor. Received from
 * another process, it is untrusted until pool_check accepts it. */
typedef struct {
    uint32_t block;
    uint32_t offset;            // from the block's start
    uint32_t length;            // bytes
} PoolRef;

_Static_assert(sizeof(PoolRef) == 12, "PoolRef is 12 bytes");

/* A descriptor's wire form, the first 12 bytes of a BLOCK payload
 * (stage_channel.h): block, offset, length, little-endian. Reading checks
 * nothing: pool_check does. */
static inline PoolRef pool_ref_read(const uint8_t *p) {
    return (PoolRef) { omni_rd32(p), omni_rd32(p + 4), omni_rd32(p + 8) };
}

static inline void pool_ref_write(uint8_t *p, PoolRef r) {
    omni_wr32(p, r.block);
    omni_wr32(p + 4, r.offset);
    omni_wr32(p + 8, r.length);
}

typedef struct {
    uint32_t n_blocks;
    uint32_t free;
    uint32_t used;              // referenced (n_blocks - free)
    uint32_t waiters;           // producers waiting for a block now
} PoolStats;

/* Creates a pool of n_blocks blocks of block_size bytes (a multiple of
 * POOL_ALIGN, at most POOL_MAX_BLOCK) in a sealed memfd (close-on-exec:
 * the frontend places it on the stage's fixed descriptor when it execs
 * one) and maps it; every block is free. Returns 0, or -1 with err set
 * (nothing is left to free then). The Pool owns the fd and the mapping
 * until pool_destroy. */
int   pool_create(Pool *p, uint32_t n_blocks, uint32_t block_size, Err *err);

/* Maps the pool in fd, a memfd another process made with pool_create.
 * Refuses, with err naming the reason, anything else: a bad descriptor,
 * a file that is not a sealed memfd, a wrong magic or version, sizes out
 * of range or that do not add up to the file's size (a truncated memfd).
 * fd stays the caller's (it may close it; the mapping stays). Returns 0
 * or -1 (nothing to free then). */
int   pool_attach(Pool *p, int fd, Err *err);

/* Unmaps an attached pool. The blocks this process held stay held:
 * unref them first, or let the frontend reclaim them by owner. */
void  pool_detach(Pool *p);

/* Unmaps a created pool and closes its fd; the memory goes when the last
 * process that maps it or holds the fd lets go. */
void  pool_destroy(Pool *p);

/* Takes a free block for owner (a stage process slot) and request_id
 * (0: none), with one reference; the tag and the reference are set in one
 * atomic step. Returns its index, or -1 when every
 * block is taken (pool_wait then, to apply backpressure). Lock-free;
 * O(1) while the pool has room, O(n_blocks) when nearly full. */
int   pool_alloc(Pool *p, uint16_t owner, uint64_t request_id);

/* Adds a reference to block b, which the caller holds (so it cannot be
 * freed meanwhile). Returns 0, or -1 when b is out of range, free, or at
 * POOL_MAX_REFS. */
int   pool_ref(Pool *p, uint32_t b);

/* Drops a reference to block b; the last one frees it and wakes the
 * producers waiting. Returns 1 when this freed the block, 0 when
 * references remain, -1 when b is out of range or already free (a
 * double unref: nothing changes). The caller must not touch the block's
 * bytes after its last reference is gone. */
int   pool_unref(Pool *p, uint32_t b);

/* Block b's first byte, a view into the mapping (block_size bytes), or
 * NULL when b is out of range. */
void *pool_block(const Pool *p, uint32_t b);

/* Waits until a block may be free: returns 0 when one was freed (or was
 * free already) and the caller should retry pool_alloc, -1 when
 * timeout_ms passed first (timeout_ms < 0: no limit). A futex on the
 * shared free_seq, so a free in any process wakes it. Blocking: for a
 * stage's producer thread, never an event loop. */
int   pool_wait(Pool *p, int timeout_ms);

/* Frees every block tagged with owner, whatever its count: the frontend
 * calls it once the stage process in that slot has died. The tag is the
 * allocator's and stays with a block passed on to another stage, so the
 * requests whose blocks these were must fail with the stage (they do:
 * a stage's death fails its requests). Wakes the waiting producers.
 * Returns the number of blocks freed. */
int   pool_reclaim_owner(Pool *p, uint16_t owner);

/* Frees every block allocated for request_id (not 0), whatever its count:
 * the request was cancelled. Only once no live process will touch those
 * blocks again (each stage that held them dropped the request, or died):
 * a reference held elsewhere is cancelled with them, and an unref through
 * it later could drop another allocation's reference. Returns the number
 * of blocks freed. */
int   pool_reclaim_request(Pool *p, uint64_t request_id);

/* Free and used counts now, for metrics: a scan of the states, each exact
 * at the moment it is read. Can't fail. */
void  pool_stats(const Pool *p, PoolStats *st);

/* Checks a descriptor received from another process: block in range,
 * offset + length within block_size (without overflow), block held by
 * someone. Returns 0, or -1 with err naming the bad field. */
int   pool_check(const Pool *p, PoolRef r, Err *err);

#endif
