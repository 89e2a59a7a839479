/* testutil.h -- helpers the unit test programs share: reading a whole file,
 * finding the llama.cpp checkout whose data (tokenizer vectors, chat
 * template cases) the tests compare against, and opening a GGUF's
 * tokenizer. Header-only: each test program is one translation unit plus
 * libomni. */

#ifndef OMNI_TESTUTIL_H
#define OMNI_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "tokenizer.h"

/* The whole file, NUL-terminated, malloc'd (caller frees); *len (if not
 * NULL) gets its size. NULL when it cannot be read. */
static inline char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long  n;

    if (len != NULL) *len = 0;
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = n >= 0 ? malloc((size_t) n + 1) : NULL;
    if (buf != NULL && fread(buf, 1, (size_t) n, f) != (size_t) n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf == NULL) return NULL;
    buf[n] = '\0';
    if (len != NULL) *len = (size_t) n;
    return buf;
}

/* The checkout: $OMNI_LLAMA_SRC, else the last line t/fetch-llama-src
 * prints (run from the repository root, as make test does). 0 on success. */
static inline int find_llama_src(char *dst, size_t cap) {
    const char *env = getenv("OMNI_LLAMA_SRC");
    char        line[4096];
    FILE       *p;

    dst[0] = '\0';
    if (env != NULL && *env != '\0') {
        snprintf(dst, cap, "%s", env);
        return 0;
    }
    p = popen("t/fetch-llama-src", "r");
    if (p == NULL) return -1;
    while (fgets(line, sizeof(line), p) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] != '\0') snprintf(dst, cap, "%s", line);
    }
    return pclose(p) == 0 && dst[0] != '\0' ? 0 : -1;
}

/* path's GGUF opened into *g and its tokenizer into *tk (the caller frees
 * both); 0, or -1 with the reason on stderr. */
static inline int open_tokenizer(const char *path, GGUF *g, Tokenizer **tk) {
    Err err;

    if (gguf_open(g, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    *tk = tokenizer_new(g, &err);
    if (*tk == NULL) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Points OMNI_CUDA_LIB (unless set) at the CUDA plugin make built: the
 * test binary is build/t/X or build/asan/t/X, the plugin build/omni-cuda.so,
 * where backend_new would not look (beside the binary). */
static inline void use_built_cuda_plugin(void) {
    char exe[4096], path[4200];
    ssize_t n;

    if (getenv("OMNI_CUDA_LIB") != NULL) return;
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    for (int up = 1; up <= 2; up++) {
        char *slash = strrchr(exe, '/');

        if (slash == NULL) return;
        *slash = '\0';
        snprintf(path, sizeof(path), "%s/../omni-cuda.so", exe);
        if (access(path, F_OK) == 0) {
            setenv("OMNI_CUDA_LIB", path, 1);
            return;
        }
    }
}

#endif
