/* fake_cuda_plugin.c -- stand-ins for omni-cuda.so, so test_cuda_plan can
 * drive backend_new's loading on machines without a GPU: built as
 * build/t/fake-cuda.so (the entry point, behaving as FAKE_CUDA says) and,
 * with -DFAKE_NO_ENTRY, build/t/fake-noentry.so (a library without one).
 *
 *   FAKE_CUDA=nodevice   fails as the real plugin does without a device
 *   otherwise            returns a Backend named "fake-cuda" that only
 *                        knows how to free itself */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifndef FAKE_NO_ENTRY

static void fake_free(Backend *be) {
    free(be);
}

__attribute__((visibility("default")))
Backend *omni_cuda_backend_new(const BackendConfig *cfg, char *err,
                               size_t errlen)
{
    const char *mode = getenv("FAKE_CUDA");
    Backend    *be;

    (void) cfg;
    if (mode != NULL && strcmp(mode, "nodevice") == 0) {
        snprintf(err, errlen, "no CUDA device (fake)");
        return NULL;
    }
    be = calloc(1, sizeof(*be));
    if (be == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    be->name = "fake-cuda";
    be->free = fake_free;
    return be;
}

#else

__attribute__((visibility("default"))) int fake_cuda_unrelated = 1;

#endif
