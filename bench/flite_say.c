/* flite_say.c -- Flite's own synthesis of whole sentences, the baseline of
 * the word error rate measurement (`make bench`): what cmu_us_rms says
 * with no talker/voicebox split, no chunking and no resampling.
 *
 *   flite_say [--voice rms|slt|awb|kal16] OUTDIR < SENTENCES
 *
 * Writes OUTDIR/N.raw (s16le, mono, the voice's 16 kHz) for the N-th line
 * of stdin, counting from 1. A measuring tool: exits 1 on any error. */

#include <stdio.h>
#include <string.h>

#include <flite/flite.h>

cst_voice *register_cmu_us_rms(const char *voxdir);
cst_voice *register_cmu_us_slt(const char *voxdir);
cst_voice *register_cmu_us_awb(const char *voxdir);
cst_voice *register_cmu_us_kal16(const char *voxdir);

int main(int argc, char **argv) {
    const char *name = "rms", *dir;
    char        line[8192], path[4096];
    cst_voice  *v;
    int         n = 0;

    if (argc == 4 && strcmp(argv[1], "--voice") == 0) name = argv[2];
    else if (argc != 2) {
        fputs("usage: flite_say [--voice NAME] OUTDIR < SENTENCES\n", stderr);
        return 1;
    }
    dir = argv[argc - 1];
    flite_init();
    v = strcmp(name, "slt") == 0 ? register_cmu_us_slt(NULL)
        : strcmp(name, "awb") == 0 ? register_cmu_us_awb(NULL)
        : strcmp(name, "kal16") == 0 ? register_cmu_us_kal16(NULL)
        : register_cmu_us_rms(NULL);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        cst_wave *w;
        FILE     *f;

        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0') continue;
        w = flite_text_to_wave(line, v);
        snprintf(path, sizeof(path), "%s/%d.raw", dir, ++n);
        if (w == NULL || (f = fopen(path, "wb")) == NULL) {
            fprintf(stderr, "flite_say: line %d: cannot synthesize or write "
                    "%s\n", n, path);
            return 1;
        }
        fwrite(w->samples, sizeof(short), (size_t) w->num_samples, f);
        fclose(f);
        delete_wave(w);
    }
    return 0;
}
