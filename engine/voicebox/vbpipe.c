/* vbpipe.c -- one request's audio path, run by the worker that holds it:
 * a units chunk from the pool -> Flite's PCM (16 kHz) -> soxr to
 * SPEECH_RATE -> the request's codec -> pool blocks for the loop.
 *
 * It is separate from vbcore.c, which decides who runs what and when:
 * this file never takes the core's mutex except to post a block.
 *
 * Blocks: the codec's bytes are copied into the request's current block
 * until it is full; when a synthesis callback ends, the partial block goes
 * too, so the first encoded bytes leave as soon as Flite's first piece is
 * through the codec rather than when a whole block of audio is ready. A
 * worker that finds the pool full waits for a free block in slices of
 * VB_WAIT_MS, checking the request's stop flag between them: backpressure
 * is a stalled worker, never more memory and never a stalled loop. */

#include <string.h>

#include "vbcore_impl.h"


/* The block being filled goes to the loop (nothing when it is empty). */
static void pipe_post(VbReq *r) {
    PoolRef ref = { (uint32_t) r->blk, 0, r->fill };

    if (r->blk < 0 || r->fill == 0) return;
    vb_post(r->core, r, VB_OUT_BLOCK, ref);
    r->blk = -1;
    r->fill = 0;
}

/* A block for r, waiting for one while the pool is full. Returns 0, or -1
 * when r was stopped meanwhile. */
static int pipe_block(VbReq *r) {
    Pool *p = r->core->pool;
    int   b;

    while ((b = pool_alloc(p, r->core->cfg.owner, r->id)) < 0) {
        if (atomic_load(&r->stop)) return -1;
        (void) pool_wait(p, VB_WAIT_MS);
    }
    r->blk = b;
    r->fill = 0;
    return 0;
}

/* The encoder's sink: n bytes into r's blocks. */
static int pipe_bytes(void *ud, const uint8_t *p, size_t n) {
    VbReq  *r = ud;
    Pool   *pool = r->core->pool;
    size_t  k;

    while (n > 0) {
        if (atomic_load(&r->stop)) return -1;
        if (r->blk < 0 && pipe_block(r) != 0) return -1;
        k = pool->block_size - r->fill;
        k = k < n ? k : n;
        memcpy((uint8_t *) pool_block(pool, (uint32_t) r->blk) + r->fill, p,
               k);
        r->fill += (uint32_t) k;
        p += k;
        n -= k;
        if (r->fill == pool->block_size) pipe_post(r);
    }
    return 0;
}

/* Opens r's resampler (the voice's rate to SPEECH_RATE) and encoder, on
 * the worker of r's first turn: an encoder may write its header at open,
 * and that may wait for a pool block. Returns 0, or -1 with r->err set
 * (vbpipe_close frees what was opened). */
int vbpipe_open(VbReq *r) {
    int rate = tts_voice_rate(r->voice);

    r->rs = resample_new(rate, SPEECH_RATE, &r->err);
    if (r->rs == NULL) return err_prefix(&r->err, "resampler");
    if (resample_out_max(r->rs, VB_PIECE) > r->core->out_cap) {
        return err_set(&r->err, "voice rate %d Hz: more than %zu samples "
                       "out per %d in", rate, r->core->out_cap, VB_PIECE);
    }
    r->enc = audio_encoder_open(r->format, SPEECH_RATE, pipe_bytes, r,
                                &r->err);
    if (r->enc == NULL) {
        return err_prefix(&r->err, "%s encoder",
                          speech_format_name(r->format));
    }
    return 0;
}

/* Frees r's codec state and drops the block it was filling. Loop thread,
 * once no worker touches r. Can't fail. */
void vbpipe_close(VbReq *r) {
    audio_encoder_free(r->enc);
    resample_free(r->rs);
    r->enc = NULL;
    r->rs = NULL;
    if (r->blk >= 0) (void) pool_unref(r->core->pool, (uint32_t) r->blk);
    r->blk = -1;
    r->fill = 0;
}

typedef struct {
    VbWorker *w;
    VbReq    *r;
} PipeSink;

/* Flite's sink: n samples at the voice's rate, resampled and encoded in
 * pieces of VB_PIECE (so the worker's buffer bounds the output), then the
 * partial block leaves. */
static int pipe_pcm(void *ud, const int16_t *pcm, size_t n) {
    PipeSink *ps = ud;
    VbReq    *r = ps->r;
    size_t    k, n_out;

    if (atomic_load(&r->stop)) return -1;
    while (n > 0) {
        k = n < VB_PIECE ? n : VB_PIECE;
        if (resample_process(r->rs, pcm, k, ps->w->out, r->core->out_cap,
                             &n_out, &r->err) != 0
            || audio_encoder_write(r->enc, ps->w->out, n_out, &r->err) != 0)
        {
            return -1;
        }
        r->samples += n_out;
        pcm += k;
        n -= k;
    }
    pipe_post(r);
    return 0;
}

/* Synthesizes the units chunk at ref (a reference r held; dropped here)
 * through r's pipeline. last: no silence after it. Returns the samples
 * Flite made, or -1 with r->err set (or r stopped). */
long vbpipe_chunk(VbWorker *w, VbReq *r, PoolRef ref, bool last) {
    VbCore       *c = r->core;
    PipeSink      ps = { w, r };
    TtsSynthOpts  o = { .speed = r->speed, .first = r->chunks == 0 };
    Units         u;
    long          n;
    int           rc;

    rc = units_decode(&u, (const uint8_t *) pool_block(c->pool, ref.block)
                      + ref.offset, ref.length, &r->err);
    (void) pool_unref(c->pool, ref.block);
    if (rc != 0) {
        err_prefix(&r->err, "units chunk %d", r->chunks + 1);
        return -1;
    }
    o.last = last || u.last;
    n = c->synth(r->voice, &u, &o, pipe_pcm, &ps, &r->err);
    units_free(&u);
    if (n < 0 && !atomic_load(&r->stop)) {
        err_prefix(&r->err, "synthesis of chunk %d", r->chunks + 1);
    }
    r->chunks++;
    return n;
}

/* Ends r's stream: what soxr held back, the codec's tail, the last
 * block; then the DONE counts. Returns 0, or -1 with r->err set. */
int vbpipe_finish(VbWorker *w, VbReq *r) {
    size_t n_out;

    do {
        if (resample_flush(r->rs, w->out, r->core->out_cap, &n_out,
                           &r->err) != 0
            || audio_encoder_write(r->enc, w->out, n_out, &r->err) != 0)
        {
            return err_prefix(&r->err, "end of stream");
        }
        r->samples += n_out;
    } while (n_out == r->core->out_cap);
    if (audio_encoder_finish(r->enc, &r->err) != 0) {
        return err_prefix(&r->err, "end of stream");
    }
    pipe_post(r);
    r->done.audio_ms = (uint32_t) (r->samples * 1000 / SPEECH_RATE);
    return 0;
}
