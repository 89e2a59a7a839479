/* gguf.h -- reading (and writing) GGUF model files.
 *
 * File layout (all little-endian; v2 and v3 share it, v1 is refused):
 *
 *   magic      "GGUF"                  4 bytes
 *   version    uint32                  2 or 3
 *   n_tensors  uint64
 *   n_kv       uint64
 *   kv[n_kv]:  key   string            string = uint64 length + bytes (no NUL)
 *              type  uint32            GGUFValueType
 *              value                   scalar, string, or array:
 *                                      uint32 elem type + uint64 count + elems
 *   tensor_info[n_tensors]:
 *              name   string
 *              n_dims uint32           1..4
 *              ne     uint64[n_dims]   ne[0] is the contiguous (row) dimension
 *              type   uint32           ggml type id (DType for those we run)
 *              offset uint64           from the start of the data section,
 *                                      a multiple of the alignment
 *   padding to `general.alignment` (uint32, default 32, a power of two)
 *   data section
 *
 * The file is memory-mapped read-only, or read into private huge-page
 * memory (GGUF_COPY, faster to stream weights from, and writable until
 * gguf_seal so that a backend can rearrange them first). Every count,
 * length, offset and size is checked against the bytes that remain before
 * it is used, with overflow checks on every product and sum; a bad file
 * yields one error naming the file and the problem, never an out-of-bounds
 * read. Keys, strings and tensor data are views into the mapping: they
 * live as long as the GGUF. Numbers inside arrays may be unaligned, so
 * they are read through the gguf_arr_* accessors, never by casting the
 * pointer. */

#ifndef OMNI_GGUF_H
#define OMNI_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "log.h"

#define GGUF_MAX_DIMS       4
#define GGUF_DEFAULT_ALIGN  32

typedef enum {
    GGUF_UINT8   = 0,
    GGUF_INT8    = 1,
    GGUF_UINT16  = 2,
    GGUF_INT16   = 3,
    GGUF_UINT32  = 4,
    GGUF_INT32   = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL    = 7,
    GGUF_STRING  = 8,
    GGUF_ARRAY   = 9,
    GGUF_UINT64  = 10,
    GGUF_INT64   = 11,
    GGUF_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} GGUFValueType;

typedef struct {
    const char *ptr;        // view into the mapping, not NUL-terminated
    uint64_t    len;
} GGUFStr;

typedef struct {
    GGUFStr        key;
    GGUFValueType  type;
    GGUFValueType  elem_type;   // arrays only
    uint64_t       count;       // arrays only: number of elements
    const uint8_t *raw;         // view: the value bytes (for arrays, the
                                // elements, after type and count)
    uint64_t       raw_len;     // bytes at raw
    GGUFStr       *strs;        // string arrays only: (count,), owned
} GGUFKV;

typedef struct {
    GGUFStr     name;
    uint32_t    n_dims;
    int64_t     ne[GGUF_MAX_DIMS];  // unused dims are 1
    uint32_t    type;               // ggml type id
    uint64_t    offset;             // within the data section
    uint64_t    nbytes;
    const void *data;               // view into the mapping
} GGUFTensor;

typedef struct {
    char           path[256];   // for error messages (truncated if long)
    const uint8_t *base;        // the mapping (or caller's buffer), borrowed
    size_t         size;        // bytes at base
    void          *region;      // what gguf_close unmaps (NULL for a
    size_t         region_len;  //   caller's buffer), owned
    uint32_t       version;
    uint64_t       n_kv;
    GGUFKV        *kv;          // (n_kv,), owned
    uint64_t       n_tensors;
    GGUFTensor    *tensors;     // (n_tensors,), owned
    uint32_t       alignment;
    uint64_t       data_offset; // start of the data section in the file
    bool           writable;    // base is a private copy (GGUF_COPY) not
                                //   yet sealed: tensor data may be written
} GGUF;

/* Type facts for every ggml type id GGUF files carry. Returns false for an
 * id we do not know; then *blck and *size are untouched. */
bool        ggml_type_info(uint32_t type, int64_t *blck, int64_t *size);
const char *ggml_type_name(uint32_t type);

typedef enum {
    GGUF_MAP = 0,           // mmap the file: instant, shares the page cache
    GGUF_COPY,              // read it into private memory on transparent
                            //   huge pages: faster to stream on the CPU;
                            //   writable until gguf_seal
} GGUFLoad;

/* Opens and validates a GGUF file. On success fills g and returns 0; on
 * failure returns -1 with err set ("PATH: problem") and g needs no close. */
int  gguf_load(GGUF *g, const char *path, GGUFLoad how, Err *err);
/* gguf_load with GGUF_MAP. */
int  gguf_open(GGUF *g, const char *path, Err *err);
/* Makes a GGUF_COPY's memory read-only, once whoever rearranges weights in
 * place (model_repack) is done; clears writable. A no-op for a mapping.
 * Can't fail (a kernel refusing the protection only loses it). */
void gguf_seal(GGUF *g);

/* Gives the tensor data's memory back (madvise MADV_DONTNEED, whole pages
 * after the metadata): a private copy's pages are freed and read as zeros
 * from then on, a mapping's are dropped from the process and read from the
 * file again if touched. For a model whose weights a device holds (its
 * host copy is never read again: 16 GB for an 8B F16 file). Metadata,
 * names and strings stay. Can't fail; no-op on a caller's buffer. */
void gguf_drop_data(GGUF *g);

/* The same over a caller-owned buffer (the fuzzer's input); buf must outlive
 * g. name is used in error messages. */
int  gguf_open_buffer(GGUF *g, const void *buf, size_t size, const char *name,
                      Err *err);

/* Frees what gguf_open allocated and unmaps the file. Safe on a zeroed GGUF. */
void gguf_close(GGUF *g);

const GGUFKV     *gguf_find_kv(const GGUF *g, const char *key);
const GGUFTensor *gguf_find_tensor(const GGUF *g, const char *name);

/* Typed getters. They return 0 when the key exists and holds a compatible
 * value (any integer type whose value fits, for the integer getters; f32 or
 * f64 for get_f32), 1 when the key is absent (out untouched), and -1 with
 * err set when it exists with an incompatible type or value. */
int  gguf_get_u32(const GGUF *g, const char *key, uint32_t *out, Err *err);
int  gguf_get_f32(const GGUF *g, const char *key, float *out, Err *err);
int  gguf_get_bool(const GGUF *g, const char *key, bool *out, Err *err);
int  gguf_get_str(const GGUF *g, const char *key, GGUFStr *out, Err *err);
/* Arrays: 0 and *out set when key holds an array of elem_type. */
int  gguf_get_arr(const GGUF *g, const char *key, GGUFValueType elem_type,
                  const GGUFKV **out, Err *err);

/* Element accessors for arrays; i < kv->count is the caller's duty. */
float    gguf_arr_f32(const GGUFKV *kv, uint64_t i);
int32_t  gguf_arr_i32(const GGUFKV *kv, uint64_t i);
GGUFStr  gguf_arr_str(const GGUFKV *kv, uint64_t i);

/* True when s equals the NUL-terminated c. */
bool gguf_str_eq(GGUFStr s, const char *c);


/* ---- Writing ------------------------------------------------------------
 * A GGUFWriter collects key/values and tensor descriptions, then writes the
 * header; the caller then writes every tensor's data in the order the
 * tensors were added, with gguf_writer_write_data, which pads. Nothing of
 * the tensor data is held by the writer, so writing a multi-GB model takes
 * as much memory as one tensor. */

typedef struct {
    uint8_t  *buf;          // header bytes being built, owned
    size_t    len, cap;
    uint64_t  n_kv;
    uint64_t  n_tensors;
    uint8_t  *tinfo;        // tensor-info bytes, owned
    size_t    tinfo_len, tinfo_cap;
    uint64_t *nbytes;       // (n_tensors,) data size of each tensor, owned
    uint64_t  data_len;     // running size of the data section
    uint64_t  next_data;    // index of the next tensor write_data expects
    int       oom;          // sticky allocation failure
} GGUFWriter;

void gguf_writer_init(GGUFWriter *w);
void gguf_writer_free(GGUFWriter *w);
void gguf_writer_u32(GGUFWriter *w, const char *key, uint32_t v);
void gguf_writer_f32(GGUFWriter *w, const char *key, float v);
void gguf_writer_bool(GGUFWriter *w, const char *key, bool v);
void gguf_writer_str(GGUFWriter *w, const char *key, const char *v);
/* Copies a key/value read from another file verbatim. */
void gguf_writer_copy_kv(GGUFWriter *w, const GGUFKV *kv);
/* Declares a tensor; ne[0] is the row length. Returns its data size. */
uint64_t gguf_writer_tensor(GGUFWriter *w, const char *name, uint32_t type,
                            int n_dims, const int64_t *ne);
/* Writes magic, counts, key/values, tensor infos and the alignment padding. */
int  gguf_writer_write_header(GGUFWriter *w, FILE *f, Err *err);
/* Writes the next tensor's nbytes of data followed by alignment padding. */
int  gguf_writer_write_data(GGUFWriter *w, FILE *f, const void *data,
                            Err *err);

#endif
