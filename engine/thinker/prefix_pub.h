/* prefix_pub.h -- the publisher: a thread of the thinker stage that writes
 * to Redis what the prefix index (prefix_index.h) says the KV cache holds,
 * in the schema of proto/prefix_key.h, for nginx's prefix-aware routing:
 *
 *   NS px:ROUTE:HEX   "TOKENS"   EX ttl, refreshed every ttl / 3
 *   NS load:ROUTE     "RUNNING WAITING MAX_SEQS"   EX 5, every second
 *
 * The stage's main thread pushes operations (SET, DEL, RESET) into a
 * bounded queue and never waits: a full queue drops the operation and the
 * caller resends the whole index after a RESET once there is room. The
 * thread applies them to its own mirror of what is held (so nothing it
 * does reads the index or the scheduler) and writes the mirror's changes
 * to Redis, pipelined.
 *
 * Redis is reached with hiredis's synchronous API, with connect and
 * command timeouts (PUB_TIMEOUT_MS), from this thread only. On each
 * (re)connect: AUTH and SELECT when configured, then the keys an earlier
 * incarnation left (SCAN MATCH NS px:ROUTE:*, those the mirror does not
 * hold UNLINKed: a crashed stage's KV cache is gone), then the whole
 * mirror. A failure drops the connection; reconnects back off from 100 ms,
 * doubling to 5 s. Each outage is logged once (once more if what fails
 * changes: refused, then a wrong password), with Redis's own words where
 * it answered, and its end once; never per operation. A clean stop
 * UNLINKs what the mirror holds and the load key.
 *
 * Memory: the queue, a drain buffer and the mirror are allocated at
 * pub_start, sized from the index's capacity; hiredis allocates its own
 * buffers on the thread. */

#ifndef OMNI_PREFIX_PUB_H
#define OMNI_PREFIX_PUB_H

#include <stdbool.h>
#include <stdint.h>

#include "log.h"
#include "prefix_key.h"
#include "stage_channel.h"

#define PUB_TIMEOUT_MS   1000       // connect, and each command's reply
#define PUB_LOAD_TTL_S   5          // the load key's expiry
#define PUB_PASSWORD_MAX 512

typedef enum {
    PUB_SET,                        // key names tokens tokens: held
    PUB_DEL,                        // key is no longer held
    PUB_RESET,                      // the SETs that follow are everything
                                    //   held: start the mirror over
} PubOpType;

typedef struct {
    OmniPkey key;
    int32_t  tokens;                // PUB_SET's
    uint8_t  type;                  // PubOpType
} PubOp;

/* Where Redis is: --redis "unix:/path" or "host:port" ("[v6]:port"). */
typedef struct {
    bool unix_sock;
    char path[108];                 // sockaddr_un's
    char host[256];
    int  port;
} RedisAddr;

typedef struct {
    RedisAddr   addr;
    const char *addr_text;          // as given, for log lines
    const char *user;               // ACL user, or NULL
    const char *password;           // NULL: no AUTH; copied
    int         db;                 // SELECTed when > 0
    const char *ns;                 // key namespace ("omni:")
    const char *route;              // this engine in nginx's upstream
    int         ttl_s;              // prefix keys' expiry, >= 3
    int         max_seqs;           // the load key's MAX_SEQS
    int64_t     max_keys;           // what the index holds at most
    OmniStats  *stats;              // borrowed, or NULL: the load's
                                    //   counts come from it, the redis_*
                                    //   counters go to it
} PubConfig;

typedef struct Publisher Publisher;

/* Parses --redis's value. Returns 0, or -1 with err saying what is wrong
 * with it. Can't fail otherwise. */
int  redis_addr_parse(const char *s, RedisAddr *a, Err *err);

/* The first line of path (without its line end) into out (cap bytes):
 * --redis-password-file. Returns 0, or -1 with err set (unreadable,
 * empty, longer than cap - 1). */
int  redis_read_password(const char *path, char *out, size_t cap, Err *err);

/* Starts the thread; strings in c are copied. It connects in the
 * background: Redis being down is not an error here. Returns NULL with
 * err set when memory or a thread cannot be had. */
Publisher *pub_start(const PubConfig *c, Err *err);

/* Queues op for the thread. Returns false, dropping it, when the queue is
 * full. Never blocks but for the queue's lock (held for copies only). */
bool pub_push(Publisher *p, const PubOp *op);

/* Free places in the queue: a push of up to this many succeeds (the
 * thread only takes from it). */
int64_t pub_room(Publisher *p);

/* True (once) when the thread lost an operation on its side (its mirror
 * was full): the caller sends a RESET and every held key again. */
bool pub_want_resend(Publisher *p);

/* Stops the thread: what is queued is applied, what the mirror holds is
 * UNLINKed (with the load key) if Redis is there, then the connection
 * closes and everything is freed. Takes at most a few PUB_TIMEOUT_MS.
 * NULL is a no-op. */
void pub_stop(Publisher *p);

#endif
