/* main.c -- omni-engine's command line.
 *
 *   omni-engine generate   --model PATH --prompt TEXT [sampling options]
 *   omni-engine tokenize   --model PATH --text TEXT [--no-bos]
 *   omni-engine bench      --model PATH [--n-prompt N] [--n-gen N]
 *   omni-engine make-model --out PATH --arch A --dim D ... --vocab-from GGUF
 *   omni-engine serve      --model PATH --socket PATH [serve options]
 *   omni-engine stage thinker --ipc-fd N --stats-fd N [serve options]
 *   omni-engine client     --socket PATH --prompt TEXT [...] | --health ...
 *   omni-engine prefix-keys --request JSON [--model PATH] [--block-size N]
 *
 * Each subcommand builds its objects in order and frees them in reverse.
 * Every error ends the process with status 1 and one line on stderr,
 * "omni-engine: <what went wrong>"; usage errors name the option.
 *
 * `serve` is the frontend (frontend.c); it starts `stage thinker` itself,
 * passing its own options on, so both parse them here into one
 * ServeConfig (serve.h) and agree on every setting. */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "chat.h"
#include "client.h"
#include "generate.h"
#include "kernels.h"
#include "log.h"
#include "make_model.h"
#include "model.h"
#include "prefix_cli.h"
#include "prefix_pub.h"
#include "request.h"
#include "runtime.h"
#include "serve.h"
#include "stage.h"
#include "thinker.h"
#include "tokenizer.h"
#ifdef OMNI_HAVE_SPEECH
#include "listener.h"
#include "talker.h"
#include "voicebox.h"
#endif

#define MAX_OPTS 48

/* ---- Option parsing ----------------------------------------------------
 * Options are "--name value" or boolean "--name". Each subcommand lists the
 * options it accepts; anything else is an error naming the option. */

typedef struct {
    const char *name;
    bool        flag;           // takes no value
    const char *value;          // parsed value, or "1" for a set flag
} Opt;

typedef struct {
    Opt opts[MAX_OPTS];
    int n;
} Opts;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2),
                                                     noreturn));

static void die(const char *fmt, ...) {
    va_list ap;

    fputs("omni-engine: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void opts_parse(Opts *o, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        Opt        *opt = NULL;

        if (strncmp(a, "--", 2) != 0) die("unexpected argument '%s'", a);
        for (int k = 0; k < o->n; k++) {
            if (strcmp(o->opts[k].name, a + 2) == 0) opt = &o->opts[k];
        }
        if (opt == NULL) die("unknown option '%s'", a);
        if (opt->flag) {
            opt->value = "1";
        } else if (i + 1 >= argc) {
            die("option '%s' needs a value", a);
        } else {
            opt->value = argv[++i];
        }
    }
}

static const char *opt_str(const Opts *o, const char *name, const char *def) {
    for (int k = 0; k < o->n; k++) {
        if (strcmp(o->opts[k].name, name) == 0 && o->opts[k].value != NULL) {
            return o->opts[k].value;
        }
    }
    return def;
}

static const char *opt_need(const Opts *o, const char *name) {
    const char *v = opt_str(o, name, NULL);

    if (v == NULL) die("missing required option '--%s'", name);
    return v;
}

static long long opt_int(const Opts *o, const char *name, long long def,
                         long long lo, long long hi)
{
    const char *v = opt_str(o, name, NULL);
    char       *end;
    long long   x;

    if (v == NULL) return def;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
        die("option '--%s' must be an integer in %lld..%lld, not '%s'", name,
            lo, hi, v);
    }
    return x;
}

static float opt_float(const Opts *o, const char *name, float def, float lo,
                       float hi)
{
    const char *v = opt_str(o, name, NULL);
    char       *end;
    float       x;

    if (v == NULL) return def;
    errno = 0;
    x = strtof(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        die("option '--%s' must be a number in %g..%g, not '%s'", name, lo,
            hi, v);
    }
    return x;
}

static long long opt_need_int(const Opts *o, const char *name, long long lo,
                              long long hi)
{
    opt_need(o, name);
    return opt_int(o, name, 0, lo, hi);
}

static bool opt_flag(const Opts *o, const char *name) {
    return opt_str(o, name, NULL) != NULL;
}

/* Every value of a repeatable option (opts_parse keeps only the last),
 * walking argv the way opts_parse does. Returns how many, at most max. */
static int opt_all(const Opts *o, int argc, char **argv, const char *name,
                   const char **out, int max)
{
    int n = 0;

    for (int i = 0; i < argc; i++) {
        bool flag = false;

        for (int k = 0; k < o->n; k++) {
            if (strcmp(o->opts[k].name, argv[i] + 2) == 0) {
                flag = o->opts[k].flag;
            }
        }
        if (flag || i + 1 >= argc) continue;
        if (strcmp(argv[i] + 2, name) == 0) {
            if (n == max) die("option '--%s' given more than %d times", name,
                              max);
            out[n++] = argv[i + 1];
        }
        i++;
    }
    return n;
}

static void opts_add(Opts *o, const char *const *names, bool flag) {
    for (; *names != NULL; names++) {
        o->opts[o->n].name = *names;
        o->opts[o->n].flag = flag;
        o->opts[o->n].value = NULL;
        o->n++;
    }
}


/* ---- Shared setup ------------------------------------------------------ */

static const char *model_path(const Opts *o) {
    const char *p = opt_str(o, "model", getenv("OMNI_MODEL"));

    if (p == NULL) die("missing required option '--model' (or OMNI_MODEL)");
    return p;
}

/* Weights are copied into huge-page memory unless --mmap asks to map them
 * (instant start, page cache shared between processes; decode is slower). */
static GGUFLoad load_how(const Opts *o) {
    return opt_flag(o, "mmap") ? GGUF_MAP : GGUF_COPY;
}

/* Whether path is a GGUF without tensors, such as llama.cpp's
 * vocabulary-only files (models/ggml-vocab-*.gguf). */
static bool vocab_only(const char *path) {
    GGUF g;
    Err  err;
    bool none;

    if (gguf_open(&g, path, &err) != 0) return false;
    none = g.n_tensors == 0;
    gguf_close(&g);
    return none;
}

/* Dies with a runtime_load(_weights) error; a vocabulary-only file is
 * named as such, since what is missing is not one tensor but all of them. */
static void die_loading(const char *path, const Err *err) {
    if (vocab_only(path)) {
        die("%s: a vocabulary-only GGUF (a tokenizer, no weights): "
            "'tokenize' reads it, but generating needs a model", path);
    }
    die("%s", err->msg);
}

/* Encodes text, growing the buffer once if the first guess is short. */
static int32_t *encode(const Tokenizer *tk, const char *text, bool add_special,
                       bool parse_special, int64_t *n)
{
    size_t   len = strlen(text);
    int64_t  cap = (int64_t) len + 8;
    int32_t *ids = malloc((size_t) cap * sizeof(int32_t));
    Err      err;

    if (ids == NULL) die("out of memory");
    *n = tokenizer_encode(tk, text, len, add_special, parse_special, ids, cap,
                          &err);
    if (*n > cap) {
        cap = *n;
        ids = realloc(ids, (size_t) cap * sizeof(int32_t));
        if (ids == NULL) die("out of memory");
        *n = tokenizer_encode(tk, text, len, add_special, parse_special, ids,
                              cap, &err);
    }
    if (*n < 0) die("tokenizing: %s", err.msg);
    return ids;
}

/* The prompt as one user message in the model's chat template. */
static char *render_chat(const Runtime *rt, const char *system,
                         const char *user)
{
    ChatMsg msgs[2];
    int     n = 0;
    char   *buf = NULL;
    size_t  cap = 0;
    Err     err;

    if (rt->tmpl_unknown) {
        log_msg(LOG_WARN, "unrecognised chat template, using the plain "
                "format");
    }
    if (system != NULL) msgs[n++] = (ChatMsg) { "system", system };
    msgs[n++] = (ChatMsg) { "user", user };
    if (runtime_render_chat(rt, msgs, n, CHAT_ADD_GEN, &buf, &cap, NULL,
                            &err) < 0) {
        die("chat template: %s", err.msg);
    }
    return buf;
}

/* --NAME, else the environment variable env (so a whole test run can
 * force a kernel set or a backend), else names[0]; a value not among names
 * dies, listing them as list says. */
static const char *choice_option(const Opts *o, const char *name,
                                 const char *env, const char *const *names,
                                 size_t n, const char *list)
{
    const char *e = getenv(env);
    const char *s = opt_str(o, name, e != NULL && e[0] != '\0' ? e
                                                                 : names[0]);

    for (size_t i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) return s;
    }
    die("option '--%s' (or %s) must be %s, not '%s'", name, env, list, s);
}

static const char *isa_option(const Opts *o) {
    static const char *const isas[] = { "auto", "avx512", "avx2", "neon",
                                        "ref" };

    return choice_option(o, "isa", "OMNI_ISA", isas, 5,
                         "auto, avx512, avx2, neon or ref");
}

static const char *backend_option(const Opts *o) {
    static const char *const names[] = { "auto", "cpu", "cuda" };

    return choice_option(o, "backend", "OMNI_BACKEND", names, 3,
                         "auto, cpu or cuda");
}

static double gpu_fraction_option(const Opts *o) {
    return opt_float(o, "gpu-memory-fraction", 0.9, 0.01, 1.0);
}

/* The backend for rt's model (max_out logits rows per call), which then
 * holds or rearranges its weights. Says on stderr why "auto" did not pick
 * CUDA, once. */
static void make_backend(const Opts *o, Runtime *rt, int64_t n_ctx,
                         int64_t batch, int64_t max_out, int block_size)
{
    BackendConfig bc = { 0 };
    Err           err;

    bc.backend = backend_option(o);
    bc.n_threads = (int) opt_int(o, "threads", 0, 0, 1024);
    bc.isa = isa_option(o);
    bc.max_tokens = batch;
    bc.max_out = max_out;
    bc.max_ctx = n_ctx;
    bc.block_size = block_size;
    bc.gpu_memory_fraction = gpu_fraction_option(o);
    if (runtime_backend(rt, &bc, &err) != 0) die("%s", err.msg);
    if (bc.note[0] != '\0') fprintf(stderr, "omni-engine: %s\n", bc.note);
}


/* ---- generate ---------------------------------------------------------- */

static int emit_stdout(void *ud, TextKind kind, const char *text,
                       size_t len)
{
    (void) ud;
    (void) kind;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* Without --seed a fresh one is drawn (--stats reports it). */
static void read_sampling(const Opts *o, GenParams *gp) {
    SamplerParams *s = &gp->sampling;
    Err            err;

    sampler_params_default(s);
    s->temperature = opt_float(o, "temperature", 1.0f, 0.0f, 2.0f);
    s->top_k = (int32_t) opt_int(o, "top-k", 0, 0, 1 << 30);
    s->top_p = opt_float(o, "top-p", 1.0f, 0.0f, 1.0f);
    s->min_p = opt_float(o, "min-p", 0.0f, 0.0f, 1.0f);
    s->presence_penalty = opt_float(o, "presence-penalty", 0.0f, -2.0f, 2.0f);
    s->frequency_penalty = opt_float(o, "frequency-penalty", 0.0f, -2.0f,
                                     2.0f);
    if (opt_str(o, "seed", NULL) != NULL) {
        s->seed = (uint64_t) opt_int(o, "seed", 0, 0, INT64_MAX);
    } else if (request_draw_seed(&s->seed, &err) != 0) {
        die("%s", err.msg);     // sample afresh, as the API does
    }
    gp->max_tokens = opt_int(o, "max-tokens", 256, 1, 1 << 30);
    if (opt_str(o, "stop", NULL) != NULL) {
        gp->stop[0] = opt_str(o, "stop", NULL);
        gp->n_stop = 1;
    }
    gp->top_logits = (int32_t) opt_int(o, "top-logits", 0, 0, INT32_MAX);
    gp->top_out = stderr;
}

static int cmd_generate(int argc, char **argv) {
    static const char *vals[] = {
        "model", "prompt", "system", "max-tokens", "temperature", "seed",
        "top-k", "top-p", "min-p", "presence-penalty", "frequency-penalty",
        "stop", "threads", "isa", "ctx", "batch", "top-logits", "backend",
        "gpu-memory-fraction", NULL
    };
    static const char *flags[] = { "chat", "stats", "mmap", NULL };
    Opts       o = { .n = 0 };
    Runtime    rt;
    Generator  g;
    GenParams  gp = { 0 };
    GenStats   st;
    Err        err;
    int64_t    n_prompt, n_ctx, batch;
    int32_t   *prompt;
    char      *chat_text = NULL;
    const char *text;

    opts_add(&o, vals, false);
    opts_add(&o, flags, true);
    opts_parse(&o, argc, argv);
    text = opt_need(&o, "prompt");
    read_sampling(&o, &gp);
    if (runtime_load(&rt, model_path(&o), load_how(&o), &err) != 0) {
        die_loading(model_path(&o), &err);
    }
    if (opt_flag(&o, "chat")) {
        chat_text = render_chat(&rt, opt_str(&o, "system", NULL), text);
        text = chat_text;
    }
    prompt = encode(rt.tk, text, true, chat_text != NULL, &n_prompt);
    n_ctx = opt_int(&o, "ctx", rt.m.c.n_ctx < RUNTIME_CTX_DEFAULT_MAX
                    ? rt.m.c.n_ctx : RUNTIME_CTX_DEFAULT_MAX, 16,
                    rt.m.c.n_ctx);
    batch = opt_int(&o, "batch", 512, 1, 1 << 16);
    make_backend(&o, &rt, n_ctx, batch, 1, GEN_BLOCK_SIZE);
    if (gen_init(&g, &rt.m, rt.tk, rt.be, n_ctx, batch, &err) != 0
        || gen_run(&g, prompt, n_prompt, &gp, emit_stdout, NULL, &st, &err)
           != 0)
    {
        die("%s", err.msg);
    }
    if (opt_flag(&o, "stats")) {
        fprintf(stderr, "\nomni-engine: backend %s, prompt %" PRId64
                " tokens in %.3f s (%.1f tok/s), generated %" PRId64
                " in %.3f s (%.2f tok/s), finish %s, seed %" PRIu64 "\n",
                rt.be->name, st.n_prompt, st.t_prefill,
                st.n_prompt / st.t_prefill, st.n_gen, st.t_decode,
                st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0, st.finish,
                gp.sampling.seed);
    }
    gen_free(&g);
    free(prompt);
    free(chat_text);
    runtime_free(&rt);
    return 0;
}


/* ---- tokenize ---------------------------------------------------------- */

/* Tokenizing needs the vocabulary only: the GGUF's metadata is read
 * (mapped, not copied) and no tensor is looked at, so llama.cpp's
 * vocabulary-only files work as well as whole models. */
static int cmd_tokenize(int argc, char **argv) {
    static const char *vals[] = { "model", "text", NULL };
    static const char *flags[] = { "no-bos", "parse-special", NULL };
    Opts        o = { .n = 0 };
    GGUF        g;
    Tokenizer  *tk;
    Err         err;
    int64_t     n;
    int32_t    *ids;
    const char *path;

    opts_add(&o, vals, false);
    opts_add(&o, flags, true);
    opts_parse(&o, argc, argv);
    path = model_path(&o);
    if (gguf_open(&g, path, &err) != 0) die("%s", err.msg);
    tk = tokenizer_new(&g, &err);
    if (tk == NULL) {
        gguf_close(&g);
        die("%s: %s", path, err.msg);
    }
    ids = encode(tk, opt_need(&o, "text"), !opt_flag(&o, "no-bos"),
                 opt_flag(&o, "parse-special"), &n);
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    tokenizer_free(tk);
    gguf_close(&g);
    return 0;
}


/* ---- bench ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[16];

    memcpy(s, v, (size_t) n * sizeof(double));
    qsort(s, (size_t) n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void print_series(const char *name, int64_t n, const double *v,
                         int reps)
{
    printf("\"%s\": {\"n\": %" PRId64 ", \"tokens_per_s\": [", name, n);
    for (int i = 0; i < reps; i++) printf(i ? ", %.3f" : "%.3f", v[i]);
    printf("], \"median\": %.3f}", median(v, reps));
}

static int cmd_bench(int argc, char **argv) {
    static const char *vals[] = {
        "model", "n-prompt", "n-gen", "threads", "isa", "reps", "batch",
        "backend", "gpu-memory-fraction", NULL
    };
    static const char *flags[] = { "mmap", NULL };
    Opts        o = { .n = 0 };
    Runtime     rt;
    BenchParams p;
    BenchResult r;
    Err         err;
    const char *path;

    opts_add(&o, vals, false);
    opts_add(&o, flags, true);
    opts_parse(&o, argc, argv);
    path = model_path(&o);
    p.n_prompt = opt_int(&o, "n-prompt", 512, 0, 1 << 16);
    p.n_gen = opt_int(&o, "n-gen", 128, 0, 1 << 16);
    p.reps = (int) opt_int(&o, "reps", 3, 1, 16);
    p.batch = opt_int(&o, "batch", 1, 1, 4096);
    if (runtime_load_weights(&rt, path, load_how(&o), &err) != 0) {
        die_loading(path, &err);
    }
    if (p.n_prompt + p.n_gen > rt.m.c.n_ctx) {
        die("--n-prompt and --n-gen exceed the model's context of %d",
            rt.m.c.n_ctx);
    }
    make_backend(&o, &rt, p.n_prompt > p.n_gen ? p.n_prompt : p.n_gen,
                 p.n_prompt > p.batch ? p.n_prompt : p.batch, p.batch,
                 BENCH_BLOCK);
    if (bench_run(&rt.m, rt.be, &p, &r, &err) != 0) die("%s", err.msg);
    printf("{\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %d, "
           "\"batch\": %" PRId64 ", \"weight_bytes_per_token\": %" PRIu64
           ", ", path, rt.be->name, (int) opt_int(&o, "threads", 0, 0, 1024),
           p.batch, rt.m.weight_bytes);
    if (p.n_prompt > 0) print_series("pp", p.n_prompt, r.pp_tps, r.reps);
    if (p.n_prompt > 0 && p.n_gen > 0) printf(", ");
    if (p.n_gen > 0) print_series("tg", p.n_gen, r.tg_tps, r.reps);
    printf("}\n");
    runtime_free(&rt);
    return 0;
}


/* ---- make-model -------------------------------------------------------- */

static DType parse_type(const char *s) {
    static const DType types[] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0,
                                   DT_Q4_0 };

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (strcmp(s, dtype_name(types[i])) == 0) return types[i];
    }
    die("option '--type' must be f32, f16, bf16, q8_0 or q4_0, not '%s'", s);
}

/* The whole of a text file, NUL-terminated; dies when it cannot be read
 * or holds a NUL. */
static char *read_text(const char *path) {
    FILE   *f = fopen(path, "rb");
    char   *buf = NULL;
    size_t  len = 0, cap = 0, n;

    if (f == NULL) die("%s: %s", path, strerror(errno));
    do {
        if (len + 4096 + 1 > cap) {
            cap = (len + 4096 + 1) * 2;
            buf = realloc(buf, cap);
            if (buf == NULL) die("%s: out of memory", path);
        }
        n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
    } while (n > 0);
    if (ferror(f)) die("%s: read error", path);
    fclose(f);
    buf[len] = '\0';
    if (strlen(buf) != len) die("%s: the file holds a NUL byte", path);
    return buf;
}

static int cmd_make_model(int argc, char **argv) {
    static const char *vals[] = {
        "out", "arch", "dim", "layers", "heads", "kv-heads", "ffn", "type",
        "vocab-from", "seed", "ctx", "head-dim", "rope-dims", "swa", "std",
        "rope-scaling", "rope-factor", "chat-template", NULL
    };
    static const char *flags[] = { "tied", "rope-factors", NULL };
    Opts            o = { .n = 0 };
    MakeModelParams p;
    Err             err;
    char           *tmpl = NULL;

    memset(&p, 0, sizeof(p));

    opts_add(&o, vals, false);
    opts_add(&o, flags, true);
    opts_parse(&o, argc, argv);
    p.out = opt_need(&o, "out");
    p.arch = opt_need(&o, "arch");
    p.dim = (int) opt_need_int(&o, "dim", 1, 65536);
    p.layers = (int) opt_need_int(&o, "layers", 1, 1024);
    p.heads = (int) opt_need_int(&o, "heads", 1, 1024);
    p.kv_heads = (int) opt_int(&o, "kv-heads", p.heads, 1, 1024);
    p.ffn = (int) opt_need_int(&o, "ffn", 1, 262144);
    p.ctx = (int) opt_int(&o, "ctx", 4096, 16, 1 << 20);
    p.type = parse_type(opt_need(&o, "type"));
    p.vocab_from = opt_need(&o, "vocab-from");
    p.seed = (uint64_t) opt_int(&o, "seed", 1, 0, INT64_MAX);
    p.tied = opt_flag(&o, "tied");
    p.head_dim = (int) opt_int(&o, "head-dim", 0, 0, 512);
    p.rope_dims = (int) opt_int(&o, "rope-dims", 0, 0, 512);
    p.swa = (int) opt_int(&o, "swa", 0, 0, 1 << 30);
    p.std = opt_float(&o, "std", 0.02f, 1e-6f, 10.0f);
    p.rope_scaling = opt_str(&o, "rope-scaling", NULL);
    p.rope_factor = opt_float(&o, "rope-factor", 4.0f, 1.0f, 1024.0f);
    p.rope_factors = opt_flag(&o, "rope-factors");
    if (opt_str(&o, "chat-template", NULL) != NULL) {
        tmpl = read_text(opt_str(&o, "chat-template", NULL));
        p.chat_template = tmpl;
    }
    if (make_model(&p, &err) != 0) die("%s", err.msg);
    free(tmpl);
    return 0;
}


/* ---- serve and stage ---------------------------------------------------
 * `serve` runs the frontend; the frontend starts `stage thinker` with the
 * options serve was given, so both read them with read_serve. */

static const char *const SERVE_VALS[] = {
    "model", "socket", "model-name", "threads", "isa", "backend",
    "gpu-memory-fraction", "ctx",
    "max-batch-tokens", "max-seqs", "max-queue", "block-size", "kv-cache-mb",
    "drain-timeout", "read-timeout", "stage-unready-after",
    "stage-kill-after", "log-level", "lock-file", "pool-blocks",
    "pool-block-kib", "voicebox-slots", "speech-first-words",
    "speech-chunk-words", "speech-quality-words", "listener-slots",
    "listener-buffer-mib", "listener-model", "redis", "redis-password-file",
    "redis-user", "redis-db", "redis-namespace", "route-id", "prefix-ttl",
    NULL
};
static const char *const SERVE_FLAGS[] = {
    "mmap", "no-prefix-cache", "replace", NULL
};

static LogLevel parse_log_level(const char *s) {
    static const char *names[] = { "debug", "info", "warn", "error" };

    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) return (LogLevel) i;
    }
    die("option '--log-level' must be debug, info, warn or error, not '%s'",
        s);
}

/* Whether s is 0 to max bytes with no whitespace or control character:
 * a Redis key part and an nginx server name both take it as it is. */
static bool key_part_ok(const char *s, size_t max) {
    size_t n = strlen(s);

    if (n > max) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char) s[i];

        if (c <= 0x20 || c == 0x7f) return false;
    }
    return true;
}

/* The prefix routing options (--redis and those that need it). The
 * password file is read here too, so that serve refuses a bad one at
 * start; the thinker reads it again for itself. */
static void read_redis(const Opts *o, ServeConfig *c) {
    static const char *const needs[] = {
        "redis-password-file", "redis-user", "redis-db", "redis-namespace",
        "route-id", "prefix-ttl", NULL
    };
    RedisAddr   a;
    Err         err;
    char        pw[PUB_PASSWORD_MAX];
    const char *route;

    c->redis = opt_str(o, "redis", NULL);
    if (c->redis == NULL) {
        for (int i = 0; needs[i] != NULL; i++) {
            if (opt_str(o, needs[i], NULL) != NULL) {
                die("option '--%s' needs '--redis'", needs[i]);
            }
        }
        return;
    }
    if (redis_addr_parse(c->redis, &a, &err) != 0) {
        die("option '--redis': %s", err.msg);
    }
    c->redis_password_file = opt_str(o, "redis-password-file", NULL);
    if (c->redis_password_file != NULL
        && redis_read_password(c->redis_password_file, pw, sizeof(pw), &err)
           != 0)
    {
        die("option '--redis-password-file': %s", err.msg);
    }
    explicit_bzero(pw, sizeof(pw));
    c->redis_user = opt_str(o, "redis-user", NULL);
    if (c->redis_user != NULL && (c->redis_user[0] == '\0'
                                  || !key_part_ok(c->redis_user, 255)))
    {
        die("option '--redis-user' must be a name of 1 to 255 bytes");
    }
    if (c->redis_user != NULL && c->redis_password_file == NULL) {
        die("option '--redis-user' needs '--redis-password-file'");
    }
    c->redis_db = (int) opt_int(o, "redis-db", 0, 0, 1 << 20);
    c->redis_namespace = opt_str(o, "redis-namespace", "omni:");
    if (!key_part_ok(c->redis_namespace, 64)) {
        die("option '--redis-namespace' must be at most 64 bytes without "
            "spaces or control characters, not '%s'", c->redis_namespace);
    }
    c->route_id = opt_str(o, "route-id", NULL);
    route = c->route_id != NULL ? c->route_id : c->socket_path;
    if (route == NULL || route[0] == '\0'
        || !key_part_ok(route, c->route_id != NULL ? 255 : 250))
    {
        die("option '--route-id' (by default 'unix:' and '--socket') must "
            "be 1 to 255 bytes without spaces or control characters");
    }
    c->prefix_ttl_s = (int) opt_int(o, "prefix-ttl", 300, 3, 86400);
}

/* Fills c from the serve options; name (cap bytes) holds a derived model
 * name. Every bad value dies naming its option. */
static void read_serve(const Opts *o, ServeConfig *c, char *name, size_t cap)
{
    const char *mn = opt_str(o, "model-name", NULL);
    size_t      n;

    c->model_path = model_path(o);
    c->socket_path = opt_str(o, "socket", NULL);
    if (mn != NULL && mn[0] == '\0') die("option '--model-name' is empty");
    c->model_name = mn;
    if (mn == NULL) {
        n = serve_model_name(c, name, cap);
        if (n == 0 || n >= cap) {
            die("option '--model-name' is needed for '%s'", c->model_path);
        }
        c->model_name = name;
    }
    c->threads = (int) opt_int(o, "threads", 0, 0, 1024);
    c->isa = isa_option(o);
    c->backend = backend_option(o);
    c->gpu_memory_fraction = gpu_fraction_option(o);
    c->mmap = opt_flag(o, "mmap");
    c->ctx = opt_int(o, "ctx", 0, 16, 1 << 20);
    c->max_seqs = (int) opt_int(o, "max-seqs", 64, 1, 4096);
    c->max_batch_tokens = opt_int(o, "max-batch-tokens", 512, 1, 1 << 20);
    if (c->max_batch_tokens < c->max_seqs) {
        die("option '--max-batch-tokens' (%" PRId64 ") must be at least "
            "'--max-seqs' (%d)", c->max_batch_tokens, c->max_seqs);
    }
    c->max_queue = (int) opt_int(o, "max-queue", 1024, 0, 1 << 20);
    c->block_size = (int) opt_int(o, "block-size", 16, 1, 1024);
    c->kv_cache_mb = opt_float(o, "kv-cache-mb", 0, 0.01, 1 << 20);
    c->prefix_cache = !opt_flag(o, "no-prefix-cache");
    c->drain_s = (int) opt_int(o, "drain-timeout", 30, 0, 86400);
    c->read_timeout_s = (int) opt_int(o, "read-timeout", 10, 1, 86400);
    c->stage_unready_s = opt_float(o, "stage-unready-after", 10, 0.25,
                                   86400);
    c->stage_kill_s = opt_float(o, "stage-kill-after", 60, 0, 86400);
    if (c->stage_kill_s > 0 && c->stage_kill_s < c->stage_unready_s) {
        die("option '--stage-kill-after' (%g) must be 0 or at least "
            "'--stage-unready-after' (%g)", c->stage_kill_s,
            c->stage_unready_s);
    }
    c->lock_file = opt_str(o, "lock-file", NULL);   // the stage ignores it
    c->replace = opt_flag(o, "replace");
    if (c->replace && c->lock_file == NULL) {
        die("option '--replace' needs '--lock-file'");
    }
    c->pool_blocks = (int) opt_int(o, "pool-blocks", 512, 16, 1 << 16);
    c->pool_block_kib = (int) opt_int(o, "pool-block-kib", 32, 4, 16384);
    if ((int64_t) c->pool_blocks * c->pool_block_kib > 4 << 20) {
        die("the pool ('--pool-blocks' %d x '--pool-block-kib' %d) must be "
            "at most 4 GiB", c->pool_blocks, c->pool_block_kib);
    }
    c->pool_fd = 0;
    c->stage_owner = 0;
    c->voicebox_slots = (int) opt_int(o, "voicebox-slots", 0, 1, 1024);
    c->speech_first_words = (int) opt_int(o, "speech-first-words", 0, 1,
                                          1000);
    c->speech_chunk_words = (int) opt_int(o, "speech-chunk-words", 0, 1,
                                          1000);
    c->speech_quality_words = (int) opt_int(o, "speech-quality-words", 0, 1,
                                            1000);
    c->listener_slots = (int) opt_int(o, "listener-slots", 0, 1, 256);
    c->listener_buffer_mib = (int) opt_int(o, "listener-buffer-mib", 0, 1,
                                           1 << 20);
    c->listener_model = opt_str(o, "listener-model", NULL);
    read_redis(o, c);
    log_set_level(parse_log_level(opt_str(o, "log-level", "info")));
}

static int cmd_serve(int argc, char **argv) {
    Opts        o = { .n = 0 };
    ServeConfig c;
    char        name[256];
    Err         err;

    opts_add(&o, SERVE_VALS, false);
    opts_add(&o, SERVE_FLAGS, true);
    opts_parse(&o, argc, argv);
    read_serve(&o, &c, name, sizeof(name));
    opt_need(&o, "socket");
    if (frontend_run(&c, argc, argv, &err) != 0) die("%s", err.msg);
    return 0;
}

/* The stages `stage NAME` runs, one row each (stage.h). The speech stages
 * are built with OMNI_HAVE_SPEECH (native builds, once their code is
 * in); the frontend's table (frontend/stages.c) follows the same macro. */
static const StageOps *const STAGES[] = {
    &thinker_stage,
#ifdef OMNI_HAVE_SPEECH
    &talker_stage,
    &voicebox_stage,
    &listener_stage,
#endif
};

#define N_STAGES (sizeof(STAGES) / sizeof(STAGES[0]))

static const StageOps *find_stage(const char *name) {
    char   names[256];
    size_t n = 0;

    for (size_t i = 0; i < N_STAGES; i++) {
        if (strcmp(name, STAGES[i]->name) == 0) return STAGES[i];
        n += (size_t) snprintf(names + n, sizeof(names) - n, "%s%s",
                               i > 0 ? ", " : "", STAGES[i]->name);
    }
    die("unknown stage '%s' (%s)", name, names);
}

static int cmd_stage(int argc, char **argv) {
    static const char *fds[] = { "ipc-fd", "stats-fd", "pool-fd",
                                 "stage-owner", NULL };
    Opts            o = { .n = 0 };
    ServeConfig     c;
    char            name[256];
    Err             err;
    int             ipc, stats;
    const StageOps *ops = find_stage(argc > 0 ? argv[0] : "");

    opts_add(&o, SERVE_VALS, false);
    opts_add(&o, SERVE_FLAGS, true);
    opts_add(&o, fds, false);
    opts_parse(&o, argc - 1, argv + 1);
    ipc = (int) opt_need_int(&o, "ipc-fd", 0, 1 << 20);
    stats = (int) opt_need_int(&o, "stats-fd", 0, 1 << 20);
    read_serve(&o, &c, name, sizeof(name));
    c.pool_fd = (int) opt_int(&o, "pool-fd", 0, 1, 1 << 20);
    c.stage_owner = (uint16_t) opt_int(&o, "stage-owner", 0, 1, 0xFFFF);
    if (stage_main(ops, &c, ipc, stats, &err) != 0) die("%s", err.msg);
    return 0;
}


/* ---- prefix-keys ------------------------------------------------------- */

static int cmd_prefix_keys(int argc, char **argv) {
    static const char *vals[] = { "model", "request", "block-size", NULL };
    Opts            o = { .n = 0 };
    PrefixCliParams p;
    Err             err;

    opts_add(&o, vals, false);
    opts_parse(&o, argc, argv);
    p.request = opt_need(&o, "request");
    p.request_len = strlen(p.request);
    p.model_path = opt_str(&o, "model", NULL);
    p.block_size = (int) opt_int(&o, "block-size", 16, 1, 1024);
    if (prefix_cli_run(&p, stdout, &err) != 0) die("%s", err.msg);
    return 0;
}


/* ---- client ------------------------------------------------------------ */

/* A control request; the exit status says whether health is 200. */
static int client_ctl(const char *sock, const Opts *o) {
    int     n = opt_flag(o, "health") + opt_flag(o, "models")
                + opt_flag(o, "metrics");
    uint8_t type = opt_flag(o, "health") ? OMNI_F_HEALTH
                   : opt_flag(o, "models") ? OMNI_F_MODELS : OMNI_F_METRICS;
    Err     err;
    int     rc;

    if (n > 1) die("options '--health', '--models' and '--metrics' exclude "
                   "each other");
    if (opt_str(o, "prompt", NULL) != NULL) {
        die("option '--prompt' does not go with '--health', '--models' or "
            "'--metrics'");
    }
    rc = client_control(sock, type, stdout, &err);
    if (rc < 0) die("%s", err.msg);
    return rc == 200 ? 0 : 1;
}

static int cmd_client(int argc, char **argv) {
    static const char *vals[] = {
        "socket", "prompt", "model", "max-tokens", "temperature", "seed",
        "top-p", "top-k", "stop", NULL
    };
    static const char *flags[] = {
        "chat", "usage", "health", "models", "metrics", NULL
    };
    static const char *finish[] = { "stop", "length" };
    Opts          o = { .n = 0 };
    ClientRequest rq;
    OmniDone      d;
    Err           err;
    const char   *sock;

    opts_add(&o, vals, false);
    opts_add(&o, flags, true);
    opts_parse(&o, argc, argv);
    sock = opt_need(&o, "socket");
    if (opt_flag(&o, "health") || opt_flag(&o, "models")
        || opt_flag(&o, "metrics"))
    {
        return client_ctl(sock, &o);
    }
    rq.socket_path = sock;
    rq.prompt = opt_need(&o, "prompt");
    rq.chat = opt_flag(&o, "chat");
    rq.model = opt_str(&o, "model", NULL);
    rq.max_tokens = opt_int(&o, "max-tokens", -1, 1, 1 << 30);
    rq.temperature = opt_float(&o, "temperature", NAN, 0.0f, 2.0f);
    rq.top_p = opt_float(&o, "top-p", NAN, 0.0f, 1.0f);
    rq.top_k = opt_int(&o, "top-k", -1, 0, 1 << 30);
    rq.seed = opt_int(&o, "seed", -1, 0, INT64_MAX);
    rq.n_stop = opt_all(&o, argc, argv, "stop", rq.stop, STOP_MAX);
    if (client_generate(&rq, stdout, &d, &err) != 0) die("%s", err.msg);
    if (opt_flag(&o, "usage")) {
        fprintf(stderr, "prompt_tokens %u cached_tokens %u completion_tokens "
                "%u finish %s seed %" PRIu64 "\n", d.prompt_tokens,
                d.cached_tokens, d.completion_tokens, finish[d.finish],
                d.seed);
    }
    return 0;
}


/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f) {
    fputs("usage: omni-engine COMMAND [options]\n"
          "\n"
          "  generate   --model PATH --prompt TEXT [--max-tokens N]\n"
          "             [--temperature T] [--seed S] [--top-k K] [--top-p P]\n"
          "             [--min-p P] [--presence-penalty X]\n"
          "             [--frequency-penalty X] [--stop TEXT] [--chat]\n"
          "             [--system TEXT] [--threads N] [--isa auto|avx512|"
          "avx2|neon|ref]\n"
"             [--ctx N] [--batch N] [--stats] [--mmap]\n"
          "             [--top-logits K]   (K best logits per step, JSON "
          "lines on stderr)\n"
          "  bench      --model PATH [--n-prompt 512] [--n-gen 128] "
          "[--reps 3]\n"
          "             [--threads N] [--isa ...] [--mmap]   (prints JSON)\n"
          "  tokenize   --model PATH --text TEXT [--no-bos] "
          "[--parse-special]\n"
          "  make-model --out PATH --arch llama|qwen2|qwen3|gemma|gemma2|"
          "gemma3|phi3\n"
          "             --dim D --layers L --heads H --kv-heads K --ffn F\n"
          "             --type f32|f16|bf16|q8_0|q4_0 --vocab-from GGUF\n"
          "             [--seed S] [--ctx N] [--tied] [--std 0.02]\n"
          "             [--head-dim N] [--rope-dims N] [--swa N]\n"
          "             [--rope-scaling linear|yarn --rope-factor F]\n"
          "             [--rope-factors]   (phi3 long/short factors)\n"
          "             [--chat-template FILE] (instead of the vocab's)\n"
          "  serve      --model PATH --socket PATH [--model-name NAME]\n"
          "             [--threads N] [--isa ...] [--mmap] [--ctx N]\n"
          "             [--max-batch-tokens 512] [--max-seqs 64]\n"
          "             [--max-queue 1024] [--block-size 16]\n"
          "             [--kv-cache-mb 1024] [--no-prefix-cache]\n"
          "             [--drain-timeout 30] [--read-timeout 10]\n"
          "             [--stage-unready-after 10] [--stage-kill-after 60]\n"
          "             [--log-level info] [--lock-file PATH [--replace]]\n"
          "             [--pool-blocks 512] [--pool-block-kib 32]\n"
          "             [--voicebox-slots N] [--speech-first-words 4]\n"
          "             [--speech-chunk-words 12] "
          "[--speech-quality-words 40]\n"
          "             [--listener-slots N] [--listener-buffer-mib 256]\n"
          "             [--listener-model DIR]\n"
          "             [--redis unix:/path|host:port "
          "[--redis-password-file PATH]\n"
          "             [--redis-user NAME] [--redis-db N]\n"
          "             [--redis-namespace omni:] [--route-id ID]\n"
          "             [--prefix-ttl 300]]\n"
          "  stage      NAME --ipc-fd N --stats-fd N [--pool-fd N]\n"
          "             [--stage-owner N] [serve options]\n"
          "             (started by serve, not by hand)\n"
          "  prefix-keys --request JSON [--model PATH] [--block-size 16]\n"
          "             (a chat request's prefix keys: I HEX TOKENS lines)\n"
          "  client     --socket PATH --prompt TEXT [--chat] [--model NAME]\n"
          "             [--max-tokens N] [--temperature T] [--seed S]\n"
          "             [--top-p P] [--top-k K] [--stop TEXT]... [--usage]\n"
          "  client     --socket PATH --health|--models|--metrics\n", f);
}

/* The commands, in the order `help` lists them. */
static const struct {
    const char *name;
    int       (*run)(int argc, char **argv);
} COMMANDS[] = {
    { "generate",   cmd_generate },
    { "tokenize",   cmd_tokenize },
    { "bench",      cmd_bench },
    { "make-model", cmd_make_model },
    { "serve",      cmd_serve },
    { "stage",      cmd_stage },
    { "prefix-keys", cmd_prefix_keys },
    { "client",     cmd_client },
};

int main(int argc, char **argv) {
    size_t n = sizeof(COMMANDS) / sizeof(COMMANDS[0]);
    char   names[256];
    size_t len = 0;

    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], COMMANDS[i].name) == 0) {
            return COMMANDS[i].run(argc - 2, argv + 2);
        }
        len += (size_t) snprintf(names + len, sizeof(names) - len, "%s, ",
                                 COMMANDS[i].name);
    }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    die("unknown command '%s' (%shelp)", argv[1], names);
}
