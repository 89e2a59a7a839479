/* transcripts.c -- the store of spoken answers' transcripts and the
 * splicing of them into a request's JSON (transcripts.h says why and how
 * they are bounded).
 *
 * Kept apart from conn.c because it is a data structure with its own
 * bounds and invariants, testable without sockets or stages.
 *
 * Invariants: every entry is in exactly one of the FIFO (oldest..newest,
 * linked by older/newer, and in its hash chain) and the free list (linked
 * by hnext); n counts the FIFO, bytes the text it holds; entries in the
 * FIFO are ordered by put time, so by expiry. */

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "json_scan.h"
#include "transcripts.h"

#define ID_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" \
                 "0123456789_-"


/* ---- The store ----------------------------------------------------------- */

int transcripts_init(Transcripts *t, size_t max_entries, size_t max_bytes,
                     Err *err)
{
    memset(t, 0, sizeof(*t));
    if (max_entries < 1 || max_entries > INT32_MAX / 2 || max_bytes < 1) {
        return err_set(err, "transcripts: bad bounds (%zu entries, %zu "
                       "bytes)", max_entries, max_bytes);
    }
    t->n_buckets = 1;
    while (t->n_buckets < 2 * max_entries) t->n_buckets <<= 1;
    t->e = calloc(max_entries, sizeof(*t->e));
    t->buckets = malloc(t->n_buckets * sizeof(*t->buckets));
    if (t->e == NULL || t->buckets == NULL) {
        transcripts_free(t);
        return err_set(err, "transcripts: out of memory");
    }
    for (uint32_t b = 0; b < t->n_buckets; b++) t->buckets[b] = -1;
    for (size_t i = 0; i < max_entries; i++) {
        t->e[i].hnext = i + 1 < max_entries ? (int32_t) i + 1 : -1;
    }
    t->max_entries = max_entries;
    t->max_bytes = max_bytes;
    t->oldest = t->newest = -1;
    t->free = 0;
    return 0;
}

void transcripts_free(Transcripts *t) {
    for (int32_t i = t->oldest; t->e != NULL && i >= 0; i = t->e[i].newer) {
        free(t->e[i].text);
    }
    free(t->e);
    free(t->buckets);
    memset(t, 0, sizeof(*t));
}

/* The head of id's hash chain (FNV-1a of the id). */
static int32_t *bucket_of(Transcripts *t, const char *id) {
    uint32_t h = 2166136261u;

    for (const char *p = id; *p != '\0'; p++) {
        h = (h ^ (unsigned char) *p) * 16777619u;
    }
    return &t->buckets[h & (t->n_buckets - 1)];
}

/* The entry held under id, or -1; *link gets the pointer to it in its
 * chain (for unlinking). */
static int32_t find(Transcripts *t, const char *id, int32_t **link) {
    for (int32_t *p = bucket_of(t, id); *p >= 0; p = &t->e[*p].hnext) {
        if (strcmp(t->e[*p].id, id) == 0) {
            if (link != NULL) *link = p;
            return *p;
        }
    }
    return -1;
}

/* Removes entry i from the FIFO and its chain, frees its text and puts it
 * on the free list. */
static void drop(Transcripts *t, int32_t i) {
    Transcript *e = &t->e[i];
    int32_t    *link = NULL;

    find(t, e->id, &link);
    *link = e->hnext;
    if (e->older >= 0) t->e[e->older].newer = e->newer;
    else t->oldest = e->newer;
    if (e->newer >= 0) t->e[e->newer].older = e->older;
    else t->newest = e->older;
    t->n--;
    t->bytes -= e->len;
    free(e->text);
    e->text = NULL;
    e->hnext = t->free;
    t->free = i;
}

/* Drops the expired entries, all at the FIFO's head. */
static void expire(Transcripts *t, double now) {
    while (t->oldest >= 0 && t->e[t->oldest].expires <= now) {
        drop(t, t->oldest);
    }
}

static bool valid_id(const char *id) {
    size_t n = strlen(id);

    return n >= 1 && n <= SPEECH_MAX_ID && strspn(id, ID_CHARS) == n;
}

int transcripts_put(Transcripts *t, const char *id, const char *text,
                    size_t len, double now, Err *err)
{
    Transcript *e;
    int32_t     i, *head;
    char       *copy;

    expire(t, now);
    if (!valid_id(id)) return err_set(err, "transcripts: bad audio id");
    if ((i = find(t, id, NULL)) >= 0) drop(t, i);
    if (omni_utf8_valid(text, len) != len) {
        return err_set(err, "transcripts: the text of %s is not UTF-8", id);
    }
    if (len > t->max_bytes) {
        return err_set(err, "transcripts: the text of %s (%zu bytes) is "
                       "over the store's %zu", id, len, t->max_bytes);
    }
    copy = malloc(len + 1);
    if (copy == NULL) return err_set(err, "transcripts: out of memory");
    memcpy(copy, text, len);
    copy[len] = '\0';
    while (t->n >= t->max_entries || t->bytes + len > t->max_bytes) {
        drop(t, t->oldest);
    }
    i = t->free;
    e = &t->e[i];
    t->free = e->hnext;
    memcpy(e->id, id, strlen(id) + 1);
    e->text = copy;
    e->len = len;
    e->expires = now + TRANSCRIPT_TTL_S;
    e->older = t->newest;
    e->newer = -1;
    if (t->newest >= 0) t->e[t->newest].newer = i;
    else t->oldest = i;
    t->newest = i;
    head = bucket_of(t, id);
    e->hnext = *head;
    *head = i;
    t->n++;
    t->bytes += len;
    return 0;
}

const char *transcripts_get(Transcripts *t, const char *id, double now,
                            size_t *len)
{
    int32_t i;

    expire(t, now);
    if (!valid_id(id) || (i = find(t, id, NULL)) < 0) return NULL;
    if (len != NULL) *len = t->e[i].len;
    return t->e[i].text;
}


/* ---- Splicing into a request --------------------------------------------- */

void json_put(char *out, size_t cap, size_t *at, const char *s, size_t n) {
    if (*at + n <= cap) memcpy(out + *at, s, n);
    *at += n;
}

void json_put_escaped(char *out, size_t cap, size_t *at, const char *text,
                      size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t            run = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char) text[i];
        char          esc[6] = { '\\', 'u', '0', '0', hex[ch >> 4],
                                 hex[ch & 15] };

        if (ch != '"' && ch != '\\' && ch >= 0x20) continue;
        json_put(out, cap, at, text + run, i - run);
        run = i + 1;
        if (ch == '"' || ch == '\\') {
            esc[1] = (char) ch;
            json_put(out, cap, at, esc, 2);
        } else {
            json_put(out, cap, at, esc, 6);
        }
    }
    json_put(out, cap, at, text + run, len - run);
}

/* Whether message i's id was already attached by an earlier message. */
static bool seen_before(const OmniRequest *r, int i) {
    for (int j = 0; j < i; j++) {
        if (r->audio_ids[j] != NULL
            && strcmp(r->audio_ids[j], r->audio_ids[i]) == 0)
            return true;
    }
    return false;
}

long transcripts_attach(Transcripts *t, const OmniRequest *r,
                        const char *json, size_t len, double now, char *out,
                        size_t cap, int *missing)
{
    static const char member[] = ",\"audio_transcripts\":{";
    size_t            end = len, at, n_ids = 0;

    *missing = -1;
    while (end > 0 && json[end - 1] != '}') end--;
    if (end == 0) return -1;
    end--;                              // json[end] is the closing brace
    at = end;
    for (int i = 0; r->chat && i < r->n_msgs; i++) {
        const char *text, *id = r->audio_ids[i];
        size_t      tlen;

        if (id == NULL || seen_before(r, i)) continue;
        if ((text = transcripts_get(t, id, now, &tlen)) == NULL) {
            *missing = i;
            return -1;
        }
        if (n_ids++ == 0) json_put(out, cap, &at, member, sizeof(member) - 1);
        json_put(out, cap, &at, n_ids == 1 ? "\"" : ",\"", n_ids == 1 ? 1 : 2);
        json_put(out, cap, &at, id, strlen(id));
        json_put(out, cap, &at, "\":\"", 3);
        json_put_escaped(out, cap, &at, text, tlen);
        json_put(out, cap, &at, "\"", 1);
    }
    if (n_ids == 0) return 0;
    json_put(out, cap, &at, "}}", 2);
    if (at <= cap) memcpy(out, json, end);
    return (long) at;
}
