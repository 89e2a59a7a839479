/* lswork.c -- one request's audio path on a listener worker: each input
 * decoded in pieces (audio/decoder.h, to 16 kHz mono), each piece fed to
 * the slot's recogniser (asr.h), each utterance it finishes turned into a
 * TRANSCRIPT payload (omni_proto.h) and posted to the loop at once.
 *
 * Failures are the client's when the bytes are (400, naming the input's
 * parameter: not audio, corrupt, empty, longer than max_audio_seconds),
 * ours otherwise (a recogniser failure 500, out of memory 503). */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "lscore_impl.h"

/* The worker's part of a segment's way out. */
typedef struct {
    LsWorker *w;
    LsReq    *r;
} SegCtx;

/* Sets r's failure: status, the input's param, code, message. Returns -1. */
static int work_fail(LsReq *r, int status, const char *code,
                     const char *fmt, ...)
{
    va_list ap;

    r->w_status = status;
    r->w_code = code;
    snprintf(r->w_param, sizeof(r->w_param), "%s",
             status == 400 ? r->in[r->cur].param : "");
    va_start(ap, fmt);
    vsnprintf(r->w_err.msg, sizeof(r->w_err.msg), fmt, ap);
    va_end(ap);
    return -1;
}

static void stats_add(LsCore *c, uint64_t segments, uint64_t words,
                      uint64_t ms, uint64_t bad)
{
    OmniStats *s = c->cfg.stats;

    if (s == NULL) return;
    if (segments) atomic_fetch_add(&s->listener.segments, segments);
    if (words) atomic_fetch_add(&s->listener.words, words);
    if (ms) atomic_fetch_add(&s->listener.audio_ms, ms);
    if (bad) atomic_fetch_add(&s->listener.decode_errors, bad);
}


/* ---- Segments ----------------------------------------------------------- */

/* Appends to out (cap bytes) at *at; *at goes past cap when it did not
 * fit (the caller checks once). */
static void put(char *out, size_t cap, size_t *at, const char *fmt, ...) {
    va_list ap;
    int     n;

    if (*at >= cap) return;
    va_start(ap, fmt);
    n = vsnprintf(out + *at, cap - *at, fmt, ap);
    va_end(ap);
    *at += n > 0 ? (size_t) n : 0;
}

/* A dictionary word as a JSON string's inside: \ and " escaped, control
 * bytes dropped (the dictionary has none; the escape is for a model
 * that might). */
static void put_word(char *out, size_t cap, size_t *at, const char *w) {
    for (; *w != '\0'; w++) {
        if ((unsigned char) *w < 0x20) continue;
        if (*w == '"' || *w == '\\') put(out, cap, at, "\\%c", *w);
        else put(out, cap, at, "%c", *w);
    }
}

/* The TRANSCRIPT payload of seg into out; its length, or 0 when it does
 * not fit OMNI_MAX_TEXT (ASR_MAX_WORDS words of ASR_MAX_WORD bytes,
 * timed, always do: 512 x ~100 bytes). */
static size_t seg_json(const LsReq *r, const AsrSegment *seg, char *out) {
    size_t cap = OMNI_MAX_TEXT, at = 0;

    put(out, cap, &at, "{\"input\":%d,\"text\":\"", r->cur);
    for (int i = 0; i < seg->n_words; i++) {
        if (i > 0) put(out, cap, &at, " ");
        put_word(out, cap, &at, seg->words[i].word);
    }
    put(out, cap, &at, "\",\"start\":%.2f,\"end\":%.2f,\"avg_logprob\":%.4f",
        seg->start, seg->end, isfinite(seg->avg_logprob)
                              ? seg->avg_logprob : -99.0);
    if (r->words) {
        put(out, cap, &at, ",\"words\":[");
        for (int i = 0; i < seg->n_words; i++) {
            put(out, cap, &at, "%s{\"word\":\"", i > 0 ? "," : "");
            put_word(out, cap, &at, seg->words[i].word);
            put(out, cap, &at, "\",\"start\":%.2f,\"end\":%.2f}",
                seg->words[i].start, seg->words[i].end);
        }
        put(out, cap, &at, "]");
    }
    put(out, cap, &at, "}");
    return at < cap ? at : 0;
}

static int on_segment(void *ud, const AsrSegment *seg, Err *err) {
    SegCtx *x = ud;
    size_t  n = seg_json(x->r, seg, x->w->seg);
    char   *copy;

    if (n == 0) return err_set(err, "a segment of %d words is over %u "
                               "bytes", seg->n_words, OMNI_MAX_TEXT);
    if ((copy = malloc(n)) == NULL) return err_set(err, "out of memory");
    memcpy(copy, x->w->seg, n);
    if (ls_post(x->w->core, x->r, LS_OUT_SEGMENT, copy, n) != 0) {
        return err_set(err, "stopped");
    }
    stats_add(x->w->core, 1, (uint64_t) seg->n_words, 0, 0);
    return 0;
}


/* ---- Inputs ------------------------------------------------------------- */

/* Decodes and recognises input r->cur, which starts at off in r->buf. */
static int work_input(LsWorker *w, LsReq *r, uint64_t off) {
    const LsInput *in = &r->in[r->cur];
    const double   max = r->max_seconds * ASR_RATE;
    SegCtx         x = { w, r };
    AudioInFormat  fmt;
    AudioDecoder  *d;
    uint64_t       n0 = r->samples;
    bool           oom = false;
    Err            err;
    int            rc = 0;

    d = audio_decoder_open(r->buf + off, in->bytes, in->format, ASR_RATE,
                           &err, &oom);
    if (d == NULL) {
        if (!oom) stats_add(w->core, 0, 0, 0, 1);
        return work_fail(r, oom ? 503 : 400, oom ? "out_of_memory" : NULL,
                         "%s", err.msg);
    }
    fmt = audio_decoder_format(d);
    if (asr_begin(w->asr, &err) != 0) {
        audio_decoder_free(d);
        return work_fail(r, 500, NULL, "%s", err.msg);
    }
    while (rc == 0 && !atomic_load(&r->stop)) {
        ssize_t k = audio_decoder_read(d, w->pcm, LS_PIECE, &err, &oom);

        if (k < 0) {
            if (!oom) stats_add(w->core, 0, 0, 0, 1);
            rc = work_fail(r, oom ? 503 : 400, oom ? "out_of_memory" : NULL,
                           "%s", err.msg);
        } else if (k == 0) {
            break;
        } else if ((double) (r->samples + (uint64_t) k) > max) {
            stats_add(w->core, 0, 0, 0, 1);
            rc = work_fail(r, 400, "audio_too_long", "the audio is longer "
                           "than the limit of %g seconds",
                           r->max_seconds);
        } else {
            r->samples += (uint64_t) k;
            stats_add(w->core, 0, 0, (uint64_t) k * 1000 / ASR_RATE, 0);
            if (asr_feed(w->asr, w->pcm, (size_t) k, on_segment, &x, &err)) {
                rc = work_fail(r, 500, NULL, "%s", err.msg);
            }
        }
    }
    audio_decoder_free(d);
    if (rc != 0 || atomic_load(&r->stop)) return -1;
    if (r->samples == n0) {
        stats_add(w->core, 0, 0, 0, 1);
        return work_fail(r, 400, NULL, "no audio: the %s file holds no "
                         "samples", audio_in_format_name(fmt));
    }
    if (asr_finish(w->asr, on_segment, &x, &err) != 0) {
        return work_fail(r, 500, NULL, "%s", err.msg);
    }
    return 0;
}

int ls_work(LsWorker *w, LsReq *r) {
    uint64_t off = 0;

    for (r->cur = 0; r->cur < r->n_in; r->cur++) {
        if (work_input(w, r, off) != 0) return -1;
        off += r->in[r->cur].bytes;
    }
    return 0;
}
