/* synth.c -- the voices and the voicebox's synthesis (synth.h): Units back
 * into Flite's token list, flite_do_synth over utt_synth_tokens, the
 * samples streamed to the sink through Flite's audio streaming callback,
 * with the utterance's silences trimmed on the way (the pause plan is made
 * from the Segment relation's end times, which exist before the first
 * callback: durations are predicted before the waveform).
 *
 * Why utt_synth_tokens and not flite_synth_phones: the token list keeps the
 * words, their punctuation and their phones, so phrasing, intonation and
 * durations come out as Flite makes them for the whole text (bit-identical,
 * test_tts checks it); a bare phone string loses prosody (the recipe's
 * WER rose from 12-20% to 35-46%) and exit()s on an unknown phone. */

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "speech.h"
#include "synth.h"
#include "tts_impl.h"

// Pauses kept where Flite leaves ~0.35 s of silence at a chunk's end: a
// join keeps a pause that follows the text's punctuation; the request's
// last chunk keeps a short tail so players do not clip the last sound.
#define PAUSE_WORD_MS      60       // a cut between words (no punctuation)
#define PAUSE_CLAUSE_MS   120       // after , ; : and dashes
#define PAUSE_SENTENCE_MS 250       // after . ! ?
#define TAIL_LAST_MS       50
// Kept before the first phone's start: the diphone voice (kal16) places
// its first sound up to ~3 ms before the time its Segment relation says.
#define LEAD_GUARD_MS       5

struct TtsVoice {
    const char *name;               // "rms": speech.h's VoiceInfo.flite
    cst_voice *(*reg)(const char *);
    cst_voice  *flite;              // registered by tts_init, then read-only
    int         rate;               // Hz, measured by tts_init
};

static TtsVoice voices[] = {
    { "rms",   register_cmu_us_rms,   NULL, 0 },
    { "slt",   register_cmu_us_slt,   NULL, 0 },
    { "awb",   register_cmu_us_awb,   NULL, 0 },
    { "kal16", register_cmu_us_kal16, NULL, 0 },
};
#define N_VOICES (sizeof(voices) / sizeof(voices[0]))

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static Err            init_err;
static int            init_rc = -1;

// ---------------------------------------------------------------------------
// Voices

/* Registers one voice, checks it speaks usenglish's phone set (what
 * units_decode checks phones against) and learns its rate from a word. */
static int voice_load(TtsVoice *tv, Err *err) {
    const cst_val *ps;
    cst_wave      *w;

    if ((tv->flite = tv->reg(NULL)) == NULL)
        return err_set(err, "flite voice %s: registration failed", tv->name);
    ps = feat_val(tv->flite->features, "phoneset");
    if (ps == NULL || val_phoneset(ps) != &us_phoneset)
        return err_set(err, "flite voice %s: not usenglish's phone set, "
                       "which speech units are checked against", tv->name);
    if ((w = flite_text_to_wave("a", tv->flite)) == NULL)
        return err_set(err, "flite voice %s: cannot synthesize", tv->name);
    tv->rate = w->sample_rate;
    delete_wave(w);
    if (tv->rate <= 0)
        return err_set(err, "flite voice %s: sample rate %d", tv->name,
                       tv->rate);
    return 0;
}

static void init_voices(void) {
    flite_init();
    for (size_t i = 0; i < N_VOICES; i++)
        if (voice_load(&voices[i], &init_err) < 0) return;
    init_rc = 0;
}

int tts_init(Err *err) {
    pthread_once(&init_once, init_voices);
    if (init_rc < 0) return err_set(err, "tts: %s", init_err.msg);
    return 0;
}

const TtsVoice *tts_voice(const char *flite_name) {
    if (init_rc < 0 || flite_name == NULL) return NULL;
    for (size_t i = 0; i < N_VOICES; i++)
        if (strcmp(voices[i].name, flite_name) == 0) return &voices[i];
    return NULL;
}

int tts_voice_rate(const TtsVoice *v) { return v->rate; }

cst_voice *tts_flite_voice(const TtsVoice *v) { return v->flite; }

// ---------------------------------------------------------------------------
// Units -> Flite's token list

/* Each rebuilt token is one word: the one it carries phones for. A token
 * without phones (only punctuation) has no words, as it had none in the
 * analysis (us_tokentowords is not run again: its expansions are done). */
static cst_val *one_word(cst_item *token) {
    if (!item_feat_present(token, "phones")) return NULL;
    return cons_val(string_val(item_feat_string(token, "name")), NULL);
}

/* The phones "hh ax0 l ow1" as Flite's list ("hh" "ax0" "l" "ow1"); a list,
 * not the string form: with a string, a word whose phones equal the
 * previous word's is dropped ("no no no" would say "no"). */
static cst_val *phone_list(const char *phones) {
    cst_val    *head = NULL;
    const char *end = phones + strlen(phones);

    // built back to front so each cons is O(1)
    while (end > phones) {
        const char *start = end;
        char        buf[8];
        size_t      n;

        while (start > phones && start[-1] != ' ') start--;
        n = (size_t) (end - start);
        if (n >= sizeof(buf)) n = sizeof(buf) - 1;   // decode allows < 8
        memcpy(buf, start, n);
        buf[n] = '\0';
        head = cons_val(string_val(buf), head);
        end = start > phones ? start - 1 : start;
    }
    return head;
}

static cst_utterance *tokens_of(const Units *units) {
    cst_utterance *u = new_utterance();
    cst_relation  *r = utt_relation_create(u, "Token");

    for (int i = 0; i < units->n_words; i++) {
        const UnitWord *w = &units->words[i];
        cst_item       *t = relation_append(r, NULL);

        item_set_string(t, "name", w->text);
        item_set_string(t, "whitespace", i == 0 ? "" : " ");
        item_set_string(t, "prepunctuation", w->prepunc);
        item_set_string(t, "punc", w->punc);
        if (w->phones[0] != '\0')
            item_set(t, "phones", phone_list(w->phones));
    }
    feat_set(u->features, "tokentowords_func", itemfunc_val(one_word));
    return u;
}

// ---------------------------------------------------------------------------
// Streaming and trimming

typedef struct {
    const TtsSynthOpts *o;
    const Units        *units;
    cst_utterance      *u;
    TtsPcmSink          sink;
    void               *ud;
    bool                planned;    // keep_from/keep_to are set
    bool                refused;    // the sink said stop
    bool                streamed;   // the callback ran at least once
    long                keep_from;  // samples of Flite's wave kept:
    long                keep_to;    //   [keep_from, keep_to)
    long                sent;
} Stream;

static bool is_silence(const cst_item *s) {
    return strcmp(item_name(s), us_phoneset.silence) == 0;
}

/* The pause a chunk ending in punctuation p keeps before the next one. */
static int join_pause_ms(const char *p) {
    if (strpbrk(p, ".!?") != NULL) return PAUSE_SENTENCE_MS;
    if (strpbrk(p, ",;:-") != NULL) return PAUSE_CLAUSE_MS;
    return PAUSE_WORD_MS;
}

/* Decides which samples to keep, from the Segment relation's end times
 * (seconds): the first chunk starts at its first sound, every chunk ends
 * its last sound plus the pause it is owed; the silence Flite puts before
 * a later chunk's first sound goes too (the previous chunk's tail is the
 * pause). */
static void plan(Stream *st, int rate) {
    const cst_item *s = relation_head(utt_relation(st->u, "Segment"));
    const cst_item *last = relation_tail(utt_relation(st->u, "Segment"));
    const Units    *un = st->units;
    double          from = 0, to = HUGE_VAL;
    int             keep_ms;

    st->planned = true;
    if (st->o->keep_silence || s == NULL) {
        st->keep_from = 0;
        st->keep_to = LONG_MAX;
        return;
    }
    if (is_silence(s)) from = item_feat_float(s, "end");
    if (is_silence(last) && item_prev(last) != NULL)
        to = item_feat_float(item_prev(last), "end");
    keep_ms = st->o->last ? TAIL_LAST_MS
            : join_pause_ms(un->n_words > 0
                            ? un->words[un->n_words - 1].punc : "");
    st->keep_from = (long) (from * rate) - LEAD_GUARD_MS * rate / 1000;
    if (st->keep_from < 0) st->keep_from = 0;
    st->keep_to = to == HUGE_VAL ? LONG_MAX
                : (long) (to * rate) + (long) keep_ms * rate / 1000;
}

/* Pads the chunk's end with silence when Flite's own ended before the
 * pause it is owed (its final pause is often shorter than a sentence
 * break: the rest of a join's silence was the next chunk's lead, which
 * is trimmed). */
static int pad(Stream *st, long wave_len) {
    static const int16_t zeros[256];

    for (long at = wave_len; at < st->keep_to && !st->refused; ) {
        long n = st->keep_to - at < 256 ? st->keep_to - at : 256;

        if (st->sink(st->ud, zeros, (size_t) n) < 0) st->refused = true;
        st->sent += n;
        at += n;
    }
    return st->refused ? -1 : 0;
}

/* Hands the kept part of samples [start, start + n) of the wave on. */
static int pass_on(Stream *st, const cst_wave *w, long start, long n) {
    long from, to;

    if (!st->planned) plan(st, w->sample_rate);
    from = start > st->keep_from ? start : st->keep_from;
    to = start + n < st->keep_to ? start + n : st->keep_to;
    if (from >= to) return 0;
    if (st->sink(st->ud, w->samples + from, (size_t) (to - from)) < 0) {
        st->refused = true;
        return -1;
    }
    st->sent += to - from;
    return 0;
}

static int on_audio(const cst_wave *w, int start, int size, int last,
                    cst_audio_streaming_info *asi) {
    Stream *st = asi->userdata;

    (void) last;
    st->streamed = true;
    if (size <= 0) return CST_AUDIO_STREAM_CONT;
    return pass_on(st, w, start, size) < 0 ? CST_AUDIO_STREAM_STOP
                                           : CST_AUDIO_STREAM_CONT;
}

long tts_synth(const TtsVoice *v, const Units *units, const TtsSynthOpts *o,
               TtsPcmSink sink, void *ud, Err *err) {
    Stream                    st = { .o = o, .units = units, .sink = sink,
                                     .ud = ud };
    cst_audio_streaming_info *asi;
    const cst_wave           *w;

    if (!(o->speed >= SPEECH_MIN_SPEED && o->speed <= SPEECH_MAX_SPEED))
        return err_set(err, "tts: speed %g is outside [%g, %g]", o->speed,
                       SPEECH_MIN_SPEED, SPEECH_MAX_SPEED);
    if (units->n_phones == 0) return 0;     // nothing to say: no sound
    st.u = tokens_of(units);
    if (o->speed != 1.0f) {
        // scales the voice's own stretch (kal16 has 1.1): durations only,
        // the pitch model is untouched
        float base = get_param_float(v->flite->features,
                                     "duration_stretch", 1.0);

        feat_set_float(st.u->features, "duration_stretch", base / o->speed);
    }
    tts_noise_reset();
    asi = new_audio_streaming_info();
    asi->asc = on_audio;
    asi->userdata = &st;
    feat_set(st.u->features, "streaming_info",
             audio_streaming_info_val(asi));    // the utterance frees it
    if (flite_do_synth(st.u, v->flite, utt_synth_tokens) == NULL)
        return err_set(err, "tts: flite failed on a chunk of %d words",
                       units->n_words);     // flite_do_synth freed it
    // a voice that does not stream hands its wave over at the end
    w = utt_wave(st.u);
    if (!st.streamed && !st.refused && w != NULL)
        pass_on(&st, w, 0, w->num_samples);
    if (st.planned && st.keep_to != LONG_MAX && !st.refused && w != NULL)
        pad(&st, w->num_samples);
    delete_utterance(st.u);
    if (st.refused) return err_set(err, "tts: output refused");
    return st.sent;
}
