/* gguf.c -- GGUF reader and writer; the format is documented in gguf.h.
 *
 * The reader is a cursor over the mapped bytes. Every read goes through
 * cur_take(), which checks the bytes remaining before handing out a pointer,
 * so a truncated or lying file can only produce an error. Counts read from
 * the file are bounded by what the remaining bytes could possibly hold
 * before any allocation is sized from them: a 40-byte file claiming 2^60
 * tensors fails on the bound, it does not try to allocate.
 *
 * Errors name the file and the first problem found, e.g.
 * "m.gguf: tensor 'tok_embd' data (offset 1024, 4096 bytes) runs past the
 * end of the file (2048 bytes)". */

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"

#define GGUF_MAGIC          "GGUF"
#define GGUF_MAX_KEY_LEN    65535       /* ggml's own limit is looser; no
                                           real key is longer than ~100 */

typedef struct {
    const GGUF    *g;
    uint64_t       pos;
} Cursor;

/* ggml type ids: block size in elements and bytes per block. Ids missing here
 * were removed from ggml (Q4_2, Q4_3, ...) and are rejected. */
static const struct {
    uint32_t    id;
    const char *name;
    int64_t     blck;
    int64_t     size;
} ggml_types[] = {
    {  0, "f32",      1,   4 }, {  1, "f16",      1,   2 },
    {  2, "q4_0",    32,  18 }, {  3, "q4_1",    32,  20 },
    {  6, "q5_0",    32,  22 }, {  7, "q5_1",    32,  24 },
    {  8, "q8_0",    32,  34 }, {  9, "q8_1",    32,  36 },
    { 10, "q2_K",   256,  84 }, { 11, "q3_K",   256, 110 },
    { 12, "q4_K",   256, 144 }, { 13, "q5_K",   256, 176 },
    { 14, "q6_K",   256, 210 }, { 15, "q8_K",   256, 292 },
    { 16, "iq2_xxs", 256, 66 }, { 17, "iq2_xs", 256,  74 },
    { 18, "iq3_xxs", 256, 98 }, { 19, "iq1_s",  256,  50 },
    { 20, "iq4_nl",  32,  18 }, { 21, "iq3_s",  256, 110 },
    { 22, "iq2_s",  256,  82 }, { 23, "iq4_xs", 256, 136 },
    { 24, "i8",       1,   1 }, { 25, "i16",      1,   2 },
    { 26, "i32",      1,   4 }, { 27, "i64",      1,   8 },
    { 28, "f64",      1,   8 }, { 29, "iq1_m",  256,  56 },
    { 30, "bf16",     1,   2 }, { 34, "tq1_0",  256,  54 },
    { 35, "tq2_0",  256,  66 }, { 39, "mxfp4",   32,  17 },
};

/* Byte size of one scalar value of each GGUF value type; 0 for string/array. */
static const uint64_t value_size[GGUF_TYPE_COUNT] = {
    [GGUF_UINT8] = 1, [GGUF_INT8] = 1, [GGUF_UINT16] = 2, [GGUF_INT16] = 2,
    [GGUF_UINT32] = 4, [GGUF_INT32] = 4, [GGUF_FLOAT32] = 4, [GGUF_BOOL] = 1,
    [GGUF_STRING] = 0, [GGUF_ARRAY] = 0, [GGUF_UINT64] = 8, [GGUF_INT64] = 8,
    [GGUF_FLOAT64] = 8,
};

static const char *value_type_name[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
    "string", "array", "uint64", "int64", "float64",
};


bool ggml_type_info(uint32_t type, int64_t *blck, int64_t *size) {
    for (size_t i = 0; i < sizeof(ggml_types) / sizeof(ggml_types[0]); i++) {
        if (ggml_types[i].id == type) {
            *blck = ggml_types[i].blck;
            *size = ggml_types[i].size;
            return true;
        }
    }
    return false;
}

const char *ggml_type_name(uint32_t type) {
    for (size_t i = 0; i < sizeof(ggml_types) / sizeof(ggml_types[0]); i++) {
        if (ggml_types[i].id == type) return ggml_types[i].name;
    }
    return "unknown";
}


/* ---- Cursor ------------------------------------------------------------- */

static uint64_t cur_left(const Cursor *c) {
    return c->g->size - c->pos;
}

/* Returns a pointer to the next n bytes and advances, or NULL when fewer than
 * n bytes remain. */
static const uint8_t *cur_take(Cursor *c, uint64_t n) {
    const uint8_t *p;

    if (n > cur_left(c)) return NULL;
    p = c->g->base + c->pos;
    c->pos += n;
    return p;
}

static int cur_u32(Cursor *c, uint32_t *v) {
    const uint8_t *p = cur_take(c, 4);

    if (p == NULL) return -1;
    memcpy(v, p, 4);
    return 0;
}

static int cur_u64(Cursor *c, uint64_t *v) {
    const uint8_t *p = cur_take(c, 8);

    if (p == NULL) return -1;
    memcpy(v, p, 8);
    return 0;
}

static int cur_str(Cursor *c, GGUFStr *s) {
    uint64_t len;

    if (cur_u64(c, &len) != 0) return -1;
    s->ptr = (const char *) cur_take(c, len);
    s->len = len;
    return s->ptr == NULL ? -1 : 0;
}


/* ---- Parsing ------------------------------------------------------------ */

static int truncated(const GGUF *g, Err *err, const char *what) {
    return err_set(err, "%s: file is truncated or corrupt: %s runs past the "
                   "end of the file (%zu bytes)", g->path, what, g->size);
}

/* Parses an array value (after its GGUF_ARRAY type tag). String arrays get an
 * owned index of their elements so lookups are O(1). */
static int parse_array(GGUF *g, Cursor *c, GGUFKV *kv, Err *err) {
    uint32_t  et;
    uint64_t  esz, start;

    if (cur_u32(c, &et) != 0 || cur_u64(c, &kv->count) != 0) {
        return truncated(g, err, "an array header");
    }
    if (et >= GGUF_TYPE_COUNT || et == GGUF_ARRAY) {
        return err_set(err, "%s: key '%.*s' is an array of unsupported type "
                       "%u", g->path, (int) kv->key.len, kv->key.ptr, et);
    }
    kv->elem_type = et;
    start = c->pos;
    kv->raw = g->base + start;

    if (et != GGUF_STRING) {
        esz = value_size[et];
        if (kv->count > cur_left(c) / esz) {
            return truncated(g, err, "an array");
        }
        kv->raw_len = kv->count * esz;
        c->pos += kv->raw_len;
        return 0;
    }

    /* every string takes at least its 8-byte length */
    if (kv->count > cur_left(c) / 8) return truncated(g, err, "a string array");
    kv->strs = malloc((kv->count ? kv->count : 1) * sizeof(GGUFStr));
    if (kv->strs == NULL) {
        return err_set(err, "%s: out of memory indexing %" PRIu64 " strings",
                       g->path, kv->count);
    }
    for (uint64_t i = 0; i < kv->count; i++) {
        if (cur_str(c, &kv->strs[i]) != 0) {
            return truncated(g, err, "a string in an array");
        }
    }
    kv->raw_len = c->pos - start;
    return 0;
}

static int parse_kv(GGUF *g, Cursor *c, GGUFKV *kv, Err *err) {
    uint32_t type;

    if (cur_str(c, &kv->key) != 0) return truncated(g, err, "a key");
    if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY_LEN) {
        return err_set(err, "%s: key of invalid length %" PRIu64, g->path,
                       kv->key.len);
    }
    if (cur_u32(c, &type) != 0) return truncated(g, err, "a value type");
    if (type >= GGUF_TYPE_COUNT) {
        return err_set(err, "%s: key '%.*s' has invalid value type %u",
                       g->path, (int) kv->key.len, kv->key.ptr, type);
    }
    kv->type = type;

    if (type == GGUF_ARRAY) return parse_array(g, c, kv, err);

    kv->raw = g->base + c->pos;
    if (type == GGUF_STRING) {
        GGUFStr s;
        if (cur_str(c, &s) != 0) return truncated(g, err, "a string value");
        kv->raw_len = 8 + s.len;
        return 0;
    }
    kv->raw_len = value_size[type];
    if (cur_take(c, kv->raw_len) == NULL) return truncated(g, err, "a value");
    return 0;
}

static int check_unique_keys(GGUF *g, Err *err) {
    /* O(n^2) but n_kv is a few dozen in real files; the fuzzer's bound on it
       comes from the file size */
    for (uint64_t i = 0; i < g->n_kv; i++) {
        for (uint64_t j = 0; j < i; j++) {
            if (g->kv[i].key.len == g->kv[j].key.len
                && memcmp(g->kv[i].key.ptr, g->kv[j].key.ptr,
                          g->kv[i].key.len) == 0)
            {
                return err_set(err, "%s: duplicate key '%.*s'", g->path,
                               (int) g->kv[i].key.len, g->kv[i].key.ptr);
            }
        }
    }
    return 0;
}

/* Validates shape and type of one tensor and computes its byte size. */
static int parse_tensor_info(GGUF *g, Cursor *c, GGUFTensor *t, Err *err) {
    int64_t  blck, tsize;
    uint64_t nelem = 1, v;

    if (cur_str(c, &t->name) != 0) return truncated(g, err, "a tensor name");
    if (t->name.len == 0 || t->name.len > 255) {
        return err_set(err, "%s: tensor name of invalid length %" PRIu64,
                       g->path, t->name.len);
    }
    if (cur_u32(c, &t->n_dims) != 0) return truncated(g, err, "a tensor");
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
        return err_set(err, "%s: tensor '%.*s' has %u dimensions (1..%d "
                       "allowed)", g->path, (int) t->name.len, t->name.ptr,
                       t->n_dims, GGUF_MAX_DIMS);
    }
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if ((uint32_t) d >= t->n_dims) continue;
        if (cur_u64(c, &v) != 0) return truncated(g, err, "a tensor shape");
        if (v == 0 || v > INT64_MAX || nelem > INT64_MAX / v) {
            return err_set(err, "%s: tensor '%.*s' has invalid dimension %d "
                           "(%" PRIu64 ")", g->path, (int) t->name.len,
                           t->name.ptr, d, v);
        }
        t->ne[d] = (int64_t) v;
        nelem *= v;
    }
    if (cur_u32(c, &t->type) != 0 || cur_u64(c, &t->offset) != 0) {
        return truncated(g, err, "a tensor");
    }
    if (!ggml_type_info(t->type, &blck, &tsize)) {
        return err_set(err, "%s: tensor '%.*s' has unknown type id %u",
                       g->path, (int) t->name.len, t->name.ptr, t->type);
    }
    if (t->ne[0] % blck != 0) {
        return err_set(err, "%s: tensor '%.*s' row length %" PRId64 " is not "
                       "a multiple of the %s block size %" PRId64, g->path,
                       (int) t->name.len, t->name.ptr, t->ne[0],
                       ggml_type_name(t->type), blck);
    }
    /* nelem < 2^63 and tsize <= 292, so this cannot overflow 64 bits */
    t->nbytes = nelem / (uint64_t) blck * (uint64_t) tsize;
    return 0;
}

static int check_unique_tensors(GGUF *g, Err *err) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        for (uint64_t j = 0; j < i; j++) {
            if (g->tensors[i].name.len == g->tensors[j].name.len
                && memcmp(g->tensors[i].name.ptr, g->tensors[j].name.ptr,
                          g->tensors[i].name.len) == 0)
            {
                return err_set(err, "%s: duplicate tensor '%.*s'", g->path,
                               (int) g->tensors[i].name.len,
                               g->tensors[i].name.ptr);
            }
        }
    }
    return 0;
}

static int parse_alignment(GGUF *g, Err *err) {
    uint32_t a = GGUF_DEFAULT_ALIGN;
    int      rc = gguf_get_u32(g, "general.alignment", &a, err);

    if (rc < 0) return err_prefix(err, "%s", g->path);
    if (a == 0 || (a & (a - 1)) != 0 || a > 65536) {
        return err_set(err, "%s: general.alignment %u is not a power of two "
                       "up to 65536", g->path, a);
    }
    g->alignment = a;
    return 0;
}

/* Places every tensor in the data section, checking bounds and alignment. */
static int place_tensors(GGUF *g, Err *err) {
    uint64_t avail = g->size - g->data_offset;

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        GGUFTensor *t = &g->tensors[i];

        if (t->offset % g->alignment != 0) {
            return err_set(err, "%s: tensor '%.*s' offset %" PRIu64 " is not "
                           "a multiple of the alignment %u", g->path,
                           (int) t->name.len, t->name.ptr, t->offset,
                           g->alignment);
        }
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            return err_set(err, "%s: file is truncated or corrupt: tensor "
                           "'%.*s' data (offset %" PRIu64 ", %" PRIu64
                           " bytes) runs past the end of the file (%zu "
                           "bytes)", g->path, (int) t->name.len, t->name.ptr,
                           t->offset, t->nbytes, g->size);
        }
        t->data = g->base + g->data_offset + t->offset;
    }
    return 0;
}

static int parse(GGUF *g, Err *err) {
    Cursor         c = { g, 0 };
    const uint8_t *magic = cur_take(&c, 4);
    uint64_t       pad;

    if (magic == NULL || memcmp(magic, GGUF_MAGIC, 4) != 0) {
        return err_set(err, "%s: not a GGUF file (bad magic)", g->path);
    }
    if (cur_u32(&c, &g->version) != 0) return truncated(g, err, "the header");
    if (g->version < 2 || g->version > 3) {
        return err_set(err, "%s: GGUF version %u is not supported (2 and 3 "
                       "are)", g->path, g->version);
    }
    if (cur_u64(&c, &g->n_tensors) != 0 || cur_u64(&c, &g->n_kv) != 0) {
        return truncated(g, err, "the header");
    }
    /* a key/value takes at least 12 bytes, a tensor info at least 28 */
    if (g->n_kv > cur_left(&c) / 12 || g->n_tensors > cur_left(&c) / 28) {
        return err_set(err, "%s: file is truncated or corrupt: header claims "
                       "%" PRIu64 " keys and %" PRIu64 " tensors in %zu bytes",
                       g->path, g->n_kv, g->n_tensors, g->size);
    }

    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(GGUFKV));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(GGUFTensor));
    if (g->kv == NULL || g->tensors == NULL) {
        return err_set(err, "%s: out of memory", g->path);
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (parse_kv(g, &c, &g->kv[i], err) != 0) return -1;
    }
    if (check_unique_keys(g, err) != 0 || parse_alignment(g, err) != 0) {
        return -1;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (parse_tensor_info(g, &c, &g->tensors[i], err) != 0) return -1;
    }
    if (check_unique_tensors(g, err) != 0) return -1;

    pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    if (g->n_tensors > 0 && pad > cur_left(&c)) {
        return truncated(g, err, "the padding before the data section");
    }
    g->data_offset = c.pos + (pad <= cur_left(&c) ? pad : cur_left(&c));
    return place_tensors(g, err);
}

static void set_path(GGUF *g, const char *path) {
    snprintf(g->path, sizeof(g->path), "%s", path);
}

int gguf_open_buffer(GGUF *g, const void *buf, size_t size, const char *name,
                     Err *err)
{
    memset(g, 0, sizeof(*g));
    set_path(g, name);
    g->base = buf;
    g->size = size;
    if (parse(g, err) != 0) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

/* Maps the file read-only: instant, and the pages are the page cache's,
 * shared with every process that maps the same file. */
static void *load_map(int fd, size_t size, const char *path, Err *err) {
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);

    if (map == MAP_FAILED) {
        err_set(err, "%s: mmap failed: %s", path, strerror(errno));
        return NULL;
    }
    return map;
}

/* Reads the file into private memory aligned to, and advised onto,
 * transparent huge pages. A decode step streams every weight once: with
 * 4 KiB page-cache pages the hardware prefetchers stop at every page and
 * each page costs a TLB walk; on huge pages single-stream decode measured
 * about 20% faster (1B F16, 2 threads). The memory stays writable until
 * gguf_seal, so the backend can first rearrange the weights it reads. The
 * region to unmap goes to *region and *region_len. */
static void *load_copy(int fd, size_t size, const char *path, void **region,
                       size_t *region_len, Err *err)
{
    size_t   huge = (size_t) 2 << 20;
    size_t   len = (size + huge - 1) / huge * huge + huge, off = 0;
    char    *p, *base;

    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    if (p == MAP_FAILED) {
        err_set(err, "%s: cannot allocate %zu bytes for the weights: %s",
                path, size, strerror(errno));
        return NULL;
    }
    base = (char *) (((uintptr_t) p + huge - 1) & ~(uintptr_t) (huge - 1));
    /* a kernel without transparent huge pages refuses: still correct */
    (void) madvise(base, len - (size_t) (base - p) - huge, MADV_HUGEPAGE);
    while (off < size) {
        ssize_t n = pread(fd, base + off, size - off, (off_t) off);

        if (n <= 0) {
            munmap(p, len);
            err_set(err, "%s: read failed at byte %zu: %s", path, off,
                    n < 0 ? strerror(errno) : "the file shrank");
            return NULL;
        }
        off += (size_t) n;
    }
    *region = p;
    *region_len = len;
    return base;
}

int gguf_load(GGUF *g, const char *path, GGUFLoad how, Err *err) {
    struct stat st;
    void       *base;
    int         fd;

    memset(g, 0, sizeof(*g));
    set_path(g, path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "%s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return err_set(err, "%s: file is truncated: %lld bytes is too short "
                       "for a GGUF header", path, (long long) st.st_size);
    }
    if (how == GGUF_COPY) {
        base = load_copy(fd, (size_t) st.st_size, path, &g->region,
                         &g->region_len, err);
    } else {
        base = load_map(fd, (size_t) st.st_size, path, err);
        g->region = base;
        g->region_len = (size_t) st.st_size;
    }
    close(fd);
    if (base == NULL) return -1;
    g->base = base;
    g->size = (size_t) st.st_size;
    g->writable = how == GGUF_COPY;
    if (parse(g, err) != 0) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

void gguf_seal(GGUF *g) {
    if (!g->writable) return;
    /* base is huge-page aligned; a refusal only loses the protection */
    (void) mprotect((void *) g->base, g->size, PROT_READ);
    g->writable = false;
}

void gguf_drop_data(GGUF *g) {
    long      page = sysconf(_SC_PAGESIZE);
    uintptr_t start, end;

    if (g->region == NULL || page <= 0) return;
    start = ((uintptr_t) g->base + g->data_offset + (uintptr_t) page - 1)
            & ~((uintptr_t) page - 1);
    end = ((uintptr_t) g->base + g->size) & ~((uintptr_t) page - 1);
    if (end > start) {
        (void) madvise((void *) start, end - start, MADV_DONTNEED);
    }
}

int gguf_open(GGUF *g, const char *path, Err *err) {
    return gguf_load(g, path, GGUF_MAP, err);
}

void gguf_close(GGUF *g) {
    if (g->kv != NULL) {
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
        free(g->kv);
    }
    free(g->tensors);
    if (g->region != NULL) munmap(g->region, g->region_len);
    memset(g, 0, sizeof(*g));
}


/* ---- Lookup ------------------------------------------------------------- */

bool gguf_str_eq(GGUFStr s, const char *c) {
    size_t n = strlen(c);

    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const GGUFKV *gguf_find_kv(const GGUF *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    }
    return NULL;
}

const GGUFTensor *gguf_find_tensor(const GGUF *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    }
    return NULL;
}

static int wrong_type(const GGUFKV *kv, const char *want, Err *err) {
    return err_set(err, "key '%.*s' has type %s, expected %s",
                   (int) kv->key.len, kv->key.ptr, value_type_name[kv->type],
                   want);
}

/* Reads any integer scalar as int64 (uint64 above INT64_MAX fails). */
static int kv_int(const GGUFKV *kv, int64_t *out) {
    uint8_t  u8;  int8_t  i8;  uint16_t u16; int16_t i16;
    uint32_t u32; int32_t i32; uint64_t u64;

    switch (kv->type) {
    case GGUF_UINT8:  memcpy(&u8, kv->raw, 1);  *out = u8;  return 0;
    case GGUF_INT8:   memcpy(&i8, kv->raw, 1);  *out = i8;  return 0;
    case GGUF_UINT16: memcpy(&u16, kv->raw, 2); *out = u16; return 0;
    case GGUF_INT16:  memcpy(&i16, kv->raw, 2); *out = i16; return 0;
    case GGUF_UINT32: memcpy(&u32, kv->raw, 4); *out = u32; return 0;
    case GGUF_INT32:  memcpy(&i32, kv->raw, 4); *out = i32; return 0;
    case GGUF_INT64:  memcpy(out, kv->raw, 8);              return 0;
    case GGUF_UINT64:
        memcpy(&u64, kv->raw, 8);
        if (u64 > INT64_MAX) return -1;
        *out = (int64_t) u64;
        return 0;
    default:
        return -1;
    }
}

int gguf_get_u32(const GGUF *g, const char *key, uint32_t *out, Err *err) {
    const GGUFKV *kv = gguf_find_kv(g, key);
    int64_t       v;

    if (kv == NULL) return 1;
    if (kv_int(kv, &v) != 0) return wrong_type(kv, "an integer", err);
    if (v < 0 || v > UINT32_MAX) {
        return err_set(err, "key '%s' value %" PRId64 " is out of range",
                       key, v);
    }
    *out = (uint32_t) v;
    return 0;
}

int gguf_get_f32(const GGUF *g, const char *key, float *out, Err *err) {
    const GGUFKV *kv = gguf_find_kv(g, key);
    double        d;

    if (kv == NULL) return 1;
    if (kv->type == GGUF_FLOAT32) {
        memcpy(out, kv->raw, 4);
        return 0;
    }
    if (kv->type == GGUF_FLOAT64) {
        memcpy(&d, kv->raw, 8);
        *out = (float) d;
        return 0;
    }
    return wrong_type(kv, "float32", err);
}

int gguf_get_bool(const GGUF *g, const char *key, bool *out, Err *err) {
    const GGUFKV *kv = gguf_find_kv(g, key);

    if (kv == NULL) return 1;
    if (kv->type != GGUF_BOOL) return wrong_type(kv, "bool", err);
    *out = kv->raw[0] != 0;
    return 0;
}

int gguf_get_str(const GGUF *g, const char *key, GGUFStr *out, Err *err) {
    const GGUFKV *kv = gguf_find_kv(g, key);

    if (kv == NULL) return 1;
    if (kv->type != GGUF_STRING) return wrong_type(kv, "string", err);
    out->ptr = (const char *) kv->raw + 8;
    out->len = kv->raw_len - 8;
    return 0;
}

int gguf_get_arr(const GGUF *g, const char *key, GGUFValueType elem_type,
                 const GGUFKV **out, Err *err)
{
    const GGUFKV *kv = gguf_find_kv(g, key);

    if (kv == NULL) return 1;
    if (kv->type != GGUF_ARRAY || kv->elem_type != elem_type) {
        return err_set(err, "key '%s' is not an array of %s", key,
                       value_type_name[elem_type]);
    }
    *out = kv;
    return 0;
}

float gguf_arr_f32(const GGUFKV *kv, uint64_t i) {
    float v;

    memcpy(&v, kv->raw + i * 4, 4);
    return v;
}

int32_t gguf_arr_i32(const GGUFKV *kv, uint64_t i) {
    int32_t v;

    memcpy(&v, kv->raw + i * 4, 4);
    return v;
}

GGUFStr gguf_arr_str(const GGUFKV *kv, uint64_t i) {
    return kv->strs[i];
}


/* ---- Writer ------------------------------------------------------------- */

static void wbuf_put(GGUFWriter *w, uint8_t **buf, size_t *len, size_t *cap,
                     const void *p, size_t n)
{
    size_t   ncap;
    uint8_t *nb;

    if (w->oom) return;
    if (*len + n > *cap) {
        ncap = *cap ? *cap * 2 : 4096;
        while (ncap < *len + n) ncap *= 2;
        nb = realloc(*buf, ncap);
        if (nb == NULL) {
            w->oom = 1;
            return;
        }
        *buf = nb;
        *cap = ncap;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
}

static void w_kv_bytes(GGUFWriter *w, const void *p, size_t n) {
    wbuf_put(w, &w->buf, &w->len, &w->cap, p, n);
}

static void w_ti_bytes(GGUFWriter *w, const void *p, size_t n) {
    wbuf_put(w, &w->tinfo, &w->tinfo_len, &w->tinfo_cap, p, n);
}

static void w_key(GGUFWriter *w, const char *key, uint32_t type) {
    uint64_t len = strlen(key);

    w_kv_bytes(w, &len, 8);
    w_kv_bytes(w, key, len);
    w_kv_bytes(w, &type, 4);
    w->n_kv++;
}

void gguf_writer_init(GGUFWriter *w) {
    memset(w, 0, sizeof(*w));
}

void gguf_writer_free(GGUFWriter *w) {
    free(w->buf);
    free(w->tinfo);
    free(w->nbytes);
    memset(w, 0, sizeof(*w));
}

void gguf_writer_u32(GGUFWriter *w, const char *key, uint32_t v) {
    w_key(w, key, GGUF_UINT32);
    w_kv_bytes(w, &v, 4);
}

void gguf_writer_f32(GGUFWriter *w, const char *key, float v) {
    w_key(w, key, GGUF_FLOAT32);
    w_kv_bytes(w, &v, 4);
}

void gguf_writer_bool(GGUFWriter *w, const char *key, bool v) {
    uint8_t b = v;

    w_key(w, key, GGUF_BOOL);
    w_kv_bytes(w, &b, 1);
}

void gguf_writer_str(GGUFWriter *w, const char *key, const char *v) {
    uint64_t len = strlen(v);

    w_key(w, key, GGUF_STRING);
    w_kv_bytes(w, &len, 8);
    w_kv_bytes(w, v, len);
}

void gguf_writer_copy_kv(GGUFWriter *w, const GGUFKV *kv) {
    uint64_t klen = kv->key.len;
    uint32_t type = kv->type, et = kv->elem_type;

    w_kv_bytes(w, &klen, 8);
    w_kv_bytes(w, kv->key.ptr, klen);
    w_kv_bytes(w, &type, 4);
    if (type == GGUF_ARRAY) {
        w_kv_bytes(w, &et, 4);
        w_kv_bytes(w, &kv->count, 8);
    }
    w_kv_bytes(w, kv->raw, kv->raw_len);
    w->n_kv++;
}

static uint64_t align_up(uint64_t v, uint64_t a) {
    return (v + a - 1) / a * a;
}

uint64_t gguf_writer_tensor(GGUFWriter *w, const char *name, uint32_t type,
                            int n_dims, const int64_t *ne)
{
    uint64_t  len = strlen(name), nelem = 1, nbytes, *nb;
    uint32_t  nd = (uint32_t) n_dims;
    int64_t   blck = 1, size = 4;

    ggml_type_info(type, &blck, &size);
    w_ti_bytes(w, &len, 8);
    w_ti_bytes(w, name, len);
    w_ti_bytes(w, &nd, 4);
    for (int d = 0; d < n_dims; d++) {
        uint64_t v = (uint64_t) ne[d];
        w_ti_bytes(w, &v, 8);
        nelem *= v;
    }
    nbytes = nelem / (uint64_t) blck * (uint64_t) size;
    w_ti_bytes(w, &type, 4);
    w_ti_bytes(w, &w->data_len, 8);

    nb = realloc(w->nbytes, (w->n_tensors + 1) * sizeof(uint64_t));
    if (nb == NULL) {
        w->oom = 1;
        return nbytes;
    }
    w->nbytes = nb;
    w->nbytes[w->n_tensors++] = nbytes;
    w->data_len = align_up(w->data_len + nbytes, GGUF_DEFAULT_ALIGN);
    return nbytes;
}

/* fwrite that accepts an empty (possibly NULL) buffer. */
static int write_all(FILE *f, const void *p, size_t n) {
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_pad(FILE *f, uint64_t n) {
    static const uint8_t zeros[GGUF_DEFAULT_ALIGN];

    return n == 0 || fwrite(zeros, 1, n, f) == n ? 0 : -1;
}

int gguf_writer_write_header(GGUFWriter *w, FILE *f, Err *err) {
    uint32_t version = 3;
    uint64_t hdr_len;

    if (w->oom) return err_set(err, "out of memory building the GGUF header");
    hdr_len = 4 + 4 + 8 + 8 + w->len + w->tinfo_len;
    if (fwrite(GGUF_MAGIC, 1, 4, f) != 4
        || fwrite(&version, 4, 1, f) != 1
        || fwrite(&w->n_tensors, 8, 1, f) != 1
        || fwrite(&w->n_kv, 8, 1, f) != 1
        || write_all(f, w->buf, w->len) != 0
        || write_all(f, w->tinfo, w->tinfo_len) != 0
        || write_pad(f, align_up(hdr_len, GGUF_DEFAULT_ALIGN) - hdr_len) != 0)
    {
        return err_set(err, "writing the GGUF header: %s", strerror(errno));
    }
    return 0;
}

int gguf_writer_write_data(GGUFWriter *w, FILE *f, const void *data,
                           Err *err)
{
    uint64_t n;

    if (w->next_data >= w->n_tensors) {
        return err_set(err, "more tensor data written than declared");
    }
    n = w->nbytes[w->next_data++];
    if (write_all(f, data, n) != 0
        || write_pad(f, align_up(n, GGUF_DEFAULT_ALIGN) - n) != 0)
    {
        return err_set(err, "writing tensor data: %s", strerror(errno));
    }
    return 0;
}
