/* bench_kernels.c -- CPU matmul throughput per weight type and shape, next
 * to the machine's memory read bandwidth.
 *
 *   bench_kernels [isa] [threads] [types] [reps]
 *     isa      auto (default), avx512, avx2, ref
 *     threads  0 = one per core (default)
 *     types    comma list of ggml type names (f32, f16, bf16, q8_0, q4_0,
 *              q4_1, q5_0, q5_1, q2_K..q6_K, iq4_nl, iq4_xs), default
 *              f16,q8_0,q4_0,bf16,f32
 *     reps     timed repetitions per configuration, default 7
 *
 * Shapes are the projections of a llama-shaped 1B model (dim 2048, 8 KV
 * heads of 64, ffn 5632, vocab 32000). For n = 1 (decode) it prints GB/s of
 * weights streamed: "cold" rotates over copies of the matrix that together
 * exceed the last-level cache, as a decode step does over a model's layers,
 * and is the figure to hold against the bandwidth roofline; "hot" repeats
 * one matrix, which is what llama.cpp's test-backend-ops perf measures.
 * Batched decode, cold: n = 4 in GB/s (four sequences should cost what one
 * does), n = 16 in GFLOP/s. For n = 512 (prefill) it prints GFLOP/s.
 * Matrices are first given to the backend's repack, as a model loaded into
 * memory is. Times are medians of
 * reps runs after a warm-up; the spread (min..max) is printed so noise is
 * visible.
 * Benchmarks report, never assert. */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "membw.h"

#define COLD_BYTES  ((size_t) 768 << 20)    /* beyond any L3 we run on */
#define PROBE_BYTES ((size_t) 1 << 30)
#define MAX_REPS    64

static const struct {
    int64_t     rows, cols;
    const char *what;
} shapes[] = {
    { 2048, 2048, "wq/wo" },
    { 512, 2048, "wk/wv" },
    { 5632, 2048, "gate/up" },
    { 2048, 5632, "down" },
    { 32000, 2048, "output" },
};

#define N_SHAPES (int) (sizeof(shapes) / sizeof(shapes[0]))

static double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

typedef struct {
    double med, min, max;
} Stat;

static Stat stat_of(double *t, int n) {
    Stat s;

    qsort(t, (size_t) n, sizeof(double), cmp_double);
    s.med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    s.min = t[0];
    s.max = t[n - 1];
    return s;
}

static uint64_t rng = 88172645463325252ull;

static float rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float) ((double) (rng >> 40) / (double) (1 << 23) - 1.0);
}


/* ---- memory read bandwidth ------------------------------------------------ */

/* GB/s reading PROBE_BYTES with nth threads: median and spread of reps
 * passes after one warm-up. */
static Stat probe_bandwidth(const uint64_t *buf, int nth, int reps) {
    double   t[MAX_REPS];
    uint64_t sum = 0;

    for (int r = -1; r < reps; r++) {
        double gbs = membw_pass(buf, PROBE_BYTES, nth, &sum);

        if (r >= 0) t[r] = gbs;
    }
    if (sum == 1) fputc(' ', stderr);       /* keep the loads */
    return stat_of(t, reps);
}


/* ---- matrices --------------------------------------------------------------- */

/* Offsets of the f16 scale and min (or -1) in a block of the types that
 * quantize_row cannot write (llama-quantize does): their rows are random
 * bytes with these set to sane scales. */
static void block_scales(DType t, int *d_off, int *m_off) {
    *d_off = 0;
    *m_off = -1;
    switch (t) {
    case DT_Q2_K: *d_off = 80; *m_off = 82; break;
    case DT_Q3_K: *d_off = 108; break;
    case DT_Q6_K: *d_off = 208; break;
    case DT_Q4_1:
    case DT_Q5_1:
    case DT_Q4_K:
    case DT_Q5_K: *m_off = 2; break;
    default:      break;
    }
}

/* One row of type t from cols random values, or random bytes with sane
 * scales where quantize_row has no quantizer for t. */
static void make_row(DType t, const float *src, char *row, int64_t cols) {
    size_t rb = dtype_row_bytes(t, cols);
    size_t bs = dtype_row_bytes(t, dtype_block(t));
    int    d_off, m_off;

    if (quantize_row(t, src, row, cols) == 0) return;
    block_scales(t, &d_off, &m_off);
    for (size_t i = 0; i < rb; i++) row[i] = (char) (rnd() * 128.0f);
    for (size_t b = 0; b < rb / bs; b++) {
        uint16_t d = f32_to_f16(0.002f + 0.001f * rnd());
        uint16_t m = f32_to_f16(0.01f * rnd());

        memcpy(row + b * bs + d_off, &d, 2);
        if (m_off >= 0) memcpy(row + b * bs + m_off, &m, 2);
    }
}

/* Fills a matrix of type t: 64 distinct random rows, repeated. */
static void *make_weights(DType t, int64_t rows, int64_t cols, size_t *rb) {
    float *src = malloc((size_t) cols * sizeof(float));
    char  *d, *pattern;

    *rb = dtype_row_bytes(t, cols);
    d = aligned_alloc(64, (*rb * (size_t) rows + 63) / 64 * 64);
    pattern = malloc(*rb * 64);
    if (src == NULL || d == NULL || pattern == NULL) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < 64; r++) {
        for (int64_t i = 0; i < cols; i++) src[i] = rnd();
        make_row(t, src, pattern + (size_t) r * *rb, cols);
    }
    for (int64_t r = 0; r < rows; r++) {
        memcpy(d + (size_t) r * *rb, pattern + (size_t) (r % 64) * *rb, *rb);
    }
    free(pattern);
    free(src);
    return d;
}

/* Any weight type by ggml's name ("q4_K"). */
static bool parse_type(const char *s, DType *t) {
    for (uint32_t i = 0; i < 64; i++) {
        if (dtype_supported(i) && strcmp(s, dtype_name((DType) i)) == 0) {
            *t = (DType) i;
            return true;
        }
    }
    return false;
}

/* Median seconds of one matmul over reps runs, cycling through n_copies
 * matrices (1 = hot). */
static Stat time_matmul(Backend *be, float *out, const float *x, int64_t n,
                        Matrix *m, int n_copies, int reps)
{
    double t[MAX_REPS];
    int    inner = n == 1 ? 8 * n_copies : n <= 16 ? n_copies : 1;

    /* warm-up: page in, wake the pool, fill caches the way runs will */
    for (int c = 0; c < n_copies; c++) be->matmul(be, out, x, n, &m[c]);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();

        for (int i = 0; i < inner; i++) {
            be->matmul(be, out, x, n, &m[i % n_copies]);
        }
        t[r] = (now_s() - t0) / inner;
    }
    return stat_of(t, reps);
}

static void bench_type(Backend *be, DType t, float *x, float *out, int reps) {
    for (int s = 0; s < N_SHAPES; s++) {
        int64_t rows = shapes[s].rows, cols = shapes[s].cols;
        size_t  rb, bytes = dtype_row_bytes(t, cols) * (size_t) rows;
        int     n_cold = (int) ((COLD_BYTES + bytes - 1) / bytes);
        Matrix  m[512];
        Stat    hot, cold, b4, b16, big;
        double  flop = 2.0 * 512 * (double) rows * (double) cols;

        n_cold = n_cold < 2 ? 2 : n_cold > 512 ? 512 : n_cold;
        for (int c = 0; c < n_cold; c++) {
            void *d = make_weights(t, rows, cols, &rb);

            m[c] = (Matrix) { t, rows, cols, rb, d, WL_ROWS };
            if (be->repack != NULL) be->repack(be, &m[c]);
        }
        cold = time_matmul(be, out, x, 1, m, n_cold, reps);
        hot = time_matmul(be, out, x, 1, m, 1, reps);
        b4 = time_matmul(be, out, x, 4, m, n_cold, reps);
        b16 = time_matmul(be, out, x, 16, m, n_cold, reps);
        big = time_matmul(be, out, x, 512, m, 1, reps < 5 ? reps : 5);
        printf("%-5s %5ldx%-5ld %-8s n=1 cold %7.1f us %6.1f GB/s "
               "[%5.1f..%5.1f]  hot %6.1f GB/s   n=4 cold %6.1f GB/s  "
               "n=16 cold %6.1f GFLOP/s   n=512 %8.2f ms %6.1f GFLOP/s "
               "[%5.1f..%5.1f]\n",
               dtype_name(t), (long) rows, (long) cols, shapes[s].what,
               cold.med * 1e6, (double) bytes / cold.med / 1e9,
               (double) bytes / cold.max / 1e9, (double) bytes / cold.min / 1e9,
               (double) bytes / hot.med / 1e9, (double) bytes / b4.med / 1e9,
               flop / 512 * 16 / b16.med / 1e9, big.med * 1e3,
               flop / big.med / 1e9, flop / big.max / 1e9,
               flop / big.min / 1e9);
        fflush(stdout);
        for (int c = 0; c < n_cold; c++) free((void *) m[c].data);
    }
}

int main(int argc, char **argv) {
    const char   *isa = argc > 1 ? argv[1] : "auto";
    int           nth = argc > 2 ? atoi(argv[2]) : 0;
    char         *types = strdup(argc > 3 ? argv[3] : "f16,q8_0,q4_0,bf16,f32");
    int           reps = argc > 4 ? atoi(argv[4]) : 7;
    BackendConfig cfg = { .n_threads = nth, .isa = isa,
        .max_tokens = 512, .max_cols = 5632, .max_ctx = 1 };
    char          err[256], line[256] = "";
    Backend      *be;
    float        *x = aligned_alloc(64, 512 * 5632 * sizeof(float));
    float        *out = malloc(512 * 32000 * sizeof(float));
    uint64_t     *probe = aligned_alloc(64, PROBE_BYTES);
    FILE         *f;
    Stat          bw1, bw2;

    reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    be = backend_cpu_new(&cfg, err, sizeof(err));
    if (be == NULL || x == NULL || out == NULL || probe == NULL) {
        fprintf(stderr, "bench_kernels: %s\n", be ? "out of memory" : err);
        return 1;
    }
    for (int64_t i = 0; i < 512 * 5632; i++) x[i] = rnd();
    memset(probe, 1, PROBE_BYTES);

    f = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (f != NULL) {
        if (fgets(line, sizeof(line), f) == NULL) line[0] = '\0';
        line[strcspn(line, "\n")] = '\0';
        pclose(f);
    }
    printf("# bench_kernels commit %s, kernels cpu-%s, %d threads, gcc %s\n",
           line[0] ? line : "unknown", be->name,
           nth > 0 ? nth : (int) sysconf(_SC_NPROCESSORS_ONLN), __VERSION__);
    f = fopen("/proc/cpuinfo", "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "model name", 10) == 0) {
            printf("# cpu%s", strchr(line, ':') + 1);
            break;
        }
    }
    if (f != NULL) fclose(f);

    bw1 = probe_bandwidth(probe, 1, reps);
    bw2 = probe_bandwidth(probe, nth > 0 ? nth : 2, reps);
    printf("# memory read bandwidth (1 GiB): 1 thread %.1f GB/s [%.1f..%.1f], "
           "%d threads %.1f GB/s [%.1f..%.1f]\n", bw1.med, bw1.min, bw1.max,
           nth > 0 ? nth : 2, bw2.med, bw2.min, bw2.max);
    free(probe);

    for (char *tok = strtok(types, ","); tok != NULL; tok = strtok(NULL, ",")) {
        DType t;

        if (!parse_type(tok, &t)) {
            fprintf(stderr, "bench_kernels: unknown type '%s'\n", tok);
            continue;
        }
        bench_type(be, t, x, out, reps);
    }
    be->free(be);
    free(types);
    free(x);
    free(out);
    return 0;
}
